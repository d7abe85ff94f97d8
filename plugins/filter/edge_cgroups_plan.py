# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation of the inference slice's settings (controller side, role edge_cgroups).

One filter, ``edge_cgroups_plan``, checks every setting against the board
(the slice's CPUs, the RAM, the RT throttle) before the role changes anything,
and returns the values the unit files get. All problems are reported at once.
"""
import re

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: edge_cgroups_plan
short_description: Validate the inference slice's settings and resolve auto values
description:
  - Takes the role's settings and the board's numbers; returns the values for the slice unit.
  - Fails with one message listing every problem (a quota above what the slice's CPUs can give,
    a memory limit above the RAM, an RT budget not below the kernel's, ...).
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input
options:
  _input:
    description: >-
      A dict with slice, cpus (list of the slice's CPUs), cpulist, cpu_weight, cpu_quota,
      memory_max, memory_high, io_weight, rt_runtime_us, rt_global (kernel.sched_rt_runtime_us),
      ram_bytes, probe_priority.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Check the slice settings against the board
  ansible.builtin.set_fact:
    plan: >-
      {{ {'slice': 'ai-infer.slice', 'cpus': [4, 5, 6, 7], 'cpulist': '4-7', 'cpu_weight': 1000,
          'cpu_quota': 'auto', 'memory_max': '75%', 'memory_high': '', 'io_weight': 1000,
          'rt_runtime_us': 0, 'rt_global': 950000, 'ram_bytes': 16777216000,
          'probe_priority': 40} | edgetune.fleet.edge_cgroups_plan }}
"""

RETURN = r"""
_value:
  description:
    - C(cpu_quota) (V(auto) resolved to 100% per CPU of the slice, or empty), C(memory_max) and
      C(memory_high) as given, and C(memory_max_bytes) and C(memory_high_bytes) (null for no limit).
  type: dict
"""

_SLICE = re.compile(r"^[A-Za-z0-9:_.]+(-[A-Za-z0-9:_.]+)*\.slice$")
_RESERVED = ("-.slice", "system.slice", "user.slice", "machine.slice")
_SIZE = re.compile(r"^([0-9]+)([KMGT]?)$")
_PERCENT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)%$")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def memory_bytes(value, ram):
    """systemd's memory forms -> bytes (None for no limit). ValueError when malformed."""
    text = str(value if value is not None else "").strip()
    if text in ("", "infinity"):
        return None
    match = _PERCENT.match(text)
    if match:
        percent = float(match.group(1))
        if percent > 100:
            raise ValueError("%s is more than 100%% of the RAM" % text)
        return int(ram * percent / 100)
    match = _SIZE.match(text)
    if match:
        return int(match.group(1)) * _UNITS[match.group(2)]
    raise ValueError("%r is not NN%%, bytes with an optional K/M/G/T suffix, infinity or empty" % text)


def _human(size):
    for unit in ("T", "G", "M", "K"):
        if size >= _UNITS[unit]:
            return "%.1f%siB" % (size / _UNITS[unit], unit)
    return "%d bytes" % size


def edge_cgroups_plan(settings):
    s = dict(settings)
    errors = []
    cpus = list(s.get("cpus") or [])
    slice_name = str(s.get("slice", ""))
    if not _SLICE.match(slice_name) or slice_name in _RESERVED:
        errors.append("edge_cgroups_slice %r is not a slice of its own (name.slice; not %s)"
                      % (slice_name, ", ".join(_RESERVED)))
    if not cpus:
        errors.append("the slice has no CPUs (no inference CPUs in edge_bootargs_cpus)")
    for key in ("cpu_weight", "io_weight"):
        value = s.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 10000:
            errors.append("edge_cgroups_%s %r must be 1-10000" % (key, value))

    quota = str(s.get("cpu_quota", "")).strip()
    if quota == "auto":
        quota = "%d%%" % (100 * len(cpus)) if cpus else ""
    if quota:
        match = re.match(r"^([0-9]+)%$", quota)
        if not match or int(match.group(1)) < 1:
            errors.append("edge_cgroups_cpu_quota %r is not auto, empty or NNN%% (at least 1%%)" % quota)
        elif int(match.group(1)) > 100 * len(cpus):
            errors.append("edge_cgroups_cpu_quota %s is more than the %d CPU(s) of the slice (%s) can give: "
                          "at most %d%%" % (quota, len(cpus), s.get("cpulist", ""), 100 * len(cpus)))

    ram = int(s.get("ram_bytes") or 0)
    limits = {}
    for key in ("memory_max", "memory_high"):
        value = s.get(key)
        try:
            limits[key] = memory_bytes(value, ram)
        except ValueError as exc:
            errors.append("edge_cgroups_%s: %s" % (key, exc))
            continue
        if limits[key] is not None and ram and limits[key] > ram:
            errors.append("edge_cgroups_%s %s (%s) is more than the RAM (%s)" % (key, value, _human(limits[key]),
                                                                                 _human(ram)))
        if limits[key] is not None and limits[key] < 16 * _UNITS["M"]:
            errors.append("edge_cgroups_%s %s is below 16 MiB: nothing would run in the slice" % (key, value))
    if limits.get("memory_max") is not None and limits.get("memory_high") is not None \
            and limits["memory_high"] > limits["memory_max"]:
        errors.append("edge_cgroups_memory_high %s is above edge_cgroups_memory_max %s"
                      % (s.get("memory_high"), s.get("memory_max")))

    runtime, ceiling = s.get("rt_runtime_us"), s.get("rt_global")
    if not isinstance(runtime, int) or isinstance(runtime, bool) or runtime < 0:
        errors.append("edge_cgroups_rt_runtime_us %r must be a number of microseconds, 0 or more" % (runtime,))
    elif isinstance(ceiling, int) and ceiling >= 0 and runtime >= ceiling:
        errors.append("edge_cgroups_rt_runtime_us %d must be below kernel.sched_rt_runtime_us (%d): the slice cannot "
                      "hold as much RT time as the whole system" % (runtime, ceiling))
    priority = s.get("probe_priority")
    if not isinstance(priority, int) or isinstance(priority, bool) or not 1 <= priority <= 99:
        errors.append("edge_cgroups_probe_priority %r must be 1-99" % (priority,))
    if errors:
        raise AnsibleFilterError("Invalid slice settings, nothing was changed: " + "; ".join(errors))
    return {
        "cpu_quota": quota,
        "memory_max": str(s.get("memory_max") or "").strip(),
        "memory_high": str(s.get("memory_high") or "").strip(),
        "memory_max_bytes": limits.get("memory_max"),
        "memory_high_bytes": limits.get("memory_high"),
    }


class FilterModule(object):
    def filters(self):
        return {"edge_cgroups_plan": edge_cgroups_plan}
