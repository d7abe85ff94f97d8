"""From a captured board to converged twins, verified with the device checks.

A board tree powered on by the twin's own boot script (the Orin NX 16GB's,
as tests/unit/test_capture.py builds it) is captured into a captured-boards
directory of this test; `edgetune-dev twin up --fleet captured/NAME:2` boots two
twins of it, `ansible-playbook site.yml` converges them like the built-in
boards, and `edgetune verify` runs the molecule checks marked ``device``
against them through an inventory, expectations derived from the intent and
the boards' facts. The twins are named cap-itest-* and removed at the end.
"""
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
NAME = "cap-itest-orin"
TWINS = ["%s-1" % NAME, "%s-2" % NAME]

pytestmark = pytest.mark.controller


def expected_for(board):
    """molecule's hand-written expectations for a board (molecule/shared/tests' tables)."""
    import importlib.util
    shared = ROOT / "molecule" / "shared" / "tests"
    saved = sys.modules.get("conftest")
    tables = {}
    try:
        for name in ("conftest", "test_cpu_cgroups", "test_power"):
            spec = importlib.util.spec_from_file_location(name, str(shared / (name + ".py")))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            tables[name] = module
    finally:
        for name in ("test_cpu_cgroups", "test_power"):
            sys.modules.pop(name, None)
        if saved is not None:
            sys.modules["conftest"] = saved
    hand = dict(tables["conftest"].EXPECTED[board])
    hand["sets"] = tables["test_cpu_cgroups"].SETS[board]
    hand["sysctls"] = tables["test_cpu_cgroups"].SYSCTLS
    hand["power"] = tables["test_power"].POWER[board]
    return hand


def edgetune(*args, env=None, check=True, command="edgetune"):
    """The CLI (command edgetune) or the harness (edgetune-dev) of this environment."""
    done = subprocess.run([str(Path(sys.executable).parent / command), *args], cwd=str(ROOT), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if subprocess.run(["docker", "info"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        pytest.skip("no Docker engine answers")
    from test_capture import power_on
    work = tmp_path_factory.mktemp("capture-twin")
    power_on("orin-nx-16gb-r36", work / "device")
    env = dict(os.environ, EDGETUNE_CAPTURED_DIR=str(work / "captured"),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    started = time.time()
    edgetune("twin", "capture", "--root", str(work / "device"), "--name", NAME, env=env, command="edgetune-dev")
    try:
        up = edgetune("twin", "up", "--fleet", "captured/%s:2" % NAME, "--inventory-dir", str(work / "up"), env=env,
                      command="edgetune-dev")
        booted = time.time() - started
        inventory = work / "inventory"
        (inventory / "group_vars").parent.mkdir(parents=True, exist_ok=True)
        os.symlink(str(ROOT / "inventory" / "twin" / "group_vars"), str(inventory / "group_vars"))
        (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {
            "vars": {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"},
            "children": {"orin-fleet": {"hosts": {name: None for name in TWINS}}}}}))
        yield {"work": work, "env": env, "inventory": inventory, "up": up, "booted": booted}
    finally:
        for name in TWINS:
            subprocess.run(["docker", "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_twins_of_the_capture_boot_as_the_board(fleet):
    for name in TWINS:
        inspect = subprocess.run(["docker", "inspect", "-f", '{{index .Config.Labels "io.edgetune_dev.twin"}}', name],
                                 stdout=subprocess.PIPE, universal_newlines=True, check=True)
        assert inspect.stdout.strip() == "captured/" + NAME
        boot = json.loads(subprocess.run(["docker", "exec", name, "cat", "/run/edgetune-twin/boot.json"],
                                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout)
        assert boot["board"] == NAME and boot["entry"] == "primary"
        assert "bl_prof_dataptr=2031616@0x471E10000" in boot["cmdline"]
        model = subprocess.run(["docker", "exec", name, "cat", "/sys/firmware/devicetree/base/model"],
                               stdout=subprocess.PIPE, check=True).stdout
        assert model.rstrip(b"\0") == b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
        serial = subprocess.run(["docker", "exec", name, "cat", "/sys/firmware/devicetree/base/serial-number"],
                                stdout=subprocess.PIPE, check=True).stdout
        assert serial.rstrip(b"\0") == b"000000000000"


def test_site_converges_the_captured_twins_and_verify_passes(fleet):
    started = time.time()
    site = subprocess.run(["ansible-playbook", "-i", str(fleet["inventory"]), "site.yml"], cwd=str(ROOT),
                          env=dict(fleet["env"], ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    converged = time.time() - started
    for name in TWINS:
        recap = re.search(r"^%s\s+:\s+ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(name),
                          site.stdout, re.M)
        assert recap and recap.groups() == ("0", "0"), site.stdout[-4000:]
    assert "NVIDIA Jetson Orin NX 16GB" in site.stdout   # the collection's profile matched the captured board

    started = time.time()
    junit = fleet["work"] / "verify.xml"
    plan = fleet["work"] / "plan.json"
    done = edgetune("verify", "-l", "orin-fleet", "-i", str(fleet["inventory"] / "hosts.yml"), "--junit", str(junit),
                    "--keep-plan", str(plan), env=fleet["env"], check=False)
    verified = time.time() - started
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    print(done.stdout[-2500:])
    suite = ElementTree.parse(str(junit)).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
    assert {c.get("name").split("[")[1].rstrip("]") for c in cases} == {"ansible://%s" % n for n in TWINS}
    passed = [c for c in cases if c.find("skipped") is None]
    assert len(passed) >= 2 * 10, [c.get("name") for c in passed]
    # The derived expectations are what molecule's hand-written ones say for this board.
    derived = json.loads(plan.read_text())
    for name in TWINS:
        mine = derived[name]["expected"]
        hand = expected_for("orin-nx-16gb-r36")
        assert mine["bootargs"] == hand["bootargs"] and mine["isolated"] == hand["isolated"]
        assert mine["bootloader"] == hand["bootloader"] and mine["sets"] == hand["sets"]
        assert mine["power"]["inference"] == hand["power"]["inference"]
        assert mine["power"]["devfreq"] == hand["power"]["devfreq"] and mine["power"]["mode"] == hand["power"]["mode"]
        # molecule checks kernel.numa_balancing on its own (0 where the kernel has it).
        assert mine["sysctls"].pop("kernel/numa_balancing", "0") == "0" and mine["sysctls"] == hand["sysctls"]
    print("capture + 2 twins up: %.0f s; site.yml: %.0f s; verify: %.0f s" % (fleet["booted"], converged, verified))


def test_a_no_change_site_skips_each_role_as_one_task_and_changes_nothing(fleet):
    """After the converge above: the next site.yml finds every role current (the plan's converge part), so the
    controller dispatches at most 25 task results per device (the tune play is left at once, the deploy's
    role not included) and nothing changes."""
    from edgetune.ansible_setup import JSON_REPORT_ENV
    from edgetune_dev.bench_audit import changed_tasks, executions, task_results
    site = subprocess.run(["ansible-playbook", "-i", str(fleet["inventory"]), "site.yml"], cwd=str(ROOT),
                          env=dict(fleet["env"], **JSON_REPORT_ENV), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-2000:]
    report = json.loads(site.stdout)
    results, executed = task_results(report), executions(report)
    assert sorted(results) == sorted(TWINS) and changed_tasks(report) == 0
    given = [task["task"]["name"] for play in report["plays"] for task in play["tasks"] if TWINS[0] in task["hosts"]]
    assert max(results.values()) <= 25, (results, given)
    assert max(executed.values()) <= 2, executed
    skipped = [task["task"]["name"] for play in report["plays"] for task in play["tasks"]
               if all(res.get("skipped") for res in task["hosts"].values())]
    # The tune play ended for the device before its first role's include (meta end_host is not reported).
    assert "Apply the kernel boot arguments" not in given and "Record what was applied" not in given, given
    assert "Deploy the runtime release" in skipped
    print("no-change site.yml: task results per device %s, module executions %s" % (results, executed))


def test_verify_fails_after_a_drift_naming_the_setting(fleet):
    """After the converge above: a governor set back by hand on one twin fails verify there, named."""
    name = TWINS[1]
    policy = "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor"   # the Orin NX's inference cluster
    subprocess.run(["docker", "exec", name, "sh", "-c", "echo schedutil > %s" % policy], check=True)
    junit = fleet["work"] / "verify-drift.xml"
    done = edgetune("verify", "-l", name, "-i", str(fleet["inventory"] / "hosts.yml"), "--junit", str(junit),
                    env=fleet["env"], check=False)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    # One check fails, on that twin, naming the file and the value it found (read from the JUnit
    # report: pytest's one-line summary drops the message when the terminal is narrow).
    suite = ElementTree.parse(str(junit)).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = [(case.get("name"), case.find("failure").get("message")) for case in suite.iter("testcase")
              if case.find("failure") is not None]
    assert [case for case, _ in failed] == ["test_governors_and_limits_read_back[ansible://%s]" % name], failed
    assert failed[0][1].startswith("AssertionError: %s" % policy), failed
    assert "'schedutil' == 'performance'" in done.stdout, done.stdout[-4000:]
    assert int(suite.get("failures")) == 1
