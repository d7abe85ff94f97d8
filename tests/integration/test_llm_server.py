"""The built llama-server with the SmolLM2 GGUF, for real, on 127.0.0.1: both
artifacts unpacked with the device's reader (checksums and manifests), the
server started pinned to one CPU, then the gates edge_runtime_gate runs on a
device: /health ready, every thread's policy and CPUs from /proc/PID/task,
the first tokens at temperature 0 against the engine manifest's record, and a
streamed generation's TTFT and inter-token P99 against limits. A model whose
weights were changed (the output norm zeroed: a well-formed file, a wrong
engine) gives other first tokens and is refused.

Needs `make artifacts` (the llama-server artifact of this machine's
architecture and the engine in .cache/artifacts/); skipped with the reason
otherwise.
"""
import glob
import json
import os
import sys
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact as artifact
from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_gguf
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_llm, edge_sched
from edgetune_dev import llm

pytestmark = pytest.mark.controller
ARTIFACTS = Path(__file__).resolve().parents[2] / ".cache" / "artifacts"


def _find():
    """(server tarball, engine tarball) this machine can run, or a reason to skip."""
    runnable = []
    for sidecar in sorted(glob.glob(str(ARTIFACTS / "edgetune-llama-server-*.tar.gz.manifest.json"))):
        doc = json.loads(Path(sidecar).read_text())
        device = {"architecture": artifact.detect_architecture(), "glibc": artifact.detect_glibc()}
        if not artifact.compatibility_problems(doc, device):
            runnable.append(sidecar[:-len(".manifest.json")])
    engines = sorted(glob.glob(str(ARTIFACTS / ("edgetune-engine-%s-*.tar.gz" % llm.ENGINE_NAME))))
    if not runnable or not engines:
        return None, "no llama-server artifact for this machine or no GGUF engine in %s: run `make artifacts`" % (
            ARTIFACTS)
    return (runnable[0], engines[0]), None


FOUND, REASON = _find()
if FOUND is None:
    pytestmark = [pytestmark, pytest.mark.skip(reason=REASON)]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    server_tar, engine_tar = FOUND
    root = tmp_path_factory.mktemp("release")
    manifests = {}
    for kind, path in (("runtime", server_tar), ("engine", engine_tar)):
        manifests[kind] = artifact.inspect_tarball(path, kind)[0]
        artifact.unpack(path, str(root / kind))
    assert artifact.pairing_problems(manifests["runtime"], manifests["engine"]) == []
    return {"server": root / "runtime" / manifests["runtime"]["entry"],
            "model": root / "engine" / manifests["engine"]["entry"], "manifests": manifests, "root": root}


def test_engine_manifest_is_what_the_file_says(release):
    model = release["manifests"]["engine"]["model"]
    assert edge_gguf.describe(edge_gguf.read(str(release["model"]))) == model
    assert model["quantization"] == "Q4_1" and model["architecture"] == "llama"
    assert 130e6 < model["parameters"] < 140e6 and model["context_length"] == 8192
    assert release["manifests"]["engine"]["golden"]["tokens"]


def test_the_gates_pass_on_the_real_server(release, tmp_path):
    cpu = min(os.sched_getaffinity(0))
    golden = release["manifests"]["engine"]["golden"]
    with llm.Server(release["server"], release["model"], threads=1, cpus={cpu},
                    log=str(tmp_path / "server.log")) as server:
        ready = server.wait_ready(120)
        assert ready["body"].get("status") == "ok"

        threads = edge_sched.threads_of(server.proc.pid)
        assert len(threads) >= 2, threads  # the HTTP and inference threads, each read from /proc/PID/task
        assert edge_sched.thread_mismatches(threads, "other", None, {cpu}) == []
        if len(os.sched_getaffinity(0)) > 1:
            other = max(os.sched_getaffinity(0))
            wrong = edge_sched.thread_mismatches(threads, "fifo", 40, {other})
            assert len(wrong) == len(threads) and "policy other (expected fifo)" in wrong[0]

        run = edge_llm.stream_completion(server.port, golden["prompt"], golden["max_tokens"], timeout=120)
        assert edge_llm.golden_problems(run["tokens"], golden) == [], (run["tokens"], golden["tokens"])

        summary, runs = edge_llm.measure(server.port, "Once upon a time", max_tokens=16, runs=3, warmup=1,
                                         timeout=120)
        assert summary["runs"] == 3 and summary["inter_token"]["count"] >= 3 * 10
        assert 0 < summary["ttft"]["p50_ms"] <= summary["ttft"]["p99_ms"]
        assert summary["tokens_per_s"] > 1
        # Generous limits pass on a loaded 2-core machine; a limit no server meets is reported.
        assert edge_llm.latency_problems(summary, ttft_p99_ms=30000, token_p99_ms=5000) == []
        problems = edge_llm.latency_problems(summary, ttft_p99_ms=0.001, token_p99_ms=0.001)
        assert len(problems) == 2 and "time to first token P99" in problems[0]
        # Greedy decoding is deterministic: the same prompt gives the same tokens every time.
        assert len({tuple(r["tokens"]) for r in runs}) == 1


def test_a_wrong_model_is_refused_by_its_first_tokens(release, tmp_path):
    parsed = edge_gguf.read(str(release["model"]))
    norm = next(t for t in parsed["tensors"] if t["name"] == "output_norm.weight")
    broken = tmp_path / "broken.gguf"
    data = bytearray(release["model"].read_bytes())
    start = parsed["data_offset"] + norm["offset"]
    data[start:start + edge_gguf.tensor_bytes(norm)] = bytes(edge_gguf.tensor_bytes(norm))
    broken.write_bytes(bytes(data))
    assert artifact.sha256_file(str(broken)) != release["manifests"]["engine"]["files"]["model.gguf"]
    golden = release["manifests"]["engine"]["golden"]
    with llm.Server(release["server"], broken, threads=1, log=str(tmp_path / "server.log")) as server:
        server.wait_ready(120)
        run = edge_llm.stream_completion(server.port, golden["prompt"], golden["max_tokens"], timeout=120,
                                         require_tokens=False)
    problems = edge_llm.golden_problems(run["tokens"], golden)
    assert problems and "a corrupt or different model or runtime" in problems[0], run


def test_a_model_llama_server_cannot_load_ends_the_wait_with_its_status(release, tmp_path):
    truncated = tmp_path / "truncated.gguf"
    with open(str(release["model"]), "rb") as handle:
        truncated.write_bytes(handle.read(4 << 20))
    with pytest.raises(edge_gguf.GGUFError, match="truncated"):
        edge_gguf.read(str(truncated))
    with llm.Server(release["server"], truncated, threads=1, log=str(tmp_path / "server.log")) as server:
        with pytest.raises(edge_llm.LLMError, match="llama-server exited with status"):
            server.wait_ready(120)


def test_the_gate_module_on_the_real_server(release, tmp_path, capsys, monkeypatch):
    """edge_runtime_gate as the deploy runs it, with the gates an LLM release gets; only systemd's
    view of the unit is faked (no systemd here): its MainPID is the real server's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "modules"))
    import edge_runtime_gate
    from ansible.module_utils.testing import patch_module_args

    cpu = min(os.sched_getaffinity(0))
    golden = release["manifests"]["engine"]["golden"]
    with llm.Server(release["server"], release["model"], threads=1, cpus={cpu},
                    log=str(tmp_path / "server.log")) as server:
        unit = {"ActiveState": "active", "SubState": "running", "MainPID": server.proc.pid, "ExecMainStatus": 0,
                "NRestarts": 0, "Result": "success", "InactiveExitTimestampMonotonic": 0,
                "ActiveEnterTimestampMonotonic": 0}
        monkeypatch.setattr(edge_runtime_gate, "unit_state", lambda module, service: dict(unit))

        def gate(**args):
            params = dict(gates=["health", "threads", "golden", "stream"], service="llm.service", port=server.port,
                          health_path="/health", health_timeout=120, expect={"policy": "other", "cpus": str(cpu)},
                          golden=golden, generations=2, max_tokens=8, request_timeout=120)
            with patch_module_args(dict(params, **args)):
                with pytest.raises(SystemExit):
                    edge_runtime_gate.main()
            return json.loads(capsys.readouterr().out)

        result = gate(ttft_p99_ms=30000, token_p99_ms=5000)
        assert not result.get("failed"), result.get("msg")
        assert result["golden"]["observed"][:len(golden["tokens"])] == golden["tokens"]
        assert len(result["threads"]) >= 2 and {t["cpus"] for t in result["threads"]} == {str(cpu)}
        assert result["token_latency"]["runs"] == 2 and result["token_latency"]["inter_token"]["count"] >= 2 * 6

        result = gate(token_p99_ms=0.001)
        assert result["failed"] and "stream gate: inter-token gap P99" in result["msg"]
        result = gate(golden=dict(golden, tokens=[" Lyon"] + golden["tokens"][1:]))
        assert result["failed"] and "golden gate: refusing the engine" in result["msg"]
        assert "instead of ' Lyon'" in result["msg"]
