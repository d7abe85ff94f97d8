"""edge_audit: each kind of drift is classified right, and nothing is written."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_audit, edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import (
    audit, audit_records, evaluate, prometheus_text)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import parse_record, render_record

FIXTURES = Path(__file__).parent / "fixtures" / "bootloader"
ARGS = ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7"]


def device(tmp_path, append_extra, running_extra):
    """An Orin NX tree: extlinux.conf with APPEND + extra, /proc/cmdline with running extra."""
    stock = (FIXTURES / "extlinux_r36_orin_nx.conf").read_text()
    append = next(line for line in stock.splitlines() if line.strip().startswith("APPEND"))
    boot = tmp_path / "boot/extlinux/extlinux.conf"
    boot.parent.mkdir(parents=True)
    boot.write_text(stock.replace(append, append + append_extra))
    cmdline = " ".join(append.split()[2:]) + running_extra + " bl_prof_dataptr=2031616@0x471E10000\n"
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text(cmdline)
    return tmp_path


def cmdline_check(**extra):
    check = {"setting": "bootargs", "role": "edge_bootargs", "kind": "cmdline", "bootloader": "extlinux",
             "path": "/boot/extlinux/extlinux.conf", "args": ARGS, "absent": []}
    check.update(extra)
    return check


def snapshot(root):
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in Path(root).rglob("*") if p.is_file()}


def test_tuned_and_running_is_ok(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS), " " + " ".join(ARGS))
    assert evaluate(cmdline_check(), str(root))["state"] == "ok"


def test_in_boot_file_but_not_running_is_pending_reboot_not_drift(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS), "")
    result = evaluate(cmdline_check(), str(root))
    assert result["state"] == "pending-reboot"
    assert result["detail"] == "in the boot file, waiting for a reboot: to add: " + " ".join(ARGS)


def test_argument_removed_from_boot_file_is_drift_even_while_running(tmp_path):
    root = device(tmp_path, " " + ARGS[0], " " + " ".join(ARGS))
    result = evaluate(cmdline_check(), str(root))
    assert result["state"] == "drifted"
    assert result["detail"] == "boot file /boot/extlinux/extlinux.conf, to add: nohz_full=4-7"


def test_an_argument_that_must_go_is_named_to_remove_not_lacking(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS) + " quiet", " " + " ".join(ARGS))
    result = evaluate(cmdline_check(absent=["quiet"]), str(root))
    assert result["state"] == "drifted"
    assert result["detail"] == "boot file /boot/extlinux/extlinux.conf, to remove: quiet"


def test_a_removal_from_the_boot_file_is_pending_until_the_reboot(tmp_path):
    """A run took nohz_full out of the boot file (its key left the intent) in this boot: the record's
    unbooted part keeps it pending on later audits of this boot, and not after the reboot."""
    root = device(tmp_path, " " + ARGS[0], " " + " ".join(ARGS))
    state = root / "etc/edgetune/bootargs.json"
    state.parent.mkdir(parents=True)
    state.write_text(render_record({"args": ARGS[:1], "replaced": {"isolcpus": []},
                                    "unbooted": {"boot_id": "boot-2", "args": [], "absent": ["nohz_full"]}}))
    boot_id = root / "proc/sys/kernel/random/boot_id"
    boot_id.parent.mkdir(parents=True)
    boot_id.write_text("boot-2\n")
    check = cmdline_check(args=ARGS[:1], record="/etc/edgetune/bootargs.json")
    result = evaluate(check, str(root))
    assert result["state"] == "pending-reboot", result
    assert result["detail"] == "in the boot file, waiting for a reboot: to remove: nohz_full"
    boot_id.write_text("boot-3\n")   # rebooted, yet nohz_full still runs: not this record's to say
    assert evaluate(check, str(root))["state"] == "ok"
    (root / "proc/cmdline").write_text((root / "proc/cmdline").read_text().replace(" nohz_full=4-7", ""))
    assert evaluate(check, str(root))["state"] == "ok"


def record_of(tmp_path, args, replaced=None):
    state = tmp_path / "etc/edgetune/bootargs.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    body = {"args": args}
    if replaced is not None:
        body["replaced"] = replaced
    state.write_text(render_record(parse_record(json.dumps(body))))
    return "/etc/edgetune/bootargs.json"


def test_argument_the_intent_dropped_is_drift(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS) + " nosoftlockup", " " + " ".join(ARGS) + " nosoftlockup")
    record = record_of(tmp_path, ARGS + ["nosoftlockup"], {"isolcpus": [], "nohz_full": [], "nosoftlockup": []})
    assert evaluate(cmdline_check(), str(root))["state"] == "ok"  # without the record: a vendor arg
    result = evaluate(cmdline_check(record=record), str(root))
    assert result["state"] == "drifted" and "nosoftlockup" in result["detail"]


def test_a_dropped_key_must_have_its_old_tokens_back(tmp_path):
    tuned = " " + " ".join(ARGS) + " console=ttyS0"
    root = device(tmp_path, tuned, tuned)
    boot = root / "boot/extlinux/extlinux.conf"
    consoles = [t for t in boot.read_text().split() if t.startswith("console=")][:2]
    boot.write_text(boot.read_text().replace(" " + consoles[0], "", 1).replace(" " + consoles[1], "", 1))
    record = record_of(tmp_path, ARGS + ["console=ttyS0"], {"isolcpus": [], "nohz_full": [], "console": consoles})
    result = evaluate(cmdline_check(record=record), str(root))
    assert result["state"] == "drifted" and "console=ttyTCU0,115200" in result["detail"]


def test_a_kept_key_is_not_drift_but_an_old_record_is(tmp_path):
    """A key such as root= that replaced nothing stays when dropped (removing it would make the
    entry unbootable); a record that a run would rewrite is drift of its own."""
    tuned = " " + " ".join(ARGS) + " init=/sbin/tini"
    root = device(tmp_path, tuned, tuned)
    keep = ["root", "rootfstype", "rootflags", "init", "nfsroot"]
    record = record_of(tmp_path, ARGS + ["init=/sbin/tini"], {"isolcpus": [], "nohz_full": [], "init": []})
    assert evaluate(cmdline_check(record=record), str(root))["state"] == "drifted"  # init= would go
    result = evaluate(cmdline_check(record=record, keep=keep), str(root))
    assert result["state"] == "drifted" and "record" in result["detail"]
    record_of(tmp_path, ARGS, {"isolcpus": [], "nohz_full": []})
    assert evaluate(cmdline_check(record=record, keep=keep), str(root))["state"] == "ok"


def test_value_and_file_checks(tmp_path):
    gov = tmp_path / "sys/devices/system/cpu/cpufreq/policy4/scaling_governor"
    gov.parent.mkdir(parents=True)
    gov.write_text("schedutil\n")
    unit = tmp_path / "etc/systemd/system/edgetune-power.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Unit]\n")
    checks = [
        {"setting": "governor", "kind": "value", "path": "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor",
         "desired": "performance"},
        {"setting": "unit", "kind": "file", "path": "/etc/systemd/system/edgetune-power.service",
         "sha1": hashlib.sha1(b"[Unit]\n").hexdigest()},
        {"setting": "irq", "kind": "value", "path": "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor",
         "desired": "schedutil", "compare": "text"},
        {"setting": "htb", "kind": "unsupported", "reason": "missing CONFIG_NET_SCH_HTB"},
        {"setting": "gone", "kind": "file", "path": "/etc/missing", "sha1": "0"},
    ]
    results, summary = audit(checks, str(tmp_path))
    assert [r["state"] for r in results] == ["drifted", "ok", "ok", "unsupported", "drifted"]
    assert summary == {"ok": 2, "drifted": 2, "pending-reboot": 0, "unsupported": 1, "error": 0}
    unit.write_text("[Unit]\nDescription=edited by hand\n")
    assert evaluate(checks[1], str(tmp_path))["state"] == "drifted"


def test_cpulist_values_compare_as_sets(tmp_path):
    aff = tmp_path / "proc/irq/70/smp_affinity_list"
    aff.parent.mkdir(parents=True)
    aff.write_text("0,1,2,3\n")
    check = {"setting": "irq70", "kind": "value", "path": "/proc/irq/70/smp_affinity_list",
             "desired": "0-3", "compare": "cpulist"}
    assert evaluate(check, str(tmp_path))["state"] == "ok"
    aff.write_text("4-7\n")
    assert evaluate(check, str(tmp_path))["state"] == "drifted"


def test_unparsable_boot_file_is_an_error_not_ok(tmp_path):
    root = device(tmp_path, "", "")
    (root / "boot/extlinux/extlinux.conf").write_text("DEFAULT nowhere\nLABEL a\n  APPEND x\n")
    result = evaluate(cmdline_check(), str(root))
    assert result["state"] == "error" and "nowhere" in result["detail"]


def test_audit_writes_nothing(tmp_path):
    root = device(tmp_path, "", "")
    before = snapshot(root)
    audit([cmdline_check()], str(root))
    assert snapshot(root) == before


# --------------------------------------------------------------------------
# Apply records: the checks each role recorded, with the inputs of that apply

RECORD_DIR = "/etc/edgetune/applied"
INPUTS = {"variables": {"edge_bootargs_extra": [], "edge_bootargs_enabled": True},
          "plan": {"bootargs": "a1", "cpu": "c1"}}


def record(root, role, checks, inputs=None):
    path = Path(root) / RECORD_DIR.lstrip("/") / (role + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "role": role, "inputs": inputs or INPUTS, "checks": checks},
                               indent=4, sort_keys=True))


def by_setting(results):
    return {r["setting"]: r for r in results}


def test_records_are_evaluated_and_matching_inputs_are_ok(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS), " " + " ".join(ARGS))
    record(root, "edge_bootargs", [cmdline_check()])
    results, summary = audit_records(str(root), RECORD_DIR, {"edge_bootargs": {"enabled": True, "inputs": INPUTS}})
    found = by_setting(results)
    assert found["bootargs"]["state"] == "ok"
    assert found["edge_bootargs applied state"]["state"] == "ok"
    assert summary["drifted"] == 0


def test_changed_inputs_are_drift_naming_what_changed(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS), " " + " ".join(ARGS))
    record(root, "edge_bootargs", [cmdline_check()])
    today = {"variables": {"edge_bootargs_extra": ["quiet"], "edge_bootargs_enabled": True},
             "plan": {"bootargs": "a2", "cpu": "c1"}}
    results, summary = audit_records(str(root), RECORD_DIR, {"edge_bootargs": {"enabled": True, "inputs": today}})
    applied = by_setting(results)["edge_bootargs applied state"]
    assert applied["state"] == "drifted" and summary["drifted"] == 1
    assert 'edge_bootargs_extra [] -> ["quiet"]' in applied["detail"]
    assert "plan part bootargs" in applied["detail"] and "plan part cpu" not in applied["detail"]
    # The recorded checks are still evaluated: the device matches what was applied.
    assert by_setting(results)["bootargs"]["state"] == "ok"


def test_no_record_is_drift_and_a_switched_off_role_is_not_expected(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS), " " + " ".join(ARGS))
    results = audit_records(str(root), RECORD_DIR, {"edge_cpu": {"enabled": True, "inputs": INPUTS},
                                                    "edge_power": {"enabled": False, "inputs": INPUTS}})[0]
    assert [(r["setting"], r["state"]) for r in results] == [("edge_cpu applied state", "drifted")]
    assert "never applied here: no /etc/edgetune/applied/edge_cpu.json" in results[0]["detail"]


@pytest.mark.parametrize("content", ["{not json", "[]", '{"checks": "none"}', ""])
def test_an_unreadable_record_is_an_error_not_a_traceback(tmp_path, content):
    root = device(tmp_path, "", "")
    path = root / RECORD_DIR.lstrip("/") / "edge_cpu.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    results, summary = audit_records(str(root), RECORD_DIR, {"edge_cpu": {"enabled": True, "inputs": INPUTS}})
    assert summary["error"] == 1 and "edge_cpu.json" in results[0]["detail"]


def test_the_audit_judged_on_the_controller_from_the_facts_execution_finds_the_same(tmp_path):
    """playbooks/audit.yml's one device execution: the records evaluated with the facts (applied_state),
    then judged against today's plan on the controller (task_results with evaluated) -- the same results
    as the module reading and judging them on the device, for every kind of finding."""
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import applied_state, task_results
    root = device(tmp_path, " " + " ".join(ARGS), " " + " ".join(ARGS[:1]))       # one argument pending
    record(root, "edge_bootargs", [cmdline_check()])
    record(root, "edge_cpu", [cmdline_check(args=["nohz_full=1-3"], setting="other args")])
    bad = root / RECORD_DIR.lstrip("/") / "edge_power.json"
    bad.write_text("{not json")
    today = {"variables": {"edge_bootargs_extra": ["quiet"]}, "plan": {"bootargs": "a2"}}
    records = {"record_dir": RECORD_DIR, "roles": {
        "edge_bootargs": {"enabled": True, "inputs": today}, "edge_cpu": {"enabled": True, "inputs": INPUTS},
        "edge_power": {"enabled": True, "inputs": INPUTS}, "edge_boot": {"enabled": True, "inputs": INPUTS},
        "edge_pcie_qos": {"enabled": False, "inputs": INPUTS}}}
    on_device = task_results({"records": records, "root": str(root)})
    judged = task_results({"records": records, "evaluated": applied_state(str(root), RECORD_DIR)})
    assert judged == on_device
    states = dict((r["setting"], r["state"]) for r in judged[0])
    assert states == {"edge_boot applied state": "drifted", "edge_bootargs applied state": "drifted",
                      "edge_cpu applied state": "ok", "edge_power applied state": "error",
                      "bootargs": "pending-reboot", "other args": "drifted"}


def test_on_device_timer_reads_every_record_as_recorded(tmp_path):
    root = device(tmp_path, "", "")  # the boot file lost its arguments
    record(root, "edge_bootargs", [cmdline_check()])
    results, summary = audit_records(str(root), RECORD_DIR)
    assert by_setting(results)["bootargs"]["state"] == "drifted"
    assert "edge_bootargs applied state" not in by_setting(results)  # no plan to compare the inputs with
    assert summary["drifted"] == 1


def test_prometheus_textfile_lines():
    text = prometheus_text('kiosk"1', [{"setting": "bootargs", "role": "edge_bootargs", "state": "drifted"}])
    assert 'edgetune_drift{host="kiosk\\"1",setting="bootargs",role="edge_bootargs",state="drifted"} 1' in text
    assert text.startswith("# HELP edgetune_drift")


@pytest.mark.controller
def test_on_device_command_writes_the_textfile_and_exits_1_on_drift(tmp_path):
    """The timer's command line, with module_utils installed beside the script as the role does."""
    root = device(tmp_path / "dev", " " + ARGS[0], " " + " ".join(ARGS))
    install = tmp_path / "lib"
    repo = Path(__file__).resolve().parents[2]
    # What role edge_audit_timer installs: the plan's files of the audit program.
    from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_package import program_files
    for item in program_files("audit"):
        dest = install / item["dest"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(repo / item["src"], dest)
    irq_device(root)
    # The apply records, as role edge_record writes them.
    record(root, "edge_bootargs", [cmdline_check()])
    record(root, "edge_cpu", [irq_check()])
    prom = tmp_path / "edgetune.prom"
    run = subprocess.run([sys.executable, str(install / "edge_audit.py"), "--records", RECORD_DIR,
                          "--prometheus", str(prom), "--root", str(root)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    assert run.returncode == 1, run.stderr
    assert "drifted" in run.stdout
    assert 'setting="bootargs",role="edge_bootargs",state="drifted"} 1' in prom.read_text()
    # Every kind the roles publish is evaluated on the device too (edge_cpu's IRQ checks).
    assert 'setting="IRQ affinity",role="edge_cpu",state="ok"} 1' in prom.read_text(), run.stdout

    # While an apply holds the device, the timer skips: it says so, keeps the last results and
    # stamps the textfile, so that a long apply does not look like a dead timer.
    lease_file = tmp_path / "apply.lease"
    lease_file.write_text(json.dumps({"format": 1, "run_id": "ctl:1:2", "controller": "ctl", "user": "ops",
                                      "playbook": "site.yml", "since": 1.0, "expires": 4e9,
                                      "boot_id": open("/proc/sys/kernel/random/boot_id").read().strip()}))
    before = prom.read_text()
    skipped = subprocess.run([sys.executable, str(install / "edge_audit.py"), "--records", RECORD_DIR,
                              "--prometheus", str(prom), "--root", str(root), "--lease", str(lease_file)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.startswith("skipped: an apply holds the device: controller ctl, user ops, playbook site.yml")
    after = prom.read_text()
    stamp = [line for line in after.splitlines() if line.startswith("edgetune_audit_last_run_timestamp_seconds ")]
    assert len(stamp) == 1 and stamp[0] not in before
    assert [line for line in after.splitlines() if not line.startswith("edgetune_audit_last_run")] == \
        [line for line in before.splitlines() if not line.startswith("edgetune_audit_last_run")]


# --------------------------------------------------------------------------
# irq_affinity: an RK3588-like tree (housekeeping 0-3, inference 4-7)

RK_IRQS = [  # irq, chip, hwirq, trigger, name, affinity after a converged run
    (11, "GICv3", 26, "Level", "arch_timer", "0-7"),     # per-CPU (GIC PPI): the kernel keeps it everywhere
    (40, "GICv3", 252, "Level", "xhci-hcd:usb1", "0-3"),
    (84, "ITS-MSI", 524291, "Edge", "nvme0q3", "4-5"),   # managed: the kernel spread it
    (90, "ITS-MSI", 1048576, "Edge", "enP4p65s0", "0-3"),
    (95, "GICv3", 300, "Level", "vendor-thing", "0-7"),  # refused on the run (recorded), no hint
]


def irq_device(tmp_path, overrides=None, workqueue="0f"):
    overrides = overrides or {}
    lines = ["           " + "".join("CPU%-8d" % c for c in range(8)).rstrip()]
    for irq, chip, hwirq, trigger, name, cpus in RK_IRQS:
        directory = tmp_path / "proc/irq" / str(irq)
        directory.mkdir(parents=True)
        (directory / "smp_affinity_list").write_text(overrides.get(irq, cpus) + "\n")
        lines.append("%4d: %s %8s %3d %-8s %s" % (irq, "         1 " * 8, chip, hwirq, trigger, name))
    (tmp_path / "proc/interrupts").write_text("\n".join(lines) + "\n")
    (tmp_path / "proc/irq/default_smp_affinity").write_text("0f\n")
    online = tmp_path / "sys/devices/system/cpu/online"
    online.parent.mkdir(parents=True)
    online.write_text("0-7\n")
    if workqueue is not None:
        wq = tmp_path / "sys/devices/virtual/workqueue/cpumask"
        wq.parent.mkdir(parents=True)
        wq.write_text(workqueue + "\n")
    state = tmp_path / "etc/edgetune/boot.d/irq-affinity.json"
    state.parent.mkdir(parents=True)
    state.write_text(edge_boot.document("irq_affinity", {"cpus": "0-3", "refused": [
        {"irq": 11, "name": "arch_timer"}, {"irq": 84, "name": "nvme0q3"}, {"irq": 95, "name": "vendor-thing"}]},
        "edge_irq_affinity"))
    return tmp_path


def irq_check(**extra):
    check = {"setting": "IRQ affinity", "role": "edge_cpu", "kind": "irq_affinity", "cpus": "0-3",
             "inference": "4-7", "keep_subsets": True, "unmovable_names": [],
             "state_file": "/etc/edgetune/boot.d/irq-affinity.json"}
    check.update(extra)
    return check


def test_irqs_where_the_module_left_them_are_ok(tmp_path):
    root = irq_device(tmp_path)
    result = evaluate(irq_check(), str(root))
    assert result["state"] == "ok", result
    assert "90 enP4p65s0: 0-3" in result["running"]
    # per-CPU and managed interrupts on inference CPUs are the kernel's doing, not drift
    assert not any(line.startswith(("11 ", "84 ")) for line in result["running"])


def test_movable_irq_moved_onto_inference_cpus_is_drift(tmp_path):
    root = irq_device(tmp_path, {90: "4-7"})
    result = evaluate(irq_check(), str(root))
    assert result["state"] == "drifted"
    assert "IRQ 90 (enP4p65s0) on 4-7, reaches inference CPUs 4-7" in result["detail"]
    assert "IRQ 40" not in result["detail"]


def test_irq_refused_earlier_is_not_drift_but_without_the_record_it_is(tmp_path):
    root = irq_device(tmp_path)
    assert evaluate(irq_check(), str(root))["state"] == "ok"
    result = evaluate(irq_check(state_file=None), str(root))
    assert result["state"] == "drifted" and "IRQ 95 (vendor-thing)" in result["detail"]
    assert "IRQ 11" not in result["detail"] and "IRQ 84" not in result["detail"]  # hinted by /proc/interrupts


def test_irq_on_a_housekeeping_subset_is_kept_unless_exact_sets_are_wanted(tmp_path):
    root = irq_device(tmp_path, {40: "2"})
    assert evaluate(irq_check(), str(root))["state"] == "ok"
    result = evaluate(irq_check(keep_subsets=False), str(root))
    assert result["state"] == "drifted" and "IRQ 40 (xhci-hcd:usb1) on 2" in result["detail"]


def test_workqueue_and_default_affinity_masks(tmp_path):
    root = irq_device(tmp_path, workqueue="ff")
    wq = evaluate(irq_check(setting="workqueue", target="workqueue"), str(root))
    assert wq["state"] == "drifted" and wq["running"] == "0-7"
    default = evaluate(irq_check(setting="default", target="default_affinity"), str(root))
    assert default["state"] == "ok" and default["running"] == "0-3"
    (root / "proc/irq/default_smp_affinity").write_text("f0\n")
    assert evaluate(irq_check(setting="default", target="default_affinity"), str(root))["state"] == "drifted"


def test_kernel_without_workqueue_cpumask_is_unsupported(tmp_path):
    root = irq_device(tmp_path, workqueue=None)
    result = evaluate(irq_check(setting="workqueue", target="workqueue"), str(root))
    assert result["state"] == "unsupported" and "no unbound workqueue cpumask" in result["detail"]


def test_offline_housekeeping_cpus_are_an_error_not_ok(tmp_path):
    root = irq_device(tmp_path)
    (root / "sys/devices/system/cpu/online").write_text("4-7\n")
    result = evaluate(irq_check(), str(root))
    assert result["state"] == "error" and "not online" in result["detail"]


def test_audit_and_module_check_mode_agree_on_what_would_move(tmp_path):
    """The same classification: what the module would move is exactly what the audit calls drift."""
    import edge_irq_affinity as irqmod
    root = irq_device(tmp_path, {40: "4-7", 90: "0-7", 84: "6-7", 11: "0-7"})
    known = irqmod.known_refusals(irqmod.read_state(str(root / "etc/edgetune/boot.d/irq-affinity.json"))[1])
    plan = irqmod.run(str(root), "0-3", known_refused=known, check_mode=True)
    detail = evaluate(irq_check(), str(root))["detail"]
    assert sorted(m["irq"] for m in plan.moved) == [40, 90]
    assert "IRQ 40 " in detail and "IRQ 90 " in detail
    assert "IRQ 84" not in detail and "IRQ 11" not in detail


def test_irq_audit_writes_nothing(tmp_path):
    root = irq_device(tmp_path, {90: "4-7"}, workqueue="ff")
    before = snapshot(root)
    audit([irq_check(), irq_check(target="workqueue"), irq_check(target="default_affinity")], str(root))
    assert snapshot(root) == before


def test_memory_limits_compare_as_bytes_rounded_down_to_pages(tmp_path):
    limit = tmp_path / "sys/fs/cgroup/memory/ai.slice/ai-infer.slice/memory.limit_in_bytes"
    limit.parent.mkdir(parents=True)
    check = {"setting": "MemoryMax", "kind": "value", "path": "/sys/fs/cgroup/memory/ai.slice/ai-infer.slice/"
             "memory.limit_in_bytes", "desired": "22748862873", "compare": "bytes"}
    limit.write_text("22748860416\n")  # what the kernel keeps of MemoryMax=90% of 24684096 kB: whole 4 KiB pages
    assert evaluate(check, str(tmp_path))["state"] == "ok"
    limit.write_text("9223372036854771712\n")  # no limit any more
    assert evaluate(check, str(tmp_path))["state"] == "drifted"
    limit.write_text("22748862874\n")  # above the desired limit
    assert evaluate(check, str(tmp_path))["state"] == "drifted"
    limit.write_text("max\n")
    assert evaluate(check, str(tmp_path))["state"] == "drifted"


def test_memory_limits_given_as_a_share_of_the_ram_follow_memtotal(tmp_path):
    limit = tmp_path / "sys/fs/cgroup/ai.slice/ai-infer.slice/memory.max"
    limit.parent.mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    meminfo = tmp_path / "proc/meminfo"
    check = {"setting": "MemoryMax", "kind": "value", "path": "/sys/fs/cgroup/ai.slice/ai-infer.slice/memory.max",
             "desired": "90%", "compare": "ram-share"}
    meminfo.write_text("MemTotal:       24684096 kB\nMemFree:        1 kB\n")
    limit.write_text("22748860416\n")  # what systemd and the kernel made of MemoryMax=90% of that MemTotal
    assert evaluate(check, str(tmp_path))["state"] == "ok"
    # MemTotal moved by 62 KiB since systemd resolved the limit (a VM's memory): still the same limit.
    meminfo.write_text("MemTotal:       24684158 kB\n")
    assert evaluate(check, str(tmp_path))["state"] == "ok"
    limit.write_text("%d\n" % int(24684096 * 1024 * 0.8))  # MemoryMax=80% written by hand
    result = evaluate(check, str(tmp_path))
    assert result["state"] == "drifted" and "90%" in result["detail"], result
    limit.write_text("max\n")
    assert evaluate(check, str(tmp_path))["state"] == "drifted"
    meminfo.write_text("MemFree: 1 kB\n")
    limit.write_text("22748860416\n")
    assert evaluate(check, str(tmp_path))["state"] == "error"


# --------------------------------------------------------------------------
# nvpmodel: the power mode by name, running (nvpmodel -q) and recorded for the boot

ORIN_NX_CONF = Path(__file__).resolve().parents[2] / "tools/edgetune_dev/twin/guest/nvpmodel_confs" \
    / "nvpmodel_p3767_0000_super.conf"


def nvpmodel_device(tmp_path, pmode):
    (tmp_path / "etc").mkdir(parents=True)
    (tmp_path / "etc/nvpmodel.conf").write_text(ORIN_NX_CONF.read_text())
    if pmode is not None:
        (tmp_path / "var/lib/nvpmodel").mkdir(parents=True)
        (tmp_path / "var/lib/nvpmodel/status").write_text("pmode:%04d fmode:quiet" % pmode)
    return tmp_path


def running_mode(monkeypatch, name, mode_id, params=()):
    monkeypatch.setattr(edge_audit, "nvpmodel_query",
                        lambda root, conf, status: {"name": name, "id": mode_id, "params": list(params)})


NVPMODEL_CHECK = {"setting": "nvpmodel mode", "role": "edge_power", "kind": "nvpmodel", "mode": "MAXN_SUPER"}


def test_nvpmodel_running_the_desired_mode_is_ok(tmp_path, monkeypatch):
    running_mode(monkeypatch, "MAXN_SUPER", 0)
    result = evaluate(NVPMODEL_CHECK, str(nvpmodel_device(tmp_path, 0)))
    assert (result["state"], result["running"], result["persisted"]) == ("ok", "MAXN_SUPER (id 0)",
                                                                         "MAXN_SUPER (id 0)")


def test_nvpmodel_another_mode_is_drift_named_by_name_and_id(tmp_path, monkeypatch):
    running_mode(monkeypatch, "25W", 3)
    result = evaluate(NVPMODEL_CHECK, str(nvpmodel_device(tmp_path, 3)))
    assert result["state"] == "drifted"
    assert result["detail"] == "nvpmodel mode is 25W (id 3), desired MAXN_SUPER (id 0)"


def test_nvpmodel_recorded_for_the_boot_is_pending(tmp_path, monkeypatch):
    running_mode(monkeypatch, "25W", 3)
    result = evaluate(NVPMODEL_CHECK, str(nvpmodel_device(tmp_path, 0)))
    assert result["state"] == "pending-reboot" and "starts at the next boot (running 25W (id 3))" in result["detail"]
    waiting = {"param": "CPU_ONLINE", "arg": "CORE_7", "path": "/sys/devices/system/cpu/cpu7/online",
               "real": "0", "conf": "1"}
    running_mode(monkeypatch, "MAXN_SUPER", 0, [waiting])
    result = evaluate(NVPMODEL_CHECK, str(nvpmodel_device(tmp_path / "b", 0)))
    assert result["state"] == "pending-reboot" and "CPU_ONLINE start at the next boot" in result["detail"]


def test_nvpmodel_mode_the_device_does_not_have_is_drift_listing_its_modes(tmp_path, monkeypatch):
    running_mode(monkeypatch, "MAXN_SUPER", 0)
    result = evaluate(dict(NVPMODEL_CHECK, mode="MAXN"), str(nvpmodel_device(tmp_path, 0)))
    assert result["state"] == "drifted" and "has no power mode 'MAXN' (modes: MAXN_SUPER, 10W" in result["detail"]


def test_nvpmodel_without_conf_or_program_is_an_error_not_a_traceback(tmp_path, monkeypatch):
    assert evaluate(NVPMODEL_CHECK, str(tmp_path))["state"] == "error"
    # On a fixture root the program is never run: said so.
    result = evaluate(NVPMODEL_CHECK, str(nvpmodel_device(tmp_path / "c", 0)))
    assert result["state"] == "error" and "runs on the device root only" in result["detail"]


def test_a_new_edgetune_is_a_change_of_the_inputs(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS), " " + " ".join(ARGS))
    record(root, "edge_bootargs", [cmdline_check()], dict(INPUTS, code="c0de1"))
    results = audit_records(str(root), RECORD_DIR, {"edge_bootargs": {"enabled": True,
                                                                      "inputs": dict(INPUTS, code="c0de2")}})[0]
    applied = by_setting(results)["edge_bootargs applied state"]
    assert applied["state"] == "drifted" and "edgetune's code for this role" in applied["detail"]


# --------------------------------------------------------------------------
# jetson_clocks: pinned or not, read with `jetson_clocks --show` on the device
def show_program(tmp_path, pinned, emc_override=True):
    """A jetson_clocks that prints what r35/r36.4.3 print for an Orin NX (two CPUs, shortened)."""
    low = "1984000" if pinned else "729600"
    lines = ["SOC family:tegra234  Machine:NVIDIA Orin NX Developer Kit", "Online CPUs: 0-1"]
    lines += ["cpu%d: Online=1 Governor=schedutil MinFreq=%s MaxFreq=1984000 CurrentFreq=1984000 IdleStates: "
              "WFI=1 c7=1" % (n, low) for n in (0, 1)]
    lines.append("GPU MinFreq=%s MaxFreq=918000000 CurrentFreq=918000000" % ("918000000" if pinned else "306000000"))
    lines.append("EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=3199000000"
                 + (" FreqOverride=%d" % int(pinned) if emc_override else ""))
    lines.append("NV Power Mode: MAXN")
    program = tmp_path / "jetson_clocks"
    program.write_text("#!/bin/sh\n[ \"$1\" = --show ] || exit 2\ncat <<'END'\n%s\nEND\n" % "\n".join(lines))
    program.chmod(0o755)
    return str(program)


CLOCKS_CHECK = {"setting": "jetson_clocks", "role": "edge_power", "kind": "jetson_clocks", "desired": "pinned"}


def test_pinned_clocks_are_ok_and_unpinned_ones_drift_naming_each_clock(tmp_path):
    result = evaluate(dict(CLOCKS_CHECK, program=show_program(tmp_path, pinned=True)))
    assert (result["state"], result["running"], result["desired"]) == ("ok", "pinned", "pinned")
    (tmp_path / "b").mkdir()
    result = evaluate(dict(CLOCKS_CHECK, program=show_program(tmp_path / "b", pinned=False)))
    assert result["state"] == "drifted" and result["running"] == "restored"
    assert result["detail"] == ("clocks not pinned: cpu0: MinFreq=729600 MaxFreq=1984000; cpu1: MinFreq=729600 "
                                "MaxFreq=1984000; GPU MinFreq=306000000 MaxFreq=918000000; EMC FreqOverride=0")


def test_clocks_pinned_where_the_intent_restores_them_is_drift(tmp_path):
    result = evaluate(dict(CLOCKS_CHECK, desired="restored", program=show_program(tmp_path, pinned=True)))
    assert result["state"] == "drifted" and "pinned by jetson_clocks" in result["detail"]
    (tmp_path / "b").mkdir()
    result = evaluate(dict(CLOCKS_CHECK, desired="restored", program=show_program(tmp_path / "b", pinned=False)))
    assert result["state"] == "ok"


def test_clocks_without_the_program_or_off_the_device_root_are_an_error(tmp_path):
    result = evaluate(dict(CLOCKS_CHECK, program=show_program(tmp_path, pinned=True)), str(tmp_path))
    assert result["state"] == "error" and "runs on the device root only" in result["detail"]
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'cannot open /sys/kernel/debug' >&2\nexit 1\n")
    failing.chmod(0o755)
    result = evaluate(dict(CLOCKS_CHECK, program=str(failing)))
    assert result["state"] == "error" and "--show failed (rc 1): cannot open /sys/kernel/debug" in result["detail"]


# --------------------------------------------------------------------------
# netqos: the live qdiscs and classifier, compared by the role's loader with the recorded settings
FAKE_LOADER = r'''
import json, sys
args = sys.argv[1:]
assert args[:5] == ["check", "--config", "-", "--source", "/share/edge_classifier.c"] and args[5] == "--json", args
config = json.load(sys.stdin)
names = [args[i + 1] for i, a in enumerate(args) if a == "--interface"]
# As the real loader: a rate that differs from the live class is a difference.
live_rate = "100mbit"
report = {}
for name in names:
    wanted = dict(config, **config["interfaces"][name]).get("rate")
    diffs = [] if wanted == live_rate else ["class 1:1 rate is %s, not %s" % (live_rate, wanted)]
    report[name] = {"in_sync": not diffs, "differences": diffs, "foreign_root": False, "program": None}
print(json.dumps({"in_sync": all(r["in_sync"] for r in report.values()), "interfaces": report}))
sys.exit(0 if all(r["in_sync"] for r in report.values()) else 1)
'''


def netqos_check(tmp_path, rate="100mbit", loader=FAKE_LOADER):
    path = tmp_path / "edgetune-netqos"
    path.write_text(loader)
    return {"setting": "network priority", "role": "edge_netqos", "kind": "netqos", "interfaces": ["eth0"],
            "config": {"managed_by": "edgetune edge_netqos", "version": 1, "ports": [8470],
                       "interfaces": {"eth0": {"rate": rate}}},
            "loader": str(path), "python": sys.executable, "source": "/share/edge_classifier.c"}


def test_netqos_in_sync_is_ok_and_a_difference_is_drift_naming_it(tmp_path):
    result = evaluate(netqos_check(tmp_path))
    assert (result["state"], result["running"]) == ("ok", "eth0 in sync")
    assert result["desired"] == "classifier and HTB classes on eth0"
    # The recorded settings are the desired state: a rate the device's config file no longer
    # names does not matter, the one the check carries does.
    result = evaluate(netqos_check(tmp_path, rate="900mbit"))
    assert result["state"] == "drifted" and result["running"] == "eth0 differs"
    assert result["detail"] == "eth0: class 1:1 rate is 100mbit, not 900mbit"


def test_netqos_loader_failures_and_other_roots_are_an_error(tmp_path):
    failing = "import sys\nsys.stderr.write('edgetune-netqos: error: no device eth0\\n')\nsys.exit(2)\n"
    result = evaluate(netqos_check(tmp_path, loader=failing))
    assert result["state"] == "error" and "check failed (rc 2): edgetune-netqos: error: no device eth0" in \
        result["detail"]
    result = evaluate(dict(netqos_check(tmp_path), python=str(tmp_path / "no-python")))
    assert result["state"] == "error" and "cannot run the loader" in result["detail"]
    result = evaluate(netqos_check(tmp_path), str(tmp_path))
    assert result["state"] == "error" and "device root only" in result["detail"]


# --------------------------------------------------------------------------
# A converge skips what is current: the records read in the apply's first execution, decided by the plan.

def test_applied_state_says_which_records_hold_now(tmp_path):
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import applied_state
    root = device(tmp_path, " " + " ".join(ARGS), " " + " ".join(ARGS))
    assert applied_state(str(root), RECORD_DIR) == {}                   # never applied: every role runs
    record(root, "edge_bootargs", [cmdline_check()])
    record(root, "edge_cpu", [cmdline_check(args=["nohz_full=1-3"], setting="other args")])
    (root / RECORD_DIR.lstrip("/") / "edge_power.json").write_text("{not json")
    state = applied_state(str(root), RECORD_DIR)
    assert [r["state"] for r in state["edge_bootargs"].pop("results")] == ["ok"]
    assert state["edge_bootargs"] == {"inputs": INPUTS, "holds": True, "not_holding": []}
    assert state["edge_cpu"]["holds"] is False and state["edge_cpu"]["not_holding"] == ["other args: drifted"]
    assert "edge_power.json" in state["edge_power"]["error"]            # unreadable: the role runs


def test_the_plan_skips_only_roles_that_are_current_and_hold():
    from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_plan import converge_part
    audit_part = {"roles": {role: {"enabled": True, "inputs": INPUTS}
                            for role in ("edge_bootargs", "edge_cpu", "edge_power", "edge_runtime", "edge_boot")}}
    audit_part["roles"]["edge_pcie_qos"] = {"enabled": False, "inputs": INPUTS}
    changed = dict(INPUTS, code="another")
    applied = {"edge_bootargs": {"inputs": INPUTS, "holds": True},
               "edge_cpu": {"inputs": INPUTS, "holds": False, "not_holding": ["IRQ affinity: drifted"]},
               "edge_power": {"inputs": changed, "holds": True},
               "edge_runtime": {"inputs": INPUTS, "holds": True,
                                "artifacts": {"runtime": "a" * 64, "engine": "b" * 64}}}
    today = [{"kind": "runtime", "sha256": "a" * 64}, {"kind": "engine", "sha256": "b" * 64}]
    found = converge_part(audit_part, applied, artifacts=today)
    assert found["skip"] == {"edge_bootargs": "current and holds", "edge_runtime": "current and holds"}
    assert found["run"] == {
        "edge_cpu": "drifted: IRQ affinity: drifted",
        "edge_power": "changed since the last apply: edgetune's code for this role (its role files or the modules)",
        "edge_boot": "never applied here"}
    # `auto` found a new build on the controller: no input changed, the release did.
    newer = [{"kind": "runtime", "sha256": "c" * 64}, {"kind": "engine", "sha256": "b" * 64}]
    assert converge_part(audit_part, applied, artifacts=newer)["run"]["edge_runtime"] == \
        "changed since the last apply: a new runtime artifact (sha256 cccccccccccc, serving aaaaaaaaaaaa)"
    assert converge_part(audit_part, applied)["run"]["edge_runtime"] == \
        "changed since the last apply: the artifacts were not resolved on the controller in this run"
    assert converge_part(audit_part, applied, full=True, artifacts=today)["skip"] == {}
    assert converge_part(audit_part, None)["skip"] == {}               # not an apply (the audit, edgetune plan)


def test_the_release_an_apply_deploys_comes_from_the_controller_or_the_inventory():
    from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_plan import served_artifacts
    resolved = [{"kind": "runtime", "path": "/a/r.tar.gz", "sha256": "a" * 64},
                {"kind": "engine", "path": "/a/e.tar.gz", "sha256": "b" * 64}]
    assert served_artifacts({"edge_runtime_artifact_source": "controller"}, resolved) == [
        {"kind": "runtime", "sha256": "a" * 64}, {"kind": "engine", "sha256": "b" * 64}]
    assert served_artifacts({}, None) is None
    assert served_artifacts({"edge_runtime_artifact_source": "url", "edge_runtime_runtime_sha256": "C" * 64,
                             "edge_runtime_engine_sha256": "d" * 64}, None) == [
        {"kind": "runtime", "sha256": "c" * 64}, {"kind": "engine", "sha256": "d" * 64}]
