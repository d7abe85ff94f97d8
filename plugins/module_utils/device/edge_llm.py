# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Token latency of an LLM server (llama.cpp's llama-server), measured where it
runs: readiness on ``/health``, streaming generations through the
OpenAI-compatible ``/v1/completions`` with ``stream: true`` (time to first
token and the gaps between tokens, as the client sees them), and the first
tokens of a known prompt at temperature 0 against the record the packager made.
Python 3.8+, stdlib only: used by edge_runtime_gate on the device, by the
packager and by the tests.

A streamed completion is a ``text/event-stream`` (Server-Sent Events): events
separated by a blank line, each with one or more ``data:`` lines; llama-server
sends one event per token and a last ``data: [DONE]``.
"""

import http.client
import json
import time

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_latency import percentile
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

DONE = "[DONE]"


class LLMError(EdgeError):
    """A server that does not answer as an LLM server should; the message says what it did."""


# ------------------------------------------------------------------ SSE
def sse_events(lines):
    """The ``data`` of each Server-Sent Event in an iterable of lines (bytes or str).

    Comment lines (``:``) and other fields (``event:``, ``id:``) are skipped; several
    ``data:`` lines of one event are joined with newlines; the stream may end
    without a final blank line.
    """
    data = []
    for raw in lines:
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _colon, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def completion_text(payload):
    """The text of one streamed /v1/completions event (OpenAI shape), and its finish_reason."""
    try:
        doc = json.loads(payload)
    except ValueError:
        raise LLMError("the stream sent an event that is not JSON: %r" % payload[:120]) from None
    if not isinstance(doc, dict):
        raise LLMError("the stream sent %r where a completion chunk was expected" % payload[:120])
    if "error" in doc:
        error = doc["error"]
        raise LLMError("the server answered with an error: %s" % (
            error.get("message", error) if isinstance(error, dict) else error))
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LLMError("a completion chunk without choices: %r" % payload[:120])
    return choices[0].get("text") or "", choices[0].get("finish_reason")


# ------------------------------------------------------------------ HTTP
def get(port, path, host="127.0.0.1", timeout=2.0):
    """GET -> (status, parsed JSON or {"raw": first bytes})."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(data.decode("utf-8"))
    except ValueError:
        return response.status, {"raw": data[:200].decode("utf-8", "replace")}


def wait_ready(port, path="/health", timeout=60.0, host="127.0.0.1", check=None, interval=0.2):
    """Poll ``path`` until it answers 200. ``check()`` runs before each try and may raise
    (a process or unit that died). Returns {"ready_s", "body"}; raises LLMError on timeout."""
    began = time.monotonic()
    last = "no answer yet"
    while True:
        if check is not None:
            check()
        try:
            status, body = get(port, path, host)
            if status == 200:
                return {"ready_s": round(time.monotonic() - began, 3), "body": body}
            message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else None
            last = "HTTP %d %s" % (status, message or body.get("status") or body.get("raw", ""))
        except (OSError, http.client.HTTPException) as exc:
            last = str(exc) or type(exc).__name__
        if time.monotonic() - began >= timeout:
            raise LLMError("not ready within %.0f s (last answer from %s:%d%s: %s)" % (timeout, host, port, path, last))
        time.sleep(interval)


def stream_completion(port, prompt, max_tokens=16, host="127.0.0.1", timeout=60.0, path="/v1/completions",
                      seed=0, require_tokens=True):
    """One streamed greedy completion. Returns {"ttft_ms", "gaps_ms", "tokens", "text", "finish_reason",
    "total_ms"}: times from the moment the request is sent, one entry per event that carried text.
    A generation that stops at once is an error unless ``require_tokens`` is false (then ttft_ms is None)."""
    body = json.dumps({"prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0, "top_k": 1,
                       "seed": int(seed), "stream": True, "cache_prompt": False}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        began = time.perf_counter()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                       "Accept": "text/event-stream"})
        response = conn.getresponse()
        if response.status != 200:
            answer = response.read()[:200].decode("utf-8", "replace")
            raise LLMError("POST %s answered HTTP %d: %s" % (path, response.status, answer))
        stamps, tokens, finish, done = [], [], None, False
        for payload in sse_events(iter(response.readline, b"")):
            if payload.strip() == DONE:
                done = True
                break
            text, reason = completion_text(payload)
            finish = reason or finish
            if text:
                stamps.append(time.perf_counter())
                tokens.append(text)
            # The socket timeout bounds each read; this bounds the whole generation.
            if time.perf_counter() - began > timeout:
                raise LLMError("the generation from %s:%d%s took over %.0f s (%d tokens by then)"
                               % (host, port, path, timeout, len(tokens)))
        total = time.perf_counter() - began
    except (OSError, http.client.HTTPException) as exc:
        raise LLMError("streaming POST %s to %s:%d failed: %s" % (path, host, port, exc)) from None
    finally:
        conn.close()
    if not done:
        raise LLMError("the stream from %s:%d%s ended without [DONE] after %d tokens" % (host, port, path, len(tokens)))
    if not tokens and require_tokens:
        raise LLMError("the stream from %s:%d%s carried no token (finish_reason %s)" % (host, port, path, finish))
    ms = [(t - began) * 1000.0 for t in stamps]
    return {"ttft_ms": round(ms[0], 3) if ms else None, "gaps_ms": [round(b - a, 3) for a, b in zip(ms, ms[1:])],
            "tokens": tokens, "text": "".join(tokens), "finish_reason": finish, "total_ms": round(total * 1000.0, 3)}


# ------------------------------------------------------------------ gates
def distribution(values):
    """count, P50, P99 and max (nearest rank, as edge_latency) of a list of milliseconds."""
    ordered = sorted(values)
    out = {"count": len(ordered)}
    for name, p in (("p50_ms", 50), ("p99_ms", 99)):
        value = percentile(ordered, p)
        out[name] = round(value, 3) if value is not None else None
    out["max_ms"] = round(ordered[-1], 3) if ordered else None
    return out


def token_latency(runs):
    """Summary of stream_completion() results: TTFT and inter-token gap distributions and tokens/s."""
    gaps = [g for run in runs for g in run["gaps_ms"]]
    tokens = sum(len(run["tokens"]) for run in runs)
    decode_s = sum(sum(run["gaps_ms"]) for run in runs) / 1000.0
    return {"runs": len(runs), "tokens": tokens,
            "ttft": distribution([run["ttft_ms"] for run in runs]),
            "inter_token": distribution(gaps),
            # Decode speed: tokens after the first over the time between first and last.
            "tokens_per_s": round(sum(len(run["gaps_ms"]) for run in runs) / decode_s, 2) if decode_s > 0 else None}


def latency_problems(summary, ttft_p99_ms=0, token_p99_ms=0):
    """What of ``summary`` (token_latency()) is over its limit (0: no limit); empty when within."""
    problems = []
    if ttft_p99_ms and ttft_p99_ms > 0 and summary["ttft"]["p99_ms"] > ttft_p99_ms:
        problems.append("time to first token P99 %s ms is over the limit of %s ms"
                        % (summary["ttft"]["p99_ms"], ttft_p99_ms))
    gap = summary["inter_token"]["p99_ms"]
    if token_p99_ms and token_p99_ms > 0:
        if gap is None:
            problems.append("no inter-token gap was measured (every generation gave one token); "
                            "raise the tokens per generation")
        elif gap > token_p99_ms:
            problems.append("inter-token gap P99 %s ms is over the limit of %s ms" % (gap, token_p99_ms))
    return problems


def measure(port, prompt, max_tokens=16, runs=3, warmup=1, host="127.0.0.1", timeout=60.0, path="/v1/completions"):
    """``warmup`` unmeasured then ``runs`` measured streamed generations -> (token_latency(), runs)."""
    for _run in range(warmup):
        stream_completion(port, prompt, max_tokens, host, timeout, path)
    measured = [stream_completion(port, prompt, max_tokens, host, timeout, path) for _run in range(runs)]
    return token_latency(measured), measured


def golden_problems(observed, golden):
    """Compare the first tokens a generation gave with the packager's record
    (golden = {"prompt", "tokens": [...]}); empty when they are the same."""
    expected = list(golden.get("tokens") or [])
    if not expected:
        return ["the engine manifest records no first tokens to compare with"]
    got = list(observed[:len(expected)])
    if got == expected:
        return []
    index = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return ["the prompt %r at temperature 0 gave %r, but the engine was packaged giving %r (first difference at "
            "token %d: %r instead of %r): a corrupt or different model or runtime"
            % (golden.get("prompt"), "".join(got), "".join(expected), index,
               got[index] if index < len(got) else "(end)", expected[index])]
