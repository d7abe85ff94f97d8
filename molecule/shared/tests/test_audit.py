"""Drift audit on a converged twin: ok, then each kind of drift caught and classified."""
import json
import os
import re
import socket
import subprocess

import pytest
from conftest import run_site, same_but_argument_order


def audit(host, *extra):
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    argv = ["edgetune", "audit", "--json", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            "-l", host.backend.host, *extra]
    result = subprocess.run(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            check=False)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["hosts"]


def remove_first_occurrence(host, text, path):
    """Edit the boot file as a person would: the default entry only (the first
    occurrence), not the fallback entry that may hold the same argument."""
    host.run_expect([0], "sed -i '0,/%s/s///' %s" % (text.replace("/", "\\/"), path))


def states(hosts, name):
    return {r["setting"]: r["state"] for r in hosts[name]["results"]}


def results(hosts, name):
    return {r["setting"]: r for r in hosts[name]["results"]}


def test_converged_twin_is_clean(host):
    code, hosts = audit(host)
    assert code == 0, hosts
    assert hosts[host.backend.host]["status"] == "ok"
    assert set(states(hosts, host.backend.host).values()) <= {"ok", "unsupported"}


def test_converged_twin_publishes_the_cpu_cgroups_and_runtime_checks(host):
    found = results(audit(host)[1], host.backend.host)
    for setting in ("IRQ affinity", "default IRQ affinity", "unbound workqueue cpumask", "edgetune-irq-affinity unit",
                    "sysctl kernel.sched_rt_runtime_us", "sysctl file /etc/sysctl.d/60-edgetune-cpu.conf",
                    "ai-infer.slice unit", "ai-infer.slice CPUWeight", "ai-infer.slice CPUQuota",
                    "ai-infer.slice MemoryMax", "runtime unit", "runtime environment"):
        assert found[setting]["state"] == "ok", found.get(setting)
    if host.file("/sys/fs/cgroup/cpu").exists:  # cgroup v1 or hybrid: the v2-only settings are said so
        unsupported = [s for s in found if s.startswith("ai-infer.slice ") and "AllowedCPUs" in s]
        assert unsupported and found[unsupported[0]]["state"] == "unsupported"
        assert "NOT enforced" in found[unsupported[0]]["detail"]


def test_drift_by_hand_is_classified_and_one_site_run_fixes_it(host, expected):
    """A governor changed, a movable IRQ moved onto the inference CPUs, the runtime's and the
    slice's units edited: each drifted, named; the ordinary site.yml run repairs them all."""
    name = host.backend.host
    before = results(audit(host)[1], name)
    governor = next(s for s, r in sorted(before.items()) if s.startswith("cpufreq ") and s.endswith(" governor"))
    policy = governor.split()[1]
    gov_path = "/sys/devices/system/cpu/cpufreq/%s/scaling_governor" % policy
    other = next(g for g in host.file("/sys/devices/system/cpu/cpufreq/%s/scaling_available_governors" % policy)
                 .content_string.split() if g != before[governor]["desired"])
    # A movable IRQ: one the twin does not make the kernel refuse (its own record, not the role's).
    unmovable = set(host.file("/run/edgetune-twin/unmovable-irqs").content_string.split())
    irq = max((n for n in host.file("/proc/irq").listdir() if n.isdigit() and n not in unmovable), key=int)
    runtime_unit, slice_unit = "/etc/systemd/system/edgetune-runtime.service", "/etc/systemd/system/ai-infer.slice"
    originals = {path: host.file(path).content_string for path in (runtime_unit, slice_unit)}

    host.run_expect([0], "echo %s > %s" % (other, gov_path))
    host.run_expect([0], "echo %s > /proc/irq/%s/smp_affinity_list" % (expected["isolated"], irq))
    host.run_expect([0], "sed -i 's/^Restart=.*/Restart=no/' %s" % runtime_unit)
    host.run_expect([0], "sed -i 's/^CPUWeight=.*/CPUWeight=100/' %s" % slice_unit)
    try:
        code, hosts = audit(host)
        found = results(hosts, name)
        assert code == 1 and hosts[name]["status"] == "drifted"
        assert found[governor]["state"] == "drifted" and found[governor]["running"] == other
        assert found["IRQ affinity"]["state"] == "drifted"
        assert "IRQ %s " % irq in found["IRQ affinity"]["detail"]
        assert "reaches inference CPUs %s" % expected["isolated"] in found["IRQ affinity"]["detail"]
        assert found["runtime unit"]["state"] == "drifted"
        assert found["ai-infer.slice unit"]["state"] == "drifted"
        # Nothing else was touched, so nothing else is reported.
        drifted = {s for s, r in found.items() if r["state"] == "drifted"}
        assert drifted == {governor, "IRQ affinity", "runtime unit", "ai-infer.slice unit"}, drifted
    finally:
        result = run_site(host)  # the fix for drift is the ordinary run
        assert "failed=0" in result.stdout, result.stdout[-3000:]
    code, hosts = audit(host)
    assert code == 0 and hosts[name]["status"] == "ok", [r for r in hosts[name]["results"] if r["state"] != "ok"]
    assert host.file(gov_path).content_string.strip() == before[governor]["desired"]
    assert host.file("/proc/irq/%s/smp_affinity_list" % irq).content_string.strip() != expected["isolated"]
    for path, content in originals.items():
        assert host.file(path).content_string == content


def test_slice_value_changed_in_the_live_cgroup_is_drift_and_site_puts_it_back(host):
    """The slice's CPU weight written by hand into its cgroup (the unit file untouched): drift,
    reported by check mode, and the ordinary run has systemd write the unit's value again."""
    name = host.backend.host
    record = json.loads(host.file("/etc/edgetune/applied/edge_cgroups.json").content_string)
    weight = next(c for c in record["checks"] if c["setting"] == "ai-infer.slice CPUWeight")
    path, desired = weight["path"], weight["desired"]
    cgroup_only = ("--tags", "edge_facts,edge_cgroups")
    host.run_expect([0], "echo 2 > %s" % path)
    try:
        found = results(audit(host)[1], name)["ai-infer.slice CPUWeight"]
        assert found["state"] == "drifted" and found["running"] == "2", found
        check = run_site(host, "--check", *cgroup_only)
        assert re.search(r"Have systemd write the slice's cgroup values again .*\n(changed|ok): \[%s\]" % name,
                         check.stdout) and "changed=1 " in check.stdout, check.stdout[-3000:]
        assert host.file(path).content_string.strip() == "2"  # check mode wrote nothing
    finally:
        result = run_site(host, *cgroup_only)
        assert "failed=0" in result.stdout, result.stdout[-3000:]
    assert host.file(path).content_string.strip() == desired
    assert results(audit(host)[1], name)["ai-infer.slice CPUWeight"]["state"] == "ok"


def test_boot_argument_removed_from_boot_file_is_drift(host, expected):
    path = expected["bootloader"]
    original = host.file(path).content_string
    first = expected["bootargs"][1]
    remove_first_occurrence(host, " " + first, path)
    try:
        code, hosts = audit(host)
        assert code == 1
        assert states(hosts, host.backend.host)["kernel boot arguments"] == "drifted"
        assert first in next(r["detail"] for r in hosts[host.backend.host]["results"]
                             if r["setting"] == "kernel boot arguments")
    finally:
        result = run_site(host)  # the fix for drift is the ordinary run
        assert "failed=0" in result.stdout
    assert same_but_argument_order(host.file(path).content_string, original)


def test_pending_reboot_is_not_drift(host):
    # Only the boot arguments change here: the runs are limited to them.
    bootargs_only = ("--tags", "edge_facts,edge_bootargs")
    run_site(host, *bootargs_only, "-e", "edge_reboot_policy=never", "-e", '{"edge_bootargs_extra": ["nosoftlockup"]}')
    try:
        code, hosts = audit(host, "-e", '{"edge_bootargs_extra": ["nosoftlockup"]}')
        assert states(hosts, host.backend.host)["kernel boot arguments"] == "pending-reboot"
        assert hosts[host.backend.host]["status"] == "pending-reboot"
        assert code == 0
    finally:
        run_site(host, *bootargs_only)
    assert audit(host)[0] == 0


def test_inventory_changed_since_the_apply_is_drift_naming_the_variable(host):
    """The records hold what the last apply was made of: an inventory value changed since is named."""
    name = host.backend.host
    applied = json.loads(host.file("/etc/edgetune/applied/edge_cgroups.json").content_string)
    weight = applied["inputs"]["variables"]["edge_cgroups_cpu_weight"]
    code, hosts = audit(host, "-e", "edge_cgroups_cpu_weight=%d" % (weight + 7))
    found = results(hosts, name)
    assert code == 1 and hosts[name]["status"] == "drifted"
    assert found["edge_cgroups applied state"]["state"] == "drifted"
    assert "edge_cgroups_cpu_weight %d -> %d" % (weight, weight + 7) in found["edge_cgroups applied state"]["detail"]
    # Only that role's desired state changed; the device still matches what was applied.
    drifted = {s for s, r in found.items() if r["state"] == "drifted"}
    assert drifted == {"edge_cgroups applied state"}, drifted


def test_runtime_unit_edited_by_hand_is_drift_even_in_a_comment(host):
    """The runtime's checks are the deploy's, recorded: the unit is not read back to decide what it should be."""
    unit = "/etc/systemd/system/edgetune-runtime.service"
    original = host.file(unit).content_string
    host.run_expect([0], "cp -p {0} /root/runtime-unit.saved && sed -i '0,/^# /s/^# /# edited by hand: /' {0}"
                    .format(unit))
    try:
        assert host.file(unit).content_string != original
        found = results(audit(host)[1], host.backend.host)
        assert found["runtime unit"]["state"] == "drifted", found["runtime unit"]
    finally:
        host.run_expect([0], "mv /root/runtime-unit.saved %s" % unit)
    assert results(audit(host)[1], host.backend.host)["runtime unit"]["state"] == "ok"


def test_nvpmodel_mode_switched_by_hand_is_drift_and_site_switches_it_back(host):
    if not host.file("/etc/nvpmodel.conf").exists:
        pytest.skip("not a Jetson: no nvpmodel")
    name = host.backend.host
    setting = results(audit(host)[1], name)["nvpmodel mode"]
    assert setting["state"] == "ok", setting
    desired_id = int(setting["running"].rsplit("id ", 1)[1].rstrip(")"))
    modes = [int(m) for m in re.findall(r"POWER_MODEL ID=(\d+)", host.file("/etc/nvpmodel.conf").content_string)]
    # A mode nvpmodel switches to at once (the others ask to reboot and switch nothing when told no).
    other = next((m for m in modes if m != desired_id and host.run("nvpmodel -m %d < /dev/null" % m).rc == 0), None)
    try:
        assert other is not None, "no mode of /etc/nvpmodel.conf switches without a reboot"
        found = results(audit(host)[1], name)["nvpmodel mode"]
        assert found["state"] == "drifted", found
        assert "(id %d), desired %s (id %d)" % (other, setting["desired"], desired_id) in found["detail"]
    finally:
        result = run_site(host)
        assert "failed=0" in result.stdout, result.stdout[-3000:]
    assert results(audit(host)[1], name)["nvpmodel mode"]["state"] == "ok"


def test_clocks_restored_by_hand_are_drift_and_site_pins_them_again(host):
    if not host.file("/usr/bin/jetson_clocks").exists:
        pytest.skip("not a Jetson: no jetson_clocks")
    name = host.backend.host
    setting = results(audit(host)[1], name)["jetson_clocks"]
    assert (setting["state"], setting["running"]) == ("ok", setting["desired"]), setting
    if setting["desired"] != "pinned":
        pytest.skip("the inventory leaves the clocks restored")
    power_only = ("--tags", "edge_facts,edge_power")
    host.run_expect([0], "jetson_clocks --restore /var/lib/edgetune/jetson_clocks.conf")
    try:
        found = results(audit(host)[1], name)["jetson_clocks"]
        assert found["state"] == "drifted" and found["running"] == "restored", found
        assert re.search(r"clocks not pinned: cpu\d+: MinFreq=\d+ MaxFreq=\d+", found["detail"]), found
    finally:
        result = run_site(host, *power_only)
        assert "failed=0" in result.stdout, result.stdout[-3000:]
    assert results(audit(host)[1], name)["jetson_clocks"]["state"] == "ok"


MOVE_TC1_BACK_TO_VC0 = """
import sys
sys.path.insert(0, "/usr/local/lib/edgetune/module_utils")
import edge_pcie
path = "/sys/bus/pci/devices/%s/config"
vc = [v for v in edge_pcie.parse(edge_pcie.read_config(path))["vc_capabilities"] if v["type"] == "VC"][0]
vc0, vc1 = vc["vcs"][0], vc["vcs"][1]
edge_pcie.write_register(path, vc1["control_offset"], vc1["control_register"] & ~0x800000ff)
edge_pcie.write_register(path, vc0["control_offset"], vc0["control_register"] | 0x02)
"""


def test_pcie_mapping_moved_back_by_hand_is_drift_and_the_boot_unit_maps_it_again(host):
    name = host.backend.host
    found = [r for r in audit(host)[1][name]["results"] if r["role"] == "edge_pcie_qos" and
             r["setting"].startswith("PCIe ")]
    if not found or found[0]["state"] == "unsupported":
        pytest.skip("no PCIe link with an extended virtual channel on this twin")
    setting = found[0]
    assert setting["state"] == "ok", setting
    device = next(label.split()[0] for label in setting["running"] if label.endswith("(device)"))
    host.run_expect([0], "python3 -c '%s'" % (MOVE_TC1_BACK_TO_VC0 % device))
    drifted = results(audit(host)[1], name)[setting["setting"]]
    assert drifted["state"] == "drifted" and "%s (device)" % device in drifted["detail"], drifted
    assert "(upstream port)" not in drifted["detail"]
    host.run_expect([0], "systemctl restart edgetune-pcie-vc.service")  # what every boot runs
    assert results(audit(host)[1], name)[setting["setting"]]["state"] == "ok"


def test_unreachable_device_is_reported_never_clean(host, tmp_path):
    # A device that does not answer SSH, as in a real fleet: a closed port on loopback.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    ghost = tmp_path / "ghost.yml"
    ghost.write_text("all:\n  hosts:\n    ghost-twin-that-does-not-exist:\n"
                     "      ansible_connection: ssh\n      ansible_host: 127.0.0.1\n"
                     "      ansible_port: %d\n" % closed_port)
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    result = subprocess.run(["edgetune", "audit", "--json", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                             "-i", str(ghost)], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, check=False)
    hosts = json.loads(result.stdout)["hosts"]
    assert result.returncode == 1
    assert hosts["ghost-twin-that-does-not-exist"]["status"] == "unreachable"
    assert hosts[host.backend.host]["status"] == "ok"


def test_on_device_timer_writes_the_textfile(host, expected):
    assert host.service("edgetune-audit.timer").is_enabled
    textfile = "/var/lib/prometheus/node-exporter/edgetune.prom"
    host.run_expect([0], "systemctl start edgetune-audit.service")
    assert 'setting="kernel boot arguments",role="edge_bootargs",state="ok"} 1' in host.file(textfile).content_string
    path, first = expected["bootloader"], expected["bootargs"][1]
    original = host.file(path).content_string
    remove_first_occurrence(host, " " + first, path)
    try:
        host.run_expect([0], "systemctl start edgetune-audit.service")  # drift found is not a unit failure
        assert 'setting="kernel boot arguments",role="edge_bootargs",state="drifted"} 1' in \
            host.file(textfile).content_string
    finally:
        run_site(host)
    assert same_but_argument_order(host.file(path).content_string, original)
