"""Scheduling and port readers (plugins/module_utils/device/edge_sched.py), latency measurement
(plugins/module_utils/device/edge_latency.py), and the edge_runtime_gate and edge_runtime_probe
modules against real local processes and servers.

systemd is not running where the unit tests run: the gate's view of the unit
(systemctl show) is replaced by a fake; everything else is real (/proc, sockets,
HTTP). The systemd-run probes are exercised on the twins (molecule).
"""
import http.server
import json
import os
import socket
import subprocess
import sys
import time

import edge_runtime_gate
import edge_runtime_probe
import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_latency import percentile, run_load, summarize
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_sched import (
    compute_threads,
    explain_rt_refusal,
    parse_stat,
    port_holders,
    rt_budget_chain,
    thread_mismatches,
    threads_of,
)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible.module_utils.testing import patch_module_args


# ------------------------------------------------------------------ /proc readers
def test_parse_stat_survives_spaces_and_parentheses_in_comm():
    fields = ["S"] + ["0"] * 36 + ["40", "1"] + ["0"] * 10
    comm, policy, prio = parse_stat("4242 (et (x) y) " + " ".join(fields))
    assert (comm, policy, prio) == ("et (x) y", "fifo", 40)


def test_threads_of_this_process():
    threads = threads_of(os.getpid())
    assert threads[0]["tid"] == os.getpid()
    assert threads[0]["policy"] == "other" and threads[0]["rt_priority"] == 0
    assert threads[0]["cpus"] == sorted(os.sched_getaffinity(0))
    assert threads_of(2 ** 22 + 12345) == []


def test_thread_mismatches_name_each_thread():
    threads = [{"tid": 1, "name": "et-main", "policy": "other", "rt_priority": 0, "cpus": [0, 1]},
               {"tid": 2, "name": "et-infer-0", "policy": "fifo", "rt_priority": 30, "cpus": [4]}]
    problems = thread_mismatches(threads, "fifo", 40, [4, 5])
    assert problems == ["et-main[1]: policy other (expected fifo), CPUs 0-1 (expected 4-5)",
                        "et-infer-0[2]: priority 30 (expected 40), CPUs 4 (expected 4-5)"]
    assert thread_mismatches(threads[1:], "fifo", 30, [4]) == []
    assert thread_mismatches(threads, None, None, None) == []


def test_rt_budget_chain_and_the_explanation(tmp_path):
    cg = tmp_path / "cgroup"
    for directory, budget in (("cpu,cpuacct", 950000), ("cpu,cpuacct/docker", 0), ("cpu,cpuacct/docker/abc", 0)):
        (cg / directory).mkdir(parents=True)
        (cg / directory / "cpu.rt_runtime_us").write_text("%d\n" % budget)
    chain = rt_budget_chain("v1", "/docker/abc", str(cg))
    assert [b for _path, b in chain] == [950000, 0, 0]
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cgroup").write_text("3:cpuset:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/docker/abc\n")
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "sched_rt_runtime_us").write_text("950000\n")
    reason = explain_rt_refusal(77, str(proc), str(cg))
    assert "cpu.rt_runtime_us is 0 in %s" % (cg / "cpu,cpuacct/docker") in reason
    (proc / "sys" / "kernel" / "sched_rt_runtime_us").write_text("0\n")
    assert "kernel.sched_rt_runtime_us is 0" in explain_rt_refusal(77, str(proc), str(cg))


def test_port_holders_finds_the_listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert port_holders(port) == []
        sock.listen(1)
        holders = port_holders(port)
        assert [h["pid"] for h in holders] == [os.getpid()]
        assert holders[0]["comm"] == open("/proc/self/comm").read().strip()


# ------------------------------------------------------------------ latency
def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (50, 90, 99)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    assert percentile(list(range(1, 11)), 99) == 10 and percentile(list(range(1, 11)), 50) == 5
    summary = summarize([3.0, 1.0, 2.0], 1, 2.0)
    assert summary["p50_ms"] == 2.0 and summary["max_ms"] == 3.0 and summary["qps"] == 1.5 and summary["errors"] == 1


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay = 0.0
    status = 200
    calls = 0

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).calls += 1
        time.sleep(self.delay)
        body = b'{"ok": true}'
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        body = json.dumps({"status": "ready" if self.status == 200 else "loading"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def http_server(local_server):
    return lambda delay=0.0, status=200: local_server(Handler, delay=delay, status=status, calls=0)


def test_run_load_measures_each_request(http_server):
    port, handler = http_server(delay=0.01)
    result = run_load("127.0.0.1", port, requests=30, concurrency=2, warmup=4, keep_samples=True)
    assert handler.calls == 34 and result["count"] == 30 and result["errors"] == 0
    assert all(s >= 10.0 for s in result["samples_ms"])
    assert 10.0 <= result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    # Two connections, each request at least 10 ms: never more than 200 per second.
    assert 0 < result["qps"] <= 200 and abs(result["qps"] - 30 / result["duration_s"]) < 0.1


def test_run_load_counts_failures(http_server):
    port, _server = http_server(status=503)
    result = run_load("127.0.0.1", port, requests=5, warmup=0)
    assert result["count"] == 0 and result["errors"] == 5 and result["first_error"].startswith("503")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    result = run_load("127.0.0.1", closed, requests=3, warmup=0, timeout=1)
    assert result["errors"] == 3 and "refused" in result["first_error"].lower()


# ------------------------------------------------------------------ the gate module
def run_gate(capsys, monkeypatch, unit, **args):
    monkeypatch.setattr(edge_runtime_gate, "unit_state", lambda module, service: dict(unit))
    monkeypatch.setattr(edge_runtime_gate, "journal_tail", lambda module, service, lines=6: "engine rejected: boom")
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            edge_runtime_gate.main()
    return json.loads(capsys.readouterr().out)


ACTIVE = {"ActiveState": "active", "SubState": "running", "MainPID": 0, "ExecMainStatus": 0, "NRestarts": 0,
          "Result": "success", "InactiveExitTimestampMonotonic": 1000000, "ActiveEnterTimestampMonotonic": 3500000}


def test_latency_gate_fails_with_the_measured_numbers(capsys, monkeypatch, http_server):
    port, _server = http_server(delay=0.005)
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["health", "latency"], port=port, requests=20, warmup=2,
                      p99_ms=1)
    assert result["failed"] and "latency gate: P99" in result["msg"] and "over the limit of 1.0 ms" in result["msg"]
    assert result["latency"]["count"] == 20 and result["latency"]["p99_ms"] >= 5.0
    assert "P50 %s ms" % result["latency"]["p50_ms"] in result["msg"]
    assert result["health"]["startup_s"] == 2.5

    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["latency"], port=port, requests=20, warmup=2, p99_ms=5000)
    assert not result.get("failed") and result["latency"]["p99_limit_ms"] == 5000


def test_health_gate_stops_at_once_on_a_failed_unit(capsys, monkeypatch):
    failed = dict(ACTIVE, ActiveState="failed", SubState="failed", ExecMainStatus=3, Result="exit-code")
    began = time.monotonic()
    result = run_gate(capsys, monkeypatch, failed, gates=["health"], port=1, health_timeout=30)
    assert time.monotonic() - began < 5
    assert result["failed"] and "exit status 3: engine rejected at load" in result["msg"]
    assert "last log: engine rejected: boom" in result["msg"]


def test_health_gate_times_out_on_a_runtime_that_never_gets_ready(capsys, monkeypatch, http_server):
    port, _server = http_server(status=503)
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["health"], port=port, health_timeout=1)
    assert result["failed"] and "not ready within 1 s" in result["msg"] and "HTTP 503 loading" in result["msg"]


def test_a_gate_refuses_with_an_edge_error(capsys, monkeypatch):
    with pytest.raises(EdgeError) as caught:
        edge_runtime_gate.gate_golden(None, {"golden": {}}, {})
    assert caught.value.errors == ["golden gate: no record to compare with: pass the engine manifest's golden "
                                   "(prompt and tokens)"]
    assert caught.value.details == {}
    result = run_gate(capsys, monkeypatch, ACTIVE, gates=["golden"])
    assert result["failed"] and result["msg"] == caught.value.errors[0] and result["changed"] is False
    assert set(result) - {"invocation"} == {"changed", "failed", "msg"}


def test_threads_gate_reads_the_real_threads(capsys, monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                              "time.sleep(60)\n"])
    try:
        deadline = time.time() + 60  # a loaded machine starts Python slowly
        while len(threads_of(child.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert len(threads_of(child.pid)) == 2, "the child did not start its thread"
        unit = dict(ACTIVE, MainPID=child.pid)
        cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(child.pid)))
        result = run_gate(capsys, monkeypatch, unit, gates=["threads"], expect={"policy": "fifo", "priority": 40})
        assert result["failed"] and "2 of 2 threads" in result["msg"]
        assert "policy other (expected fifo)" in result["msg"]
        assert len(result["threads"]) == 2

        result = run_gate(capsys, monkeypatch, unit, gates=["threads"],
                          expect={"policy": "other", "cpus": cpus, "fallback_reason": "no RT budget",
                                  "cpus_fallback_reason": ""})
        assert not result.get("failed")
        assert "running SCHED_OTHER: no RT budget" in json.dumps(result["warnings"])

        result = run_gate(capsys, monkeypatch, unit, gates=["threads"], expect={"cpus": "63"})
        assert result["failed"] and "(expected 63)" in result["msg"]
    finally:
        child.kill()
        child.wait()
    result = run_gate(capsys, monkeypatch, dict(ACTIVE, MainPID=0, ActiveState="inactive"), gates=["threads"])
    assert result["failed"] and "no running main process" in result["msg"]


# ------------------------------------------------------------------ the probe module (port part)
def test_probe_names_the_port_holder(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with patch_module_args({"port": port}):
            with pytest.raises(SystemExit):
                edge_runtime_probe.main()
        result = json.loads(capsys.readouterr().out)
    assert result["port"]["free"] is False and "(pid %d" % os.getpid() in result["port"]["held_by"]
    assert result["fifo"] is None and result["affinity"] is None
    assert result["kernel_cpus"]
    assert result["unpinned_threads"] == max(1, result["kernel_cpu_count"] // 2)


@pytest.mark.parametrize("pinned, online, threads", [(4, 8, 4), (1, 2, 1), (0, 8, 4), (0, 2, 1), (0, 1, 1), (0, 0, 1)])
def test_compute_threads_one_per_owned_cpu_half_when_shared(pinned, online, threads):
    assert compute_threads(pinned, online) == threads


def test_probe_stops_again_the_slices_it_started():
    """A probe's transient unit starts its slice (and the slices above it): those that were not
    active before are stopped again, so that a refused deploy leaves no cgroup behind."""
    calls = []

    class Module(object):
        def get_bin_path(self, name, required=False):
            return "/bin/" + name

        def run_command(self, argv):
            calls.append(argv)
            return 0, ("active\n" if argv[-1] == "ai.slice" else "inactive\n"), ""

    module = Module()
    started = edge_runtime_probe.inactive_slices(module, "ai-infer.slice")
    assert started == ["ai-infer.slice"]
    assert edge_runtime_probe.stop_slices(module, started) == ["ai-infer.slice"]
    assert calls[-1] == ["/bin/systemctl", "stop", "ai-infer.slice"]


def test_the_latency_summary_the_deploy_reports():
    latency = {"latency": {"p50_ms": 3.1, "p99_ms": 4.8, "p99_limit_ms": 50.0, "max_ms": 6.2, "qps": 310.5,
                           "count": 200}}
    assert edge_runtime_gate.latency_summary(latency) == (
        "P50 3.1 ms, P99 4.8 ms (limit 50.0 ms), max 6.2 ms, 310.5 QPS over 200 requests measured on the device")
    tokens = {"token_latency": {"ttft": {"p50_ms": 80.0, "p99_ms": 95.0}, "inter_token": {"p50_ms": 30.0,
                                                                                          "p99_ms": 41.0},
                                "ttft_p99_limit_ms": 5000.0, "token_p99_limit_ms": 2000.0, "tokens_per_s": 31.2,
                                "runs": 5}}
    assert edge_runtime_gate.latency_summary(tokens) == (
        "time to first token P50 80.0 ms, P99 95.0 ms (limit 5000.0 ms); inter-token P50 30.0 ms, P99 41.0 ms "
        "(limit 2000.0 ms); 31.2 tokens/s over 5 generations measured on the device; first tokens as recorded at "
        "packaging")
    assert edge_runtime_gate.latency_summary({"health": {}}) == "unchanged, so no latency gate"
