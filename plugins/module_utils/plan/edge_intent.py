# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inventory's intent, validated before anything changes (controller side).

Pure functions: the action plugin edgetune.fleet.edge_validate (the
preflight's validation step, and each role's own start-of-role check) and the
filters edge_cpu_partition and edge_cgroups_plan call them, and the unit tests
call them directly with the real board profiles. Nothing here reads a device:
the board is what edge_facts read (``ansible_facts.edge``) and the matched
profile (``edge_facts_profile``); a systemd calendar is checked through the
``calendar`` callable the caller passes (systemd-analyze on the controller or,
read-only, on the device).

:func:`validate` checks every option of every role at once against the types
of the roles' ``meta/argument_specs.yml`` (strictly: a string is never taken
for a boolean or a list), the ranges, and the board, and returns ONE message
per bad variable naming it, its value and what is allowed, so that a run stops
before its first change with every problem listed.

Python 3.8+, stdlib only (it also imports the collection's other module_utils).
"""
import difflib
import json
import os
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact as artifact
from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_autotune
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_dvfs as dvfs
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader as netqos
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_numa as numa
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_pcie as pcie
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist, parse_cpulist
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_package as package

# Variables of the playbooks themselves (not of a role), in the argument spec form.
PLAYBOOK_OPTIONS = {
    "edge_mode": {"type": "str", "default": "apply", "choices": ["apply", "audit"],
                  "description": "apply, or audit (the preflight of playbooks/audit.yml: no artifacts are checked)"},
    "edge_reboot_policy": {"type": "str", "default": "auto", "choices": ["auto", "never"]},
    "edge_reboot_serial": {"type": "raw", "default": "100%"},
    "edge_reboot_max_fail_percentage": {"type": "int", "default": 0},
    "edge_reboot_timeout": {"type": "int", "default": 600},
    "edge_deploy_serial": {"type": "raw", "default": 1},
    "edge_deploy_max_fail_percentage": {"type": "int", "default": 0},
    "edge_converge_full": {"type": "bool", "default": False,
                           "description": "run every role in full, also those whose last apply is current and holds "
                                          "(as --tags full)"},
    "edge_lease_wait": {"type": "int", "default": 600,
                        "description": "seconds an apply waits for another apply's lease on the device"},
    "edge_lease_ttl": {"type": "int", "default": 3600,
                       "description": "seconds an apply's lease on the device is valid (longer than the run)"},
    "edge_runtime_autotune_forget": {"type": "bool", "default": False,
                                     "description": "deploy.yml removes the runtime's autotune record first, so "
                                                    "that the plan's defaults apply (edgetune tune runtime --forget)"},
}
PLAYBOOKS = "playbooks"
# Variables that moved: read under the old name (with a warning) until 0.4.0
# when the new one keeps its default. The CPU split is role edge_cpu's intent.
DEPRECATED = {"edge_bootargs_isolate": "edge_cpu_isolate",
              "edge_bootargs_housekeeping": "edge_cpu_housekeeping",
              "edge_bootargs_allow_cpu0": "edge_cpu_allow_cpu0"}
DEPRECATED_UNTIL = "0.4.0"
# Variables an edgetune release no longer reads, and why (a warning names them).
REMOVED = dict.fromkeys(
    ("edge_cpu_lib_dir", "edge_cpu_state_file", "edge_power_state_file", "edge_pcie_qos_state_file",
     "edge_cgroups_state_file"),
    "the settings a reboot loses are saved in /etc/edgetune/boot.d and re-applied by edgetune-boot.service "
    "(role edge_boot), whose program is the device package's (role edge_package)")
REMOVED.update(dict.fromkeys(
    ("edge_boot_install_dir", "edge_audit_timer_install_dir", "edge_netqos_install_dir"),
    "the boot program, the audit command and the network priority loader are one device package, installed "
    "by role edge_package in edge_package_install_dir"))
# The CPU split: typed and checked whenever a role that uses it is checked.
CPU_OPTIONS = ("edge_cpu_isolate", "edge_cpu_housekeeping", "edge_cpu_allow_cpu0")
CPU_ROLES = ("edge_bootargs", "edge_cpu", "edge_cgroups", "edge_power", "edge_runtime")
# The inference slice has one name, role edge_cgroups's (the plan gives it to the
# runtime and to the classifier); the roles that use it get it checked with them.
# Their old names for it are read only to refuse another value: unset or "" is
# fine, and so is the same name.
SLICE_OPTION = "edge_cgroups_slice"
SLICE_ALIASES = {"edge_runtime_slice": "edge_runtime", "edge_netqos_cgroup": "edge_netqos"}
# Set by the playbooks while they run (never intent).
PLAYBOOK_EXPORTS = ("edge_reboot_reasons", "edge_reboot_result", "edge_reboot_verify", "edge_audit_result",
                    # Facts of edge_facts and edge_plan, which Ansible also sets as variables.
                    "edge_applied", "edge_autotune", "edge_plan")

# A file or directory on the device: absolute, normalized, and nothing a unit
# file or a shell would read differently (no spaces, no %, no quotes).
_DEVICE_PATH = re.compile(r"^(/[A-Za-z0-9._+@:=,-]+)+$")
_SLICE = re.compile(r"^[A-Za-z0-9:_.]+(-[A-Za-z0-9:_.]+)*\.slice$")
_RESERVED_SLICES = ("-.slice", "system.slice", "user.slice", "machine.slice")
_SIZE = re.compile(r"^([0-9]+)([KMGT]?)$")
_PERCENT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)%$")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}
_TIMESPAN = re.compile(
    r"^(\s*\d+(\.\d+)?\s*(usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|"
    r"weeks|week|w|months|month|M|years|year|y)?)+\s*$")
_LIMIT = re.compile(r"^(infinity|[0-9]+[KMGTPE]?)$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*$")
_IPV4 = re.compile(r"^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$")
_ENV_NAME = re.compile(r"^(EDGETUNE|LLAMA_ARG)_[A-Z0-9_]+$")
_SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
# Written by edge_runtime's template from their own variables.
_RUNTIME_ENV_OWN = {"EDGETUNE_HOST": "edge_runtime_host", "EDGETUNE_PORT": "edge_runtime_port",
                    "EDGETUNE_HTTP_THREADS": "edge_runtime_http_threads",
                    "EDGETUNE_INFER_THREADS": "edge_runtime_infer_threads",
                    "EDGETUNE_EXPECT_SCHED": "edge_runtime_sched_policy", "EDGETUNE_MLOCK": "edge_runtime_mlock",
                    "LLAMA_ARG_HOST": "edge_runtime_host", "LLAMA_ARG_PORT": "edge_runtime_port",
                    "LLAMA_ARG_THREADS": "the plan (edge_runtime_cpus: one thread per inference CPU)",
                    "LLAMA_ARG_THREADS_HTTP": "edge_runtime_http_threads",
                    "LLAMA_ARG_CTX_SIZE": "edge_runtime_ctx_size",
                    "LLAMA_ARG_N_PARALLEL": "the role (one slot: the gates measure one stream)",
                    "LLAMA_ARG_MODEL": "the engine artifact (edge_runtime_engine_src)",
                    "LLAMA_ARG_LOAD_MODE": "edge_runtime_mlock"}
_MAX_SHOWN = 120


class IntentError(BadInput):
    """A bad value; ``variable`` names the variable it belongs to."""

    def __init__(self, message, variable=None):
        super(IntentError, self).__init__(message)
        self.variable = variable


class _Bad(Exception):
    """A type problem found while reading a value (internal)."""


def show(value):
    """A value as the message shows it: JSON, cut when long."""
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 3] + "..."


# --------------------------------------------------------------------------
# Types, strictly

_TYPE_WORDS = {"str": "a string", "path": "a path (a string)", "int": "an integer", "float": "a number",
               "bool": "true or false (a YAML boolean, not a string)", "list": "a list", "dict": "a mapping",
               "raw": "any value"}


def allowed(spec):
    """What a spec allows, in words."""
    kind = spec.get("type", "str")
    if spec.get("choices") is not None:
        return "one of " + ", ".join(show(c) for c in spec["choices"])
    if kind == "list":
        return {"str": "a list of strings", "path": "a list of paths", "int": "a list of integers",
                "float": "a list of numbers", "bool": "a list of booleans",
                "dict": "a list of mappings"}.get(spec.get("elements"), "a list")
    return _TYPE_WORDS.get(kind, kind)


def _scalar(value, kind, top):
    """``value`` as ``kind`` ('str', 'int', 'float', 'bool'); _Bad when it is not one.

    Strings are never taken for booleans ('yes', 'false', 'maybe') and a
    boolean is never a number or a string. A string of digits is taken for an
    int or a float only at the top level (``-e name=5`` gives a string); inside
    a list the YAML or JSON type must already be right.
    """
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            raise _Bad("a string, not a boolean: write true or false without quotes "
                       "(on the command line -e '{\"name\": false}')")
        raise _Bad("not true or false")
    if isinstance(value, bool):
        raise _Bad("a boolean where %s is expected (a YAML yes/no/on/off is a boolean: quote it)"
                   % _TYPE_WORDS.get(kind, kind))
    if kind in ("str", "path"):
        if isinstance(value, str):
            return value
        if isinstance(value, int):
            return str(value)
        raise _Bad("not a string")
    if kind == "int":
        if isinstance(value, int):
            return value
        if top and isinstance(value, str) and re.match(r"^\s*-?\d+\s*$", value):
            return int(value)
        raise _Bad("not an integer")
    if kind == "float":
        if isinstance(value, (int, float)):
            return value
        if top and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _Bad("not a number")
    return value


def check_type(value, spec, top=True):
    """``value`` read as ``spec`` says (type, elements, choices, options); _Bad when it does not fit."""
    kind = spec.get("type", "str")
    if value is None:
        if kind == "raw":
            return None
        raise _Bad("null, not %s" % _TYPE_WORDS.get(kind, kind))
    if kind == "raw":
        out = value
    elif kind == "list":
        if not isinstance(value, list):
            raise _Bad("%s, not a list (a string is never split into one: write [%s])" % (
                "a string" if isinstance(value, str) else "a " + type(value).__name__,
                ", ".join(p.strip() for p in value.split(",")) if isinstance(value, str) else "..."))
        elements = spec.get("elements")
        out = []
        for index, item in enumerate(value):
            try:
                if elements == "dict":
                    out.append(_check_dict(item, spec.get("options")))
                elif elements and elements != "raw":
                    out.append(_scalar(item, elements, False))
                else:
                    out.append(item)
            except _Bad as exc:
                raise _Bad("item %d (%s) is %s" % (index + 1, show(item), exc)) from None
    elif kind == "dict":
        out = _check_dict(value, spec.get("options"))
    else:
        out = _scalar(value, kind, top)
    if spec.get("choices") is not None and out not in spec["choices"]:
        raise _Bad("not a choice of this variable")
    return out


def _check_dict(value, options):
    if not isinstance(value, dict):
        raise _Bad("%s, not a mapping" % ("a string" if isinstance(value, str) else "a " + type(value).__name__))
    if not options:
        return dict(value)
    unknown = sorted(set(value) - set(options))
    if unknown:
        raise _Bad("a mapping with unknown keys %s (allowed: %s)" % (", ".join(unknown), ", ".join(sorted(options))))
    out = {}
    for key, sub in options.items():
        if key not in value or value[key] is None:
            if sub.get("required"):
                raise _Bad("a mapping without %s (required)" % key)
            if "default" in sub:
                out[key] = sub["default"]
            continue
        try:
            out[key] = check_type(value[key], sub, top=False)
        except _Bad as exc:
            raise _Bad("a mapping whose %s %s is %s (%s allowed: %s)" % (
                key, show(value[key]), exc, key, allowed(sub))) from None
    return out


# --------------------------------------------------------------------------
# Rules shared with the filters (one copy of each)

def _cpus(text, variable):
    try:
        return parse_cpulist(str(text))
    except ValueError as exc:
        raise IntentError("%s: %s" % (variable, exc), variable) from None


def cpu_partition(facts, profile, isolate, housekeeping, allow_cpu0=False):
    """Split a board's CPUs into inference (isolated) and housekeeping sets.

    ``isolate``: auto (the profile's inference clusters), none, or a CPU list;
    ``housekeeping``: auto (every online CPU not isolated) or a CPU list.
    Raises IntentError (naming the variable) on a set the board cannot have.
    """
    online = facts["cpu"]["online"]
    present = facts["cpu"]["present"] or online
    isolate, housekeeping = str(isolate).strip(), str(housekeeping).strip()
    if isolate == "auto":
        clusters = profile.get("clusters") or []
        inference = sorted(c for i in profile.get("inference_clusters") or [] for c in clusters[i])
    elif isolate == "none":
        inference = []
    elif isolate == "":
        raise IntentError("edge_cpu_isolate is empty: give auto, none or a CPU list such as 4-7",
                          "edge_cpu_isolate")
    else:
        inference = _cpus(isolate, "edge_cpu_isolate")
    if housekeeping == "auto":
        keep = [c for c in online if c not in inference]
    elif housekeeping == "":
        raise IntentError("edge_cpu_housekeeping is empty: give auto or a CPU list such as 0-3",
                          "edge_cpu_housekeeping")
    else:
        keep = _cpus(housekeeping, "edge_cpu_housekeeping")

    for name, cpus, variable in (("inference", inference, "edge_cpu_isolate"),
                                 ("housekeeping", keep, "edge_cpu_housekeeping")):
        missing = [c for c in cpus if c not in present]
        if missing:
            raise IntentError("%s CPUs %s do not exist on this board (CPUs %s)" % (
                name, format_cpulist(missing), format_cpulist(present)), variable)
    # Housekeeping work needs CPUs that are running now.  Isolated CPUs may be
    # offline (AGX Orin's MODE_30W takes cpu8-11 offline): isolcpus applies
    # when they come online, e.g. after a switch to MAXN.
    offline = [c for c in keep if c not in online]
    if offline:
        raise IntentError("housekeeping CPUs %s are offline (online: %s); bring them online or choose others" % (
            format_cpulist(offline), format_cpulist(online)), "edge_cpu_housekeeping")
    if not keep:
        raise IntentError("the housekeeping set is empty: keep at least one CPU for the system",
                          "edge_cpu_housekeeping" if housekeeping != "auto" else "edge_cpu_isolate")
    overlap = sorted(set(keep) & set(inference))
    if overlap:
        raise IntentError("CPUs %s are in both the inference and the housekeeping set" % format_cpulist(overlap),
                          "edge_cpu_housekeeping")
    if 0 in inference and not allow_cpu0:
        raise IntentError("cpu0 handles boot-time and unmovable work; keep it for housekeeping "
                          "or set edge_cpu_allow_cpu0: true", "edge_cpu_isolate")
    return {
        "inference": inference,
        "housekeeping": keep,
        "inference_list": format_cpulist(inference),
        "housekeeping_list": format_cpulist(keep),
        "offline_inference": [c for c in inference if c not in online],
    }


def memory_bytes(value, ram):
    """systemd's memory forms -> bytes (None for no limit). ValueError when malformed."""
    text = str(value if value is not None else "").strip()
    if text in ("", "infinity"):
        return None
    match = _PERCENT.match(text)
    if match:
        percent = float(match.group(1))
        if percent > 100:
            raise BadInput("%s is more than 100%% of the RAM" % text)
        return int(ram * percent / 100)
    match = _SIZE.match(text)
    if match:
        return int(match.group(1)) * _UNITS[match.group(2)]
    raise BadInput("%r is not NN%%, bytes with an optional K/M/G/T suffix, infinity or empty" % text)


def _human(size):
    for unit in ("T", "G", "M", "K"):
        if size >= _UNITS[unit]:
            return "%.1f%siB" % (size / _UNITS[unit], unit)
    return "%d bytes" % size


def slice_name_problem(name):
    """Why ``name`` is not a slice unit of its own, or None."""
    if not isinstance(name, str) or not _SLICE.match(name) or name in _RESERVED_SLICES:
        return ("is not a slice of its own; allowed: a slice unit name such as ai-infer.slice (a dash is a level, "
                "no /), not %s" % ", ".join(_RESERVED_SLICES))
    return None


def slice_plan(settings):
    """The inference slice's settings checked against the board, all at once.

    ``settings``: slice, cpus (the slice's CPUs), cpulist, cpu_weight,
    cpu_quota, memory_max, memory_high, io_weight, rt_runtime_us, rt_global
    (kernel.sched_rt_runtime_us; negative when unknown or unlimited),
    ram_bytes, probe_priority. Returns (plan, problems): problems are
    (variable or None, value, message) with the message naming neither.
    """
    s = dict(settings)
    problems = []
    cpus = list(s.get("cpus") or [])
    slice_name = s.get("slice", "")
    why = slice_name_problem(slice_name)
    if why:
        problems.append(("edge_cgroups_slice", slice_name, why))
    if not cpus:
        problems.append((None, None, "the slice has no CPUs (no inference CPUs in edge_bootargs_cpus)"))
    for key in ("cpu_weight", "io_weight"):
        value = s.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 10000:
            problems.append(("edge_cgroups_" + key, value, "must be 1-10000"))

    quota = str(s.get("cpu_quota", "")).strip()
    if quota == "auto":
        quota = "%d%%" % (100 * len(cpus)) if cpus else ""
    if quota:
        match = re.match(r"^([0-9]+)%$", quota)
        if not match or int(match.group(1)) < 1:
            problems.append(("edge_cgroups_cpu_quota", quota, "is not auto, empty or NNN% (at least 1%)"))
        elif int(match.group(1)) > 100 * len(cpus):
            problems.append(("edge_cgroups_cpu_quota", quota, "is more than the %d CPU(s) of the slice (%s) can give: "
                             "at most %d%%" % (len(cpus), s.get("cpulist", ""), 100 * len(cpus))))

    ram = int(s.get("ram_bytes") or 0)
    limits = {}
    for key in ("memory_max", "memory_high"):
        value = s.get(key)
        try:
            limits[key] = memory_bytes(value, ram)
        except ValueError as exc:
            problems.append(("edge_cgroups_" + key, value, str(exc)))
            continue
        if limits[key] is not None and ram and limits[key] > ram:
            problems.append(("edge_cgroups_" + key, value, "(%s) is more than the RAM (%s)"
                             % (_human(limits[key]), _human(ram))))
        if limits[key] is not None and limits[key] < 16 * _UNITS["M"]:
            problems.append(("edge_cgroups_" + key, value, "is below 16 MiB: nothing would run in the slice"))
    if limits.get("memory_max") is not None and limits.get("memory_high") is not None \
            and limits["memory_high"] > limits["memory_max"]:
        problems.append(("edge_cgroups_memory_high", s.get("memory_high"),
                         "is above edge_cgroups_memory_max %s" % s.get("memory_max")))

    runtime, ceiling = s.get("rt_runtime_us"), s.get("rt_global")
    if not isinstance(runtime, int) or isinstance(runtime, bool) or runtime < 0:
        problems.append(("edge_cgroups_rt_runtime_us", runtime, "must be a number of microseconds, 0 or more"))
    elif isinstance(ceiling, int) and ceiling >= 0 and runtime >= ceiling:
        problems.append(("edge_cgroups_rt_runtime_us", runtime,
                         "must be below kernel.sched_rt_runtime_us (%d): the slice cannot "
                         "hold as much RT time as the whole system" % ceiling))
    priority = s.get("probe_priority")
    if not isinstance(priority, int) or isinstance(priority, bool) or not 1 <= priority <= 99:
        problems.append(("edge_cgroups_probe_priority", priority, "must be 1-99"))
    plan = {
        "cpu_quota": quota,
        "memory_max": str(s.get("memory_max") or "").strip(),
        "memory_high": str(s.get("memory_high") or "").strip(),
        "memory_max_bytes": limits.get("memory_max"),
        "memory_high_bytes": limits.get("memory_high"),
    }
    return plan, problems


# --------------------------------------------------------------------------
# The report

class Report(object):
    """Problems by variable (one message each), warnings and notes."""

    def __init__(self, shown_as=None):
        self._problems = {}
        self._order = []
        self.warnings = []
        self.notes = []
        # {variable: the name the inventory used} (a deprecated name read for a new one)
        self.shown_as = dict(shown_as or {})

    def add(self, variable, value, message):
        if variable not in self._problems:
            self._problems[variable] = {"value": value, "messages": []}
            self._order.append(variable)
        if message not in self._problems[variable]["messages"]:
            self._problems[variable]["messages"].append(message)

    def bad(self, *variables):
        return any(v in self._problems for v in variables)

    def problems(self):
        out = []
        for variable in self._order:
            entry = self._problems[variable]
            name = self.shown_as.get(variable, variable)
            out.append({"variable": name, "value": entry["value"],
                        "message": "%s = %s: %s" % (name, show(entry["value"]), "; ".join(entry["messages"]))})
        return out


class _Checker(object):
    """The intent of one host and what the board is; each role's checks below."""

    def __init__(self, intent, report, facts, profile, roles, mode, calendar, controller_artifacts, raw=None):
        self.v = intent
        self.raw = raw or {}
        self.report = report
        self.facts = facts or {}
        self.profile = profile or {}
        self.roles = roles
        self.mode = mode
        self.calendar = calendar
        self.controller_artifacts = controller_artifacts
        self.partition = None
        self.numa = None
        self.slice_values = None
        self.artifacts = None

    # helpers
    def ok(self, *names):
        return all(n in self.v for n in names) and not self.report.bad(*names)

    def problem(self, name, message):
        """A problem of ``name``, shown with the value as the inventory gave it."""
        self.report.add(name, self.raw.get(name, self.v.get(name)), message)

    def has(self, role):
        return role in self.roles

    def board(self):
        return bool(self.facts.get("cpu")) and bool(self.profile)

    def present(self):
        cpu = self.facts.get("cpu") or {}
        return cpu.get("present") or cpu.get("online") or []

    def title(self):
        return self.profile.get("title") or "this board"

    def device_path(self, name, empty=False):
        """A path (or a list of paths) on the device; ``empty``: "" is allowed (a default)."""
        if not self.ok(name):
            return
        value = self.v[name]
        values = value if isinstance(value, list) else [value]
        for path in values:
            if path == "" and empty:
                continue
            if not isinstance(path, str) or not _DEVICE_PATH.match(path) or "/./" in path + "/" \
                    or "/../" in path + "/":
                self.problem(name, "%s is not an absolute path on the device without spaces, quotes or %%; "
                                   "allowed: an absolute path such as /etc/edgetune/x.json%s"
                             % (show(path), " or \"\" (the default)" if empty else ""))
                return

    def int_range(self, name, low=None, high=None, what=""):
        if not self.ok(name):
            return
        value = self.v[name]
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = ("%s-%s" % (low, high) if low is not None and high is not None
                      else "at least %s" % low if low is not None else "at most %s" % high)
            self.problem(name, "out of range; allowed: %s%s" % (bounds, what))

    def autotune(self):
        """The runtime's autotune: candidates the role can apply, CPUs to measure on, and a measurement
        that can finish."""
        v = self.v
        self.int_range("edge_runtime_autotune_timeout", 10, 86400, " seconds")
        self.int_range("edge_runtime_autotune_rounds", 1, 20)
        self.int_range("edge_runtime_autotune_generations", 1, 1000)
        self.int_range("edge_runtime_autotune_max_tokens", 2, 4096)
        if v.get("edge_runtime_autotune") is True or v.get("edge_runtime_autotune_again") is True:
            choice = str(v.get("edge_runtime_cpus", "auto")).strip()
            if choice in ("none", "") or (choice == "auto" and self.partition is not None
                                          and not self.partition["inference"]):
                name = ("edge_runtime_autotune" if v.get("edge_runtime_autotune") is True
                        else "edge_runtime_autotune_again")
                self.problem(name, "there are no inference CPUs to tune: the runtime runs unpinned (edge_runtime_cpus "
                                   "%s, edge_cpu_isolate) and autotune measures on the runtime's own CPUs; allowed: "
                                   "false, or give the runtime CPUs" % show(v.get("edge_runtime_cpus", "auto")))
        if self.ok("edge_runtime_autotune_candidates"):
            try:
                edge_autotune.parse_candidates(self.v["edge_runtime_autotune_candidates"],
                                               {"policy": "other", "priority": 40, "threads": "n"})
            except edge_autotune.AutotuneError as exc:
                self.problem("edge_runtime_autotune_candidates", "%s; allowed: NAME:key=value,... with keys %s"
                             % (exc, ", ".join(edge_autotune.KEYS)))

    # ------------------------------------------------------------ playbooks
    def playbooks(self):
        for name in ("edge_reboot_serial", "edge_deploy_serial"):
            if self.ok(name):
                items = self.v[name] if isinstance(self.v[name], list) else [self.v[name]]
                for item in items:
                    fine = (isinstance(item, int) and not isinstance(item, bool) and item >= 1) or (
                        isinstance(item, str) and re.match(r"^\s*(\d+|\d+(\.\d+)?%)\s*$", item)
                        and float(item.strip().rstrip("%")) > 0)
                    if not fine:
                        self.problem(name, "allowed: a batch size (a number of hosts, at least 1), a percentage "
                                           "such as \"20%\", or a list of them")
                        break
        for name in ("edge_reboot_max_fail_percentage", "edge_deploy_max_fail_percentage"):
            self.int_range(name, 0, 100, " (percent)")
        self.int_range("edge_reboot_timeout", 30, None, " seconds")
        self.int_range("edge_lease_wait", 0, 86400, " seconds")
        self.int_range("edge_lease_ttl", 60, 604800, " seconds")

    # ------------------------------------------------------------ edge_facts
    def edge_facts(self):
        name = "edge_facts_profiles_dir"
        if self.ok(name) and self.v[name] and not os.path.isdir(self.v[name]):
            self.problem(name, "no such directory on the controller; allowed: a directory of board profiles "
                               "(YAML files) or \"\" (none)")

    # ------------------------------------------------------------ the CPU split (role edge_cpu's intent)
    def cpu_sets(self):
        v = self.v
        if not self.board() or not self.ok(*CPU_OPTIONS):
            return
        try:
            self.partition = cpu_partition(self.facts, self.profile, v["edge_cpu_isolate"],
                                           v["edge_cpu_housekeeping"], v["edge_cpu_allow_cpu0"])
            self.numa_binding()
        except IntentError as exc:
            variable = exc.variable or "edge_cpu_isolate"
            text = str(exc)
            if text.startswith(variable + ": "):
                text = text[len(variable) + 2:]
            if text.startswith(variable + " is empty: "):
                self.problem(variable, "empty (an empty string is not none); allowed: %s" % (
                    "auto, none or a CPU list such as 4-7" if variable == "edge_cpu_isolate"
                    else "auto or a CPU list such as 0-3"))
                return
            hint = "" if "CPUs %s" % format_cpulist(self.present()) in text else \
                " (%s has CPUs %s)" % (self.title(), format_cpulist(self.present()))
            allowed_text = ("; allowed: auto, none or a CPU list" if variable == "edge_cpu_isolate"
                            else "; allowed: auto or a CPU list" if variable == "edge_cpu_housekeeping" else "")
            self.problem(variable, text + hint + allowed_text)

    def numa_binding(self):
        """On a host of several NUMA nodes, the inference CPUs on the accelerator's node (edge_facts read
        the layout): the slice's, the runtime's and the probe's CPUs (role edge_cpu's binding)."""
        v = self.v
        bind = v.get("edge_cpu_enabled", True) is not False and v.get("edge_cpu_numa_bind", True) is not False
        self.numa = numa.binding(self.facts.get("numa"), self.partition["inference"], bind)
        if self.numa["problem"]:
            self.problem("edge_cpu_numa_accelerator", self.numa["problem"])

    # ------------------------------------------------------------ edge_bootargs
    def edge_bootargs(self):
        v = self.v
        self.device_path("edge_bootargs_path", empty=True)
        self.device_path("edge_bootargs_extra_paths")
        self.device_path("edge_bootargs_state_file")
        if self.ok("edge_bootargs_cgroup_v2"):
            value = v["edge_bootargs_cgroup_v2"]
            if not (value == "auto" or isinstance(value, bool)):
                self.problem("edge_bootargs_cgroup_v2", "allowed: auto, true or false (true and false as YAML "
                                                        "booleans, not strings)")
        if self.ok("edge_bootargs_transparent_hugepage") and self.ok("edge_bootargs_extra") \
                and v["edge_bootargs_transparent_hugepage"]:
            twice = [a for a in v["edge_bootargs_extra"] or [] if str(a).startswith("transparent_hugepage=")]
            if twice:
                why = "edge_bootargs_extra also sets %s; set it in one of them" % twice[0]
                self.problem("edge_bootargs_transparent_hugepage", why)
        if not self.partition:
            return
        features = (self.facts.get("kernel") or {}).get("features") or {}
        release = (self.facts.get("kernel") or {}).get("release")
        if self.partition["inference"]:
            for name, feature, option in (("edge_bootargs_nohz_full", "no_hz_full", "CONFIG_NO_HZ_FULL"),
                                          ("edge_bootargs_rcu_nocbs", "rcu_nocb", "CONFIG_RCU_NOCB_CPU")):
                if self.ok(name) and v[name] and features.get(feature) is False:
                    self.problem(name, "the running kernel (%s) lacks %s; allowed here: false" % (release, option))

    # ------------------------------------------------------------ edge_cpu
    def edge_cpu(self):
        v = self.v
        if self.ok("edge_cpu_enabled") and not v["edge_cpu_enabled"]:
            return
        self.device_path("edge_cpu_sysctl_file")
        if self.ok("edge_cpu_sysctl_file") and (
                os.path.dirname(v["edge_cpu_sysctl_file"]) not in _SYSCTL_DIRS
                or not v["edge_cpu_sysctl_file"].endswith(".conf")):
            self.problem("edge_cpu_sysctl_file", "systemd-sysctl reads only *.conf files in %s at boot; allowed: "
                                                 "such a file" % ", ".join(_SYSCTL_DIRS))
        if self.ok("edge_cpu_irq_unmovable_names"):
            for pattern in v["edge_cpu_irq_unmovable_names"]:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    self.problem("edge_cpu_irq_unmovable_names", "%s is not a regular expression (%s); allowed: "
                                                                 "Python regular expressions" % (show(pattern), exc))
        if self.ok("edge_cpu_numa_accelerator") and v["edge_cpu_numa_accelerator"]:
            value = v["edge_cpu_numa_accelerator"]
            try:
                pcie.normalize_bdf(value)
            except ValueError:
                if not (value.startswith("/sys/") and _DEVICE_PATH.match(value)):
                    self.problem("edge_cpu_numa_accelerator", "allowed: a PCI address such as 0000:01:00.0, a "
                                                              "sysfs device directory under /sys, or \"\" (found by "
                                                              "PCI class)")
        if self.ok("edge_cpu_sysctl") and v["edge_cpu_sysctl"]:
            period = (self.facts.get("sched") or {}).get("rt_period_us") or 1000000
            name = "edge_cpu_sched_rt_runtime_us"
            if self.ok(name) and not 0 < v[name] < period:
                self.problem(name, "must be above 0 and below kernel.sched_rt_period_us (%d): RT throttling must "
                                   "stay on so that a runaway SCHED_FIFO thread cannot lock up a CPU (-1 turns it "
                                   "off); allowed: 1-%d" % (period, period - 1))
            self.int_range("edge_cpu_vm_stat_interval", 1, 3600, " seconds")
            self.int_range("edge_cpu_numa_balancing", 0, 3)

    # ------------------------------------------------------------ the slice's name
    def slice_name(self):
        """edge_cgroups_slice, the one name of the inference slice, for every role that uses it."""
        if self.ok(SLICE_OPTION):
            why = slice_name_problem(self.v[SLICE_OPTION])
            if why:
                self.problem(SLICE_OPTION, why)

    def slice_alias(self, name):
        """An old name of the slice (edge_runtime_slice, edge_netqos_cgroup): unset, "" or edge_cgroups_slice's."""
        self.slice_name()
        if not self.ok(name) or self.v[name] in ("", None) or not self.ok(SLICE_OPTION):
            return
        slice_name = self.v[SLICE_OPTION]
        if self.v[name] != slice_name:
            self.problem(name, "differs from %s = %s: the inference slice has one name, %s's (role edge_cgroups "
                               "creates it, edge_runtime runs the service in it and edge_netqos classifies its "
                               "sockets, all from the plan); %s is only read for compatibility; allowed: unset, "
                               "\"\" or %s (set %s instead)"
                         % (SLICE_OPTION, show(slice_name), SLICE_OPTION, name, show(slice_name), SLICE_OPTION))

    # ------------------------------------------------------------ edge_cgroups
    def edge_cgroups(self):
        v = self.v
        if self.ok("edge_cgroups_enabled") and not v["edge_cgroups_enabled"]:
            return
        self.device_path("edge_cgroups_lib_dir")
        self.slice_name()
        names = ("edge_cgroups_slice", "edge_cgroups_cpu_weight", "edge_cgroups_cpu_quota", "edge_cgroups_memory_max",
                 "edge_cgroups_memory_high", "edge_cgroups_io_weight", "edge_cgroups_rt_runtime_us",
                 "edge_cgroups_probe_priority")
        if not self.board():
            return
        # Without a valid CPU split (its variable is reported) the CPU quota is not checked. On several
        # NUMA nodes the slice takes the inference CPUs on the accelerator's node.
        cpus = self.partition["inference"] if self.partition else None
        if cpus and self.numa and self.numa["node"] is not None:
            cpus = self.numa["cpus"]
        if cpus == []:
            self.problem("edge_cgroups_enabled", "there are no inference CPUs (edge_cpu_isolate: none): the "
                                                 "slice would have no CPUs of its own; allowed: false, or choose "
                                                 "inference CPUs")
        rt_global = -1
        if self.has("edge_cpu") and self.ok("edge_cpu_enabled", "edge_cpu_sysctl", "edge_cpu_sched_rt_runtime_us") \
                and v["edge_cpu_enabled"] and v["edge_cpu_sysctl"]:
            rt_global = v["edge_cpu_sched_rt_runtime_us"]
        elif (self.facts.get("sched") or {}).get("rt_runtime_us") is not None:
            rt_global = self.facts["sched"]["rt_runtime_us"]
        settings = {"slice": v.get("edge_cgroups_slice"), "cpus": cpus or [], "cpulist": format_cpulist(cpus or []),
                    "cpu_weight": v.get("edge_cgroups_cpu_weight"), "cpu_quota": v.get("edge_cgroups_cpu_quota"),
                    "memory_max": v.get("edge_cgroups_memory_max"), "memory_high": v.get("edge_cgroups_memory_high"),
                    "io_weight": v.get("edge_cgroups_io_weight"), "rt_runtime_us": v.get("edge_cgroups_rt_runtime_us"),
                    "rt_global": rt_global, "ram_bytes": (self.facts.get("memory_kb") or 0) * 1024,
                    "probe_priority": v.get("edge_cgroups_probe_priority")}
        values, problems = slice_plan(settings)
        if not problems:
            self.slice_values = values
        for variable, _value, message in problems:
            if variable == "edge_cgroups_cpu_quota" and not cpus and not (
                    cpus is None and "is not auto" in message):
                continue
            if variable in names and self.ok(variable):
                self.problem(variable, message + _ALLOWED_SLICE.get(variable, ""))

    # ------------------------------------------------------------ edge_power
    def edge_power(self):
        v = self.v
        if self.ok("edge_power_enabled") and not v["edge_power_enabled"]:
            return
        self.device_path("edge_power_jetson_clocks_store_file")
        jetson = self.profile.get("family") == "jetson"
        if self.ok("edge_power_jetson_clocks") and v["edge_power_jetson_clocks"] is not None \
                and not isinstance(v["edge_power_jetson_clocks"], bool):
            self.problem("edge_power_jetson_clocks", "allowed: true (pin the clocks), false (restore them) or null "
                                                     "(leave them), as YAML values, not strings")
        if self.ok("edge_power_nvpmodel_mode") and self.profile and jetson:
            mode = v["edge_power_nvpmodel_mode"]
            modes = self.profile.get("nvpmodel_modes") or []
            if mode == "recommended" and not self.profile.get("nvpmodel_recommended"):
                self.problem("edge_power_nvpmodel_mode", "the profile %s recommends no nvpmodel mode; allowed: %s "
                                                         "or \"\" (leave it)"
                             % (self.profile.get("name"), ", ".join(modes)))
            elif mode not in ("recommended", "") and mode not in modes:
                self.problem("edge_power_nvpmodel_mode", "not a power mode of the %s; allowed: recommended (%s), "
                                                         "\"\" (leave the mode alone) or one of %s" % (
                                                             self.title(), self.profile.get("nvpmodel_recommended"),
                                                             ", ".join(modes)))
        pinning = jetson and self.ok("edge_power_jetson_clocks") and v["edge_power_jetson_clocks"] is True
        snap = v.get("edge_power_snap") if self.ok("edge_power_snap") else "exact"
        for name, kind in (("edge_power_cpufreq", dvfs.CPUFREQ), ("edge_power_devfreq", dvfs.DEVFREQ)):
            if not self.ok(name):
                continue
            items = v[name]
            if items == "auto":
                continue
            if not isinstance(items, list):
                self.problem(name, "allowed: auto or a list of mappings (%s)" % (
                    "policy or cpus, governor, min_freq, max_freq" if kind == dvfs.CPUFREQ
                    else "node, governor, min_freq, max_freq"))
                continue
            for item in items:
                message = self._dvfs_item(kind, item, snap, pinning)
                if message:
                    self.problem(name, message)

    def _dvfs_item(self, kind, item, snap, pinning):
        keys = ("policy", "cpus", "governor", "min_freq", "max_freq") if kind == dvfs.CPUFREQ else \
            ("node", "governor", "min_freq", "max_freq")
        if not isinstance(item, dict):
            return "entry %s is not a mapping; allowed keys: %s" % (show(item), ", ".join(keys))
        unknown = sorted(set(item) - set(keys))
        if unknown:
            return "entry %s has unknown keys %s; allowed: %s" % (show(item), ", ".join(unknown), ", ".join(keys))
        if item.get("governor") is not None and not isinstance(item["governor"], str):
            return "entry %s: governor is not a name" % show(item)
        available = None
        if kind == dvfs.CPUFREQ:
            given = [k for k in ("policy", "cpus") if item.get(k) is not None]
            if len(given) != 1:
                return "entry %s needs exactly one of policy, cpus" % show(item)
            for key in given:
                if isinstance(item[key], bool) or not isinstance(item[key], int):
                    return "entry %s: %s must be an integer" % (show(item), key)
            if not self.board():
                return None
            clusters = (self.facts.get("cpu") or {}).get("clusters") or []
            policies = [c["policy"] for c in clusters]
            cluster = None
            if "policy" in given:
                cluster = next((c for c in clusters if c["policy"] == item["policy"]), None)
                if cluster is None:
                    return "cpufreq policy%s is not on this board; it has %s" % (
                        item["policy"], ", ".join("policy%d" % p for p in policies) or "none")
            else:
                if item["cpus"] not in self.present():
                    return "cpu%s is not on this board; it has CPUs %s" % (item["cpus"], format_cpulist(self.present()))
                cluster = next((c for c in clusters if item["cpus"] in c.get("cpus", [])), None)
                if cluster is None:
                    return "cpu%s has no cpufreq policy on this board" % item["cpus"]
            name = "policy%d" % cluster["policy"]
            if cluster.get("min_freq") or cluster.get("frequencies"):
                freqs = sorted(cluster.get("frequencies") or []) or None
                low = cluster.get("min_freq") or (freqs[0] if freqs else 0)
                high = cluster.get("max_freq") or (freqs[-1] if freqs else 0)
                available = {"name": name, "kind": kind, "governors": cluster.get("governors") or None,
                             "frequencies": freqs, "range": (low, high),
                             "range_source": "cpuinfo_min_freq..cpuinfo_max_freq"}
            if pinning and (item.get("min_freq") is not None or item.get("max_freq") is not None):
                return ("edge_power_cpufreq sets limits (%s) but edge_power_jetson_clocks pins every CPU at min=max: "
                        "set edge_power_jetson_clocks to false or null, or drop min_freq/max_freq" % show(item))
        else:
            node = item.get("node")
            if not isinstance(node, str) or not node:
                return "entry %s needs a node" % show(item)
            if not self.board():
                return None
            nodes = self.facts.get("devfreq") or {}
            if node not in nodes:
                return "devfreq node %s is not on this board; it has %s" % (node, ", ".join(sorted(nodes)) or "none")
            freqs = sorted(nodes[node].get("frequencies") or []) or None
            available = {"name": node, "kind": kind, "governors": nodes[node].get("governors") or None,
                         "frequencies": freqs, "range": (freqs[0], freqs[-1]) if freqs else (0, 0),
                         "range_source": "available_frequencies"}
            gpu = (self.profile.get("devfreq") or {}).get("gpu")
            if pinning and node == gpu and (item.get("min_freq") is not None or item.get("max_freq") is not None):
                return ("edge_power_devfreq sets limits on the GPU (%s) but edge_power_jetson_clocks pins it at "
                        "min=max: set edge_power_jetson_clocks to false or null, or drop min_freq/max_freq" % node)
        if available is None:
            return None
        try:
            if item.get("governor") is not None:
                dvfs.resolve({"governor": None, "min_freq": 0, "max_freq": 0}, {"governor": item["governor"]},
                             available, snap)
            final = {}
            if available["frequencies"] or available["range"][1]:
                for attr in dvfs.FREQ_ATTRS:
                    if item.get(attr) is not None:
                        final[attr] = dvfs.resolve_freq(attr, item[attr], available, snap)
            if "min_freq" in final and "max_freq" in final and final["min_freq"] > final["max_freq"]:
                return "min_freq %d > max_freq %d on %s" % (final["min_freq"], final["max_freq"], available["name"])
        except ValueError as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------ edge_pcie_qos
    def edge_pcie_qos(self):
        v = self.v
        name = "edge_pcie_qos_timeout"
        if self.ok(name) and not 0 < v[name] <= 60:
            self.problem(name, "allowed: a number of seconds above 0 and at most 60")
        if not self.ok("edge_pcie_qos_mappings"):
            return
        for index, item in enumerate(v["edge_pcie_qos_mappings"]):
            where = "mapping %d (%s)" % (index + 1, show(item))
            given = [k for k in ("device", "device_class") if item.get(k)]
            if len(given) != 1:
                self.problem("edge_pcie_qos_mappings", "%s needs exactly one of device and device_class" % where)
                continue
            try:
                if item.get("device"):
                    pcie.normalize_bdf(item["device"])
                else:
                    pcie.parse_class(item["device_class"])
                pcie.check_request(item.get("tcs"), item.get("vc_id", 1))
            except ValueError as exc:
                self.problem("edge_pcie_qos_mappings", "%s: %s" % (where, exc))
                continue
            if len(set(item["tcs"])) != len(item["tcs"]):
                self.problem("edge_pcie_qos_mappings", "%s lists a traffic class twice" % where)

    # ------------------------------------------------------------ edge_netqos
    def edge_netqos(self):
        v = self.v
        self.slice_alias("edge_netqos_cgroup")
        for name in ("edge_netqos_config_file", "edge_netqos_loader_path", "edge_netqos_share_dir",
                     "edge_netqos_python"):
            self.device_path(name)
        if self.ok("edge_netqos_packages"):
            bad = [p for p in v["edge_netqos_packages"] if not _PACKAGE.match(p)]
            if bad:
                self.problem("edge_netqos_packages", "%s are not package names" % show(bad))
        if self.ok("edge_netqos_header_packages"):
            value = v["edge_netqos_header_packages"]
            if value != "auto" and not (isinstance(value, list) and all(
                    isinstance(p, str) and _PACKAGE.match(p) for p in value)):
                self.problem("edge_netqos_header_packages", "allowed: auto or a list of package names")
        if not self.ok("edge_netqos_interfaces", "edge_netqos_state") or v["edge_netqos_state"] != "present" \
                or not v["edge_netqos_interfaces"]:
            return
        config = {}
        keys = netqos.SETTING_KEYS
        for key in keys:
            name = "edge_netqos_" + key
            if key != "cgroup" and name in v and not self.report.bad(name) and not (key == "rate" and not v[name]):
                config[key] = v[name]
        # The sockets of the inference slice (the plan's netqos part: edge_cgroups_slice).
        if self.ok(SLICE_OPTION):
            config["cgroup"] = v[SLICE_OPTION]
        # Each setting on its own first, so that the message names its variable.
        rate = None
        if config.get("rate"):
            try:
                rate = netqos.parse_rate(config["rate"], what="rate")
            except netqos.NetQosError as exc:
                self.problem("edge_netqos_rate", "%s; allowed: a rate in tc notation such as 900mbit" % exc)
        for key in ("high_rate", "default_rate", "high_ceil", "default_ceil"):
            if key not in config or (key == "default_rate" and str(config[key]).strip().lower() == "rest"):
                continue
            try:
                netqos.parse_rate(config[key], rate or 10 ** 9, what=key)
            except netqos.NetQosError as exc:
                self.problem("edge_netqos_" + key, "%s; allowed: a rate such as 100mbit or a percentage such as "
                                                   "20%%%s" % (exc, " or rest" if key == "default_rate" else ""))
        for key in ("high_class", "default_class"):
            if key in config:
                try:
                    netqos.parse_classid(config[key], key)
                except netqos.NetQosError as exc:
                    self.problem("edge_netqos_" + key, "%s; allowed: 1:<hex minor> other than 1:0 and 1:1 "
                                                       "(quote it in YAML: 1:10 unquoted is the number 70)" % exc)
        if "ports" in config:
            try:
                netqos.parse_ports(config["ports"])
            except netqos.NetQosError as exc:
                self.problem("edge_netqos_ports", "%s; allowed: at most %d ports 1-65535 (numbers or ranges such "
                                                  "as 9000-9003)" % (exc, netqos.MAX_PORTS))
        if self.report.bad(SLICE_OPTION, *("edge_netqos_" + k for k in keys)):
            return
        seen = set()
        for entry in v["edge_netqos_interfaces"]:
            if isinstance(entry, str):
                ifname, overrides = entry, {}
            elif isinstance(entry, dict) and isinstance(entry.get("name"), str):
                ifname = entry["name"]
                overrides = dict((k, x) for k, x in entry.items() if k != "name")
                unknown = sorted(set(overrides) - set(keys))
                if unknown:
                    self.problem("edge_netqos_interfaces", "interface %s: unknown keys %s (allowed: name, %s)"
                                 % (ifname, ", ".join(unknown), ", ".join(keys)))
                    continue
            else:
                self.problem("edge_netqos_interfaces", "%s is neither an interface name nor a mapping with a name"
                             % show(entry))
                continue
            if ifname in seen:
                self.problem("edge_netqos_interfaces", "interface %s is listed twice" % ifname)
            seen.add(ifname)
            try:
                netqos.resolve(ifname, dict(config, interfaces={ifname: overrides}))
            except netqos.NetQosError as exc:
                message = str(exc)
                target = "edge_netqos_interfaces" if overrides else None
                if target is None:
                    mentioned = [k for k in keys if re.search(r"\b%s\b" % k, message.split(": ", 1)[-1])]
                    target = ("edge_netqos_" + mentioned[0] if mentioned else "edge_netqos_interfaces")
                    if target == "edge_netqos_cgroup":
                        target = SLICE_OPTION
                    if "nothing to classify" in message:
                        target = "edge_netqos_ports"
                    if "rate is missing" in message:
                        target = "edge_netqos_rate"
                        message += "; set edge_netqos_rate (or a rate per interface)"
                self.problem(target, message)

    # ------------------------------------------------------------ edge_runtime
    def edge_runtime(self):
        v = self.v
        self.slice_alias("edge_runtime_slice")
        if self.ok("edge_runtime_enabled") and not v["edge_runtime_enabled"]:
            return
        for name in ("edge_runtime_cache_dir", "edge_runtime_root", "edge_runtime_python"):
            self.device_path(name)
        self.int_range("edge_runtime_port", 1, 65535)
        self.int_range("edge_runtime_http_threads", 1, 256)
        self.int_range("edge_runtime_infer_threads", 1, 256)
        self.int_range("edge_runtime_keep", 2, None, " (the previous release is the rollback target)")
        self.int_range("edge_runtime_min_free_mb", 0, None, " MiB")
        self.int_range("edge_runtime_sched_priority", 1, 99)
        self.int_range("edge_runtime_gate_requests", 1, 100000)
        self.int_range("edge_runtime_gate_warmup", 0, 100000)
        self.int_range("edge_runtime_gate_concurrency", 1, 64)
        if self.ok("edge_runtime_gate_concurrency", "edge_runtime_gate_requests") \
                and v["edge_runtime_gate_concurrency"] > v["edge_runtime_gate_requests"]:
            self.problem("edge_runtime_gate_concurrency", "more connections than edge_runtime_gate_requests (%d); "
                                                          "allowed: 1-%d" % (v["edge_runtime_gate_requests"],
                                                                             v["edge_runtime_gate_requests"]))
        self.int_range("edge_runtime_ctx_size", 64, 1048576)
        self.autotune()
        self.int_range("edge_runtime_gate_generations", 1, 1000)
        self.int_range("edge_runtime_gate_warmup_generations", 0, 1000)
        self.int_range("edge_runtime_gate_golden_tokens", 0, 4096)
        self.int_range("edge_runtime_gate_max_tokens", 2, 4096)
        for name in ("edge_runtime_ttft_p99_ms", "edge_runtime_token_p99_ms"):
            if self.ok(name) and not 0 <= v[name] <= 600000:
                self.problem(name, "allowed: 0 (no limit) or a number of ms up to 600000")
        for name, high in (("edge_runtime_health_timeout", 3600), ("edge_runtime_gate_request_timeout", 3600),
                           ("edge_runtime_p99_ms", 60000)):
            if self.ok(name) and not 0 < v[name] <= high:
                self.problem(name, "allowed: a number above 0 and at most %d (%s)"
                             % (high, "seconds" if name.endswith("timeout") else "ms"))
        if self.ok("edge_runtime_release") and v["edge_runtime_release"] and not artifact.NAME_RE.match(
                v["edge_runtime_release"]):
            self.problem("edge_runtime_release", "allowed: \"\" (derived) or a name of letters, digits and . _ + -")
        if self.ok("edge_runtime_user") and not _USER.match(v["edge_runtime_user"]):
            self.problem("edge_runtime_user", "not a user name; allowed: lower-case letters, digits, _ and -, "
                                              "starting with a letter or _ (at most 31)")
        if self.ok("edge_runtime_host"):
            host = v["edge_runtime_host"]
            if not (_IPV4.match(host) or host == "::" or re.match(r"^[0-9a-fA-F:]+$", host) and ":" in host
                    or _HOSTNAME.match(host)):
                self.problem("edge_runtime_host", "allowed: an IP address (0.0.0.0 for all) or a host name")
        if self.ok("edge_runtime_memlock") and not _LIMIT.match(v["edge_runtime_memlock"]):
            self.problem("edge_runtime_memlock", "allowed: infinity or bytes with an optional K, M, G, T, P or E "
                                                 "suffix (systemd's LimitMEMLOCK=)")
        if self.ok("edge_runtime_rknn_version") and v["edge_runtime_rknn_version"] and \
                artifact.parse_version(v["edge_runtime_rknn_version"]) is None:
            self.problem("edge_runtime_rknn_version", "allowed: \"\" or a version such as 2.3.0")
        if self.ok("edge_runtime_env"):
            for key, value in sorted(v["edge_runtime_env"].items()):
                if not isinstance(key, str) or not _ENV_NAME.match(key):
                    self.problem("edge_runtime_env", "%s is not an EDGETUNE_* or LLAMA_ARG_* variable name; allowed: "
                                                     "EDGETUNE_ or LLAMA_ARG_ and upper-case letters, digits, _"
                                 % show(key))
                elif key in _RUNTIME_ENV_OWN:
                    self.problem("edge_runtime_env", "%s is set by the role from %s; set that instead"
                                 % (key, _RUNTIME_ENV_OWN[key]))
                elif isinstance(value, (dict, list)) or value is None or "\n" in str(value):
                    self.problem("edge_runtime_env", "%s=%s: allowed: one-line strings or numbers"
                                 % (key, show(value)))
        if self.ok("edge_runtime_cpus"):
            cpus = v["edge_runtime_cpus"].strip()
            if cpus == "":
                self.problem("edge_runtime_cpus", "empty; allowed: auto (the inference CPUs), none or a CPU list")
            elif cpus not in ("auto", "none"):
                try:
                    wanted = parse_cpulist(cpus)
                except ValueError as exc:
                    self.problem("edge_runtime_cpus", "%s; allowed: auto, none or a CPU list" % exc)
                else:
                    missing = [c for c in wanted if c not in self.present()]
                    if self.board() and missing:
                        self.problem("edge_runtime_cpus", "CPUs %s do not exist on this board (the %s has CPUs %s); "
                                                          "allowed: auto, none or a CPU list of those"
                                     % (format_cpulist(missing), self.title(), format_cpulist(self.present())))
        self._artifacts()

    def _artifacts(self):
        v = self.v
        names = ("edge_runtime_artifact_source", "edge_runtime_runtime_src", "edge_runtime_engine_src",
                 "edge_runtime_runtime_sha256", "edge_runtime_engine_sha256", "edge_runtime_artifacts_dir")
        if not self.ok(*names):
            return
        source = v["edge_runtime_artifact_source"]
        for kind in ("runtime", "engine"):
            src, sha = "edge_runtime_%s_src" % kind, "edge_runtime_%s_sha256" % kind
            if not v[src].strip():
                self.problem(src, "empty; allowed: the %s tarball (%s)" % (
                    kind, {"controller": "a file name or a path on the controller", "url": "an http(s) URL",
                           "device": "an absolute path on the device"}[source]))
                continue
            digest = v[sha].strip().lower()
            if v[src] == artifact.AUTO:
                if source != "controller":
                    wanted = "URL" if source == "url" else "absolute path on the device"
                    self.problem(src, "auto picks a tarball on the controller, and edge_runtime_artifact_source is "
                                      "%s; allowed: the %s's %s" % (source, kind, wanted))
                elif digest:
                    self.problem(sha, "set for edge_runtime_%s_src: auto, which reads the sha256 from the chosen "
                                      "tarball's .manifest.json; allowed: \"\" or a named tarball" % kind)
                continue
            if digest and not artifact.HEX64_RE.match(digest):
                self.problem(sha, "not a sha256; allowed: 64 hex digits%s" % (
                    " or \"\" (read from the .manifest.json beside the tarball)" if source == "controller" else ""))
            elif not digest and source != "controller":
                self.problem(sha, "empty, and %s artifacts need their sha256; allowed: 64 hex digits" % source)
            if source == "url" and not re.match(r"^https?://[^\s]+$", v[src]):
                self.problem(src, "not an http(s) URL (edge_runtime_artifact_source is url)")
            if source == "device" and not _DEVICE_PATH.match(v[src]):
                self.problem(src, "not an absolute path on the device (edge_runtime_artifact_source is device)")
        if source != "controller" or self.mode != "apply" or not self.controller_artifacts \
                or self.report.bad(*names):
            return
        self.check_controller_artifacts()

    def check_controller_artifacts(self):
        """The tarballs on the controller: present, checksum, manifest, the board, each other."""
        v = self.v
        manifests = {}
        resolved = []
        chosen = self.default_release()
        for kind in ("runtime", "engine"):
            src, sha = "edge_runtime_%s_src" % kind, "edge_runtime_%s_sha256" % kind
            if v[src] == artifact.AUTO and not chosen:
                continue
            path = chosen[kind] if v[src] == artifact.AUTO else \
                artifact.controller_tarball(v[src], v["edge_runtime_artifacts_dir"])
            if not os.path.isfile(path):
                self.problem(src, "Missing artifact: %s does not exist on the controller. Build the reference "
                                  "artifacts with tools/package-runtime (they go to .cache/artifacts/), or set "
                                  "edge_runtime_%s_src (edge_runtime_artifacts_dir is %s)"
                             % (path, kind, show(v["edge_runtime_artifacts_dir"])))
                continue
            expected = v[sha].strip().lower()
            named = sha if expected else src
            if not expected:
                try:
                    with open(path + ".manifest.json") as handle:
                        expected = str((json.load(handle).get("artifact") or {}).get("sha256") or "").lower()
                except (OSError, ValueError, AttributeError):
                    expected = ""
                if not artifact.HEX64_RE.match(expected):
                    self.problem(sha, "No checksum for the %s artifact %s: set edge_runtime_%s_sha256 or keep the "
                                      ".manifest.json the packager wrote beside it" % (kind, path, kind))
                    continue
            actual = artifact.sha256_file(path)
            resolved.append({"kind": kind, "path": path, "sha256": actual})
            if actual != expected:
                self.problem(named, "Checksum mismatch for the %s artifact %s: sha256 %s, expected %s%s"
                             % (kind, path, actual, expected, "" if named == sha else " (from %s.manifest.json)"
                                % os.path.basename(path)))
                continue
            try:
                manifests[kind] = artifact.checked_manifest(path, kind, actual)
            except artifact.ArtifactError as exc:
                self.problem(src, "a corrupt or foreign artifact: %s" % exc)
        if self.facts:
            # What edge_facts read of the device's inference runtimes and of the Python it runs (the
            # runtime's interpreter when edge_runtime_python is that one); the rest is the device's
            # to check (edge_release, after the copy).
            runtimes = self.facts.get("inference_runtime")
            python = self.facts.get("python") or {}
            device = {"soc": self.facts.get("soc"), "l4t": self.facts.get("l4t"), "bsp": self.facts.get("bsp"),
                      "tensorrt": (runtimes or {}).get("tensorrt"), "rknn": (runtimes or {}).get("rknn"),
                      "python": python.get("version")}
            # The machine and its glibc are the device's to check (edge_release reads them there).
            unknown = ["architecture", "glibc"] + ([] if runtimes is not None else ["tensorrt", "rknn"])
            if not python.get("version") or v.get("edge_runtime_python") not in (
                    python.get("executable"), python.get("executable_link")):
                unknown.append("python")
            platform = {"tensorrt_by_l4t": self.controller_artifacts.get("tensorrt_by_l4t"),
                        "rknn_runtime": v.get("edge_runtime_rknn_version") or ""}
            for kind, manifest in sorted(manifests.items()):
                found = artifact.compatibility_problems(manifest, device, platform, unknown=unknown)
                if kind == "engine" and len(manifests) == 2:
                    found += artifact.pairing_problems(manifests["runtime"], manifests["engine"])
                if found:
                    self.problem("edge_runtime_%s_src" % kind, "incompatible release: %s" % "; ".join(found))
        elif len(manifests) == 2:
            found = artifact.pairing_problems(manifests["runtime"], manifests["engine"])
            if found:
                self.problem("edge_runtime_engine_src", "incompatible release: %s" % "; ".join(found))
        # The thread rule follows the backend: the runtime's manifest says what it was built for.
        built_for = (manifests.get("runtime") or {}).get("backend")
        if built_for and self.ok("edge_runtime_backend") and v["edge_runtime_backend"] != built_for:
            self.problem("edge_runtime_backend", "the runtime %s is built for the %s backend; allowed: %s"
                         % (manifests["runtime"].get("name", "artifact"), built_for, built_for))
        context = ((manifests.get("engine") or {}).get("model") or {}).get("context_length")
        if isinstance(context, int) and self.ok("edge_runtime_ctx_size") and v["edge_runtime_ctx_size"] > context:
            self.problem("edge_runtime_ctx_size", "more than the engine's context length; allowed: 64-%d (%s)"
                         % (context, manifests["engine"]["name"]))
        self.artifacts = resolved if len(manifests) == 2 else None

    def default_release(self):
        """{kind: tarball path} that ``auto`` names for this device (see edge_artifact.default_release),
        {} when no variable is auto, None (and a problem said) when none fits."""
        v = self.v
        auto = [kind for kind in ("runtime", "engine") if v["edge_runtime_%s_src" % kind] == artifact.AUTO]
        if not auto:
            return {}
        first = "edge_runtime_%s_src" % auto[0]
        if not self.facts.get("architecture"):
            self.problem(first, "auto picks the build for the device's architecture and glibc, which role edge_facts "
                                "reads: run it first (site.yml does), or name the tarball")
            return None
        try:
            server, engine = artifact.default_release(v["edge_runtime_artifacts_dir"] or ".",
                                                      artifact.release_device(self.facts),
                                                      unknown=artifact.AUTO_UNKNOWN)
        except artifact.ArtifactError as exc:
            self.problem(first, "auto: %s" % exc)
            return None
        return {"runtime": server["path"], "engine": engine["path"]}

    # ------------------------------------------------------------ edge_boot
    def edge_boot(self):
        """Nothing beyond the types: the state directory, the unit and the program are the plan's."""

    # ------------------------------------------------------------ edge_package
    def edge_package(self):
        self.device_path("edge_package_install_dir")
        why = package.refused_directory(self.v["edge_package_install_dir"]) \
            if self.ok("edge_package_install_dir") else None
        if why:
            self.problem("edge_package_install_dir", "%s: %s; allowed: another directory, such as %s"
                         % (show(self.v["edge_package_install_dir"]), why, package.DEFAULT_DIR))

    # ------------------------------------------------------------ edge_audit_timer
    def edge_audit_timer(self):
        v = self.v
        if self.ok("edge_audit_timer_enabled") and not v["edge_audit_timer_enabled"]:
            return
        self.device_path("edge_audit_timer_textfile")
        if self.ok("edge_audit_timer_textfile") and not v["edge_audit_timer_textfile"].endswith(".prom"):
            self.problem("edge_audit_timer_textfile", "node_exporter's textfile collector reads only *.prom files; "
                                                      "allowed: a path ending in .prom")
        if self.ok("edge_audit_timer_random_delay") and not _TIMESPAN.match(v["edge_audit_timer_random_delay"]):
            self.problem("edge_audit_timer_random_delay", "not a systemd time span; allowed: e.g. 15min, 1h 30min, "
                                                          "90s or 0")
        self.node_exporter()
        name = "edge_audit_timer_calendar"
        if self.ok(name):
            value = v[name]
            if not value.strip() or "\n" in value:
                self.problem(name, "allowed: one systemd OnCalendar expression such as \"*-*-* 05:30:00\" or daily")
            elif self.calendar is not None:
                error = self.calendar(value)
                if error:
                    self.problem(name, "%s; allowed: a systemd OnCalendar expression such as \"*-*-* 05:30:00\", "
                                       "daily or Mon..Fri 04:00" % error)

    def node_exporter(self):
        v = self.v
        if not (self.ok("edge_audit_timer_node_exporter") and v["edge_audit_timer_node_exporter"]):
            return
        name = "edge_audit_timer_node_exporter_package"
        if self.ok(name):
            package = v[name]
            if package.endswith(".deb"):
                if not os.path.isfile(package):
                    self.problem(name, "%s does not exist on the controller; allowed: a package name in the "
                                       "device's apt sources or a .deb file on the controller" % package)
            elif not _PACKAGE_NAME.match(package):
                self.problem(name, "%r is neither a package name nor a .deb file; allowed: e.g. "
                                   "prometheus-node-exporter or /srv/debs/prometheus-node-exporter_1.5.0_arm64.deb"
                             % package)
        name = "edge_audit_timer_node_exporter_listen"
        if self.ok(name):
            match = _LISTEN.match(v[name])
            if not match or not 0 < int(match.group(2)) < 65536:
                self.problem(name, "%r is not HOST:PORT; allowed: :9100, 127.0.0.1:9100 or [::1]:9100" % v[name])


# A Debian package name (Debian Policy 5.6.1), and a node exporter's --web.listen-address.
_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_LISTEN = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):(\d{1,5})$")


_ALLOWED_SLICE = {
    "edge_cgroups_slice": "",
    "edge_cgroups_cpu_weight": "; allowed: 1-10000",
    "edge_cgroups_io_weight": "; allowed: 1-10000",
    "edge_cgroups_cpu_quota": "; allowed: auto, \"\" (none) or NNN% up to 100% per CPU of the slice",
    "edge_cgroups_memory_max": "; allowed: NN% of the RAM, bytes with an optional K/M/G/T suffix, infinity or \"\"",
    "edge_cgroups_memory_high": "; allowed: NN% of the RAM, bytes with an optional K/M/G/T suffix, infinity or \"\" "
                                "(at most edge_cgroups_memory_max)",
    "edge_cgroups_rt_runtime_us": "",
    "edge_cgroups_probe_priority": "; allowed: 1-99",
}


# --------------------------------------------------------------------------
# Entry points

def known_variables(specs, exports=()):
    """Every variable name a user may set or the roles and playbooks set."""
    names = set(PLAYBOOK_OPTIONS) | set(PLAYBOOK_EXPORTS) | set(exports) | set(DEPRECATED)
    for options in specs.values():
        names.update(options)
    return names


def unknown_variables(present, specs, exports=()):
    """Warnings for edge_* variables no role or playbook knows, each naming the nearest known one."""
    known = known_variables(specs, exports)
    warnings = []
    for name in sorted(present):
        if not name.startswith("edge_") or name in known:
            continue
        if name in REMOVED:
            warnings.append("%s is no longer used and is ignored: %s" % (name, REMOVED[name]))
            continue
        near = [DEPRECATED.get(n, n) for n in difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)]
        warnings.append("%s is not a variable of any edgetune role or playbook and is ignored%s"
                        % (name, " (did you mean %s?)" % near[0] if near else ""))
    return warnings


def read_deprecated(values, specs):
    """The values with each deprecated name read for its new one; (values, {new: old}, warnings).

    The old name counts when the new one is not given or keeps its default
    (inside a role its defaults are among the host's variables)."""
    values = dict(values)
    defaults = {name: spec.get("default") for options in specs.values() for name, spec in options.items()}
    renamed, warnings = {}, []
    for old, new in sorted(DEPRECATED.items()):
        if old not in values:
            continue
        value = values.pop(old)
        if new in values and values[new] != defaults.get(new):
            warnings.append("%s is deprecated and ignored: %s is set too (remove %s)" % (old, new, old))
            continue
        values[new] = value
        renamed[new] = old
        warnings.append("%s is deprecated: name it %s (the old name is read until %s)" % (old, new, DEPRECATED_UNTIL))
    return values, renamed, warnings


def validate(values, specs, facts=None, profile=None, roles=None, present=(), exports=(), mode="apply",
             calendar=None, controller_artifacts=None):
    """Check the intent of one host; returns {"problems": [...], "warnings": [...], "intent": {...}}.

    values: {name: value} of the host (templated; options it does not set take
    their spec's default); specs: {role: {option: spec}} (each role's
    meta/argument_specs.yml main options; the playbooks' own under
    ``PLAYBOOKS`` are added when missing); roles: the roles to check (default
    all); present: the edge_* names the host sets (for the warnings on unknown
    ones); mode: apply or audit (audit needs no artifacts); calendar: a
    callable returning None or why a systemd calendar is bad, None to skip;
    controller_artifacts: None to skip the artifacts' files, else a dict with
    tensorrt_by_l4t (the role's table) to check them on the controller.

    Each problem is {"variable", "value", "message"}: one per bad variable.
    """
    specs = dict(specs)
    specs.setdefault(PLAYBOOKS, PLAYBOOK_OPTIONS)
    roles = list(roles) if roles else sorted(specs)
    values, renamed, deprecations = read_deprecated(values, specs)
    report = Report(shown_as=renamed)
    intent, given = {}, {}
    options = [(name, spec) for role in roles for name, spec in sorted((specs.get(role) or {}).items())]
    if "edge_cpu" not in roles and set(roles) & set(CPU_ROLES):
        # The roles that use the CPU split get it checked with them.
        options += [(name, (specs.get("edge_cpu") or {})[name]) for name in CPU_OPTIONS
                    if name in (specs.get("edge_cpu") or {})]
    if "edge_cgroups" not in roles and set(roles) & set(SLICE_ALIASES.values()) \
            and SLICE_OPTION in (specs.get("edge_cgroups") or {}):
        options.append((SLICE_OPTION, specs["edge_cgroups"][SLICE_OPTION]))
    for name, spec in options:
        raw = given[name] = values[name] if name in values else spec.get("default")
        try:
            intent[name] = check_type(raw, spec)
        except _Bad as exc:
            text = str(exc)
            report.add(name, raw, text if " allowed: " in text else "%s; allowed: %s" % (text, allowed(spec)))
    if "edge_mode" in values:
        try:
            mode = check_type(values["edge_mode"], PLAYBOOK_OPTIONS["edge_mode"])
        except _Bad:
            pass
    checker = _Checker(intent, report, facts, profile, roles, mode, calendar, controller_artifacts, given)
    checker.cpu_sets()
    order = [PLAYBOOKS, "edge_facts", "edge_bootargs", "edge_cpu", "edge_cgroups", "edge_power", "edge_pcie_qos",
             "edge_package", "edge_netqos", "edge_boot", "edge_runtime", "edge_audit_timer"]
    for role in order:
        if role in roles:
            getattr(checker, role)()
    warnings = unknown_variables(present, specs, exports) if present else []
    return {"problems": report.problems(), "warnings": warnings, "deprecations": deprecations, "intent": intent,
            "partition": checker.partition, "numa": checker.numa, "slice": checker.slice_values,
            "artifacts": checker.artifacts}


def summary(host, problems, roles=None):
    """The one failure message of a host: every bad variable, one line each.

    ``roles``: the roles of a role's own start-of-role check (earlier roles of
    the run may have changed things: only the role's own changes are none);
    None for the preflight's, which runs before any change on any device.
    """
    where = ("refused before any change on any device (nothing was changed)" if not roles
             else "refused before role %s changed anything" % ", ".join(roles))
    return ("%s: %d bad variable%s in the intent, %s:\n%s"
            % (host, len(problems), "" if len(problems) == 1 else "s", where,
               "\n".join("- " + p["message"] for p in problems)))
