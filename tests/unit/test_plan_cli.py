"""`edgetune plan`: the plans read from the preflight's JSON report, printed for people and machines."""
import json

import pytest
from test_edge_plan import plan_for

from edgetune import plan as plan_cli


def report(results, stats):
    return {"plays": [{"tasks": [{"task": {"name": name}, "hosts": hosts} for name, hosts in results]}],
            "stats": stats}


def test_plans_and_refusals_are_collected_per_host():
    good = plan_for("orin-nx")
    found = plan_cli.collect(report(
        [("Read the board from the device", {"a": {}, "b": {}, "c": {"unreachable": True, "msg": "gone"}}),
         (plan_cli.PLAN_TASK, {"a": {"plan": good},
                               "b": {"failed": True, "msg": "b: 1 bad variable in the intent, refused"}})],
        {"a": {}, "b": {"failures": 1}, "c": {"unreachable": 1}}))
    assert found["a"] == {"plan": good}
    assert found["b"]["error"] == "failed" and "1 bad variable" in found["b"]["message"]
    assert found["c"]["error"] == "unreachable" and found["c"]["message"].endswith("gone")


def test_the_description_shows_each_part():
    text = plan_cli.describe("rock", plan_for("rock5b"))
    assert "inference 4-7, housekeeping 0-3" in text
    assert "isolcpus=managed_irq,domain,4-7 nohz_full=4-7" in text
    assert "cpufreq policy4 performance, policy6 performance" in text
    assert "devfreq fb000000.gpu performance, fdab0000.npu performance, dmc performance" in text
    assert "nvpmodel" not in text.split("note:")[0]
    assert "4 threads (cpu backend), SCHED_OTHER in ai-infer.slice" in text


@pytest.mark.controller  # the command reads the ansible.cfg in effect: ansible-core, the controller's
def test_exit_code_and_json(monkeypatch, capsys):
    good = plan_for("agx-r35")
    monkeypatch.setattr(plan_cli, "run_json_playbook", lambda *a, **k: report(
        [(plan_cli.PLAN_TASK, {"x": {"plan": good}})], {"x": {}}))
    args = type("Args", (), {"inventory": None, "limit": None, "extra_vars": None, "json": True})()
    assert plan_cli.cmd_plan(args) == 0
    assert json.loads(capsys.readouterr().out)["x"]["plan"]["cpu"]["inference_list"] == "4-11"
    monkeypatch.setattr(plan_cli, "run_json_playbook", lambda *a, **k: report([], {"x": {"failures": 1}}))
    args.json = False
    assert plan_cli.cmd_plan(args) == 1
    assert "x: NOT PLANNED (failed)" in capsys.readouterr().out


def test_the_description_shows_the_autotune_choice_or_why_the_defaults_apply():
    from test_edge_plan import RECORD, tuned_plan
    lines = plan_cli.describe("orin-1", tuned_plan(record=RECORD)).splitlines()
    runtime = next(line for line in lines if line.startswith("  runtime"))
    tuned = next(line for line in lines if line.startswith("  autotune"))
    assert "3 threads" in runtime and "fifo priority 30" in runtime
    assert tuned == "  autotune  choice pinned-fifo (measured 2026-12-05T10:00:00Z: inter-token P99 pinned-fifo 7.8 ms)"
    off = plan_cli.describe("orin-1", tuned_plan()).splitlines()
    assert "  autotune  off (edge_runtime_autotune)" in off
    asked = plan_cli.describe("orin-1", tuned_plan({"edge_runtime_autotune": True})).splitlines()
    assert "  autotune  defaults: no choice is recorded on the device; the next apply measures" in asked


def test_the_description_shows_the_numa_binding(tmp_path):
    from test_edge_plan import numa_plan, two_node_layout
    _checked, plan = numa_plan(two_node_layout(tmp_path, ["0-5", "6-7"], 1))
    lines = plan_cli.describe("host-1", plan).splitlines()
    numa = next(line for line in lines if line.startswith("  numa"))
    assert numa.startswith("  numa      node 1: the slice, the runtime and the probe on CPUs 6-7 (2 NUMA nodes;")
    _checked, single = numa_plan(None)
    assert "  numa      not bound: the NUMA layout was not read" in plan_cli.describe("orin-1", single).splitlines()
