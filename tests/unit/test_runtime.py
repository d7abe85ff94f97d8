"""The reference runtime (runtime/): engine arithmetic, engine validation, and the
HTTP server run as a real process (health, inference results, metrics format,
thread names, systemd notifications, graceful shutdown, exit codes).

Expected logits are computed in the tests with integer arithmetic, independently
of both the runtime's float forward pass and the packager's fractions.
"""
import copy
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_sched import threads_of
from edgetune_dev import artifacts

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runtime"))

from edgetune_runtime import engine as rt_engine  # noqa: E402
from edgetune_runtime.server import Histogram  # noqa: E402

TINY = {"name": "tiny", "version": "1.0.0", "seed": 11, "input": {"size": 16, "scale": 16},
        "layers": [{"out": 12, "activation": "relu"}, {"out": 5, "activation": "none"}],
        "weight_scale": 64, "weight_range": 8, "bias_scale": 256, "bias_range": 32,
        "labels": ["a", "b", "c", "d", "e"], "golden_samples": [0, 1, 2],
        "compatibility": {"socs": ["tegra234"], "l4t": ">=35.1,<37", "requires": {"python": ">=3.8"}}}


def integer_logits(spec, sample):
    """Logits * (input_scale * weight_scale^L * ...) in integers, then divided once: exact."""
    layers = artifacts.generate_layers(spec)
    w_scale, b_scale, in_scale = spec["weight_scale"], spec["bias_scale"], spec["input"]["scale"]
    x = rt_engine.sample_ints(sample, spec["input"]["size"])
    denom = in_scale
    for layer in layers:
        # y = W x / (w_scale * denom) + b / b_scale, kept as an integer numerator over a common denominator
        new_denom = w_scale * denom
        common = new_denom * b_scale
        y = [sum(w * xi for w, xi in zip(row, x)) * b_scale + b * new_denom
             for row, b in zip(layer["weights"], layer["bias"])]
        x = [max(v, 0) for v in y] if layer["activation"] == "relu" else y
        denom = common
    return [v / denom for v in x]


@pytest.fixture(scope="module")
def tiny_doc():
    return artifacts.build_engine_document(TINY)


@pytest.fixture(scope="module")
def reference_engine(tmp_path_factory):
    """The real reference engine artifact (mlp-small), unpacked, and its runtime."""
    out = tmp_path_factory.mktemp("ref")
    engine = artifacts.package_engine(out)
    runtime = artifacts.package_runtime(out)
    for item, sub in ((engine, "engine"), (runtime, "runtime")):
        shutil.unpack_archive(item["path"], str(out / sub), "gztar")
    return out


# ------------------------------------------------------------------ engine
def test_float_forward_pass_is_exact(tiny_doc):
    engine = rt_engine.Engine(tiny_doc)
    for sample in range(20):
        assert engine.infer(engine.sample(sample)) == integer_logits(TINY, sample)


def test_golden_results_are_the_exact_ones(tiny_doc):
    for entry in tiny_doc["golden"]:
        assert entry["logits"] == integer_logits(TINY, entry["sample"])
    assert rt_engine.Engine(tiny_doc).self_test() == 3


def test_sample_inputs_are_stable():
    # Fixed values: a change of the input generator would silently change every golden result.
    assert rt_engine.sample_ints(0, 8) == [-8, 9, 16, -11, -11, -3, -3, -10]
    assert all(-16 <= v <= 16 for v in rt_engine.sample_ints(3, 1000))


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(format="onnx"), "not an edgetune-mlp-json/1 engine"),
    (lambda d: d["layers"][1].update({"in": 11}), "layer 1 takes 11 inputs but the previous layer gives 12"),
    (lambda d: d["layers"][0].update({"weights": "!!!"}), "layer 0 weights: not base64"),
    (lambda d: d["layers"][0].update({"bias": "AAAA"}), "layer 0 bias: 3 values, expected 12"),
    (lambda d: d["layers"][0].update({"activation": "gelu"}), "unknown activation"),
    (lambda d: d.update(labels=["a"]), "gives 5 outputs but 1 labels"),
    (lambda d: d.pop("input"), "engine header is incomplete"),
    (lambda d: d.update(layers=[]), "no layers"),
])
def test_malformed_engines_are_rejected_with_the_reason(tiny_doc, mutate, message):
    doc = copy.deepcopy(tiny_doc)
    mutate(doc)
    with pytest.raises(rt_engine.EngineError, match=re.escape(message)):
        rt_engine.Engine(doc)


def test_a_wrong_golden_result_fails_the_self_test(tiny_doc):
    doc = copy.deepcopy(tiny_doc)
    doc["golden"][1]["logits"][0] += 2 ** -20
    with pytest.raises(rt_engine.EngineError, match="warm-up on sample 1 gave logits off by up to"):
        rt_engine.Engine(doc).self_test()


def test_engine_directory_uses_the_manifest_entry(tmp_path, tiny_doc):
    (tmp_path / "m.json").write_text(json.dumps(tiny_doc))
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"entry": "m.json"}))
    assert rt_engine.Engine.load(str(tmp_path)).name == "tiny"
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"entry": "../m.json"}))
    with pytest.raises(rt_engine.EngineError, match="not a file inside the engine"):
        rt_engine.Engine.load(str(tmp_path))


def test_histogram_is_cumulative():
    hist = Histogram((0.01, 0.1))
    for value in (0.005, 0.05, 0.05, 3.0):
        hist.observe(value)
    lines = hist.render("x")
    assert lines == ['x_bucket{le="0.01"} 1', 'x_bucket{le="0.1"} 3', 'x_bucket{le="+Inf"} 4',
                     "x_sum 3.105000000", "x_count 4"]


# ------------------------------------------------------------------ server process
def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, base, *extra, env=None, prefix=()):
        self.port = free_port()
        self.argv = list(prefix) + [sys.executable, "-I", "-B", str(base / "runtime" / "edgetune-runtime"),
                                    "--engine", str(base / "engine"), "--port", str(self.port)] + list(extra)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=dict(os.environ, **(env or {})), universal_newlines=True)

    def request(self, method, path, body=None, timeout=10):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read().decode()
            ctype = response.getheader("Content-Type", "")
            return response.status, (json.loads(data) if "json" in ctype else data)
        finally:
            conn.close()

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        seen = []
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("runtime exited %s: %s" % (self.proc.returncode, self.proc.stderr.read()))
            try:
                status, body = self.request("GET", "/healthz", timeout=2)
                seen.append(body["status"])
                if status == 200:
                    return seen
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("not ready within %d s" % timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def server(reference_engine):
    started = []

    def start(*extra, **kwargs):
        srv = Server(reference_engine, *extra, **kwargs)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def test_ready_only_after_load_and_warmup_then_correct_results(server, reference_engine):
    srv = server("--warmup", "150")
    seen = srv.wait_ready()
    assert "loading" in seen, "the runtime answered ready before its warm-up: %s" % seen
    status, health = srv.request("GET", "/healthz")
    assert status == 200 and health["engine"]["name"] == "mlp-small" and health["warmup"]["golden_checked"] == 4
    assert health["warmup"]["warmup_inferences"] == 150

    golden = json.loads((reference_engine / "engine" / "model.json").read_text())["golden"]
    status, body = srv.request("POST", "/infer", {"samples": [g["sample"] for g in golden], "probabilities": True})
    assert status == 200
    for out, expected in zip(body["outputs"], golden):
        assert out["logits"] == expected["logits"] and out["class"] == expected["class"]
        assert abs(sum(out["probabilities"]) - 1.0) < 1e-9
        assert max(range(10), key=lambda i: out["probabilities"][i]) == expected["class"]

    # A caller's own input gives the same result as the engine computes locally.
    engine = rt_engine.Engine.load(str(reference_engine / "engine"))
    vector = [((i * 7) % 33 - 16) / 16 for i in range(256)]
    status, body = srv.request("POST", "/infer", {"inputs": [vector]})
    assert status == 200 and body["outputs"][0]["logits"] == engine.infer(vector)


@pytest.mark.parametrize("body,code,message", [
    ({"inputs": [[1, 2]]}, 400, "each input needs 256 values"),
    ({"inputs": "x"}, 400, "non-empty list"),
    ({"sample": -1}, 400, "non-negative integer"),
    ({"samples": list(range(65))}, 400, "at most 64"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_requests_get_400(server, body, code, message):
    srv = server("--warmup", "0")
    srv.wait_ready()
    status, answer = srv.request("POST", "/infer", body)
    assert status == code and message in answer["error"]
    assert srv.request("GET", "/nothing")[0] == 404


METRIC_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*",?)*\})? -?[0-9.e+-]+$')


def test_metrics_are_prometheus_text_with_a_latency_histogram(server):
    srv = server("--warmup", "0")
    srv.wait_ready()
    for _attempt in range(5):
        assert srv.request("POST", "/infer", {"sample": 3})[0] == 200
    status, text = srv.request("GET", "/metrics")
    assert status == 200 and text.endswith("\n")
    families = {}
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _hash, _type, name, kind = line.split()
            families[name] = kind
        elif not line.startswith("#"):
            assert METRIC_LINE.match(line), line
    assert families["edgetune_inference_duration_seconds"] == "histogram"
    assert families["edgetune_request_duration_seconds"] == "histogram"
    buckets = [(m.group(1), int(m.group(2))) for m in
               re.finditer(r'^edgetune_inference_duration_seconds_bucket\{le="([^"]+)"\} (\d+)$', text, re.M)]
    counts = [c for _le, c in buckets]
    assert buckets[-1][0] == "+Inf" and counts == sorted(counts)
    count = int(re.search(r"^edgetune_inference_duration_seconds_count (\d+)$", text, re.M).group(1))
    assert count == counts[-1] == 5
    assert re.search(r'^edgetune_requests_total\{endpoint="/infer",code="200"\} 5$', text, re.M)
    assert re.search(r"^edgetune_runtime_ready 1$", text, re.M)


def test_threads_are_named(server):
    srv = server("--warmup", "0", "--http-threads", "3", "--infer-threads", "2")
    srv.wait_ready()
    names = sorted(t["name"] for t in threads_of(srv.proc.pid))
    assert names == sorted(["et-main", "et-accept", "et-http-0", "et-http-1", "et-http-2", "et-infer-0", "et-infer-1"])


def test_systemd_notifications_and_graceful_shutdown(server, tmp_path):
    sock_path = str(tmp_path / "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(sock_path)
    listener.settimeout(60)
    try:
        srv = server("--warmup", "0", env={"NOTIFY_SOCKET": sock_path})
        messages = []
        while not any("READY=1" in m for m in messages):
            messages.append(listener.recv(4096).decode())
        assert srv.request("GET", "/healthz")[0] == 200  # READY=1 is sent only once /healthz says ready

        # A request in flight when SIGTERM arrives is answered; then the runtime exits 0.
        answer = {}

        def slow_request():
            answer["status"] = srv.request("POST", "/infer", {"samples": list(range(64))}, timeout=60)[0]

        thread = threading.Thread(target=slow_request)
        thread.start()
        time.sleep(0.1)
        srv.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert answer.get("status") == 200
        assert srv.stop() == 0
        while True:
            try:
                messages.append(listener.recv(4096).decode())
            except socket.timeout:
                break
            if any("STOPPING=1" in m for m in messages):
                break
        assert any("STOPPING=1" in m for m in messages)
        assert "stopped (exit 0)" in srv.proc.stderr.read()
    finally:
        listener.close()


def test_exit_codes(server, reference_engine, tmp_path):
    first = server("--warmup", "0")
    first.wait_ready()
    clash = Server(reference_engine, "--warmup", "0")
    clash.argv[clash.argv.index("--port") + 1] = str(first.port)
    proc = subprocess.run(clash.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=60, check=False)
    clash.proc.kill()
    clash.proc.wait()
    assert proc.returncode == 5 and "cannot listen" in proc.stderr

    bad = tmp_path / "bad"
    shutil.copytree(str(reference_engine), str(bad))
    doc = json.loads((bad / "engine" / "model.json").read_text())
    doc["layers"][2]["in"] = 255
    (bad / "engine" / "model.json").write_text(json.dumps(doc))
    srv = Server(bad, "--warmup", "0")
    assert srv.proc.wait(60) == 3 and "layer 2 takes 255 inputs" in srv.proc.stderr.read()

    doc["layers"][2]["in"] = 256
    doc["golden"][0]["class"] = (doc["golden"][0]["class"] + 1) % 10
    (bad / "engine" / "model.json").write_text(json.dumps(doc))
    srv = Server(bad, "--warmup", "0")
    assert srv.proc.wait(60) == 4 and "warm-up on sample 0 gave class" in srv.proc.stderr.read()

    srv = Server(reference_engine, "--http-threads", "0")
    assert srv.proc.wait(60) == 2
    srv = Server(reference_engine, env={"EDGETUNE_WARMUP": "many"})
    assert srv.proc.wait(60) == 2 and "EDGETUNE_WARMUP='many' is not a valid int" in srv.proc.stderr.read()


def fifo_allowed():
    try:
        rc = subprocess.run(["chrt", "-f", "5", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            check=False).returncode
    except OSError:
        return False
    return rc == 0


@pytest.mark.skipif(not fifo_allowed(), reason="SCHED_FIFO is refused here (chrt -f 5 true fails: no RT "
                                               "budget in this cgroup or no CAP_SYS_NICE)")
def test_every_thread_inherits_fifo_and_the_runtime_checks_it(server):
    srv = server("--warmup", "0", "--expect-sched", "fifo", prefix=["chrt", "-f", "5"])
    srv.wait_ready()
    threads = threads_of(srv.proc.pid)
    assert len(threads) == 7
    assert {(t["policy"], t["rt_priority"]) for t in threads} == {("fifo", 5)}
    health = srv.request("GET", "/healthz")[1]
    assert health["scheduling"]["ok"] is True and {t["policy"] for t in health["scheduling"]["threads"]} == {"fifo"}


def test_the_runtime_reports_a_policy_mismatch(server):
    srv = server("--warmup", "0", "--expect-sched", "fifo")
    srv.wait_ready()
    health = srv.request("GET", "/healthz")[1]
    assert health["scheduling"]["ok"] is False and "et-infer-0" in " ".join(health["scheduling"]["mismatch"])
    assert "edgetune_runtime_thread_policy_ok 0" in srv.request("GET", "/metrics")[1]
