# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's checks of the inference slice's live cgroup values (role edge_cgroups), from the
plan's slice part: one function, shared by the role (through the filter edge_slice_checks) and the
tests, in the check schema of plugins/module_utils/device/edge_audit.py (kind ``value`` and ``unsupported``).
Python 3.8+, stdlib only.

systemd writes a slice's settings into its cgroup: on the unified hierarchy cpu.weight, cpu.max,
memory.max, memory.high, io.weight, cpuset.cpus and cpuset.mems; on cgroup v1 or hybrid cpu.shares
(CPUWeight x 1024 / 100, 2-262144), cpu.cfs_quota_us, memory.limit_in_bytes and, where the kernel has
RT group scheduling and the slice got a budget, cpu.rt_runtime_us. The v2-only settings (AllowedCPUs,
AllowedMemoryNodes, MemoryHigh) are reported unsupported there, with the reason. IOWeight on v1
(blkio/bfq weights) is not checked.
"""
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_slice

CPU_PERIOD_US = 100000
SHARES_MIN, SHARES_MAX = 2, 262144
UNIFIED_ARG = "systemd.unified_cgroup_hierarchy=1"


def systemd_roots(proc1_cgroup):
    """{controller: the cgroup systemd (PID 1) runs its tree in}, from /proc/1/cgroup: its own cgroup
    less /init.scope ("" on a device; docker/<id> in a container on the host's tree); the unified
    hierarchy's key is ""."""
    roots = {}
    for line in (proc1_cgroup or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) < 3:
            continue
        root = re.sub(r"/init\.scope$", "", fields[2]).rstrip("/")
        for controller in (fields[1].split(",") if fields[1] else [""]):
            roots[controller] = root
    return roots


def slice_dir(name):
    """The slice's cgroup below systemd's: a-b.slice lives in a.slice (a.slice/a-b.slice)."""
    return edge_slice.slice_cgroup(name).lstrip("/")


def v2_only(slice_part):
    """The slice's settings that only the unified hierarchy enforces, as systemd writes them."""
    found = ["AllowedCPUs=%s" % slice_part["cpulist"]]
    if slice_part.get("numa_node") is not None:
        found.append("AllowedMemoryNodes=%s" % slice_part["numa_node"])
    if slice_part.get("memory_high"):
        found.append("MemoryHigh=%s" % slice_part["memory_high"])
    return found


def v2_only_reason(slice_part, mode, planned_args, cmdline):
    """Why the v2-only settings are not enforced in this cgroup ``mode``, and what enforces them. The
    same words before and after the apply's own reboot (they are recorded: a reboot must not change
    the record); whether the boot argument still waits for its reboot is its own check's."""
    if UNIFIED_ARG in (planned_args or []):
        fix = ("role edge_bootargs adds %s: booted with it, systemd mounts the unified hierarchy (a container "
               "shares its host's and stays %s)" % (UNIFIED_ARG, mode))
    elif UNIFIED_ARG in (cmdline or "").split():
        fix = ("the kernel was booted with %s, but systemd still mounts the %s hierarchy (a container shares "
               "its host's)" % (UNIFIED_ARG, mode))
    else:
        fix = "set edge_bootargs_cgroup_v2: true (adds %s)" % UNIFIED_ARG
    return ("cgroup mode is %s: systemd enforces CPUWeight, CPUQuota, MemoryMax and IOWeight of %s here, but %s and "
            "the AllowedCPUs drop-ins of system.slice, user.slice and init.scope are cgroup-v2 settings and are NOT "
            "enforced. CPU confinement uses CPUAffinity= instead (system.conf.d for the system, the unit for the "
            "probe; a service in the slice needs its own CPUAffinity=%s). To enforce them boot with the unified "
            "hierarchy: %s." % (mode, slice_part["name"], ", ".join(v2_only(slice_part)), slice_part["cpulist"], fix))


def _memory(given, size):
    """(desired, compare) of a memory limit: NN% is systemd's to resolve against the RAM of the day."""
    if re.match(r"^[0-9.]+%$", str(given or "")):
        return str(given), "ram-share"
    return str(size) if size is not None else "max", "bytes"


def value_checks(slice_part, proc1_cgroup, rt_budget=False, mode=None, planned_args=(), cmdline=""):
    """The checks of the slice's live cgroup values. ``slice_part``: the plan's slice part;
    ``proc1_cgroup``: the device's /proc/1/cgroup; ``rt_budget``: whether the slice has an RT
    budget of its own in a cgroup file (v1 RT group scheduling, ready); ``mode``, ``planned_args``
    and ``cmdline``: the cgroup mode, the plan's boot arguments and the running ones, for the reason
    the v2-only settings are not enforced."""
    roots = systemd_roots(proc1_cgroup)
    name = slice_part["name"]
    below = slice_dir(name)
    quota = str(slice_part.get("cpu_quota") or "")
    quota_us = int(quota[:-1]) * CPU_PERIOD_US // 100 if quota.endswith("%") else None
    checks = []

    def value(setting, controller, filename, desired, compare="text"):
        base = "/sys/fs/cgroup" + ("/" + controller if controller else "") + roots.get(controller, "")
        checks.append({"setting": "%s %s" % (name, setting), "role": "edge_cgroups", "kind": "value",
                       "path": "%s/%s/%s" % (base, below, filename), "desired": str(desired), "compare": compare})

    def memory(setting, controller, filename, given, size):
        desired, compare = _memory(given, size)
        value(setting, controller, filename, desired, compare)

    if slice_part.get("v1"):
        shares = max(SHARES_MIN, min(SHARES_MAX, int(slice_part["cpu_weight"] * 1024 / 100)))
        value("CPUWeight", "cpu", "cpu.shares", shares)
        value("CPUQuota", "cpu", "cpu.cfs_quota_us", quota_us if quota_us is not None else -1)
        if slice_part.get("memory_max_bytes") is not None:
            memory("MemoryMax", "memory", "memory.limit_in_bytes", slice_part.get("memory_max"),
                   slice_part["memory_max_bytes"])
        if rt_budget:
            value("RT budget", "cpu", "cpu.rt_runtime_us", slice_part["rt_runtime_us"])
        checks.append({"setting": "%s %s" % (name, ", ".join(item.split("=")[0] for item in v2_only(slice_part))),
                       "role": "edge_cgroups", "kind": "unsupported",
                       "reason": v2_only_reason(slice_part, mode or slice_part.get("cgroup"), planned_args, cmdline)})
        return checks
    value("CPUWeight", "", "cpu.weight", slice_part["cpu_weight"])
    value("CPUQuota", "", "cpu.max", "%s %d" % (quota_us if quota_us is not None else "max", CPU_PERIOD_US))
    memory("MemoryMax", "", "memory.max", slice_part.get("memory_max"), slice_part.get("memory_max_bytes"))
    memory("MemoryHigh", "", "memory.high", slice_part.get("memory_high"), slice_part.get("memory_high_bytes"))
    value("IOWeight", "", "io.weight", "default %s" % slice_part["io_weight"])
    value("AllowedCPUs", "", "cpuset.cpus", slice_part["cpulist"], "cpulist")
    if slice_part.get("numa_node") is not None:
        value("AllowedMemoryNodes", "", "cpuset.mems", slice_part["numa_node"], "cpulist")
    return checks
