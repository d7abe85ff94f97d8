"""Helpers for the VM twin's checks.

The VM runs a real kernel booted by syslinux: every value asserted here is
read from the kernel's own files (proc, sysfs, cgroup2), which the VM's
power-on unit does not fake (it only adds the board identity a VM lacks).
Expectations come from the board's documented topology (HARDWARE notes) and
from what the inventory configures (role defaults, then the twins' group
vars, then the VM's host vars).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
INFERENCE = "4-7"
HOUSEKEEPING = "0-3"
BOOTARGS = ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7", "rcu_nocbs=4-7", "irqaffinity=0-3"]


def configured(host_name):
    """Role defaults < inventory/twin/group_vars/all.yml < the VM's host vars < the scenario's extra vars."""
    merged = {}
    for path in sorted((PROJECT / "roles").glob("*/defaults/main.yml")):
        merged.update(yaml.safe_load(path.read_text()) or {})
    merged.update(yaml.safe_load((PROJECT / "inventory/twin/group_vars/all.yml").read_text()) or {})
    host_vars = PROJECT / "tools/edgetune_dev/vm/host_vars" / (host_name + ".yml")
    merged.update(yaml.safe_load(host_vars.read_text()) or {})
    merged.update(scenario_extra_vars())
    return merged


@pytest.fixture(scope="session")
def config():
    return configured("vm-orin-nx-16gb-r36")


def read(host, path):
    return host.file(path).content_string.strip()


def fstype(host, path):
    """The file system a path really lives on (sysfs/proc/cgroup2 = the kernel's own file)."""
    return host.check_output("stat -f -c %%T %s" % path)


def cpulist(text):
    cpus = []
    for part in filter(None, text.strip().split(",")):
        a, _, b = part.partition("-")
        cpus += list(range(int(a), int(b or a) + 1))
    return cpus


def extlinux_labels(text):
    """{label: APPEND tokens} and the DEFAULT label, as a bootloader reads them."""
    labels, current, default = {}, None, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("DEFAULT"):
            default = line.split(None, 1)[1]
        elif line.startswith("LABEL"):
            current = line.split(None, 1)[1]
            labels[current] = None
        elif line.startswith("APPEND") and current:
            labels[current] = line.split()[1:]
    return labels, default


def scenario_ansible_args():
    """The scenario's own ansible-playbook arguments (molecule.yml), as its converge used them."""
    scenario = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parents[1]))
    config = yaml.safe_load((scenario / "molecule.yml").read_text())
    return list(config["provisioner"].get("ansible_args") or [])


def scenario_extra_vars():
    """The --extra-vars (JSON) among the scenario's ansible-playbook arguments."""
    args, found = scenario_ansible_args(), {}
    for flag, value in zip(args, args[1:]):
        if flag in ("-e", "--extra-vars"):
            found.update(json.loads(value))
    return found


def run_site(host, *extra):
    """ansible-playbook site.yml against this VM, as the user runs it."""
    argv = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            "-l", host.backend.host, str(PROJECT / "site.yml"), *scenario_ansible_args(), *extra]
    return subprocess.run(argv, cwd=str(PROJECT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False, env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))


def recap(output, name):
    match = re.search(r"^%s\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(name),
                      output, re.M)
    assert match, output[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


def edgetune_vm(*args, check=True):
    result = subprocess.run(["edgetune-dev", "vm", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, check=False, cwd=str(PROJECT))
    if check:
        assert result.returncode == 0, result.stderr
    return result


def vm_status():
    return json.loads(edgetune_vm("status", "--json", check=False).stdout)

# A line a minute while a check runs long (the project's tests/heartbeat.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import heartbeat  # noqa: E402

pytest_configure = heartbeat.pytest_configure
pytest_runtest_logstart = heartbeat.pytest_runtest_logstart
pytest_runtest_logfinish = heartbeat.pytest_runtest_logfinish
pytest_unconfigure = heartbeat.pytest_unconfigure
