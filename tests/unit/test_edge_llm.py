"""Token latency of an LLM server (plugins/module_utils/device/edge_llm.py) and the
edge_runtime_gate's stream and golden gates, against a local server that
streams Server-Sent Events the way llama-server does (chunked, one event per
token, a last [DONE]), with delays the test chooses."""
import http.server
import json
import time

import pytest
from test_edge_runtime_gate import ACTIVE, run_gate

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_llm


# ------------------------------------------------------------------ SSE parsing
def test_sse_events_joins_data_lines_and_skips_the_rest():
    stream = [b": a comment\n", b"event: token\n", b"id: 1\n", b"data: {\"a\": 1}\r\n", b"\r\n",
              b"data: line one\n", b"data:line two\n", b"\n", b"\n", b"data: [DONE]"]
    assert list(edge_llm.sse_events(stream)) == ['{"a": 1}', "line one\nline two", "[DONE]"]
    assert list(edge_llm.sse_events(["data: x\n", "\n"])) == ["x"]
    assert list(edge_llm.sse_events([])) == []


def test_completion_text_reads_the_openai_chunk_and_refuses_the_rest():
    chunk = json.dumps({"choices": [{"text": " Paris", "index": 0, "finish_reason": None}]})
    assert edge_llm.completion_text(chunk) == (" Paris", None)
    assert edge_llm.completion_text('{"choices": [{"text": "", "finish_reason": "length"}]}') == ("", "length")
    for payload, message in [("not json", "not JSON"), ("[1]", "where a completion chunk"),
                             ('{"choices": []}', "without choices"),
                             ('{"error": {"message": "model is loading"}}', "error: model is loading")]:
        with pytest.raises(edge_llm.LLMError, match=message):
            edge_llm.completion_text(payload)


# ------------------------------------------------------------------ percentiles and limits
def test_token_latency_and_its_limits():
    runs = [{"ttft_ms": 100.0 + i, "gaps_ms": [10.0, 12.0, 50.0 if i == 9 else 11.0], "tokens": ["a"] * 4}
            for i in range(10)]
    summary = edge_llm.token_latency(runs)
    assert summary["runs"] == 10 and summary["tokens"] == 40
    assert summary["ttft"] == {"count": 10, "p50_ms": 104.0, "p99_ms": 109.0, "max_ms": 109.0}
    # 30 gaps, nearest rank: P50 is the 15th (11.0), P99 the 30th (50.0).
    assert summary["inter_token"]["p50_ms"] == 11.0 and summary["inter_token"]["p99_ms"] == 50.0
    assert summary["tokens_per_s"] == round(30 / (sum(10.0 + 12.0 + 11.0 for _gap in range(9)) + 72.0) * 1000, 2)
    assert edge_llm.latency_problems(summary, 200, 60) == []
    assert edge_llm.latency_problems(summary, 0, 0) == []
    assert edge_llm.latency_problems(summary, 108, 49.9) == [
        "time to first token P99 109.0 ms is over the limit of 108 ms",
        "inter-token gap P99 50.0 ms is over the limit of 49.9 ms"]
    one = edge_llm.token_latency([{"ttft_ms": 5.0, "gaps_ms": [], "tokens": ["a"]}])
    assert "no inter-token gap was measured" in edge_llm.latency_problems(one, 0, 10)[0]


def test_golden_problems_name_the_first_difference():
    golden = {"prompt": "The capital of France is", "tokens": [" Paris", ".", " It"]}
    assert edge_llm.golden_problems([" Paris", ".", " It", " is"], golden) == []
    problem = edge_llm.golden_problems([" Paris", ",", " It"], golden)[0]
    assert "gave ' Paris, It'" in problem and "packaged giving ' Paris. It'" in problem
    assert "first difference at token 1: ',' instead of '.'" in problem
    assert "token 2: '(end)' instead of ' It'" in edge_llm.golden_problems([" Paris", "."], golden)[0]
    assert "records no first tokens" in edge_llm.golden_problems([" Paris"], {"prompt": "x"})[0]


# ------------------------------------------------------------------ a streaming server
class Streamer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    tokens = [" Paris", ".", " It", " is"]
    first_delay, gap = 0.05, 0.02
    done = True
    status = 200
    requests = []

    def log_message(self, *args):
        pass

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if self.status != 200:
            data = b'{"error": "busy"}'
            self.send_response(self.status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(self.first_delay)
        for index, text in enumerate(self.tokens[:body["max_tokens"]]):
            if index:
                time.sleep(self.gap)
            event = {"choices": [{"text": text, "index": 0, "finish_reason": None}], "object": "text_completion"}
            self.chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.chunk(b'data: {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}\n\n')
        if self.done:
            self.chunk(b"data: [DONE]\n\n")
        self.chunk(b"")

    def do_GET(self):
        data = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def streamer(local_server):
    return lambda **attrs: local_server(Streamer, **dict(attrs, requests=[]))


def test_stream_completion_times_each_token(streamer):
    port, handler = streamer(first_delay=0.08, gap=0.03)
    run = edge_llm.stream_completion(port, "The capital of France is", 4)
    assert run["tokens"] == [" Paris", ".", " It", " is"] and run["text"] == " Paris. It is"
    assert run["finish_reason"] == "length"
    # The server sleeps 30 ms before each later token; arrival jitter moves single gaps, not their sum.
    assert run["ttft_ms"] >= 80.0 and len(run["gaps_ms"]) == 3 and all(g >= 10.0 for g in run["gaps_ms"])
    assert sum(run["gaps_ms"]) >= 80.0
    assert run["total_ms"] >= run["ttft_ms"] + sum(run["gaps_ms"]) - 1
    sent = handler.requests[0]
    assert sent["stream"] is True and sent["temperature"] == 0 and sent["max_tokens"] == 4
    assert sent["prompt"] == "The capital of France is"


def test_a_slow_generation_fails_at_the_deadline_not_at_its_end(streamer):
    # Each token well within the socket timeout (a loaded machine may stall a read for a while),
    # the whole generation (10 tokens, 2.75 s) not.
    port, _handler = streamer(gap=0.3, tokens=["t%d" % i for i in range(10)])
    began = time.monotonic()
    with pytest.raises(edge_llm.LLMError, match=r"took over 1 s \(\d tokens by then\)"):
        edge_llm.stream_completion(port, "x", 10, timeout=1.0)
    assert time.monotonic() - began < 2.5


def test_stream_failures_are_one_clear_error(streamer):
    port, _handler = streamer(done=False)
    with pytest.raises(edge_llm.LLMError, match=r"ended without \[DONE\] after 4 tokens"):
        edge_llm.stream_completion(port, "x", 4)
    port, _handler = streamer(tokens=[])
    with pytest.raises(edge_llm.LLMError, match="carried no token"):
        edge_llm.stream_completion(port, "x", 4)
    empty = edge_llm.stream_completion(port, "x", 4, require_tokens=False)
    assert empty["tokens"] == [] and empty["ttft_ms"] is None and empty["finish_reason"] == "length"
    port, _handler = streamer(status=503)
    with pytest.raises(edge_llm.LLMError, match="answered HTTP 503"):
        edge_llm.stream_completion(port, "x", 4)
    with pytest.raises(edge_llm.LLMError, match="failed"):
        edge_llm.stream_completion(free_port(), "x", 4, timeout=2)


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_wait_ready_polls_and_stops_on_a_dead_process(streamer):
    port, _handler = streamer()
    assert edge_llm.wait_ready(port, "/health", 5)["body"] == {"status": "ok"}
    with pytest.raises(edge_llm.LLMError, match="not ready within 1 s"):
        edge_llm.wait_ready(free_port(), "/health", 1)

    def dead():
        raise RuntimeError("the server exited")
    with pytest.raises(RuntimeError, match="exited"):
        edge_llm.wait_ready(free_port(), "/health", 30, check=dead)


# ------------------------------------------------------------------ the gate module
def test_stream_gate_measures_and_holds_the_limits(capsys, monkeypatch, streamer):
    port, handler = streamer(first_delay=0.03, gap=0.02)
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["health", "stream"], port=port, health_path="/health",
                      generations=3, warmup_generations=1, max_tokens=4, ttft_p99_ms=5000, token_p99_ms=5000)
    assert not result.get("failed"), result.get("msg")
    latency = result["token_latency"]
    assert len(handler.requests) == 4 and latency["runs"] == 3 and latency["tokens"] == 12
    assert latency["ttft"]["count"] == 3 and latency["ttft"]["p50_ms"] >= 30.0
    assert latency["inter_token"]["count"] == 9 and latency["inter_token"]["p50_ms"] >= 20.0
    assert latency["token_p99_limit_ms"] == 5000

    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["stream"], port=port, generations=2, max_tokens=4,
                      token_p99_ms=5)
    assert result["failed"] and "stream gate: inter-token gap P99" in result["msg"]
    assert "over the limit of 5.0 ms" in result["msg"] and "tokens/s over 2 generations" in result["msg"]

    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["stream"], port=port, max_tokens=1)
    assert result["failed"] and "max_tokens at least 2" in result["msg"]


def test_golden_gate_refuses_other_first_tokens(capsys, monkeypatch, streamer):
    port, handler = streamer()
    golden = {"prompt": "The capital of France is", "tokens": [" Paris", ".", " It"]}
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port, golden=golden)
    assert not result.get("failed"), result.get("msg")
    assert result["golden"]["observed"] == [" Paris", ".", " It"] and handler.requests[0]["max_tokens"] == 3

    port, _handler = streamer(tokens=[" Lyon", ".", " It"])
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port, golden=golden)
    assert result["failed"] and result["msg"].startswith("golden gate: refusing the engine:")
    assert "first difference at token 0: ' Lyon' instead of ' Paris'" in result["msg"]

    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port)
    assert result["failed"] and "no record to compare with" in result["msg"]
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port,
                      golden=dict(golden, tokens=" Paris. It"))
    assert result["failed"] and "a list of string tokens" in result["msg"]
    # The manifest's record is passed whole: its other keys do not matter.
    port, _handler = streamer()
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port,
                      golden=dict(golden, text=" Paris. It", recorded_with="llama-server x", max_tokens=3))
    assert not result.get("failed"), result.get("msg")

    # golden_tokens: only the first N recorded tokens are asked for and compared.
    port, handler = streamer(tokens=[" Paris", ",", " It"])
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port, golden=golden, golden_tokens=1)
    assert not result.get("failed"), result.get("msg")
    assert handler.requests[0]["max_tokens"] == 1 and result["golden"]["expected"] == [" Paris"]
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port, golden=golden, golden_tokens=2)
    assert result["failed"] and "token 1: ',' instead of '.'" in result["msg"]
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port, golden=golden, golden_tokens=-1)
    assert result["failed"] and "golden_tokens 0 or more" in result["msg"]

    # An engine that stops at once (a broken model often gives end-of-text first) is refused the same way.
    port, _handler = streamer(tokens=[])
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"], port=port, golden=golden)
    assert result["failed"] and "refusing the engine" in result["msg"] and "gave ''" in result["msg"]
