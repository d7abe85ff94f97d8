"""edge_cgroup_rt against the real kernel's RT group scheduling (cgroup v1 cpu controller).

The device twins cannot show SCHED_FIFO working: their Docker cgroup has no RT
time (cpu.rt_runtime_us = 0) and the engine that runs them must not be
restarted. This test shows the module's code path on the host's own kernel
instead, in a cgroup tree it makes and removes: a parent standing for
systemd's root (given a small budget, as dockerd --cpu-rt-runtime gives its
parent cgroup), the slice's ai.slice/ai-infer.slice below it, written by the
module, then a process moved into the slice really gets SCHED_FIFO while one in
a sibling cgroup without budget gets EPERM. The budgets are 1-2% of one second
and everything is removed at the end.

Needs root and a cgroup v1 cpu controller with cpu.rt_runtime_us; skipped with
the reason otherwise.
"""
import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins/modules"))
pytestmark = pytest.mark.controller

PARENT_BUDGET = 20000
SLICE_BUDGET = 10000


def _cpu_mount():
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if tail and tail[0] == "cgroup" and "cpu" in tail[2].split(",") and fields[3] == "/":
            return Path(fields[4])
    return None


def _why_not():
    if os.geteuid() != 0:
        return "needs root to make cgroups"
    mount = _cpu_mount()
    if mount is None:
        return "no cgroup v1 cpu controller mounted at its root"
    if not (mount / "cpu.rt_runtime_us").exists():
        return "the kernel has no RT group scheduling (no cpu.rt_runtime_us)"
    runtime = int((mount / "cpu.rt_runtime_us").read_text())
    held = sum(int((d / "cpu.rt_runtime_us").read_text()) for d in mount.iterdir()
               if (d / "cpu.rt_runtime_us").exists())
    if runtime >= 0 and runtime - held < PARENT_BUDGET:
        return "the root cpu cgroup has no %d us of RT time left" % PARENT_BUDGET
    return None


@pytest.fixture
def tree(tmp_path):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    mount = _cpu_mount()
    top = mount / ("edgetune-rt-test-%d" % os.getpid())
    top.mkdir()
    children = []
    try:
        (top / "cpu.rt_runtime_us").write_text("%d\n" % PARENT_BUDGET)
        (top / "ai.slice" / "ai-infer.slice").mkdir(parents=True)
        (top / "other.slice").mkdir()
        # The module's view: /proc/1/cgroup says systemd's root is the test's parent cgroup.
        fake = tmp_path / "root"
        (fake / "proc/self").mkdir(parents=True)
        (fake / "proc/1").mkdir(parents=True)
        (fake / "proc/self/mountinfo").write_text(Path("/proc/self/mountinfo").read_text())
        (fake / "proc/1/cgroup").write_text("1:name=systemd:/%s/init.scope\n" % top.name)
        (fake / "sys").symlink_to("/sys")
        yield {"root": fake, "top": top, "children": children}
    finally:
        for child in children:
            child.kill()
            child.wait()
        for directory in (top / "ai.slice" / "ai-infer.slice", top / "ai.slice", top / "other.slice", top):
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # tasks of a killed child leave the cgroup asynchronously


def _sleeper(tree, cgroup):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tree["children"].append(child)
    (cgroup / "cgroup.procs").write_text("%d\n" % child.pid)
    return child


def _policy(pid):
    return int(Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[41 - 3])


def _set_fifo(pid):
    libc = ctypes.CDLL(None, use_errno=True)
    param = ctypes.c_int(1)
    if libc.sched_setscheduler(pid, 1, ctypes.byref(param)) != 0:  # SCHED_FIFO, priority 1
        return ctypes.get_errno()
    return 0


def test_fifo_works_in_the_slice_only_after_the_module_gave_it_a_budget(tree):
    import edge_cgroup_rt as rt

    slice_dir = tree["top"] / "ai.slice" / "ai-infer.slice"
    before = _sleeper(tree, slice_dir)
    assert _set_fifo(before.pid) == 1  # EPERM: the slice has cpu.rt_runtime_us = 0

    result = rt.run(str(tree["root"]), "ai-infer.slice", SLICE_BUDGET)
    assert result["ready"] is True and result["mode"] == "v1-rt-group" and result["in_container"] is True
    assert int((tree["top"] / "ai.slice" / "cpu.rt_runtime_us").read_text()) == SLICE_BUDGET
    assert int((slice_dir / "cpu.rt_runtime_us").read_text()) == SLICE_BUDGET

    assert _set_fifo(before.pid) == 0
    assert _policy(before.pid) == 1
    other = _sleeper(tree, tree["top"] / "other.slice")
    assert _set_fifo(other.pid) == 1  # the sibling without budget still refuses


def test_a_budget_larger_than_the_parent_holds_is_reported_not_written(tree):
    import edge_cgroup_rt as rt

    result = rt.run(str(tree["root"]), "ai-infer.slice", PARENT_BUDGET + 10000)
    assert result["ready"] is False
    assert "does not fit" in result["reason"]
    assert int((tree["top"] / "ai.slice" / "cpu.rt_runtime_us").read_text()) == 0
