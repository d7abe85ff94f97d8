"""tools/edgetune_dev/bench_audit.py: what the audit benchmark counts, on reports shaped like ansible.posix.json's."""
import json

import pytest

from edgetune_dev import bench_audit

pytestmark = pytest.mark.controller


def task(name, hosts):
    return {"task": {"name": name}, "hosts": hosts}


REPORT = {"plays": [{"tasks": [
    task("Validating arguments", {"a": {"action": "ansible.builtin.validate_argument_spec"}}),
    task("Read the board", {"a": {"action": "edgetune.fleet.edge_facts"},
                            "b": {"action": "edgetune.fleet.edge_facts"}}),
    task("Plan", {"a": {"action": "edgetune.fleet.edge_plan"}, "b": {"action": "edgetune.fleet.edge_plan"}}),
    task("Read two files", {"a": {"action": "ansible.builtin.slurp", "results": [
        {"ansible_loop_var": "item", "item": "x"}, {"ansible_loop_var": "item", "item": "y", "skipped": True}]}}),
    task("Skipped", {"b": {"action": "ansible.builtin.stat", "skipped": True}}),
    task("Audit", {
        "a": {"action": "edgetune.fleet.edge_audit", "results": [
            {"setting": "kernel boot arguments", "state": "ok"}, {"setting": "edge_cpu applied state", "state": "ok"},
            {"setting": "IRQ affinity", "state": "drifted"}]},
        "b": {"action": "edgetune.fleet.edge_audit", "judged_on": "controller", "results": []}}),
    task("Show", {"a": {"action": "ansible.builtin.debug"}}),
]}]}


def test_module_executions_count_device_work_only():
    # a: edge_facts, one slurp item (the other skipped), edge_audit (its own "results" are not loop items);
    # b: edge_facts, and an edge_audit judged on the controller from what edge_facts evaluated
    assert bench_audit.executions(REPORT) == {"a": 3, "b": 1}


def test_findings_leave_out_the_records_own_results():
    assert bench_audit.audit_results(REPORT) == {"a": {"kernel boot arguments": "ok", "IRQ affinity": "drifted"},
                                                 "b": {}}


def test_alias_inventory_cycles_over_the_twins_with_their_variables(tmp_path):
    source = tmp_path / "twin"
    (source / "group_vars").mkdir(parents=True)
    (source / "group_vars" / "all.yml").write_text("edge_runtime_require_fifo: false\n")
    (source / "host_vars").mkdir()
    (source / "host_vars" / "t1.yml").write_text("edge_cpu_isolate: 6-7\n")
    work = tmp_path / "work"
    work.mkdir()
    path = bench_audit.alias_inventory(["t1", "t2"], 3, str(work), str(source))
    hosts = json.loads((path / "hosts.yml").read_text())["all"]["hosts"]
    assert [h["ansible_host"] for h in hosts.values()] == ["t1", "t2", "t1"]
    assert (path / "group_vars" / "all.yml").read_text() == "edge_runtime_require_fifo: false\n"
    assert sorted(p.name for p in (path / "host_vars").iterdir()) == ["t1-as-00.yml", "t1-as-02.yml"]


def test_table_holds_each_size_to_its_goal():
    rows = [{"size": 1, "playbook": "audit", "wall": 2.0, "cpu_per_device": 1.0, "executions": 2, "audited": 1},
            {"size": 3, "playbook": "audit", "wall": 9.0, "cpu_per_device": 1.2, "executions": 2, "audited": 3},
            {"size": 30, "playbook": "audit", "wall": 31.5, "cpu_per_device": 0.9, "executions": 2, "audited": 30}]
    lines = bench_audit.table(rows, {1: True, 3: True, 30: False}).splitlines()
    assert lines[1].split() == ["1", "2", "1.00", "2.0", "1", "yes", "<=", "2", "executions,", "<=", "3", "s:",
                                "met"]
    assert lines[2].endswith("<= 2 executions: met")
    assert lines[3].endswith("<= 2 executions, <= 30 s: NOT met") and " NO " in lines[3]


def test_every_alias_must_find_what_its_twin_finds():
    same = {"t1-as-00": {"IRQ affinity": "ok"}, "t2-as-01": {"IRQ affinity": "drifted"},
            "t1-as-02": {"IRQ affinity": "ok"}}
    assert bench_audit.same_as_the_twins(same, ["t1", "t2"])
    assert not bench_audit.same_as_the_twins(dict(same, **{"t1-as-02": {"IRQ affinity": "error"}}), ["t1", "t2"])


def test_the_converge_path_is_shown_beside_the_full_path_against_its_goal():
    rows = [{"path": "converge", "devices": 2, "executions": 2, "wall": 6.1, "cpu_per_device": 3.0, "changed": 0},
            {"path": "full", "devices": 2, "executions": 79, "wall": 45.8, "cpu_per_device": 21.5, "changed": 0}]
    lines = bench_audit.converge_table(rows).splitlines()
    assert lines[1].split()[:6] == ["converge", "2", "2", "3.00", "6.1", "0"]
    assert lines[1].endswith("<= 3 executions, <= 10 s: met")
    assert lines[2].split() == ["full", "2", "79", "21.50", "45.8", "0"]
    assert lines[3] == "full / converge: wall 7.5x, executions 39.5x"
    slow = [dict(rows[0], wall=12.4)] + rows[1:]
    assert bench_audit.converge_table(slow).splitlines()[1].endswith("NOT met")


def test_changed_tasks_counts_each_host_that_changed():
    report = {"plays": [{"tasks": [{"hosts": {"a": {"changed": True}, "b": {"changed": False}}},
                                   {"hosts": {"a": {"changed": True}}}]}]}
    assert bench_audit.changed_tasks(report) == 2


def test_the_real_fleet_is_six_orin_nx_to_four_rk3588_and_adds_up():
    assert bench_audit.real_fleet(100) == [("orin-nx-16gb-r36", 60), ("rock5b-rk3588", 40)]
    assert sum(count for _board, count in bench_audit.real_fleet(7)) == 7


def test_the_real_fleet_goal_scales_the_wall_with_the_fleet_and_needs_every_device_audited():
    row = {"size": 100, "executions": 2, "cpu_per_device": 0.29, "wall": 39.0, "audited": 100}
    assert bench_audit.real_table(row).endswith(": met")
    assert bench_audit.real_table(dict(row, wall=41.0)).endswith("NOT met")
    assert bench_audit.real_table(dict(row, size=50, wall=21.0, audited=50)).endswith("NOT met")
    assert bench_audit.real_table(dict(row, cpu_per_device=0.31)).endswith("NOT met")
    assert bench_audit.real_table(dict(row, audited=99)).endswith("NOT met")


def test_task_results_count_every_task_a_host_was_given_skipped_or_not():
    assert bench_audit.task_results(REPORT) == {"a": 6, "b": 4}


def test_the_converge_path_is_judged_on_its_results_and_against_the_audit_s_cpu():
    rows = [{"path": "converge", "devices": 6, "executions": 2, "results": 24, "wall": 8.0, "cpu_per_device": 0.9,
             "changed": 0, "rounds": 5},
            {"path": "full", "devices": 6, "executions": 79, "results": 250, "wall": 45.8, "cpu_per_device": 9.5,
             "changed": 0, "rounds": 5},
            {"path": "audit", "devices": 6, "executions": 2, "results": 4, "wall": 5.5, "cpu_per_device": 0.6,
             "changed": 0, "rounds": 5}]
    lines = bench_audit.converge_table(rows).splitlines()
    assert lines[1].split()[:7] == ["converge", "6", "2", "0.90", "8.0", "0", "24"]
    assert lines[1].endswith("<= 3 executions, <= 10 s, <= 25 results: met")
    assert lines[-1] == "converge / audit controller CPU per device: 1.5x (goal <= 2x: met), medians of 5 rounds"
    over = [dict(rows[0], results=26, cpu_per_device=1.3)] + rows[1:]
    lines = bench_audit.converge_table(over).splitlines()
    assert lines[1].endswith("NOT met") and lines[-1].startswith("converge / audit controller CPU per device: 2.2x")
    assert "NOT met" in lines[-1]
