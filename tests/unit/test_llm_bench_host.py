"""The host mode of the LLM bench (plugins/module_utils/bench/edge_llm_bench.py): candidates parsed and
refused, and a whole run against a stand-in llama-server whose token gap depends on the policy it
really runs with, so the test proves the placement and the policy reached the server's threads."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_llm_bench as hb

FAKE_SOURCE = Path(__file__).parent / "fixtures" / "llm" / "fake_llama_server.py"
PROGRAM = Path(hb.__file__).resolve()


def test_candidates_are_rules_over_the_default():
    fifo = hb.parse_candidate("fifo:policy=fifo,priority=40,poll=0,threads=n-1,threads-batch=n")
    assert fifo["policy"] == "fifo" and fifo["priority"] == 40 and fifo["poll"] == 0
    assert hb.resolve_threads(fifo["threads"], 4) == 3 and hb.resolve_threads(fifo["threads_batch"], 4) == 4
    assert hb.resolve_threads("n-1", 1) == 1 and hb.resolve_threads("6", 4) == 6
    other = hb.parse_candidate("plain:")
    assert other["policy"] == "other" and other["priority"] == 0 and other["partition"] == "root"
    assert hb.server_argv("/s", "/m", fifo, 4, "cuda") == [
        "/s", "--model", "/m", "--threads", "3", "--threads-batch", "4", "--poll", "0", "--n-gpu-layers", "99"]


@pytest.mark.parametrize("text, message", [
    (":policy=fifo", "has no name"),
    ("x:policy=deadline", "is not other, fifo or rr"),
    ("x:speed=3", "is not key=value"),
    ("x:policy=fifo,priority=0", "an RT priority is 1 to 99"),
    ("x:threads=all", "is not n, n-K or a number"),
    ("x:poll=often", "are integers"),
])
def test_bad_candidates_are_refused_with_one_line(text, message):
    with pytest.raises(hb.BenchError, match=message):
        hb.parse_candidate(text)


def fake_server(directory):
    """The stand-in as an executable, as a release's bin/llama-server is."""
    server = directory / "llama-server"
    server.write_text("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, FAKE_SOURCE))
    server.chmod(0o755)
    return server


def bench(tmp_path, *extra, **env):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    argv = [sys.executable, str(PROGRAM), "--server", str(fake_server(tmp_path)), "--model", str(model),
            "--out", str(tmp_path), "--rounds", "2", "--generations", "4", "--max-tokens", "6", "--settle", "0", *extra]
    return subprocess.run(argv, env=dict(os.environ, FAKE_LOG=str(tmp_path / "starts.jsonl"), **env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=240,
                          check=False)


def test_bad_input_is_refused_before_anything_starts(tmp_path):
    done = bench(tmp_path, "--noise", "cpu,disk", "--rounds", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "noise 'disk' is not one of cpu, cpu+mem" in done.stderr and "--rounds must be 2" in done.stderr
    assert not (tmp_path / "starts.jsonl").exists() and not (tmp_path / "bench-llm-host.json").exists()


def fifo_allowed():
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(["chrt", "-f", "10", "true"], stderr=subprocess.DEVNULL, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not fifo_allowed() or len(os.sched_getaffinity(0)) < 2, reason="needs root, SCHED_FIFO, 2 CPUs")
def test_a_run_places_each_candidate_and_ranks_them(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    infer = str(cpus[-1])
    # The stand-in streams faster under FIFO: the bench must find that and say the default is not best.
    done = bench(tmp_path, "--infer-cpus", infer, "--noise", "cpu", "--affinity-only",
                 "--candidate", "pinned-other:policy=other", "--candidate", "pinned-fifo:policy=fifo,priority=30",
                 FAKE_GAP_MS="6", FAKE_GAP_FIFO_MS="1")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "bench-llm-host.json").read_text())
    block = result["noises"]["cpu"]
    assert block["best"] == "pinned-fifo" and block["default"] == "pinned-other"
    assert block["default_vs_best"] > 2
    fifo, other = block["rows"]["pinned-fifo"], block["rows"]["pinned-other"]
    assert fifo["threads_seen"]["policies"] == ["fifo 30"] and fifo["threads_seen"]["cpus"] == [infer]
    assert other["threads_seen"]["policies"] == ["other"] and other["threads_seen"]["cpus"] == [infer]
    untuned = block["rows"]["noisy untuned"]
    assert untuned["threads_seen"]["policies"] == ["other"] and untuned["placement"].endswith("any CPU")
    # 2 rounds of 2 generations of 6 tokens: 20 gaps per stage, noise measured while it ran.
    assert other["inter_token"]["count"] == 20 and untuned["noise_throughput"][0]["cpu_workers"] == len(cpus)
    starts = [json.loads(line) for line in (tmp_path / "starts.jsonl").read_text().splitlines()]
    # quiet + untuned (our threads, llama.cpp's) + 2 candidates, in each of 2 rounds; the tuned ones on
    # the inference CPU only; the stock server is given no thread count.
    assert len(starts) == 10
    assert sum("--threads" not in s["argv"] for s in starts) == 2
    stock = block["rows"]["noisy untuned, llama.cpp's threads"]
    assert stock["placement"].endswith("any CPU") and block["noisy_untuned_stock_vs_noisy_tuned"] is not None
    assert {tuple(s["affinity"]) for s in starts if s["policy"] == "FIFO"} == {(cpus[-1],)}
    assert "noisy untuned / noisy tuned" in done.stdout and "default pinned-other is" in done.stdout
    # Nothing is left running.
    assert subprocess.run(["pgrep", "-f", str(FAKE_SOURCE)], stdout=subprocess.PIPE, check=False).returncode == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_an_untuned_server_that_does_not_finish_is_reported_and_not_run_again(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    # llama.cpp's own thread count (no --threads) streams a token every 2 s: over the 1 s bound.
    done = bench(tmp_path, "--infer-cpus", str(cpus[-1]), "--noise", "cpu", "--affinity-only",
                 "--candidate", "pinned-other:policy=other", "--stock-timeout", "1", FAKE_GAP_THREADS_None_MS="2000")
    assert done.returncode == 0, done.stderr
    block = json.loads((tmp_path / "bench-llm-host.json").read_text())["noises"]["cpu"]
    assert block["untuned_stock_failed"].startswith("round 1: the client failed: ")
    assert block["rows"]["noisy untuned, llama.cpp's threads"] is None
    starts = [json.loads(line) for line in (tmp_path / "starts.jsonl").read_text().splitlines()]
    assert sum("--threads" not in s["argv"] for s in starts) == 1      # round 2 did not start it again
    assert "noisy untuned, llama.cpp's threads       did not finish (round 1: " in done.stdout


def test_a_placement_the_kernel_refuses_says_which_step_and_why(tmp_path):
    log_path = tmp_path / "server.log"
    with open(str(log_path), "w") as log:
        with pytest.raises(subprocess.SubprocessError):
            hb._spawn(["true"], hb._placer(None, None, "fifo", 0), log=log)  # priority 0: EINVAL for FIFO
    assert log_path.read_text() == "edgetune-bench: SCHED_FIFO priority 0 refused: Invalid argument\n"


@pytest.mark.skipif(not fifo_allowed() or len(os.sched_getaffinity(0)) < 2, reason="needs root, SCHED_FIFO, 2 CPUs")
@pytest.mark.parametrize("client", ["server", "housekeeping"])
def test_the_client_runs_where_it_is_asked_to_in_every_stage(tmp_path, monkeypatch, client):
    cpus = sorted(os.sched_getaffinity(0))
    infer, housekeeping = cpus[-1:], cpus[:-1]
    seen = []
    measure = hb.Bench._client

    def probed(self, port, generations, place, timeout=None):
        # The placement the client gets, read back by a process started with it.
        probe = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)), "
                                "os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)"],
                               preexec_fn=place, stdout=subprocess.PIPE, universal_newlines=True, check=True)
        seen.append(probe.stdout.strip())
        return measure(self, port, generations, place, timeout)

    monkeypatch.setattr(hb.Bench, "_client", probed)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "starts.jsonl"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    code = hb.main(["--server", str(fake_server(tmp_path)), "--model", str(model), "--out", str(tmp_path),
                    "--rounds", "2", "--generations", "2", "--max-tokens", "3", "--settle", "0", "--noise", "cpu",
                    "--affinity-only", "--infer-cpus", str(infer[0]), "--client", client,
                    "--candidate", "pinned-fifo:policy=fifo,priority=30"])
    assert code == 0
    assert json.loads((tmp_path / "bench-llm-host.json").read_text())["client"] == client
    # quiet, untuned, untuned with llama.cpp's threads, the candidate; in each of 2 rounds.
    assert len(seen) == 8
    if client == "housekeeping":
        assert set(seen) == {"%s %d 1" % (housekeeping, os.SCHED_FIFO)}
    else:
        assert "%s %d 30" % (infer, os.SCHED_FIFO) in seen and "%s %d 0" % (cpus, os.SCHED_OTHER) in seen


def test_the_instrument_runs_where_it_can_when_the_kernel_refuses_a_step(tmp_path):
    # Priority 0 is refused for SCHED_FIFO (EINVAL) as RT is where a cgroup has no budget; CPU 4096
    # is not there (EINVAL) as the housekeeping CPUs are not in a cgroup's cpuset; nor is the cgroup.
    probe = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0), "
                            "sorted(os.sched_getaffinity(0)))"],
                           preexec_fn=hb._placer(str(tmp_path / "no-cgroup"), [4096], "fifo", 0, best_effort=True),
                           stdout=subprocess.PIPE, universal_newlines=True, check=True)
    assert probe.stdout.strip() == "%d %s" % (os.SCHED_OTHER, sorted(os.sched_getaffinity(0)))
    with pytest.raises(subprocess.SubprocessError):
        subprocess.run(["true"], preexec_fn=hb._placer(None, [4096]), stderr=subprocess.DEVNULL, check=False)
