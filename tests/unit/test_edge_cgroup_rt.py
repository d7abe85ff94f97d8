"""edge_cgroup_rt (and edge_rt, its work) on fake cgroup trees that behave like the kernel's RT group scheduling.

The kernel (kernel/sched/rt.c, tg_rt_schedulable) accepts a cpu.rt_runtime_us
write only when the cgroup's children together hold no more RT bandwidth than
the new value and the cgroup with its siblings holds no more than its parent:
FakeKernel refuses other writes with EINVAL, as the kernel does, so the order
of the writes is tested, not assumed.
"""
import errno
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import edge_cgroup_rt as rt
import pytest
from conftest import install_boot_program, run_boot_program as boot
import yaml

from ansible.module_utils.testing import patch_module_args
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot, edge_rt
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

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
    monkeypatch.setattr(edge_rt, "write_value", fake)
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
    assert edge_rt.slice_cgroup(name) == path


@pytest.mark.parametrize("name", ["ai-infer", "ai-infer.service", "-ai.slice", "ai--infer.slice", "ai-.slice", ""])
def test_bad_slice_names_are_refused(name):
    with pytest.raises(EdgeError, match="is not a slice unit name"):
        edge_rt.slice_cgroup(name)


@pytest.mark.parametrize("text, root", [
    ("1:name=systemd:/init.scope\n0::/init.scope\n", "/"),
    ("0::/init.scope\n", "/"),
    ("9:name=systemd:/docker/abc/init.scope\n1:cpu:/docker/abc\n0::/docker/abc/init.scope\n", "/docker/abc"),
    ("9:name=systemd:/\n", "/"),
])
def test_systemd_root_is_pid1s_cgroup_without_init_scope(text, root):
    assert edge_rt.systemd_root(text) == root


def test_systemd_root_missing_is_an_error():
    with pytest.raises(EdgeError, match="cannot find systemd's cgroup"):
        edge_rt.systemd_root("3:cpuset:/\n")


def test_mountinfo_and_paths_inside_a_mount_rooted_below_the_hierarchy():
    mounts = edge_rt.parse_mountinfo(MOUNTINFO.format(root="/docker/abc"))
    cpu = next(m for m in mounts if "cpu" in m["options"])
    assert cpu["point"] == "/sys/fs/cgroup/cpu,cpuacct" and cpu["root"] == "/docker/abc"
    assert edge_rt.fs_path(cpu, "/docker/abc/ai.slice") == "/sys/fs/cgroup/cpu,cpuacct/ai.slice"
    assert edge_rt.fs_path(cpu, "/docker/abc") == "/sys/fs/cgroup/cpu,cpuacct"
    assert not any("cpu" in m["options"] for m in mounts if m["point"].endswith("cpuset"))


# --------------------------------------------------------------------------
# Budgets on cgroup v1 with RT group scheduling

def test_board_gets_the_budget_parents_first_and_read_back(device, kernel):
    result = edge_rt.run(str(device), "ai-infer.slice", 800000)
    assert result["ready"] is True and result["mode"] == "v1-rt-group" and result["in_container"] is False
    assert [(os.path.relpath(d, str(device / MOUNT)), v) for d, v in kernel.log] == [
        ("ai.slice", 800000), ("ai.slice/ai-infer.slice", 800000)]
    assert budget(device, "/ai.slice") == 800000 and budget(device, "/ai.slice/ai-infer.slice") == 800000
    assert [(lv["before"], lv["after"]) for lv in result["levels"]] == [(0, 800000), (0, 800000)]
    assert result["parent"] == {"path": str(device / MOUNT), "runtime_us": 950000, "period_us": 1000000,
                                "others_us": 0}
    # Applied: nothing more to write.
    kernel.log.clear()
    again = edge_rt.run(str(device), "ai-infer.slice", 800000)
    assert kernel.log == [] and all(lv["before"] == lv["after"] for lv in again["levels"])


def test_the_kernel_refuses_the_child_first_order(device, kernel):
    with pytest.raises(OSError):
        kernel(str(device / MOUNT / "ai.slice/ai-infer.slice/cpu.rt_runtime_us"), 800000)


def test_siblings_inside_the_parent_slice_are_counted(tmp_path, kernel):
    tree = dict(DEVICE, **{"/ai.slice": 300000, "/ai.slice/ai-camera.slice": 300000})
    root = make_tree(tmp_path / "b", tree)
    result = edge_rt.run(str(root), "ai-infer.slice", 500000)
    assert result["ready"] is True
    assert budget(root, "/ai.slice") == 800000 and budget(root, "/ai.slice/ai-infer.slice") == 500000


def test_a_budget_that_does_not_fit_the_root_writes_nothing(tmp_path, kernel):
    root = make_tree(tmp_path / "full", dict(DEVICE, **{"/system.slice": 300000}))
    result = edge_rt.run(str(root), "ai-infer.slice", 800000)
    assert result["ready"] is False and kernel.log == []
    assert "has 950000 us of RT time per 1000000 us and its other children hold 300000 us" in result["reason"]
    assert budget(root, "/ai.slice") == 0


def test_container_without_a_budget_is_reported_with_the_docker_fix(container, kernel):
    result = edge_rt.run(str(container), "ai-infer.slice", 800000)
    assert result["ready"] is False and result["in_container"] is True and kernel.log == []
    assert "cpu.rt_runtime_us=0" in result["reason"]
    assert "dockerd --cpu-rt-runtime=950000" in result["reason"]
    assert "docker run --cpu-rt-runtime=800000" in result["reason"]
    assert str(container / MOUNT / DOCKER.lstrip("/")) in result["reason"]


def test_container_with_a_budget_gets_it_below_its_own_root(tmp_path, kernel):
    tree = dict(CONTAINER, **{"/docker": 950000, DOCKER: 900000})
    root = make_tree(tmp_path / "rtc", tree, sysroot=DOCKER)
    result = edge_rt.run(str(root), "ai-infer.slice", 800000)
    assert result["ready"] is True
    assert budget(root, DOCKER + "/ai.slice/ai-infer.slice") == 800000
    assert budget(root, DOCKER) == 900000  # systemd's root is never written
    assert all(DOCKER + "/ai.slice" in d for d, _v in kernel.log)


def test_container_without_cgroup_namespace_maps_paths(tmp_path, kernel):
    tree = {DOCKER: 900000, DOCKER + "/ai.slice": 0, DOCKER + "/ai.slice/ai-infer.slice": 0}
    root = make_tree(tmp_path / "ns", tree, sysroot=DOCKER, mount_root=DOCKER)
    result = edge_rt.run(str(root), "ai-infer.slice", 100000)
    assert result["ready"] is True
    assert (root / MOUNT / "ai.slice/ai-infer.slice/cpu.rt_runtime_us").read_text().strip() == "100000"


def test_lowering_writes_the_slice_only(device, kernel):
    edge_rt.run(str(device), "ai-infer.slice", 800000)
    kernel.log.clear()
    result = edge_rt.run(str(device), "ai-infer.slice", 100000)
    assert [(os.path.basename(d), v) for d, v in kernel.log] == [("ai-infer.slice", 100000)]
    assert budget(device, "/ai.slice") == 800000 and result["ready"] is True


def test_zero_budget_means_not_ready(device, kernel):
    edge_rt.run(str(device), "ai-infer.slice", 800000)
    result = edge_rt.run(str(device), "ai-infer.slice", 0)
    assert result["ready"] is False and "EPERM" in result["reason"]
    assert budget(device, "/ai.slice/ai-infer.slice") == 0


def test_children_holding_more_than_asked_is_an_error(tmp_path, kernel):
    tree = dict(DEVICE, **{"/ai.slice": 500000, "/ai.slice/ai-infer.slice": 500000,
                           "/ai.slice/ai-infer.slice/app.service": 400000})
    root = make_tree(tmp_path / "kids", tree)
    with pytest.raises(EdgeError, match="already hold 400000 us of RT time; 100000 us is too little"):
        edge_rt.run(str(root), "ai-infer.slice", 100000)
    assert kernel.log == []


@pytest.mark.parametrize("runtime", [1000000, 2000000, -1])
def test_budget_must_stay_below_the_period(device, kernel, runtime):
    with pytest.raises(EdgeError, match="below the period"):
        edge_rt.run(str(device), "ai-infer.slice", runtime)
    assert kernel.log == []


def test_inactive_slice_is_an_error_in_a_real_run_and_pending_in_check_mode(tmp_path, kernel):
    root = make_tree(tmp_path / "off", {"/": 950000, "/system.slice": 0})
    with pytest.raises(EdgeError, match="the slice must be active") as refused:
        edge_rt.run(str(root), "ai-infer.slice", 800000)
    assert refused.value.details == {"missing_cgroup": str(root / MOUNT / "ai.slice")}
    result = edge_rt.run(str(root), "ai-infer.slice", 800000, check_mode=True)
    assert result["pending"] is True and result["ready"] is False and kernel.log == []
    # What the real run will write once the slice has started (new cgroups have no RT time).
    assert [(os.path.basename(lv["path"]), lv["before"], lv["after"]) for lv in result["levels"]] == [
        ("ai.slice", 0, 800000), ("ai-infer.slice", 0, 800000)]


def test_check_mode_on_a_never_tuned_container_says_what_the_real_run_will(tmp_path, kernel):
    """A fresh twin: no slice yet, and a container without RT time. Check mode must not promise a
    budget (and a boot unit for it) that the real run, once the slice exists, finds impossible."""
    tree = {k: v for k, v in CONTAINER.items() if "/ai.slice" not in k}
    root = make_tree(tmp_path / "fresh", tree, sysroot=DOCKER)
    checked = edge_rt.run(str(root), "ai-infer.slice", 800000, check_mode=True)
    assert "pending" not in checked and checked["ready"] is False and kernel.log == []
    started = make_tree(tmp_path / "started", CONTAINER, sysroot=DOCKER)
    real = edge_rt.run(str(started), "ai-infer.slice", 800000)
    assert checked["reason"].replace(str(root), "") == real["reason"].replace(str(started), "")
    assert all(lv["after"] == lv["before"] for lv in checked["levels"])


def test_check_mode_plans_and_writes_nothing(device, kernel):
    result = edge_rt.run(str(device), "ai-infer.slice", 800000, check_mode=True)
    assert kernel.log == [] and budget(device, "/ai.slice") == 0
    assert result["ready"] is True and [lv["after"] for lv in result["levels"]] == [800000, 800000]


def test_kernel_refusal_during_the_write_is_an_error(device, monkeypatch):
    def refuse(path, value):
        raise OSError(errno.EBUSY, "Device or resource busy")
    monkeypatch.setattr(edge_rt, "write_value", refuse)
    with pytest.raises(EdgeError, match="the kernel refused: the budget does not fit its parent"):
        edge_rt.run(str(device), "ai-infer.slice", 800000)


# --------------------------------------------------------------------------
# No RT group scheduling, cgroup v2

def test_no_rt_group_scheduling_is_ready_without_writing(tmp_path, kernel):
    root = make_tree(tmp_path / "norg", DEVICE, rt_files=False)
    result = edge_rt.run(str(root), "ai-infer.slice", 800000)
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
    result = edge_rt.run(str(_unified(tmp_path / "v2")), "ai-infer.slice", 800000, rt_group_sched)
    assert (result["mode"], result["ready"]) == (mode, ready)
    if mode == "v2-rt-group":
        assert "CONFIG_RT_GROUP_SCHED" in result["reason"] and "EPERM" in result["reason"]


def test_no_cgroup_mount_at_all_is_an_error(tmp_path):
    root = tmp_path / "none"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/1").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text("25 1 0:23 / /sys rw - sysfs sysfs rw\n")
    (root / "proc/1/cgroup").write_text("0::/init.scope\n")
    with pytest.raises(EdgeError, match="no cgroup v1 cpu controller and no cgroup v2 mount"):
        edge_rt.run(str(root), "ai-infer.slice", 800000)


# --------------------------------------------------------------------------
# The module and the boot program (edge_boot, kind rt_budget)

def save(state_dir, settings):
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "rt-budget.json"
    path.write_text(edge_boot.document("rt_budget", settings, "edge_cgroup_rt"))
    return path


def test_module_writes_state_only_when_ready_and_shows_the_diff(device, container, kernel, tmp_path, capsys):
    state = tmp_path / "boot.d" / "rt-budget.json"
    args = {"slice": "ai-infer.slice", "runtime_us": 800000, "root": str(device), "state_file": str(state)}
    check = run_module(args, capsys, check=True, diff=True)
    assert check["changed"] is True and check["state_file_changed"] is True
    assert not state.exists() and kernel.log == []
    result = run_module(args, capsys, diff=True)
    assert result["changed"] is True and result["ready"] is True and result["state_file_changed"] is True
    assert json.loads(state.read_text()) == {"format": 1, "kind": "rt_budget", "generated_by": "edge_cgroup_rt",
                                             "settings": {"slice": "ai-infer.slice", "runtime_us": 800000}}
    assert result["diff"][1] == {"before_header": str(state), "after_header": str(state), "before": "",
                                 "after": state.read_text()}
    leaf = "%s/ai.slice/ai-infer.slice/cpu.rt_runtime_us" % (device / MOUNT)
    assert "%s: 0\n" % leaf in result["diff"][0]["before"] and "%s: 800000\n" % leaf in result["diff"][0]["after"]
    again = run_module(args, capsys)
    assert again["changed"] is False and again["state_file_changed"] is False

    other = tmp_path / "container.json"
    blocked = run_module(dict(args, root=str(container), state_file=str(other)), capsys)
    assert blocked["changed"] is False and blocked["ready"] is False and not other.exists()
    assert "state_file_changed" not in blocked


def test_module_rewrites_a_state_file_of_the_old_format(device, kernel, tmp_path, capsys):
    state = tmp_path / "rt-budget.json"
    state.write_text(json.dumps({"format": 1, "generated_by": "edge_cgroup_rt", "slice": "ai-infer.slice",
                                 "runtime_us": 800000}))
    args = {"slice": "ai-infer.slice", "runtime_us": 800000, "root": str(device), "state_file": str(state)}
    result = run_module(args, capsys)
    assert result["state_file_changed"] is True
    assert edge_boot.read(str(state), "rt_budget")[1] == {"slice": "ai-infer.slice", "runtime_us": 800000}


def test_module_failure_is_one_message(device, kernel, capsys):
    result = run_module({"slice": "ai-infer.service", "runtime_us": 1, "root": str(device)}, capsys)
    assert result["failed"] is True
    assert result["msg"] == "'ai-infer.service' is not a slice unit name (like ai-infer.slice)"


def test_module_failure_names_the_missing_cgroup(tmp_path, kernel, capsys):
    root = make_tree(tmp_path / "off", {"/": 950000, "/system.slice": 0})
    result = run_module({"slice": "ai-infer.slice", "runtime_us": 800000, "root": str(root)}, capsys)
    assert result["failed"] is True and "the slice must be active" in result["msg"]
    assert result["missing_cgroup"] == str(root / MOUNT / "ai.slice")


def test_boot_gives_the_budget_the_module_saved_again_after_a_reboot(device, kernel, tmp_path, capsys):
    state_dir = tmp_path / "boot.d"
    args = {"slice": "ai-infer.slice", "runtime_us": 800000, "root": str(device),
            "state_file": str(edge_boot.state_path("rt_budget", str(state_dir)))}
    assert run_module(args, capsys)["ready"] is True
    rebooted = make_tree(tmp_path / "rebooted", DEVICE)  # the slice's cgroups are made anew, with no RT time
    kernel.log.clear()
    status, out, err = boot(state_dir, rebooted)
    assert (status, err) == (0, [])
    assert out == ["edgetune-boot: rt_budget: %s/ai.slice/cpu.rt_runtime_us: 0 -> 800000" % (rebooted / MOUNT),
                   "edgetune-boot: rt_budget: %s/ai.slice/ai-infer.slice/cpu.rt_runtime_us: 0 -> 800000"
                   % (rebooted / MOUNT)]
    assert budget(rebooted, "/ai.slice") == 800000 and budget(rebooted, "/ai.slice/ai-infer.slice") == 800000
    # Parents first, as the kernel requires (FakeKernel refuses the other order).
    assert [os.path.basename(d) for d, _v in kernel.log] == ["ai.slice", "ai-infer.slice"]
    # Applied: a second run writes nothing and says nothing.
    kernel.log.clear()
    assert boot(state_dir, rebooted) == (0, [], [])
    assert kernel.log == []


def test_boot_lowers_a_budget_the_leaf_only(device, kernel, tmp_path):
    edge_rt.run(str(device), "ai-infer.slice", 800000)
    kernel.log.clear()
    status, out, err = boot(save(tmp_path / "boot.d", {"slice": "ai-infer.slice", "runtime_us": 100000}).parent,
                            device)
    assert (status, err) == (0, [])
    assert out == ["edgetune-boot: rt_budget: %s/ai.slice/ai-infer.slice/cpu.rt_runtime_us: 800000 -> 100000"
                   % (device / MOUNT)]
    assert budget(device, "/ai.slice") == 800000 and budget(device, "/ai.slice/ai-infer.slice") == 100000


def test_boot_in_a_container_without_budget_fails_with_the_reason(container, kernel, tmp_path):
    status, out, err = boot(save(tmp_path / "boot.d", {"slice": "ai-infer.slice", "runtime_us": 800000}).parent,
                            container)
    assert status == 1 and out == [] and kernel.log == []
    assert len(err) == 1 and err[0].startswith("edgetune-boot: rt_budget: error: systemd runs in a container")
    assert "--cpu-rt-runtime" in err[0]
    assert budget(container, DOCKER + "/ai.slice/ai-infer.slice") == 0


def test_boot_with_the_slice_not_active_is_an_error(tmp_path, kernel):
    root = make_tree(tmp_path / "off", {"/": 950000, "/system.slice": 0})
    status, out, err = boot(save(tmp_path / "boot.d", {"slice": "ai-infer.slice", "runtime_us": 800000}).parent,
                            root)
    assert status == 1 and out == [] and kernel.log == []
    assert err == ["edgetune-boot: rt_budget: error: the slice's cpu cgroup %s does not exist: the slice must be "
                   "active and have a cpu setting (CPUQuota= or CPUWeight=) so that systemd creates it"
                   % (root / MOUNT / "ai.slice")]


def test_boot_with_a_zero_budget_says_sched_fifo_fails(device, kernel, tmp_path):
    status, out, err = boot(save(tmp_path / "boot.d", {"slice": "ai-infer.slice", "runtime_us": 0}).parent, device)
    assert status == 1 and out == [] and kernel.log == []
    assert err == ["edgetune-boot: rt_budget: error: the slice's RT budget is 0: SCHED_FIFO in it fails with EPERM"]


def test_boot_reports_the_levels_written_before_the_kernel_refused(device, tmp_path, monkeypatch):
    fake = FakeKernel()

    def refuse_the_leaf(path, value):
        if os.path.basename(os.path.dirname(path)) == "ai-infer.slice":
            raise OSError(errno.EBUSY, "Device or resource busy")
        fake(path, value)
    monkeypatch.setattr(edge_rt, "write_value", refuse_the_leaf)
    changes, errors = edge_rt.boot_apply({"slice": "ai-infer.slice", "runtime_us": 800000}, str(device))
    assert changes == ["%s/ai.slice/cpu.rt_runtime_us: 0 -> 800000" % (device / MOUNT)]
    assert errors == ["writing 800000 to %s/ai.slice/ai-infer.slice/cpu.rt_runtime_us failed: Device or resource "
                      "busy (the kernel refused: the budget does not fit its parent)" % (device / MOUNT)]
    assert budget(device, "/ai.slice") == 800000 and budget(device, "/ai.slice/ai-infer.slice") == 0


@pytest.mark.parametrize("settings, message", [
    ({"slice": "ai-infer.slice"}, "runtime_us must be a whole number of microseconds, 0 or more, not None"),
    ({"slice": "ai-infer.slice", "runtime_us": True}, "runtime_us must be a whole number of microseconds, 0 or "
                                                      "more, not True"),
    ({"slice": "ai-infer.slice", "runtime_us": -1}, "runtime_us must be a whole number"),
    ({"slice": "ai-infer.slice", "runtime_us": 800000.0}, "runtime_us must be a whole number"),
    ({"slice": "ai-infer.slice", "runtime_us": "800000"}, "runtime_us must be a whole number"),
    ({"slice": "ai-infer.service", "runtime_us": 1}, "slice: 'ai-infer.service' is not a slice unit name"),
    ({"slice": 7, "runtime_us": 1}, "slice must be a slice unit name (like ai-infer.slice), not 7"),
    ({"runtime_us": 1}, "slice must be a slice unit name (like ai-infer.slice), not None"),
])
def test_boot_apply_refuses_malformed_settings(device, kernel, settings, message):
    with pytest.raises(EdgeError) as refused:
        edge_rt.boot_apply(settings, str(device))
    assert len(refused.value.errors) == 1
    assert refused.value.errors[0].startswith("rt_budget settings: ") and message in refused.value.errors[0]
    assert kernel.log == []


def test_boot_apply_names_every_problem_of_the_settings(device, kernel):
    with pytest.raises(EdgeError) as refused:
        edge_rt.boot_apply({"slice": "ai", "runtime_us": False}, str(device))
    assert len(refused.value.errors) == 2
    with pytest.raises(EdgeError, match="must be a mapping"):
        edge_rt.boot_apply(["ai-infer.slice", 1], str(device))


def test_boot_with_malformed_settings_writes_nothing_and_says_why(device, kernel, tmp_path):
    state_dir = tmp_path / "boot.d"
    save(state_dir, {"slice": "ai-infer.slice", "runtime_us": True})
    status, out, err = boot(state_dir, device)
    assert status == 1 and out == [] and kernel.log == []
    assert err == ["edgetune-boot: rt_budget: error: rt_budget settings: runtime_us must be a whole number of "
                   "microseconds, 0 or more, not True"]


def _interpreters():
    return [sys.executable] + ([PY38] if os.path.exists(PY38) else [])


@pytest.mark.parametrize("python", _interpreters())
def test_boot_program_on_the_device_without_ansible(tmp_path, python):
    """As the role edge_boot installs it (the plan's files, in the collection's layout), run by the
    device's Python (3.8 too) with nothing else on its path."""
    root = make_tree(tmp_path / "boot", DEVICE)
    state_dir = tmp_path / "boot.d"
    save(state_dir, {"slice": "ai-infer.slice", "runtime_us": 800000})
    install = install_boot_program(tmp_path / "usr/local/lib/edgetune/boot")
    command = [python, "-m", edge_boot.PACKAGE + ".edge_boot", "--state-dir", str(state_dir), "--root", str(root)]
    done = subprocess.run(command, cwd=str(install), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, PYTHONPATH=""), check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "edgetune-boot: rt_budget: %s/ai.slice/cpu.rt_runtime_us: 0 -> 800000" % (root / MOUNT),
        "edgetune-boot: rt_budget: %s/ai.slice/ai-infer.slice/cpu.rt_runtime_us: 0 -> 800000" % (root / MOUNT)]
    assert budget(root, "/ai.slice/ai-infer.slice") == 800000


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
