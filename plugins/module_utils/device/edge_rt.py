# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A systemd slice's real-time budget (cpu.rt_runtime_us) on cgroup v1 with RT group scheduling.

Read by the edge_cgroup_rt module and by the boot program (edge_boot, kind
``rt_budget``): where systemd's root cgroup and the slice's cpu cgroups are
(/proc/self/mountinfo, /proc/1/cgroup), whether the slice's budget fits its
parents (the kernel's rule, kernel/sched/rt.c tg_rt_schedulable: the children
of a cgroup together hold no more RT time than the cgroup), the writes, parents
first when raising, and the values read back.

Runs on the device (Python 3.8+, stdlib only).
"""

import errno
import os
import re
from fractions import Fraction

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_slice import slice_cgroup
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import (
    read_kernel_value as read_value, under, write_kernel_value as write_value)

RUNTIME = "cpu.rt_runtime_us"
PERIOD = "cpu.rt_period_us"


# --------------------------------------------------------------------------
# Where things are

def _unescape(field):
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text):
    """-> list of dicts: point, root (of the mount inside the hierarchy), fstype, options (set)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mounts.append({"point": _unescape(fields[4]), "root": _unescape(fields[3]), "fstype": tail[0],
                       "options": set(tail[2].split(","))})
    return mounts


def systemd_root(text):
    """systemd's root cgroup from /proc/1/cgroup: its own cgroup minus /init.scope."""
    named = unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "name=systemd":
            named = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            unified = parts[2]
    path = named if named is not None else unified
    if path is None:
        raise EdgeError("cannot find systemd's cgroup in /proc/1/cgroup")
    if path.endswith("/init.scope"):
        path = path[:-len("/init.scope")]
    return path or "/"


def fs_path(mount, cgroup):
    """A cgroup path (as /proc/<pid>/cgroup prints it) inside a mounted hierarchy."""
    root = mount["root"].rstrip("/")
    if root and (cgroup == root or cgroup.startswith(root + "/")):
        cgroup = cgroup[len(root):]
    return os.path.join(mount["point"], cgroup.lstrip("/")).rstrip("/") or "/"


def ancestors(cgroup):
    """'/a.slice/a-b.slice' -> ['/a.slice', '/a.slice/a-b.slice']."""
    parts = [p for p in cgroup.split("/") if p]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


# --------------------------------------------------------------------------
# Budgets

def read_budget(directory):
    return int(read_value(os.path.join(directory, RUNTIME))), int(read_value(os.path.join(directory, PERIOD)))


def bandwidth(runtime, period):
    """The kernel's view: runtime -1 means unlimited (the whole period)."""
    return Fraction(1) if runtime < 0 else Fraction(runtime, period)


def children_bandwidth(directory, skip=None):
    total = Fraction(0)
    for entry in sorted(os.listdir(directory)):
        child = os.path.join(directory, entry)
        if child == skip or not os.path.isfile(os.path.join(child, RUNTIME)):
            continue
        total += bandwidth(*read_budget(child))
    return total


def _us(fraction, period):
    return -(-fraction.numerator * period // fraction.denominator)  # ceiling


def plan_v1(mount, sysroot, slice_path, runtime_us, assume_missing=False):
    """Levels [(path, before, after, period)] and the parent's numbers; EdgeError on impossible input.

    A cgroup of the chain that does not exist yet is an EdgeError with the detail
    ``missing_cgroup`` (its path), unless ``assume_missing`` (check mode): then it is planned as
    the kernel makes a new one, with no RT time, its parent's period and no children, so that
    check mode decides as the real run will after the slice has started."""
    root_dir = fs_path(mount, sysroot)
    chain = [fs_path(mount, sysroot.rstrip("/") + p) for p in ancestors(slice_path)]
    missing = [d for d in chain if not os.path.isfile(os.path.join(d, RUNTIME))]
    if missing and not assume_missing:
        raise EdgeError("the slice's cpu cgroup %s does not exist: the slice must be active and have a cpu "
                        "setting (CPUQuota= or CPUWeight=) so that systemd creates it" % missing[0],
                        missing_cgroup=missing[0])
    budgets = []
    for directory in chain:
        parent_period = budgets[-1][1] if budgets else read_budget(root_dir)[1]
        budgets.append((0, parent_period) if directory in missing else read_budget(directory))
    leaf_period = budgets[-1][1]
    if runtime_us < 0 or runtime_us >= leaf_period:
        raise EdgeError("runtime_us %d must be at least 0 and below the period (%d us) so that RT tasks "
                        "cannot starve the CPUs" % (runtime_us, leaf_period))
    held = children_bandwidth(chain[-1]) if chain[-1] not in missing else Fraction(0)
    if held > Fraction(runtime_us, leaf_period):
        raise EdgeError("the cgroups inside %s already hold %d us of RT time; %d us is too little"
                        % (chain[-1], _us(held, leaf_period), runtime_us))
    need = [None] * len(chain)
    need[-1] = Fraction(runtime_us, leaf_period)
    for i in range(len(chain) - 2, -1, -1):
        others = children_bandwidth(chain[i], skip=chain[i + 1]) if chain[i] not in missing else Fraction(0)
        need[i] = max(bandwidth(*budgets[i]), others + need[i + 1])
    root_runtime, root_period = read_budget(root_dir)
    others = children_bandwidth(root_dir, skip=chain[0])
    parent = {"path": root_dir, "runtime_us": root_runtime, "period_us": root_period,
              "others_us": _us(others, root_period)}
    fits = others + need[0] <= bandwidth(root_runtime, root_period)
    levels = [{"path": d, "before": b[0], "after": _us(n, b[1]) if i < len(chain) - 1 else runtime_us,
               "period": b[1]} for i, (d, b, n) in enumerate(zip(chain, budgets, need))]
    return levels, parent, fits, missing


def not_fitting_reason(parent, sysroot, runtime_us, in_container):
    if in_container and parent["runtime_us"] == 0:
        return ("systemd runs in a container whose cpu cgroup %s has cpu.rt_runtime_us=0, and a container "
                "cannot raise its own budget: SCHED_FIFO in the slice fails with EPERM. Give the container an "
                "RT budget when it is started: dockerd --cpu-rt-runtime=950000 (the daemon's parent cgroup) and "
                "docker run --cpu-rt-runtime=%d (or more) for the container."
                % (parent["path"], runtime_us))
    return ("%s has %d us of RT time per %d us and its other children hold %d us: %d us more for the slice "
            "does not fit; lower the slice's budget, or raise kernel.sched_rt_runtime_us (still below the period)."
            % (parent["path"], parent["runtime_us"], parent["period_us"], parent["others_us"], runtime_us))


def apply_levels(levels):
    """Raise parents first; a lowered leaf goes last. Read every value back.

    EdgeError on a refused write (detail ``levels``: the levels written before it) or a value
    that does not read back (``levels``: every level)."""
    order = [lv for lv in levels if lv["after"] > lv["before"]] + \
            [lv for lv in reversed(levels) if lv["after"] < lv["before"]]
    done = []
    for level in order:
        path = os.path.join(level["path"], RUNTIME)
        try:
            write_value(path, level["after"])
        except OSError as exc:
            hint = " (the kernel refused: the budget does not fit its parent)" if exc.errno in (
                errno.EINVAL, errno.EBUSY) else ""
            raise EdgeError("writing %d to %s failed: %s%s" % (level["after"], path, exc.strerror or exc, hint),
                            levels=done) from None
        done.append(level)
    for level in levels:
        path = os.path.join(level["path"], RUNTIME)
        value = int(read_value(path))
        if value != level["after"]:
            raise EdgeError("%s reads %d after writing %d" % (path, value, level["after"]), levels=levels)


def run(root="/", slice_name="", runtime_us=0, rt_group_sched=None, check_mode=False):
    """Returns the result dict (ready, mode, reason, levels, ...). EdgeError on bad input or a failed write."""
    slice_path = slice_cgroup(slice_name)
    try:
        mounts = parse_mountinfo(read_value(under(root, "proc/self/mountinfo")))
        sysroot = systemd_root(read_value(under(root, "proc/1/cgroup")))
    except OSError as exc:
        raise EdgeError("cannot read the cgroup mounts: %s" % exc) from None
    for mount in mounts:
        mount["point"] = under(root, mount["point"])
    cpu = next((m for m in mounts if m["fstype"] == "cgroup" and "cpu" in m["options"]), None)
    result = {"in_container": sysroot != "/", "levels": [], "slice_cgroup": slice_path}
    if cpu is None:
        if not any(m["fstype"] == "cgroup2" for m in mounts):
            raise EdgeError("no cgroup v1 cpu controller and no cgroup v2 mount found in /proc/self/mountinfo")
        if rt_group_sched:
            result.update(mode="v2-rt-group", ready=False, reason=(
                "cgroup v2 with RT group scheduling (CONFIG_RT_GROUP_SCHED): v2 has no RT budget file, every cgroup "
                "with the cpu controller has 0 RT time, so SCHED_FIFO in %s fails with EPERM while the slice has "
                "CPUQuota=/CPUWeight=. Use a kernel without CONFIG_RT_GROUP_SCHED (6.16+: boot with "
                "rt_group_sched=0), or leave the slice without cpu settings." % slice_name))
        elif rt_group_sched is None:
            result.update(mode="v2-unknown", ready=True, reason=(
                "cgroup v2; whether the kernel has RT group scheduling is unknown (no /proc/config.gz): "
                "SCHED_FIFO works in the slice only without CONFIG_RT_GROUP_SCHED"))
        else:
            result.update(mode="v2", ready=True, reason=(
                "cgroup v2 without RT group scheduling: SCHED_FIFO works in any cgroup, throttled by "
                "kernel.sched_rt_runtime_us"))
        return result
    if not os.path.isfile(os.path.join(cpu["point"], RUNTIME)):
        result.update(mode="no-rt-group", ready=True, reason=(
            "no RT group scheduling (no %s in the cpu controller): SCHED_FIFO works in any cgroup, throttled by "
            "kernel.sched_rt_runtime_us" % RUNTIME))
        return result
    result["mode"] = "v1-rt-group"
    try:
        levels, parent, fits, missing = plan_v1(cpu, sysroot, slice_path, runtime_us, assume_missing=check_mode)
    except OSError as exc:
        raise EdgeError("reading the RT budgets failed: %s" % exc) from None
    result.update(parent=parent)
    if missing and fits:
        # A real run starts the slice first, then sets the budget; check mode cannot start it.
        for level in levels:
            level.pop("period")
        result.update(ready=False, pending=True, levels=levels, reason=(
            "check mode: the slice's cpu cgroup %s does not exist yet; a real run starts the slice and then gives "
            "it %d us of RT time per period" % (missing[0], runtime_us)))
        return result
    if not fits:
        result.update(ready=False, reason=not_fitting_reason(parent, sysroot, runtime_us, result["in_container"]),
                      levels=[dict(lv, after=lv["before"]) for lv in levels])
        for level in result["levels"]:
            level.pop("period")
        return result
    if not check_mode:
        apply_levels(levels)
    for level in levels:
        level.pop("period")
    result.update(levels=levels, ready=runtime_us > 0, reason=(
        "cgroup v1 with RT group scheduling: %s gets %d us of RT time per period (parents first along %s)"
        % (slice_name, runtime_us, slice_path) if runtime_us > 0 else
        "the slice's RT budget is 0: SCHED_FIFO in it fails with EPERM"))
    return result


# --------------------------------------------------------------------------
# Boot-time re-apply (edge_boot, kind rt_budget)

def boot_settings(slice_name, runtime_us):
    """The settings of the rt_budget state file (what boot_apply takes)."""
    return {"slice": slice_name, "runtime_us": runtime_us}


def _changed_lines(levels):
    return ["%s/%s: %d -> %d" % (lv["path"], RUNTIME, lv["before"], lv["after"])
            for lv in levels if lv["after"] != lv["before"]]


def boot_apply(settings, root):
    """Give the slice its RT budget again (a slice's cgroup is made anew at every boot, with none).

    ``settings``: {"slice": "ai-infer.slice", "runtime_us": 800000}. Returns (changes, errors): a
    line per cpu.rt_runtime_us written, and an error when the budget cannot be given (the slice is
    not active, the budget does not fit) or the slice still cannot run SCHED_FIFO (with the reason).
    EdgeError for malformed settings."""
    problems = []
    if not isinstance(settings, dict):
        raise EdgeError("rt_budget settings must be a mapping with slice and runtime_us, not %r" % (settings,))
    name = settings.get("slice")
    if not isinstance(name, str):
        problems.append("rt_budget settings: slice must be a slice unit name (like ai-infer.slice), not %r"
                        % (name,))
    else:
        try:
            slice_cgroup(name)
        except EdgeError as exc:
            problems.append("rt_budget settings: slice: %s" % exc)
    runtime_us = settings.get("runtime_us")
    if not isinstance(runtime_us, int) or isinstance(runtime_us, bool) or runtime_us < 0:
        problems.append("rt_budget settings: runtime_us must be a whole number of microseconds, 0 or more, not %r"
                        % (runtime_us,))
    if problems:
        raise EdgeError(problems)
    try:
        result = run(root, name, runtime_us, None, False)
    except EdgeError as exc:
        return _changed_lines(exc.details.get("levels") or []), exc.errors
    changes = _changed_lines(result["levels"])
    if not result["ready"]:
        return changes, [result["reason"]]
    return changes, []
