"""edge_audit: each kind of drift is classified right, and nothing is written."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.edge_audit import audit, evaluate, prometheus_text

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
    assert "nohz_full=4-7" in result["detail"]


def test_argument_removed_from_boot_file_is_drift_even_while_running(tmp_path):
    root = device(tmp_path, " " + ARGS[0], " " + " ".join(ARGS))
    result = evaluate(cmdline_check(), str(root))
    assert result["state"] == "drifted"
    assert "nohz_full=4-7" in result["detail"] and "isolcpus" not in result["detail"]


def test_argument_the_intent_dropped_is_drift(tmp_path):
    root = device(tmp_path, " " + " ".join(ARGS) + " nosoftlockup", " " + " ".join(ARGS) + " nosoftlockup")
    state = tmp_path / "etc/edgetune/bootargs.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"args": ARGS + ["nosoftlockup"]}))
    assert evaluate(cmdline_check(), str(root))["state"] == "ok"  # without the record: a vendor arg
    assert evaluate(cmdline_check(state_file="/etc/edgetune/bootargs.json"), str(root))["state"] == "drifted"


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


def test_prometheus_textfile_lines():
    text = prometheus_text('kiosk"1', [{"setting": "bootargs", "role": "edge_bootargs", "state": "drifted"}])
    assert 'edgetune_drift{host="kiosk\\"1",setting="bootargs",role="edge_bootargs",state="drifted"} 1' in text
    assert text.startswith("# HELP edgetune_drift")


@pytest.mark.controller
def test_on_device_command_writes_the_textfile_and_exits_1_on_drift(tmp_path):
    """The timer's command line, with module_utils installed beside the script as the role does."""
    root = device(tmp_path / "dev", " " + ARGS[0], " " + " ".join(ARGS))
    install = tmp_path / "lib"
    (install / "ansible/module_utils").mkdir(parents=True)
    (install / "ansible/__init__.py").write_text("")
    (install / "ansible/module_utils/__init__.py").write_text("")
    repo = Path(__file__).resolve().parents[2]
    for name in ("edge_audit", "edge_bootfile", "edge_cmdline", "edge_board", "edge_cpulist", "edge_fileio"):
        os.symlink(repo / "module_utils" / (name + ".py"), install / "ansible/module_utils" / (name + ".py"))
    os.symlink(repo / "library/edge_audit.py", install / "edge_audit.py")
    checks = tmp_path / "checks.json"
    checks.write_text(json.dumps({"checks": [cmdline_check()]}))
    prom = tmp_path / "edgetune.prom"
    run = subprocess.run([sys.executable, str(install / "edge_audit.py"), "--checks", str(checks),
                          "--prometheus", str(prom), "--root", str(root)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    assert run.returncode == 1, run.stderr
    assert "drifted" in run.stdout
    assert 'state="drifted"} 1' in prom.read_text()
