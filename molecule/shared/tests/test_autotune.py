"""Autotune on a twin: `edgetune tune runtime` measures the candidates on the device, a latency
shim (the stand-in llama-server of the unit tests, whose token gap depends on the threads it is
given) makes a non-default candidate win, and the record, the plan, the unit's environment and the
next audit all show that winner; `--forget` brings the plan's defaults back."""
import json
import os
import subprocess
from pathlib import Path

import pytest
from test_audit import audit

FAKE_SERVER = Path(__file__).resolve().parents[3] / "tests" / "unit" / "fixtures" / "llm" / "fake_llama_server.py"
SHIM = "/usr/local/bin/llama-latency-shim"
# Two compute threads stream a token every 1 ms, any other count every 1.5 s: more than the stalls a
# loaded 2-CPU machine gives a twin (937 ms seen in one gap of the 1 ms candidate while make test ran),
# so that the measured winner is the shim's, not the machine's.
SHIM_SCRIPT = ("#!/bin/sh\nFAKE_GAP_MS=1500 FAKE_GAP_THREADS_2_MS=1 exec python3 /usr/local/lib/fake_llama_server.py"
               " \"$@\"\n")
ENV_FILE = "/etc/edgetune/runtime.env"

pytestmark = pytest.mark.one_board


def tune(host, *extra):
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    argv = ["edgetune", "tune", "runtime", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "-l", host.backend.host,
            *extra]
    return subprocess.run(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


def planned_runtime(host):
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    done = subprocess.run(["edgetune", "plan", "--json", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                           "-l", host.backend.host], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)[host.backend.host]["plan"]["runtime"]


def env_threads(host):
    return next(line.split("=", 1)[1] for line in host.file(ENV_FILE).content_string.splitlines()
                if line.startswith("LLAMA_ARG_THREADS="))


def test_a_measured_winner_is_planned_deployed_and_audited_clean_until_forgotten(host):
    subprocess.run(["docker", "cp", str(FAKE_SERVER), "%s:/usr/local/lib/fake_llama_server.py" % host.backend.host],
                   check=True)
    host.run_expect([0], "printf '%%s' '%s' > %s && chmod 755 %s" % (SHIM_SCRIPT.replace("'", "'\\''"), SHIM, SHIM))
    default_threads = env_threads(host)
    assert default_threads != "2"
    options = {"edge_runtime_autotune_server": SHIM, "edge_runtime_autotune_candidates": ["two:threads=2"],
               "edge_runtime_autotune_generations": 2, "edge_runtime_autotune_max_tokens": 4,
               "edge_runtime_autotune_timeout": 120}
    # The real llama-server then runs two threads on the twin's two shared CPUs, which stall for
    # seconds while make test runs beside: gates for that (the same for the audits, whose inputs
    # they are), not for a board.
    gates = json.dumps({"edge_runtime_gate_request_timeout": 120, "edge_runtime_token_p99_ms": 60000,
                        "edge_runtime_ttft_p99_ms": 60000, "edge_runtime_gate_generations": 2,
                        "edge_runtime_gate_max_tokens": 8})
    try:
        done = tune(host, "-e", json.dumps(options), "-e", gates)
        assert done.returncode == 0, done.stdout[-3000:]
        record = json.loads(host.file("/etc/edgetune/autotune.json").content_string)
        assert record["choice"]["name"] == "two" and record["choice"]["threads"] == "2", record["results"]
        assert [r["name"] for r in record["results"]] == ["two", "default"]
        assert record["results"][0]["inter_token_p99_ms"] < record["results"][1]["inter_token_p99_ms"]
        assert record["results"][1]["inter_token_p50_ms"] >= 1400                 # the shim's gap, measured
        runtime = planned_runtime(host)
        assert runtime["autotune"]["in_force"] and runtime["autotune"]["choice"]["name"] == "two"
        assert runtime["threads"] == 2 and not runtime["autotune_measure"]["needed"]
        assert env_threads(host) == "2"
        assert host.service("edgetune-runtime.service").is_running
        assert not host.file("/etc/edgetune/autotune.pending.json").exists      # kept once gated
        code, hosts = audit(host, "-e", gates)
        assert code == 0, [r for r in hosts[host.backend.host]["results"] if r["state"] != "ok"]
    finally:
        forgot = tune(host, "--forget")          # back to the defaults and the inventory's gates
    assert forgot.returncode == 0, forgot.stdout[-3000:]
    assert not host.file("/etc/edgetune/autotune.json").exists
    assert env_threads(host) == default_threads
    assert planned_runtime(host)["autotune"]["choice"] is None
    code, hosts = audit(host)
    assert code == 0, [r for r in hosts[host.backend.host]["results"] if r["state"] != "ok"]
