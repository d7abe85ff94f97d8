"""From a real board to a twin, on the VM twin (a real kernel reached over real SSH).

After the scenario's converge: `edgetune-dev twin capture` reads the VM through
the scenario's inventory (its recorded host key, checked under its
HostKeyAlias; SFTP on its sshd), a container twin boots from the capture as
the VM's board (its model, clusters, boot file and interrupts), and `edgetune
verify` runs against the VM itself the molecule device checks only a real
kernel proves (expectations from the inventory's intent and the VM's facts,
with the roles this scenario leaves out switched off as its --skip-tags leaves
them out, and its extra vars). A twin of a capture converging and passing every
device check is tests/integration/test_capture_twin.py's (a minute of
converge, not proved twice).
Runs before test_vm.py (file order), on the converged VM; reads the VM only.
"""
import hashlib
import json
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ElementTree

import pytest
import yaml
from conftest import PROJECT, read, scenario_extra_vars

NAME = "cap-vm"
TWIN = NAME + "-1"
VM = "vm-orin-nx-16gb-r36"
# For verify's plan: what this scenario's --skip-tags (molecule.yml) leaves out, and what its extra vars
# deploy on purpose (SCHED_FIFO).
PLAN_VARS = ["-e", '{"edge_power_enabled": false}', "-e", json.dumps(scenario_extra_vars())]


def edgetune(*args, env=None, command="edgetune"):
    """The CLI (command edgetune) or the harness (edgetune-dev)."""
    return subprocess.run([command, *args], cwd=str(PROJECT), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=False)


def device_digest(host):
    """What capture reads, hashed on the VM (read-only proof): the boot file, release files, the
    device tree and cpufreq/devfreq values, the config of each PCI device."""
    return host.check_output(
        "cat /boot/extlinux/extlinux.conf /etc/nv_tegra_release /etc/nvpmodel.conf "
        "/sys/firmware/devicetree/base/model /sys/devices/system/cpu/cpufreq/policy*/scaling_governor "
        "/sys/class/devfreq/*/governor /sys/bus/pci/devices/*/config /proc/irq/*/smp_affinity_list "
        "2>/dev/null | sha256sum")


@pytest.fixture(scope="module")
def captured(host, tmp_path_factory):
    work = tmp_path_factory.mktemp("capture-vm")
    env = dict(os.environ, EDGETUNE_CAPTURED_DIR=str(work / "captured"))
    before = device_digest(host)
    started = time.time()
    done = edgetune("twin", "capture", "-i", os.environ["MOLECULE_INVENTORY_FILE"], VM, "--name", NAME,
                    "--ssh-config", str(work / "no-ssh-config"), env=env, command="edgetune-dev")
    seconds = time.time() - started
    assert done.returncode == 0, done.stderr
    assert device_digest(host) == before
    yield {"work": work, "env": env, "dir": work / "captured" / NAME, "seconds": seconds, "stderr": done.stderr}
    subprocess.run(["docker", "rm", "-f", TWIN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)


def test_capture_reads_the_vm_over_ssh(host, captured):
    board = json.loads((captured["dir"] / "boards" / (NAME + ".json")).read_text())
    assert board["model"] == "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
    assert board["compatible"][1] == "nvidia,p3767-0000" and board["family"] == "jetson"
    assert [c["cpus"] for c in board["clusters"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert board["kernel_release"] == read(host, "/proc/sys/kernel/osrelease")
    assert board["cgroup"] == "unified" and board["bootloader"] == "l4t"
    # The VM's own interrupts (a real x86 kernel's), names scrubbed of MACs; its boot file as it is.
    assert len(board["irqs"]) > 5
    boot = (captured["dir"] / "bootfiles" / (NAME + ".extlinux.conf")).read_text()
    assert boot == host.file("/boot/extlinux/extlinux.conf").content_string
    report = json.loads((captured["dir"] / "capture.json").read_text())
    assert report["complete"] and any("already tuned by edgetune" in n for n in report["notes"])
    serial = host.file("/sys/firmware/devicetree/base/serial-number").content_string.rstrip("\0")
    machine_id = read(host, "/etc/machine-id")
    for path in captured["dir"].rglob("*"):
        if path.is_file() and path.suffix != ".config":
            text = path.read_text()
            assert serial not in text and machine_id not in text, path
    profile = yaml.safe_load((captured["dir"] / "profile" / (NAME + ".yml")).read_text())
    assert profile["clusters"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and profile["inference_clusters"] == [1]
    print("captured the VM over SSH in %.0f s" % captured["seconds"])


def test_a_twin_of_the_capture_boots_as_the_vms_board(host, captured):
    work, env = captured["work"], captured["env"]
    started = time.time()
    up = edgetune("twin", "up", "--fleet", "captured/%s:1" % NAME, "--inventory-dir", str(work / "up"), env=env,
                  command="edgetune-dev")
    assert up.returncode == 0, up.stderr

    def twin(path):
        done = subprocess.run(["docker", "exec", TWIN, "cat", path], stdout=subprocess.PIPE, check=True)
        return done.stdout.decode().rstrip("\0")
    assert twin("/sys/firmware/devicetree/base/model") == \
        host.file("/sys/firmware/devicetree/base/model").content_string.rstrip("\0")
    for policy in ("policy0", "policy4"):
        path = "/sys/devices/system/cpu/cpufreq/%s/related_cpus" % policy
        assert twin(path).strip() == read(host, path)
    assert twin("/boot/extlinux/extlinux.conf") == host.file("/boot/extlinux/extlinux.conf").content_string
    boot = json.loads(twin("/run/edgetune-twin/boot.json"))
    assert boot["board"] == NAME and boot["entry"] == "primary"
    # The VM's own interrupts, as the capture recorded them.
    board = json.loads((captured["dir"] / "boards" / (NAME + ".json")).read_text())
    numbered = {int(m.group(1)) for m in re.finditer(r"^\s*(\d+):", twin("/proc/interrupts"), re.M)}
    assert {irq["irq"] for irq in board["irqs"]} <= numbered, numbered
    print("twin of the capture up in %.0f s" % (time.time() - started))


# The checks of `edgetune verify` that the VM proves and the container twins cannot: the kernel's
# own boot arguments, cgroup v2 files, threads' policies on a kernel that grants them, the classifier.
# The whole set runs on converged twins of a capture in tests/integration/test_capture_twin.py; under
# emulation each check costs seconds.
VM_ONLY_CHECKS = ("test_args_are_in_the_boot_file_and_running", "test_slice_values_in_the_cgroup_files",
                  "test_threads_run_with_the_policy_and_cpus_they_claim",
                  "test_classifier_is_attached_where_the_inventory_asks")


def test_verify_against_the_vm_itself(captured):
    junit = captured["work"] / "vm.xml"
    started = time.time()
    done = edgetune("verify", "-l", VM, "-i", os.environ["MOLECULE_INVENTORY_FILE"], "--junit", str(junit),
                    "--checks", " or ".join(VM_ONLY_CHECKS), *PLAN_VARS, env=captured["env"])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    suite = ElementTree.parse(str(junit)).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    ran = {c.get("name").split("[")[0]: c.find("skipped") is None for c in suite.findall("testcase")}
    for check in VM_ONLY_CHECKS:
        assert ran.get(check), (check, ran)
    digest = hashlib.sha256(junit.read_bytes()).hexdigest()[:12]
    print("verify of the VM in %.0f s (report %s)" % (time.time() - started, digest))


def test_verify_fails_on_the_vm_after_a_drift_naming_the_setting(host, captured):
    """A sysctl set back by hand on the VM: verify exits 1, the check of the kernel settings fails and
    names it. Only that check runs (-k): the whole set passing on the VM is the test above."""
    path = "/proc/sys/kernel/timer_migration"
    tuned = read(host, path)
    junit = captured["work"] / "vm-drift.xml"
    host.run_expect([0], "echo %d > %s" % (1 - int(tuned), path))
    try:
        done = edgetune("verify", "-l", VM, "-i", os.environ["MOLECULE_INVENTORY_FILE"], "--junit", str(junit),
                        "--checks", "kernel_settings", *PLAN_VARS, env=captured["env"])
    finally:
        host.run_expect([0], "echo %s > %s" % (tuned, path))
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    # Read from the JUnit report: pytest's one-line summary drops the message on a narrow terminal.
    suite = ElementTree.parse(str(junit)).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = [(case.get("name"), case.find("failure").get("message")) for case in suite.iter("testcase")
              if case.find("failure") is not None]
    assert [case for case, _ in failed] == ["test_kernel_settings_running_and_persisted[ansible://%s]" % VM], failed
    assert failed[0][1].startswith("AssertionError: kernel/timer_migration"), failed
