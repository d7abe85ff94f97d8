"""Shared testinfra checks for the twin scenarios, and for real devices.

Under molecule, expectations are written here from the boards' documented
hardware (HARDWARE notes), not read from the roles' data, so a wrong role or
profile fails them.

The checks marked ``device`` only read a device; `edgetune verify` runs them
against real devices through an Ansible inventory. They live in the CLI's
package, edgetune.checks (shipped with it), and the test modules here import
them, so pytest collects the very same functions here. Their fixtures are
edgetune.checks.plugin's (registered below), where the expectations come from
each device's plan; the ones defined here and in the test modules (expected,
sets, power, ...) take precedence and give the twins' hand-written ones, so
the same check code proves on the twins that the roles are right for a board
and, on a device, that it runs what the roles intend for it.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def pytest_configure(config):
    # Not pytest_plugins: that is refused in a conftest below the rootdir (the checkout's).
    config.pluginmanager.import_plugin("edgetune.checks.plugin")
    heartbeat.pytest_configure(config)


EXPECTED = {
    "orin-nx-16gb-r36": {"model": "NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
                         "profile": "NVIDIA Jetson Orin NX 16GB", "release": "L4T 36.4.3",
                         "clusters": ["0-3", "4-7"], "bootloader": "/boot/extlinux/extlinux.conf",
                         "bootargs": ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7", "rcu_nocbs=4-7",
                                      "irqaffinity=0-3"], "isolated": "4-7"},
    "agx-orin-64gb-r35": {"model": "Jetson AGX Orin Developer Kit",
                          "profile": "NVIDIA Jetson AGX Orin 64GB", "release": "L4T 35.6.0",
                          "clusters": ["0-3", "4-7", "8-11"], "bootloader": "/boot/extlinux/extlinux.conf",
                          # r35 boots hybrid cgroups by default: the role adds the v2 switch.
                          "bootargs": ["isolcpus=managed_irq,domain,4-11", "nohz_full=4-11", "rcu_nocbs=4-11",
                                       "irqaffinity=0-3", "systemd.unified_cgroup_hierarchy=1"], "isolated": "4-11"},
    "rock5b-rk3588": {"model": "Radxa ROCK 5B", "profile": "Rockchip RK3588", "release": "armbian 25.8.1",
                      "clusters": ["0-3", "4-5", "6-7"], "bootloader": "/boot/armbianEnv.txt",
                      "bootargs": ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7", "rcu_nocbs=4-7",
                                   "irqaffinity=0-3"], "isolated": "4-7"},
}


def pytest_collection_modifyitems(config, items):
    """Checks of board-independent logic (upgrades, rollbacks, refusals) cost minutes
    each: one scenario runs them (EDGETUNE_FULL_VERIFY=1, see orin-nx-r36), the
    others skip them, so `make test` stays within CI's time. Checks that differ by
    board family only (marker one_per_family: the drift of every role, whose settings
    a Jetson and an RK3588 name differently) run once per family: a scenario of a
    family another scenario covers sets EDGETUNE_FAMILY_COVERED=1 (agx-orin-r35)."""
    skips = []
    if os.environ.get("EDGETUNE_FULL_VERIFY") != "1":
        skips.append(("one_board", "board-independent; runs in the scenario with EDGETUNE_FULL_VERIFY=1"))
    if os.environ.get("EDGETUNE_FAMILY_COVERED") == "1":
        skips.append(("one_per_family", "the same board family's other scenario runs it (EDGETUNE_FAMILY_COVERED)"))
    for marker, reason in skips:
        for item in items:
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def twin_board(host):
    """The board the twin was created as (its PID 1 environment)."""
    environ = host.check_output("tr '\\0' '\\n' < /proc/1/environ")
    return re.search(r"^EDGETUNE_TWIN_BOARD=(.+)$", environ, re.M).group(1)


def hand_written(request, table):
    """molecule: the twin board's entry of a hand-written table."""
    return table[request.getfixturevalue("twin_board")]


@pytest.fixture(scope="module")
def expected(request):
    return hand_written(request, EXPECTED)


def run_site(host, *extra, env=None):
    """ansible-playbook site.yml against this one twin, as the user runs it."""
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    argv = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            "-l", host.backend.host, os.path.join(project, "site.yml"), *extra]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", **(env or {}))
    return subprocess.run(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False, env=env)


def run_site_with_summary(host, *extra):
    """run_site, and this twin's line of the run's JSON summary (edge_summary): the changed
    tasks, by name, that the run made or would make in check mode."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "summary.jsonl")
        result = run_site(host, *extra, env={"EDGETUNE_SUMMARY_JSON": path})
        with open(path) as handle:
            return result, json.loads(handle.read().splitlines()[-1])["hosts"][host.backend.host]


def recap(output, name):
    match = re.search(r"^%s\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(name),
                      output, re.M)
    assert match, output[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


def reboot_twin(host, timeout=90):
    """Reboot the twin as a user would and wait until it is back; returns the new boot id."""
    import subprocess
    import time
    name = host.backend.host
    before = host.check_output("cat /proc/sys/kernel/random/boot_id")
    subprocess.run(["docker", "exec", name, "systemctl", "reboot"], check=False)
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(1)
        probe = subprocess.run(["docker", "exec", name, "sh", "-c",
                                "cat /proc/sys/kernel/random/boot_id && systemctl is-system-running"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False)
        lines = probe.stdout.split()
        if len(lines) == 2 and lines[0] != before and lines[1] in ("running", "degraded"):
            return lines[0]
    raise AssertionError("twin %s did not come back from reboot within %d s" % (name, timeout))


def same_but_argument_order(before, after):
    """Two boot files are the same but for the order of the arguments on their
    APPEND / extraargs lines: an argument removed by hand and put back by the next
    run goes last, and the kernel does not care."""
    def normal(text):
        lines = []
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith("APPEND "):
                keyword, first, *rest = stripped.split()
                lines.append((keyword, first, tuple(sorted(rest))))
            elif stripped.startswith("extraargs="):
                lines.append(("extraargs", tuple(sorted(stripped[len("extraargs="):].split()))))
            else:
                lines.append(line)
        return lines
    return normal(before) == normal(after)


CONVERGED_CHECK_RUNS = {}


def converged_check_run(host, boot_file):
    """One `site.yml --check --diff` on the converged twin, every role in full (a plain run skips
    the roles that are current, test_twin_converged checks that), shared by the test files that
    read it (each run costs minutes): its result and the boot file's digest before and after."""
    name = host.backend.host
    if name not in CONVERGED_CHECK_RUNS:
        before = host.check_output("md5sum %s" % boot_file)
        result = run_site(host, "--check", "--diff", "-e", json.dumps({"edge_converge_full": True}))
        CONVERGED_CHECK_RUNS[name] = (result, before, host.check_output("md5sum %s" % boot_file))
    return CONVERGED_CHECK_RUNS[name]

# A line a minute while a check runs long (the project's tests/heartbeat.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import heartbeat  # noqa: E402

pytest_runtest_logstart = heartbeat.pytest_runtest_logstart
pytest_runtest_logfinish = heartbeat.pytest_runtest_logfinish
pytest_unconfigure = heartbeat.pytest_unconfigure
