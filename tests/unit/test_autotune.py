"""Autotune on the device (plugins/module_utils/bench/edge_autotune.py): candidates the role can apply,
measured side by side against a stand-in llama-server whose token gap depends on the threads or
the policy it really runs with, so the test proves each candidate reached the server; the choice,
the record and the refusals."""
import json
import os
import sys
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_autotune as at

FAKE_SOURCE = Path(__file__).parent / "fixtures" / "llm" / "fake_llama_server.py"
DEFAULT = {"policy": "other", "priority": 40, "threads": "n"}
ONLINE = sorted(os.sched_getaffinity(0))


def fake_server(directory):
    server = directory / "llama-server"
    server.write_text("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, FAKE_SOURCE))
    server.chmod(0o755)
    model = directory / "model.gguf"
    model.write_bytes(b"GGUF")
    return str(server), str(model)


def test_the_default_comes_first_and_only_keys_the_role_applies_are_taken():
    found = at.parse_candidates(["fifo:policy=fifo,priority=30", "fewer:threads=n-1"], DEFAULT)
    assert [c["name"] for c in found] == ["default", "fifo", "fewer"]
    assert (found[0]["policy"], found[0]["priority"], found[0]["threads"]) == ("other", 0, "n")
    assert at.choice_of(found[1]) == {"name": "fifo", "policy": "fifo", "priority": 30, "threads": "n"}
    with pytest.raises(at.AutotuneError, match="candidate x: poll cannot be applied by the role"):
        at.parse_candidates(["x:poll=0"], DEFAULT)
    with pytest.raises(at.AutotuneError, match="default is used twice"):
        at.parse_candidates(["default:threads=1"], DEFAULT)
    with pytest.raises(at.AutotuneError, match="is not other, fifo or rr"):
        at.parse_candidates(["x:policy=idle"], DEFAULT)


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs a CPU for the runtime and one for the noise")
def test_the_fastest_candidate_is_chosen_and_every_one_ran_as_asked(tmp_path, monkeypatch):
    server, model = fake_server(tmp_path)
    log = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_GAP_MS", "60")
    monkeypatch.setenv("FAKE_GAP_THREADS_1_MS", "1")      # one thread wins
    cpus = ONLINE[-1:]
    candidates = at.parse_candidates(["two:threads=2", "one:threads=1"], dict(DEFAULT, threads="n"))
    record = at.measure(server, model, cpus, candidates, noise="cpu", rounds=2, generations=4, max_tokens=6,
                        timeout_s=120)
    # threads "n" on one CPU is one thread too: the default and "one" run alike, "two" is slow.
    assert record["choice"]["name"] in ("one", "default") and record["results"][-1]["name"] == "two"
    assert record["results"][0]["inter_token_p99_ms"] < record["results"][-1]["inter_token_p99_ms"]
    assert record["results"][-1]["inter_token_p50_ms"] >= 55
    assert record["rounds"] == 2 and record["cpus"] == str(cpus[0]) and record["noise"] == "cpu"
    starts = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(starts) == 6                                # three candidates, two rounds
    assert {tuple(s["affinity"]) for s in starts} == {tuple(cpus)}
    assert sorted({s["argv"][s["argv"].index("--threads") + 1] for s in starts}) == ["1", "2"]
    at.write_record(record, str(tmp_path))
    assert at.read_record(str(tmp_path)) == record
    assert at.in_force(record, str(cpus[0]), "cpu") is None
    assert "measured on CPUs" in at.in_force(record, "4-7", "cpu")
    assert "cuda backend" in at.in_force(dict(record, backend="cuda"), str(cpus[0]), "cpu")


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs a CPU for the runtime")
def test_a_candidate_that_cannot_start_is_left_out_with_the_reason(tmp_path, monkeypatch):
    server, model = fake_server(tmp_path)
    monkeypatch.setenv("FAKE_GAP_MS", "1")
    monkeypatch.setenv("FAKE_EXIT_THREADS_3", "SCHED_FIFO refused")
    candidates = at.parse_candidates(["three:threads=3"], DEFAULT)
    record = at.measure(server, model, ONLINE[-1:], candidates, rounds=2, generations=2, max_tokens=3,
                        ready_timeout=10)
    assert record["choice"]["name"] == "default" and [r["name"] for r in record["results"]] == ["default"]
    assert "SCHED_FIFO refused (FAKE_EXIT_THREADS_3)" in record["refused"]["three"]
    monkeypatch.setenv("FAKE_EXIT_THREADS_1", "no model")
    with pytest.raises(at.AutotuneError, match="no candidate could be measured"):
        at.measure(server, model, ONLINE[-1:], candidates, generations=1, max_tokens=2, ready_timeout=10)


def test_bad_input_is_refused_before_anything_starts(tmp_path):
    server, model = fake_server(tmp_path)
    candidates = at.parse_candidates([], DEFAULT)
    with pytest.raises(at.AutotuneError, match="there are no inference CPUs to tune"):
        at.measure(server, model, [], candidates)
    with pytest.raises(at.AutotuneError, match="noise 'disk' is not one of none, cpu, cpu\\+mem"):
        at.measure(server, model, ONLINE[-1:], candidates, noise="disk")
    with pytest.raises(at.AutotuneError, match="the runtime runs on every CPU"):
        at.measure(server, model, ONLINE, candidates, noise="cpu")
    with pytest.raises(at.AutotuneError, match="the server /nowhere is not a file"):
        at.measure("/nowhere", model, ONLINE[-1:], candidates)


def test_the_time_bound_stops_before_the_first_round_completes(tmp_path, monkeypatch):
    server, model = fake_server(tmp_path)
    monkeypatch.setenv("FAKE_GAP_MS", "1")
    candidates = at.parse_candidates(["one:threads=1"], DEFAULT)
    clock = iter([0.0] + [1000.0] * 50)
    monkeypatch.setattr(at.time, "monotonic", lambda: next(clock))
    with pytest.raises(at.AutotuneError, match="time bound was reached before every candidate was measured"):
        at.measure(server, model, ONLINE[-1:], candidates, generations=1, max_tokens=2, timeout_s=5)


def test_an_unreadable_record_is_said_and_not_applied(tmp_path):
    path = tmp_path / at.RECORD.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    record = at.read_record(str(tmp_path))
    assert record["error"].startswith("cannot read /etc/edgetune/autotune.json: ")
    assert at.in_force(record, "1", "cpu") == record["error"]
    assert at.read_record(str(tmp_path / "none")) is None


def run_module(capsys, check=False, **args):
    import edge_runtime_autotune
    from ansible.module_utils.testing import patch_module_args
    args["_ansible_check_mode"] = check
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            edge_runtime_autotune.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.controller
def test_the_module_refuses_without_inference_cpus_and_check_mode_measures_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(at, "RECORD", str(tmp_path / "autotune.json"))
    monkeypatch.setattr(at, "PENDING", str(tmp_path / "autotune.pending.json"))
    server, model = fake_server(tmp_path)
    refused = run_module(capsys, server=server, model=model, cpus="", planned_cpus="")
    assert refused["failed"] and "there are no inference CPUs to tune" in refused["msg"]
    bad = run_module(capsys, server=server, model=model, planned_cpus="1", candidates=["x:poll=0"])
    assert bad["failed"] and "poll cannot be applied by the role" in bad["msg"]
    checked = run_module(capsys, check=True, server=server, model=model, planned_cpus="1", candidates=["x:threads=1"])
    assert checked["changed"] and checked["record"] is None and not (tmp_path / "autotune.json").exists()
    assert run_module(capsys, state="absent")["changed"] is False
    # A measurement is pending until the deploy of its choice passed the gates, then the record.
    assert run_module(capsys, state="accepted")["changed"] is False
    (tmp_path / "autotune.pending.json").write_text(json.dumps({"choice": {"name": "y"}}))
    kept = run_module(capsys, state="accepted")
    assert kept["changed"] and kept["choice"] == {"name": "y"} and not (tmp_path / "autotune.pending.json").exists()
    assert at.read_record("/") == {"choice": {"name": "y"}}
    (tmp_path / "autotune.json").write_text(json.dumps({"choice": {"name": "x"}}))
    gone = run_module(capsys, state="absent")
    assert gone["changed"] and gone["ansible_facts"] == {"edge_autotune": None}
    assert not (tmp_path / "autotune.json").exists()
