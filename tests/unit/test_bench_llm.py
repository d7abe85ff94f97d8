"""tools/bench-runtime's LLM numbers (tools/edgetune_dev/bench_llm.py): the program it pipes to the
device, run here as the device runs it (Python -I from stdin, no edgetune installed) against a
local server streaming as llama-server does; the summary, the ratios and the table."""
import json
import subprocess
import sys

from test_edge_llm import Streamer

from edgetune_dev import bench_llm


def device(*argv):
    return subprocess.run([sys.executable, "-I", "-", *argv], input=bench_llm.device_program(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
                          check=False)


def test_the_device_program_waits_for_health_and_measures_streamed_generations(local_server):
    port, handler = local_server(Streamer, requests=[], first_delay=0.06, gap=0.02)
    assert device("ready", str(port), "10").returncode == 0
    done = device("measure", json.dumps({"port": port, "prompt": "Once upon a time", "max_tokens": 4, "runs": 2,
                                         "warmup": 1, "timeout": 30}))
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert len(runs) == 2 and len(handler.requests) == 3   # one warm-up, two measured
    assert all(run["tokens"] == [" Paris", ".", " It", " is"] and len(run["gaps_ms"]) == 3 for run in runs)
    # The server sleeps 60 ms before the first token and 20 ms before each next one: a loaded machine may
    # deliver two tokens at once (one gap near 0, the next 40 ms), never sooner than they were sent.
    assert all(run["ttft_ms"] >= 55 and sum(run["gaps_ms"]) >= 55 for run in runs)
    assert handler.requests[0]["stream"] is True and handler.requests[0]["temperature"] == 0


def test_a_failing_server_is_one_json_error_not_a_traceback(local_server):
    port, _handler = local_server(Streamer, requests=[], status=503)
    done = device("measure", json.dumps({"port": port, "prompt": "x", "max_tokens": 4, "runs": 1, "warmup": 0,
                                         "timeout": 10}))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "HTTP 503" in json.loads(done.stdout)["error"]


def runs(ttft, gap, count=4):
    return [{"ttft_ms": ttft, "gaps_ms": [gap] * 3, "tokens": ["a"] * 4} for _run in range(count)]


def test_summary_ratios_and_table():
    summaries = {bench_llm.QUIET: bench_llm.summarize(runs(40.0, 10.0)),
                 bench_llm.UNTUNED: bench_llm.summarize(runs(200.0, 50.0)),
                 bench_llm.TUNED: bench_llm.summarize(runs(50.0, 12.5))}
    assert summaries[bench_llm.QUIET]["inter_token"]["p99_ms"] == 10.0
    assert summaries[bench_llm.QUIET]["tokens_per_s"] == 100.0 and len(summaries[bench_llm.QUIET]["gaps_ms"]) == 12
    found = bench_llm.ratios(summaries)
    assert found["inter_token"] == {"noisy_tuned_vs_quiet": 1.25, "noisy_untuned_vs_noisy_tuned": 4.0}
    assert found["ttft"] == {"noisy_tuned_vs_quiet": 1.25, "noisy_untuned_vs_noisy_tuned": 4.0}
    text = bench_llm.table(summaries)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["stage", "TTFT", "P50"]
    assert lines[1].startswith("quiet: tuned service") and "10.0 ms" in lines[1] and lines[1].endswith("100.0")
    assert "inter-token P99: noisy tuned / quiet 1.25x, noisy untuned / noisy tuned 4.0x" in text


def test_it_says_whether_a_board_or_a_twin_was_measured():
    service = {"policy": "fifo", "priority": 40, "cpus": "4-7"}
    assert "real device: 8 kernel CPUs, the service FIFO prio 40 on CPUs 4-7" in bench_llm.what_was_measured(
        False, list(range(8)), service)
    twin = bench_llm.what_was_measured(True, [0, 1], dict(service, policy="other"))
    assert "device twin" in twin and "2 CPUs" in twin and "nothing to isolate" in twin
