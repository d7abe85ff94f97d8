"""edge_cgroup_rt on fake cgroup trees that behave like the kernel's RT group scheduling.

The kernel (kernel/sched/rt.c, tg_rt_schedulable) accepts a cpu.rt_runtime_us
write only when the cgroup's children together hold no more RT bandwidth than
the new value and the cgroup with its siblings holds no more than its parent:
FakeKernel refuses other writes with EINVAL, as the kernel does, so the order
of the module's writes is tested, not assumed.
"""
import errno
import io
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import edge_cgroup_rt as rt
import pytest
import yaml

from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"
MOUNT = "sys/fs/cgroup/cpu,cpuacct"
MOUNTINFO = (
    "25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
    "32 30 0:28 {root} /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup "
    "rw,xattr,name=systemd\n"
    "35 30 0:31 {root} /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "36 30 0:32 {root} /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpuset\n"
)


def make_tree(root, budgets, sysroot="/", mount_root="/", rt_files=True):
    """budgets: {cgroup path: runtime}; every cgroup gets a 1 s period."""
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/1").mkdir(parents=True, exist_ok=True)
    (root / "proc/self/mountinfo").write_text(MOUNTINFO.format(root=mount_root))
    scope = sysroot.rstrip("/") + "/init.scope"
    (root / "proc/1/cgroup").write_text("12:name=systemd:%s\n4:cpu,cpuacct:%s\n0::%s\n" % (scope, scope, scope))
    for cgroup, runtime in budgets.items():
        relative = cgroup[len(mount_root.rstrip("/")):] if mount_root != "/" else cgroup
        directory = root / MOUNT / relative.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.shares").write_text("1024\n")
        if rt_files:
            (directory / "cpu.rt_runtime_us").write_text("%d\n" % runtime)
            (directory / "cpu.rt_period_us").write_text("1000000\n")
    return root


def budget(root, cgroup):
    return int((root / MOUNT / cgroup.lstrip("/") / "cpu.rt_runtime_us").read_text())


DEVICE = {"/": 950000, "/system.slice": 0, "/user.slice": 0, "/init.scope": 0,
          "/ai.slice": 0, "/ai.slice/ai-infer.slice": 0}
DOCKER = "/docker/3e55484"
CONTAINER = {"/": 950000, "/docker": 0, DOCKER: 0, DOCKER + "/init.scope": 0, DOCKER + "/system.slice": 0,
             DOCKER + "/ai.slice": 0, DOCKER + "/ai.slice/ai-infer.slice": 0}


@pytest.fixture
def device(tmp_path):
    return make_tree(tmp_path / "device", DEVICE)


@pytest.fixture
def container(tmp_path):
    return make_tree(tmp_path / "container", CONTAINER, sysroot=DOCKER)


class FakeKernel:
    """write_value for cpu.rt_runtime_us with the kernel's schedulability rule."""

    def __init__(self):
        self.log = []

    @staticmethod
    def _bandwidth(directory):
        runtime = int(open(os.path.join(directory, "cpu.rt_runtime_us")).read())
        period = int(open(os.path.join(directory, "cpu.rt_period_us")).read())
        return Fraction(period if runtime < 0 else runtime, period)

    def _children(self, directory, skip=None):
        return sum((self._bandwidth(os.path.join(directory, e)) for e in os.listdir(directory)
                    if os.path.join(directory, e) != skip and os.path.isdir(os.path.join(directory, e))), Fraction(0))

    def __call__(self, path, value):
        directory = os.path.dirname(path)
        self.log.append((directory, int(value)))
        new = Fraction(int(value), 1000000)
        parent = os.path.dirname(directory)
        if self._children(directory) > new or self._children(parent, skip=directory) + new > self._bandwidth(parent):
            raise OSError(errno.EINVAL, "Invalid argument")
        with open(path, "w") as handle:
            handle.write("%s\n" % value)


@pytest.fixture
def kernel(monkeypatch):
    fake = FakeKernel()
    monkeypatch.setattr(rt, "write_value", fake)
    return fake


def run_module(args, capsys, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            rt.main()
    return json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------
# Names and paths

@pytest.mark.parametrize("name, path", [
    ("ai-infer.slice", "/ai.slice/ai-infer.slice"),
    ("inference.slice", "/inference.slice"),
    ("a-b-c.slice", "/a.slice/a-b.slice/a-b-c.slice"),
    ("-.slice", "/"),
])
def test_slice_cgroup_follows_systemds_dash_hierarchy(name, path):
    assert rt.slice_cgroup(name) == path


@pytest.mark.parametrize("name", ["ai-infer", "ai-infer.service", "-ai.slice", "ai--infer.slice", "ai-.slice", ""])
def test_bad_slice_names_are_refused(name):
    with pytest.raises(rt.RtError, match="is not a slice unit name"):
        rt.slice_cgroup(name)


@pytest.mark.parametrize("text, root", [
    ("1:name=systemd:/init.scope\n0::/init.scope\n", "/"),
    ("0::/init.scope\n", "/"),
    ("9:name=systemd:/docker/abc/init.scope\n1:cpu:/docker/abc\n0::/docker/abc/init.scope\n", "/docker/abc"),
    ("9:name=systemd:/\n", "/"),
])
def test_systemd_root_is_pid1s_cgroup_without_init_scope(text, root):
    assert rt.systemd_root(text) == root


def test_systemd_root_missing_is_an_error():
    with pytest.raises(rt.RtError, match="cannot find systemd's cgroup"):
        rt.systemd_root("3:cpuset:/\n")


def test_mountinfo_and_paths_inside_a_mount_rooted_below_the_hierarchy():
    mounts = rt.parse_mountinfo(MOUNTINFO.format(root="/docker/abc"))
    cpu = next(m for m in mounts if "cpu" in m["options"])
    assert cpu["point"] == "/sys/fs/cgroup/cpu,cpuacct" and cpu["root"] == "/docker/abc"
    assert rt.fs_path(cpu, "/docker/abc/ai.slice") == "/sys/fs/cgroup/cpu,cpuacct/ai.slice"
    assert rt.fs_path(cpu, "/docker/abc") == "/sys/fs/cgroup/cpu,cpuacct"
    assert not any("cpu" in m["options"] for m in mounts if m["point"].endswith("cpuset"))


# --------------------------------------------------------------------------
# Budgets on cgroup v1 with RT group scheduling

def test_board_gets_the_budget_parents_first_and_read_back(device, kernel):
    result = rt.run(str(device), "ai-infer.slice", 800000)
    assert result["ready"] is True and result["mode"] == "v1-rt-group" and result["in_container"] is False
    assert [(os.path.relpath(d, str(device / MOUNT)), v) for d, v in kernel.log] == [
        ("ai.slice", 800000), ("ai.slice/ai-infer.slice", 800000)]
    assert budget(device, "/ai.slice") == 800000 and budget(device, "/ai.slice/ai-infer.slice") == 800000
    assert [(lv["before"], lv["after"]) for lv in result["levels"]] == [(0, 800000), (0, 800000)]
    assert result["parent"] == {"path": str(device / MOUNT), "runtime_us": 950000, "period_us": 1000000,
                                "others_us": 0}
    # Applied: nothing more to write.
    kernel.log.clear()
    again = rt.run(str(device), "ai-infer.slice", 800000)
    assert kernel.log == [] and all(lv["before"] == lv["after"] for lv in again["levels"])


def test_the_kernel_refuses_the_child_first_order(device, kernel):
    with pytest.raises(OSError):
        kernel(str(device / MOUNT / "ai.slice/ai-infer.slice/cpu.rt_runtime_us"), 800000)


def test_siblings_inside_the_parent_slice_are_counted(tmp_path, kernel):
    tree = dict(DEVICE, **{"/ai.slice": 300000, "/ai.slice/ai-camera.slice": 300000})
    root = make_tree(tmp_path / "b", tree)
    result = rt.run(str(root), "ai-infer.slice", 500000)
    assert result["ready"] is True
    assert budget(root, "/ai.slice") == 800000 and budget(root, "/ai.slice/ai-infer.slice") == 500000


def test_a_budget_that_does_not_fit_the_root_writes_nothing(tmp_path, kernel):
    root = make_tree(tmp_path / "full", dict(DEVICE, **{"/system.slice": 300000}))
    result = rt.run(str(root), "ai-infer.slice", 800000)
    assert result["ready"] is False and kernel.log == []
    assert "has 950000 us of RT time per 1000000 us and its other children hold 300000 us" in result["reason"]
    assert budget(root, "/ai.slice") == 0


def test_container_without_a_budget_is_reported_with_the_docker_fix(container, kernel):
    result = rt.run(str(container), "ai-infer.slice", 800000)
    assert result["ready"] is False and result["in_container"] is True and kernel.log == []
    assert "cpu.rt_runtime_us=0" in result["reason"]
    assert "dockerd --cpu-rt-runtime=950000" in result["reason"]
    assert "docker run --cpu-rt-runtime=800000" in result["reason"]
    assert str(container / MOUNT / DOCKER.lstrip("/")) in result["reason"]


def test_container_with_a_budget_gets_it_below_its_own_root(tmp_path, kernel):
    tree = dict(CONTAINER, **{"/docker": 950000, DOCKER: 900000})
    root = make_tree(tmp_path / "rtc", tree, sysroot=DOCKER)
    result = rt.run(str(root), "ai-infer.slice", 800000)
    assert result["ready"] is True
    assert budget(root, DOCKER + "/ai.slice/ai-infer.slice") == 800000
    assert budget(root, DOCKER) == 900000  # systemd's root is never written
    assert all(DOCKER + "/ai.slice" in d for d, _v in kernel.log)


def test_container_without_cgroup_namespace_maps_paths(tmp_path, kernel):
    tree = {DOCKER: 900000, DOCKER + "/ai.slice": 0, DOCKER + "/ai.slice/ai-infer.slice": 0}
    root = make_tree(tmp_path / "ns", tree, sysroot=DOCKER, mount_root=DOCKER)
    result = rt.run(str(root), "ai-infer.slice", 100000)
    assert result["ready"] is True
    assert (root / MOUNT / "ai.slice/ai-infer.slice/cpu.rt_runtime_us").read_text().strip() == "100000"


def test_lowering_writes_the_slice_only(device, kernel):
    rt.run(str(device), "ai-infer.slice", 800000)
    kernel.log.clear()
    result = rt.run(str(device), "ai-infer.slice", 100000)
    assert [(os.path.basename(d), v) for d, v in kernel.log] == [("ai-infer.slice", 100000)]
    assert budget(device, "/ai.slice") == 800000 and result["ready"] is True


def test_zero_budget_means_not_ready(device, kernel):
    rt.run(str(device), "ai-infer.slice", 800000)
    result = rt.run(str(device), "ai-infer.slice", 0)
    assert result["ready"] is False and "EPERM" in result["reason"]
    assert budget(device, "/ai.slice/ai-infer.slice") == 0


def test_children_holding_more_than_asked_is_an_error(tmp_path, kernel):
    tree = dict(DEVICE, **{"/ai.slice": 500000, "/ai.slice/ai-infer.slice": 500000,
                           "/ai.slice/ai-infer.slice/app.service": 400000})
    root = make_tree(tmp_path / "kids", tree)
    with pytest.raises(rt.RtError, match="already hold 400000 us of RT time; 100000 us is too little"):
        rt.run(str(root), "ai-infer.slice", 100000)
    assert kernel.log == []


@pytest.mark.parametrize("runtime", [1000000, 2000000, -1])
def test_budget_must_stay_below_the_period(device, kernel, runtime):
    with pytest.raises(rt.RtError, match="below the period"):
        rt.run(str(device), "ai-infer.slice", runtime)
    assert kernel.log == []


def test_inactive_slice_is_an_error_in_a_real_run_and_pending_in_check_mode(tmp_path, kernel):
    root = make_tree(tmp_path / "off", {"/": 950000, "/system.slice": 0})
    with pytest.raises(rt.MissingCgroup, match="the slice must be active"):
        rt.run(str(root), "ai-infer.slice", 800000)
    result = rt.run(str(root), "ai-infer.slice", 800000, check_mode=True)
    assert result["pending"] is True and result["ready"] is False and kernel.log == []
    # What the real run will write once the slice has started (new cgroups have no RT time).
    assert [(os.path.basename(lv["path"]), lv["before"], lv["after"]) for lv in result["levels"]] == [
        ("ai.slice", 0, 800000), ("ai-infer.slice", 0, 800000)]


def test_check_mode_on_a_never_tuned_container_says_what_the_real_run_will(tmp_path, kernel):
    """A fresh twin: no slice yet, and a container without RT time. Check mode must not promise a
    budget (and a boot unit for it) that the real run, once the slice exists, finds impossible."""
    tree = {k: v for k, v in CONTAINER.items() if "/ai.slice" not in k}
    root = make_tree(tmp_path / "fresh", tree, sysroot=DOCKER)
    checked = rt.run(str(root), "ai-infer.slice", 800000, check_mode=True)
    assert "pending" not in checked and checked["ready"] is False and kernel.log == []
    started = make_tree(tmp_path / "started", CONTAINER, sysroot=DOCKER)
    real = rt.run(str(started), "ai-infer.slice", 800000)
    assert checked["reason"].replace(str(root), "") == real["reason"].replace(str(started), "")
    assert all(lv["after"] == lv["before"] for lv in checked["levels"])


def test_check_mode_plans_and_writes_nothing(device, kernel):
    result = rt.run(str(device), "ai-infer.slice", 800000, check_mode=True)
    assert kernel.log == [] and budget(device, "/ai.slice") == 0
    assert result["ready"] is True and [lv["after"] for lv in result["levels"]] == [800000, 800000]


def test_kernel_refusal_during_the_write_is_an_error(device, monkeypatch):
    def refuse(path, value):
        raise OSError(errno.EBUSY, "Device or resource busy")
    monkeypatch.setattr(rt, "write_value", refuse)
    with pytest.raises(rt.RtError, match="the kernel refused: the budget does not fit its parent"):
        rt.run(str(device), "ai-infer.slice", 800000)


# --------------------------------------------------------------------------
# No RT group scheduling, cgroup v2

def test_no_rt_group_scheduling_is_ready_without_writing(tmp_path, kernel):
    root = make_tree(tmp_path / "norg", DEVICE, rt_files=False)
    result = rt.run(str(root), "ai-infer.slice", 800000)
    assert result["mode"] == "no-rt-group" and result["ready"] is True and kernel.log == []


def _unified(root):
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/1").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(
        "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n")
    (root / "proc/1/cgroup").write_text("0::/init.scope\n")
    return root


@pytest.mark.parametrize("rt_group_sched, mode, ready", [(True, "v2-rt-group", False), (False, "v2", True),
                                                         (None, "v2-unknown", True)])
def test_cgroup_v2(tmp_path, rt_group_sched, mode, ready):
    result = rt.run(str(_unified(tmp_path / "v2")), "ai-infer.slice", 800000, rt_group_sched)
    assert (result["mode"], result["ready"]) == (mode, ready)
    if mode == "v2-rt-group":
        assert "CONFIG_RT_GROUP_SCHED" in result["reason"] and "EPERM" in result["reason"]


def test_no_cgroup_mount_at_all_is_an_error(tmp_path):
    root = tmp_path / "none"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/1").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text("25 1 0:23 / /sys rw - sysfs sysfs rw\n")
    (root / "proc/1/cgroup").write_text("0::/init.scope\n")
    with pytest.raises(rt.RtError, match="no cgroup v1 cpu controller and no cgroup v2 mount"):
        rt.run(str(root), "ai-infer.slice", 800000)


# --------------------------------------------------------------------------
# The module and the boot-time command

def test_module_writes_state_only_when_ready_and_shows_the_diff(device, container, kernel, tmp_path, capsys):
    state = tmp_path / "rt-budget.json"
    args = {"slice": "ai-infer.slice", "runtime_us": 800000, "root": str(device), "state_file": str(state)}
    check = run_module(args, capsys, check=True, diff=True)
    assert check["changed"] is True and not state.exists() and kernel.log == []
    result = run_module(args, capsys, diff=True)
    assert result["changed"] is True and result["ready"] is True
    assert json.loads(state.read_text()) == {"format": 1, "generated_by": "edge_cgroup_rt",
                                             "slice": "ai-infer.slice", "runtime_us": 800000}
    leaf = "%s/ai.slice/ai-infer.slice/cpu.rt_runtime_us" % (device / MOUNT)
    assert "%s: 0\n" % leaf in result["diff"][0]["before"] and "%s: 800000\n" % leaf in result["diff"][0]["after"]
    assert run_module(args, capsys)["changed"] is False

    other = tmp_path / "container.json"
    blocked = run_module(dict(args, root=str(container), state_file=str(other)), capsys)
    assert blocked["changed"] is False and blocked["ready"] is False and not other.exists()


def test_module_failure_is_one_message(device, kernel, capsys):
    result = run_module({"slice": "ai-infer.service", "runtime_us": 1, "root": str(device)}, capsys)
    assert result["failed"] is True
    assert result["msg"] == "'ai-infer.service' is not a slice unit name (like ai-infer.slice)"


def _interpreters():
    return [sys.executable] + ([PY38] if os.path.exists(PY38) else [])


@pytest.mark.parametrize("python", _interpreters())
def test_cli_gives_the_budget_again_after_a_reboot(tmp_path, python):
    root = make_tree(tmp_path / "boot", DEVICE)
    state = tmp_path / "rt-budget.json"
    state.write_text(rt.state_document("ai-infer.slice", 800000))
    command = [python, str(REPO / "plugins/modules/edge_cgroup_rt.py"),
               "--apply-state", str(state), "--root", str(root)]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          env=dict(os.environ, PYTHONPATH=""), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "edge_cgroup_rt: %s/ai.slice/cpu.rt_runtime_us: 0 -> 800000" % (root / MOUNT),
        "edge_cgroup_rt: %s/ai.slice/ai-infer.slice/cpu.rt_runtime_us: 0 -> 800000" % (root / MOUNT)]
    assert budget(root, "/ai.slice/ai-infer.slice") == 800000


def test_cli_in_a_container_without_budget_fails_with_the_reason(container, tmp_path):
    state = tmp_path / "rt-budget.json"
    state.write_text(rt.state_document("ai-infer.slice", 800000))
    out, err = io.StringIO(), io.StringIO()
    assert rt.apply_state_file(str(state), str(container), out, err) == 1
    assert out.getvalue() == "" and "--cpu-rt-runtime" in err.getvalue()


@pytest.mark.parametrize("content", ["{", json.dumps({"format": 1, "slice": "ai-infer.slice"}),
                                     json.dumps({"format": 1, "slice": "ai-infer.slice", "runtime_us": True}),
                                     json.dumps({"format": 2, "slice": "ai-infer.slice", "runtime_us": 1})])
def test_cli_rejects_a_bad_state_file(device, tmp_path, content, kernel):
    state = tmp_path / "bad.json"
    state.write_text(content)
    err = io.StringIO()
    assert rt.apply_state_file(str(state), str(device), io.StringIO(), err) == 1
    assert len(err.getvalue().splitlines()) == 1 and kernel.log == []


def test_documentation_matches_argument_spec(monkeypatch):
    captured = {}

    class Stop(Exception):
        pass

    def fake_module(**kwargs):
        captured.update(kwargs)
        raise Stop()

    monkeypatch.setattr(rt, "AnsibleModule", fake_module)
    with pytest.raises(Stop):
        rt.main()
    doc = yaml.safe_load(rt.DOCUMENTATION)
    yaml.safe_load(rt.EXAMPLES)
    yaml.safe_load(rt.RETURN)
    spec = captured["argument_spec"]
    assert set(doc["options"]) == set(spec)
    for name, option in spec.items():
        assert doc["options"][name]["type"] == option.get("type", "str"), name
        assert doc["options"][name].get("default") == option.get("default"), name
        assert doc["options"][name].get("required", False) == option.get("required", False), name
    assert captured["supports_check_mode"] is True
