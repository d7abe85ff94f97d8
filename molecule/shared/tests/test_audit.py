"""Drift audit on a converged twin: ok, then each kind of drift caught, classified and repaired."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import recap, run_site, run_site_with_summary, same_but_argument_order


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
    for setting in ("IRQ affinity", "default IRQ affinity", "unbound workqueue cpumask", "edgetune-boot unit",
                    "sysctl kernel.sched_rt_runtime_us", "sysctl file /etc/sysctl.d/60-edgetune-cpu.conf",
                    "ai-infer.slice unit", "ai-infer.slice CPUWeight", "ai-infer.slice CPUQuota",
                    "ai-infer.slice MemoryMax", "runtime unit", "runtime environment"):
        assert found[setting]["state"] == "ok", found.get(setting)
    if host.file("/sys/fs/cgroup/cpu").exists:  # cgroup v1 or hybrid: the v2-only settings are said so
        unsupported = [s for s in found if s.startswith("ai-infer.slice ") and "AllowedCPUs" in s]
        assert unsupported and found[unsupported[0]]["state"] == "unsupported"
        assert "NOT enforced" in found[unsupported[0]]["detail"]


def record_check(host, role, setting):
    record = json.loads(host.file("/etc/edgetune/applied/%s.json" % role).content_string)
    return next(c for c in record["checks"] if c["setting"] == setting)


def other_value(host, listing, desired):
    return next(v for v in host.file(listing).content_string.split() if v != desired)


def drift_every_kind(host, expected, found):
    """Change by hand one setting of every kind the audit knows, as a person at the device would.
    Returns, per kind: the audit setting it drifts, the task of the ordinary run that puts it
    back, and (path, desired content) to read afterwards where a file holds the value."""
    drifts = {}

    def drift(kind, setting, task, command, readback=None, detail=None):
        host.run_expect([0], command)
        drifts[kind] = {"setting": setting, "task": task, "readback": readback, "detail": detail}

    governor = next(s for s in sorted(found) if s.startswith("cpufreq ") and s.endswith(" governor"))
    path = "/sys/devices/system/cpu/cpufreq/%s/scaling_governor" % governor.split()[1]
    other = other_value(host, path.replace("scaling_governor", "scaling_available_governors"),
                        found[governor]["desired"])
    drift("cpufreq governor", governor, "edge_power : Set the cpufreq and devfreq governors and limits",
          "echo %s > %s" % (other, path), (path, found[governor]["desired"]))
    devfreq = next((s for s in sorted(found) if s.startswith("devfreq ") and s.endswith(" governor")), None)
    if devfreq:
        path = "/sys/class/devfreq/%s/governor" % devfreq.split()[1]
        other = other_value(host, path.replace("/governor", "/available_governors"), found[devfreq]["desired"])
        drift("devfreq governor", devfreq, "edge_power : Set the cpufreq and devfreq governors and limits",
              "echo %s > %s" % (other, path), (path, found[devfreq]["desired"]))
    # A movable IRQ: one the twin does not make the kernel refuse (its own record, not the role's).
    unmovable = set(host.file("/run/edgetune-twin/unmovable-irqs").content_string.split())
    irq = max((n for n in host.file("/proc/irq").listdir() if n.isdigit() and n not in unmovable), key=int)
    moves = "edge_cpu : Move the movable IRQs and the unbound workqueues to the housekeeping CPUs"
    drift("IRQ affinity", "IRQ affinity", moves,
          "echo %s > /proc/irq/%s/smp_affinity_list" % (expected["isolated"], irq), detail="IRQ %s " % irq)
    cpu_count = int(expected["clusters"][-1].split("-")[-1]) + 1
    drift("workqueue mask", "unbound workqueue cpumask", moves,
          "echo %x > /sys/devices/virtual/workqueue/cpumask" % ((1 << cpu_count) - 1))  # every CPU
    drift("sysctl", "sysctl kernel.timer_migration", "edge_cpu : Set and persist the kernel's housekeeping settings",
          "echo 1 > /proc/sys/kernel/timer_migration", ("/proc/sys/kernel/timer_migration", "0"))
    remove_first_occurrence(host, " " + expected["bootargs"][1], expected["bootloader"])
    drifts["boot arguments"] = {"setting": "kernel boot arguments", "readback": None,
                                "task": "edge_bootargs : Write the boot arguments into the bootloader file",
                                "detail": "to add: %s" % expected["bootargs"][1]}
    weight = record_check(host, "edge_cgroups", "ai-infer.slice CPUWeight")
    drift("slice live cgroup value", "ai-infer.slice CPUWeight",
          "edge_cgroups : Have systemd write the slice's cgroup values again (changed by hand)",
          "echo 2 > %s" % weight["path"], (weight["path"], str(weight["desired"])))
    dropin = record_check(host, "edge_cgroups", "system.slice housekeeping drop-in")
    drift("slice drop-in", "system.slice housekeeping drop-in",
          "edge_cgroups : Keep the system's slices on the housekeeping CPUs",
          "echo '# edited by hand' >> %s" % dropin["path"])
    # A comment of the runtime unit, its scheduling note where it has one: the audit compares the
    # unit with the deploy's record, never with itself, so editing a comment is drift too.
    unit = "/etc/systemd/system/edgetune-runtime.service"
    drift("runtime unit", "runtime unit", "edge_runtime : Write the service unit",
          "if grep -q '^# SCHED_OTHER:' {0}; then sed -i 's/^# SCHED_OTHER:/# SCHED_FIFO:/' {0};"
          " else sed -i '0,/^# /s/^# /# edited by hand: /' {0}; fi".format(unit))
    # The release serving: its program changed on disk (replaced, as a careless copy would) and the
    # service stopped. edge_release unpacks the release again; the service restarts on it.
    drift("runtime release files", "runtime release", "edge_runtime : Install the release and switch to it",
          "cd /opt/edgetune/current/runtime"
          " && entry=$(python3 -c 'import json; print(json.load(open(\"MANIFEST.json\"))[\"entry\"])')"
          " && cp \"$entry\" /tmp/edited && echo edited >> /tmp/edited && mv /tmp/edited \"$entry\"",
          detail="was changed")
    drift("runtime service", "runtime release", "edge_runtime : Restart the runtime on the new release or settings",
          "systemctl stop edgetune-runtime.service", detail="edgetune-runtime.service is inactive, not active")
    # The files of the boot program's unit, the audit timer and the device package, a comment added
    # by hand (harmless to systemd and Python, still not what the roles wrote).
    for kind, role, setting, task in (
            ("boot unit", "edge_boot", "edgetune-boot unit", "edge_boot : Install the edgetune-boot unit"),
            ("audit timer", "edge_audit_timer", "audit timer unit",
             "edge_audit_timer : Install the audit service and timer"),
            ("device package", "edge_package", None,
             "edge_package : Install the device programs and the module utilities they import")):
        record = host.file("/etc/edgetune/applied/%s.json" % role)
        if not record.exists:  # the role is off for this device
            continue
        check = next(c for c in json.loads(record.content_string)["checks"] if c["kind"] == "file" and (
            c["setting"] == setting if setting else c["path"].endswith("/edge_cpulist.py")))
        drift(kind, check["setting"], task, "echo '# edited by hand' >> %s" % check["path"])
    if "nvpmodel mode" in found:
        desired_id = int(found["nvpmodel mode"]["running"].rsplit("id ", 1)[1].rstrip(")"))
        modes = [int(m) for m in re.findall(r"POWER_MODEL ID=(\d+)", host.file("/etc/nvpmodel.conf").content_string)]
        # A mode nvpmodel switches to at once (the others ask to reboot and switch nothing when told no).
        other = next((m for m in modes if m != desired_id and host.run("nvpmodel -m %d < /dev/null" % m).rc == 0),
                     None)
        assert other is not None, "no mode of /etc/nvpmodel.conf switches without a reboot"
        drifts["nvpmodel mode"] = {"setting": "nvpmodel mode", "readback": None,
                                   "task": "edge_power : Select the nvpmodel power mode by name",
                                   "detail": "(id %d), desired %s (id %d)" % (other, found["nvpmodel mode"]["desired"],
                                                                              desired_id)}
    if found.get("jetson_clocks", {}).get("desired") == "pinned":
        drift("jetson_clocks", "jetson_clocks", "edge_power : Pin the clocks with jetson_clocks, or restore them",
              "jetson_clocks --restore /var/lib/edgetune/jetson_clocks.conf")
    pcie = next((s for s, r in sorted(found.items()) if s.startswith("PCIe class ")
                 and r["state"] != "unsupported"), None)
    if pcie:
        device = next(label.split()[0] for label in found[pcie]["running"] if label.endswith("(device)"))
        drift("PCIe mapping", pcie, "edge_pcie_qos : Map the traffic classes on each link, upstream port first",
              "python3 -c '%s'" % (MOVE_TC1_BACK_TO_VC0 % device), detail="%s (device)" % device)
    classifier = found.get("network priority")
    if classifier and classifier["state"] != "unsupported":
        # The inference class throttled by hand with tc, as a person trying things at the device would.
        drift("network classifier", "network priority",
              "edge_netqos : Set the classifier and the HTB classes on the interfaces",
              "tc class change dev eth0 parent 1:1 classid 1:10 htb rate 1mbit ceil 1mbit prio 0",
              detail="eth0: class 1:10 rate is 1mbit")
    return drifts


@pytest.mark.one_per_family
def test_every_kind_of_drift_is_reported_by_the_audit_and_check_mode_and_one_site_run_repairs_it(host, expected):
    """One setting of every kind changed by hand at once: the audit names each (and nothing
    else outside their roles), check mode reports the task that puts each back and writes
    nothing, one ordinary site.yml run repairs them all, the audit is clean after it and the
    run after that changes nothing."""
    name = host.backend.host
    before = results(audit(host)[1], name)
    assert {r["state"] for r in before.values()} <= {"ok", "unsupported"}, before
    boot_file = host.file(expected["bootloader"]).content_string
    try:
        drifts = drift_every_kind(host, expected, before)
        drifted_boot_file = host.file(expected["bootloader"]).content_string
        code, hosts = audit(host)
        found = results(hosts, name)
        assert code == 1 and hosts[name]["status"] == "drifted", hosts[name]
        for kind, drift in drifts.items():
            assert found[drift["setting"]]["state"] == "drifted", (kind, found[drift["setting"]])
            assert (drift["detail"] or "") in found[drift["setting"]]["detail"], (kind, found[drift["setting"]])
        # A power mode switch or restored clocks also move the frequency limits edge_power owns.
        others = {s for s, r in found.items() if r["state"] == "drifted"} - {d["setting"] for d in drifts.values()}
        assert all(found[s]["role"] == "edge_power" for s in others), others

        written = {path: host.file(path).content_string for path, _ in
                   (d["readback"] for d in drifts.values() if d["readback"])}
        check, summary = run_site_with_summary(host, "--check", "--diff")
        assert recap(check.stdout, name)["failed"] == 0, check.stdout[-3000:]
        reported = {task.split(".", 2)[-1] for task in summary["changed"]}
        missing = {kind: d["task"] for kind, d in drifts.items() if d["task"] not in reported}
        assert not missing, (missing, sorted(reported))
        # Check mode wrote nothing.
        assert host.file(expected["bootloader"]).content_string == drifted_boot_file
        assert {path: host.file(path).content_string for path in written} == written
    finally:
        repair = run_site(host)  # the fix for drift is the ordinary run
        assert recap(repair.stdout, name)["failed"] == 0, repair.stdout[-3000:]
    code, hosts = audit(host)
    assert code == 0 and hosts[name]["status"] == "ok", [r for r in hosts[name]["results"] if r["state"] != "ok"]
    for drift in drifts.values():
        if drift["readback"]:
            path, desired = drift["readback"]
            assert host.file(path).content_string.strip() == desired, path
    assert same_but_argument_order(host.file(expected["bootloader"]).content_string, boot_file)
    rerun = run_site(host)
    assert recap(rerun.stdout, name)["changed"] == 0, rerun.stdout[-3000:]


@pytest.mark.one_per_family
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


@pytest.mark.one_board
def test_another_copy_of_the_collection_and_its_artifacts_audits_clean_until_an_artifact_byte_differs(host, tmp_path):
    """Converged from this checkout; audited as another controller would (AWX, a laptop): the collection
    installed from its tarball in another directory, the artifacts in another directory, another
    ansible.cfg and HOME. Nothing on the device changed: clean. One byte of the engine differs: drifted,
    named by the artifact's sha256."""
    name = host.backend.host
    project = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    tools = Path(sys.executable).parent
    ops = tmp_path / "laptop"
    (ops / "home").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(HOME=str(ops / "home"), ANSIBLE_CONFIG=str(ops / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    for argv in (["collection", "build", "--output-path", str(tmp_path / "dist"), str(project)],
                 ["collection", "install", "--offline", "--no-deps", "-p", str(ops / "collections")]):
        if argv[1] == "install":
            argv += [str(p) for p in (tmp_path / "dist").glob("*.tar.gz")]
        done = subprocess.run([str(tools / "ansible-galaxy")] + argv, cwd=str(ops), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, check=False)
        assert done.returncode == 0, done.stdout[-2000:]
    (ops / "ansible.cfg").write_text("[defaults]\ncollections_path = %s\nforce_valid_group_names = ignore\n"
                                     "[connection]\npipelining = True\n" % (ops / "collections"))
    artifacts = ops / "artifacts"  # the same bytes, elsewhere (hard links)
    shutil.copytree(str(project / ".cache" / "artifacts"), str(artifacts), copy_function=os.link)

    def audit_from_the_laptop():
        done = subprocess.run([str(tools / "edgetune"), "audit", "--json", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                               "-l", name, "-e", "edge_runtime_artifacts_dir=%s" % artifacts],
                              cwd=str(ops), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              check=False)
        return done.returncode, json.loads(done.stdout)["hosts"][name]

    code, found = audit_from_the_laptop()
    assert (code, found["status"]) == (0, "ok"), found
    for engine in artifacts.glob("edgetune-engine-*.tar.gz"):  # one byte differs: a copy, not the link
        data = bytearray(engine.read_bytes())
        data[len(data) // 2] ^= 0x01
        engine.unlink()
        engine.write_bytes(bytes(data))
    code, found = audit_from_the_laptop()
    runtime = {r["setting"]: r for r in found["results"]}["edge_runtime applied state"]
    assert (code, found["status"], runtime["state"]) == (1, "drifted", "drifted"), found
    assert "engine artifact sha256" in runtime["detail"], runtime


MOVE_TC1_BACK_TO_VC0 = """
import sys
sys.path.insert(0, "/usr/local/lib/edgetune/package")
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_pcie
path = "/sys/bus/pci/devices/%s/config"
vc = [v for v in edge_pcie.parse(edge_pcie.read_config(path))["vc_capabilities"] if v["type"] == "VC"][0]
vc0, vc1 = vc["vcs"][0], vc["vcs"][1]
edge_pcie.write_register(path, vc1["control_offset"], vc1["control_register"] & ~0x800000ff)
edge_pcie.write_register(path, vc0["control_offset"], vc0["control_register"] | 0x02)
"""


def test_unreachable_devices_are_reported_with_the_cause_never_clean(host, tmp_path):
    """Two devices that do not answer, as in a real fleet: one over SSH on a closed loopback port,
    and a twin whose container is stopped (created from the same image, never started)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    stopped = "stopped-%s" % host.backend.host  # one per scenario: they run at the same time
    image = subprocess.run(["docker", "inspect", "-f", "{{.Config.Image}}", host.backend.host], check=True,
                           stdout=subprocess.PIPE, text=True).stdout.strip()
    subprocess.run(["docker", "rm", "-f", stopped], check=False, stdout=subprocess.DEVNULL,  # left by an aborted run
                   stderr=subprocess.DEVNULL)
    subprocess.run(["docker", "create", "--name", stopped, image], check=True, stdout=subprocess.DEVNULL)
    try:
        ghost = tmp_path / "ghost.yml"
        ghost.write_text("all:\n  hosts:\n    ghost-twin-that-does-not-exist:\n"
                         "      ansible_connection: ssh\n      ansible_host: 127.0.0.1\n"
                         "      ansible_port: %d\n"
                         "    %s:\n      ansible_connection: community.docker.docker\n" % (closed_port, stopped))
        project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
        result = subprocess.run(["edgetune", "audit", "--json", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                                 "-i", str(ghost)], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, check=False)
    finally:
        subprocess.run(["docker", "rm", "-f", stopped], check=False, stdout=subprocess.DEVNULL)
    hosts = json.loads(result.stdout)["hosts"]
    assert result.returncode == 3  # unreachable devices: the fleet was not all seen
    assert hosts["ghost-twin-that-does-not-exist"]["status"] == "unreachable"
    assert "Connection refused" in hosts["ghost-twin-that-does-not-exist"]["cause"], hosts
    assert hosts[stopped]["status"] == "unreachable", hosts[stopped]
    assert "is not running" in hosts[stopped]["cause"], hosts[stopped]
    assert hosts[host.backend.host]["status"] == "ok"


def test_on_device_timer_writes_the_textfile(host, expected):
    assert host.service("edgetune-audit.timer").is_enabled
    textfile = "/var/lib/prometheus/node-exporter/edgetune.prom"
    host.run_expect([0], "systemctl start edgetune-audit.service")
    assert 'setting="kernel boot arguments",role="edge_bootargs",state="ok"} 1' in host.file(textfile).content_string
    path, first = expected["bootloader"], expected["bootargs"][1]
    host.run_expect([0], "cp -p %s /root/boot-file.saved" % path)
    remove_first_occurrence(host, " " + first, path)
    try:
        host.run_expect([0], "systemctl start edgetune-audit.service")  # drift found is not a unit failure
        assert 'setting="kernel boot arguments",role="edge_bootargs",state="drifted"} 1' in \
            host.file(textfile).content_string
    finally:
        host.run_expect([0], "cp -p /root/boot-file.saved %s" % path)
    host.run_expect([0], "systemctl start edgetune-audit.service")
    assert 'setting="kernel boot arguments",role="edge_bootargs",state="ok"} 1' in host.file(textfile).content_string
