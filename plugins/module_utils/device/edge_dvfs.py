# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU (cpufreq) and device (devfreq) frequency scaling: read, validate, plan, read back.

Runs on the device (Python 3.8+, stdlib only).  The same attribute names are
used for both kinds: ``governor``, ``min_freq`` and ``max_freq``; FILES maps
them to the sysfs file names.  cpufreq values are kHz, devfreq values Hz.

Write ordering: the kernel rejects (or silently clamps) a min above the
current max, so :func:`limit_writes` writes max first when the new min is above
the current max, and min first otherwise.  With a valid start state and a valid
end state one of the two orders is always safe:

- min first needs new_min <= cur_max;
- max first needs cur_min <= new_max, which holds whenever new_min > cur_max
  (cur_min <= cur_max < new_min <= new_max).

The module edge_dvfs and the boot program (edge_boot, kind ``dvfs``) share
:func:`run`: the module applies its options, saves :func:`state_settings` with
edge_boot.sync, and :func:`boot_apply` re-applies those settings at boot.
"""

import errno
import os
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import (
    read_kernel_value as read_sysfs, under, write_kernel_value as write_sysfs)

CPUFREQ = "cpufreq"
DEVFREQ = "devfreq"
ATTRS = ("governor", "min_freq", "max_freq")
FREQ_ATTRS = ("min_freq", "max_freq")
SNAPS = ("exact", "down", "up", "nearest")
# The keys of an entry (the module's options; a saved entry has policy, never cpus, and may have snap).
CPUFREQ_KEYS = ("policy", "cpus", "governor", "min_freq", "max_freq")
DEVFREQ_KEYS = ("node", "governor", "min_freq", "max_freq")

CPU_DIR = "sys/devices/system/cpu"
CPUFREQ_DIR = CPU_DIR + "/cpufreq"
DEVFREQ_DIR = "sys/class/devfreq"

FILES = {
    CPUFREQ: {"governor": "scaling_governor", "min_freq": "scaling_min_freq",
              "max_freq": "scaling_max_freq"},
    DEVFREQ: {"governor": "governor", "min_freq": "min_freq", "max_freq": "max_freq"},
}
UNITS = {CPUFREQ: "kHz", DEVFREQ: "Hz"}

_POLICY_RE = re.compile(r"^policy(\d+)$")


def _read_optional(path):
    try:
        return read_sysfs(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise


def _read_int(path):
    text = read_sysfs(path)
    try:
        return int(text)
    except ValueError:
        raise BadInput("%s: expected an integer, read %r" % (path, text)) from None


def parse_cpulist(text):
    """'0-3,8' or '0 1 2 3' (related_cpus) -> [0, 1, 2, 3, 8]."""
    cpus = []
    for part in text.replace(",", " ").split():
        if "-" in part:
            first, last = part.split("-", 1)
            cpus.extend(range(int(first), int(last) + 1))
        else:
            cpus.append(int(part))
    return cpus


def format_cpulist(cpus):
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    ranges = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in ranges)


# --------------------------------------------------------------------------
# Discovery

def list_policies(root):
    """{policy number: directory} of the cpufreq policies present."""
    base = under(root, CPUFREQ_DIR)
    found = {}
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for name in names:
        match = _POLICY_RE.match(name)
        if match and os.path.isdir(os.path.join(base, name)):
            found[int(match.group(1))] = os.path.join(base, name)
    return found


def list_devfreq(root):
    """{node name: directory} of the devfreq nodes present (class links resolved)."""
    base = under(root, DEVFREQ_DIR)
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    return {name: os.path.join(base, name) for name in names
            if os.path.isdir(os.path.join(base, name))}


def _related_cpus(directory):
    """The policy's CPUs, or None when the kernel does not tell (inactive policy)."""
    try:
        related = _read_optional(os.path.join(directory, "related_cpus"))
        return parse_cpulist(related) if related else None
    except (OSError, ValueError):
        return None


def describe_policies(root):
    """'policy0 (cpus 0-3), policy4 (cpus 4-7)' for error messages."""
    parts = []
    for number, directory in sorted(list_policies(root).items()):
        cpus = _related_cpus(directory)
        parts.append("policy%d (cpus %s)" % (number, format_cpulist(cpus) if cpus else "?"))
    return ", ".join(parts) or "none"


def inactive_reason(root, number, directory):
    """Why a present policy cannot be managed now, or None when it can.

    When every CPU of a cluster is offline (AGX Orin MODE_30W takes cpu8-11
    offline) the policy directory stays but the kernel answers EBUSY.
    """
    cpus = _related_cpus(directory)
    if cpus:
        online = []
        for cpu in cpus:
            state = _read_optional(under(root, "%s/cpu%d/online" % (CPU_DIR, cpu)))
            online.append(state != "0")  # cpu0 often has no online file: always online
        if not any(online):
            return "policy%d is inactive: its cpus %s are offline" % (number, format_cpulist(cpus))
    try:
        read_sysfs(os.path.join(directory, FILES[CPUFREQ]["governor"]))
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return "policy%d is inactive (the kernel answers EBUSY): its cpus are offline" % number
        raise
    return None


def policy_for_cpu(root, cpu):
    """The policy number that governs ``cpu``.

    ``cpuN/cpufreq`` is a symlink to ``../cpufreq/policyM``; when it is not
    (old kernels, or trees without the link) the policies' related_cpus decide.
    """
    link = under(root, "%s/cpu%d/cpufreq" % (CPU_DIR, cpu))
    if os.path.islink(link):
        match = _POLICY_RE.match(os.path.basename(os.readlink(link).rstrip("/")))
        if match:
            return int(match.group(1))
    for number, directory in sorted(list_policies(root).items()):
        if cpu in (_related_cpus(directory) or ()):
            return number
    raise LookupError("cpu%d has no cpufreq policy on this board; present: %s"
                      % (cpu, describe_policies(root)))


# --------------------------------------------------------------------------
# Reading

def read_state(kind, directory):
    """Current {governor, min_freq, max_freq} of a policy or devfreq node."""
    files = FILES[kind]
    return {
        "governor": read_sysfs(os.path.join(directory, files["governor"])),
        "min_freq": _read_int(os.path.join(directory, files["min_freq"])),
        "max_freq": _read_int(os.path.join(directory, files["max_freq"])),
    }


def read_available(kind, directory, name):
    """What a policy or node accepts.

    Returns {name, kind, governors (list or None), frequencies (sorted list or
    None), range (lowest, highest), range_source}.  A cpufreq driver without
    scaling_available_frequencies accepts any value in the cpuinfo range.
    """
    if kind == CPUFREQ:
        governors = _read_optional(os.path.join(directory, "scaling_available_governors"))
        table = _read_optional(os.path.join(directory, "scaling_available_frequencies"))
        low = _read_int(os.path.join(directory, "cpuinfo_min_freq"))
        high = _read_int(os.path.join(directory, "cpuinfo_max_freq"))
        source = "cpuinfo_min_freq..cpuinfo_max_freq"
    else:
        governors = _read_optional(os.path.join(directory, "available_governors"))
        table = _read_optional(os.path.join(directory, "available_frequencies"))
        low = high = None
        source = "available_frequencies"
    frequencies = None
    if table:
        try:
            frequencies = sorted(set(int(x) for x in table.split()))
        except ValueError:
            raise BadInput("%s: cannot parse frequency table %r" % (directory, table)) from None
    if low is None:
        if not frequencies:
            raise BadInput("%s: no available_frequencies to validate against" % directory)
        low, high = frequencies[0], frequencies[-1]
    return {
        "name": name,
        "kind": kind,
        "governors": governors.split() if governors else None,
        "frequencies": frequencies,
        "range": (low, high),
        "range_source": source,
    }


# --------------------------------------------------------------------------
# Validation and planning

def _steps_text(steps):
    return " ".join(str(step) for step in steps)


def resolve_freq(attr, value, available, snap="exact"):
    """A desired frequency (int, digit string, 'min' or 'max') -> the value to write."""
    name = available["name"]
    unit = UNITS[available["kind"]]
    table = available["frequencies"]
    low, high = available["range"]
    if snap not in SNAPS:
        raise BadInput("snap %r is not one of %s" % (snap, ", ".join(SNAPS)))
    if value in ("min", "max"):
        if table:
            return table[0] if value == "min" else table[-1]
        return low if value == "min" else high
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput("%s %r on %s: give a frequency in %s, or min or max"
                       % (attr, value, name, unit))
    if not low <= value <= high:
        raise BadInput("%s %d %s on %s is out of range %d..%d %s (%s)"
                       % (attr, value, unit, name, low, high, unit, available["range_source"]))
    if not table or value in table:
        return value
    below = [step for step in table if step < value]
    above = [step for step in table if step > value]
    if snap == "exact":
        nearest = below[-1:] + above[:1]
        raise BadInput(
            "%s %d %s on %s is not an available frequency; nearest steps: %s "
            "(set snap to down, up or nearest to round; available: %s)"
            % (attr, value, unit, name, _steps_text(nearest), _steps_text(table)))
    if snap == "down" and below:
        return below[-1]
    if snap == "up" and above:
        return above[0]
    if snap == "nearest":
        # Ties go to the lower step (the cooler choice).
        return min(below[-1:] + above[:1], key=lambda step: (abs(step - value), step))
    raise BadInput("%s %d %s on %s: no available frequency %s it; available: %s"
                   % (attr, value, unit, name, "at or below" if snap == "down" else "at or above",
                      _steps_text(table)))


def resolve(current, desired, available, snap="exact"):
    """Validate ``desired`` and return it resolved: {attr: value} for the attributes given.

    Raises ValueError naming the attribute and listing what is valid.
    """
    name = available["name"]
    unit = UNITS[available["kind"]]
    final = {}
    governor = desired.get("governor")
    if governor is not None:
        governors = available["governors"]
        if not isinstance(governor, str) or not governor or governor.split() != [governor]:
            raise BadInput("governor %r on %s is not a governor name" % (governor, name))
        if governors is not None and governor not in governors:
            raise BadInput("governor %r not available on %s; available: %s"
                           % (governor, name, " ".join(governors)))
        final["governor"] = governor
    for attr in FREQ_ATTRS:
        if desired.get(attr) is not None:
            final[attr] = resolve_freq(attr, desired[attr], available, snap)
    new_min = final.get("min_freq", current["min_freq"])
    new_max = final.get("max_freq", current["max_freq"])
    if new_min > new_max:
        raise BadInput(
            "min_freq %d %s%s > max_freq %d %s%s on %s"
            % (new_min, unit, "" if "min_freq" in final else " (current)",
               new_max, unit, "" if "max_freq" in final else " (current)", name))
    return final


def limit_writes(current, final):
    """Ordered (attr, old, new) writes of min_freq/max_freq; see the module docstring."""
    new_min = final.get("min_freq", current["min_freq"])
    new_max = final.get("max_freq", current["max_freq"])
    mins = [("min_freq", current["min_freq"], new_min)] if new_min != current["min_freq"] else []
    maxs = [("max_freq", current["max_freq"], new_max)] if new_max != current["max_freq"] else []
    if new_min > current["max_freq"]:
        return maxs + mins
    return mins + maxs


def plan(current, desired, available, snap="exact"):
    """The ordered list of (attribute, old, new) writes that reach ``desired``.

    The governor comes first (a governor change may reset the limits on some
    drivers), then the limits in a safe order.  ValueError when ``desired`` is
    not valid for this policy/node.
    """
    final = resolve(current, desired, available, snap)
    writes = []
    if "governor" in final and final["governor"] != current["governor"]:
        writes.append(("governor", current["governor"], final["governor"]))
    return writes + limit_writes(current, final)


def apply_state(current, writes):
    """``current`` with the planned writes applied (what check mode reports as after)."""
    after = dict(current)
    for attr, _old, new in writes:
        after[attr] = new
    return after


def readback_errors(kind, directory, final):
    """Messages for every managed attribute whose value did not stick."""
    errors = []
    state = read_state(kind, directory)
    for attr in ATTRS:
        if attr in final and state[attr] != final[attr]:
            errors.append("%s: expected %s, read back %s"
                          % (os.path.join(directory, FILES[kind][attr]), final[attr], state[attr]))
    return errors


# --------------------------------------------------------------------------
# Applying (the module and the boot program)

class Target(object):
    """One policy or devfreq node: where it is, what is wanted, what was found and done."""

    def __init__(self, kind, name, key, directory, desired):
        self.kind = kind
        self.name = name  # policy4 / fb000000.gpu
        self.key = key  # 4 / fb000000.gpu (as saved in the state file)
        self.directory = directory
        self.desired = desired
        self.current = self.available = self.final = self.after = None
        self.writes = []
        # Why the target is left out now (a policy whose CPUs are all offline), or None.
        self.inactive = None

    def report(self):
        files = FILES[self.kind]
        return {
            "path": self.directory,
            "managed": [a for a in ATTRS if a in (self.final or {})],
            "before": self.current,
            "after": self.after,
            "writes": [{"file": files[a], "old": old, "new": new} for a, old, new in self.writes],
        }

    def lines(self, state):
        files = FILES[self.kind]
        return ["%s: %s" % (os.path.join(self.directory, files[a]), state[a])
                for a in ATTRS if a in self.final]


def _wanted(entry, keys):
    return {k: entry[k] for k in keys if entry.get(k) is not None}


def entry_errors(kind, entry, extra=()):
    """Shape checks of one entry (the argument spec does them for Ansible; the boot program
    for saved settings, whose entries may also have the keys ``extra``)."""
    if not isinstance(entry, dict):
        return ["%s entry %r is not a mapping" % (kind, entry)]
    keys = (CPUFREQ_KEYS if kind == CPUFREQ else DEVFREQ_KEYS) + tuple(extra)
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        return ["%s entry %r: unknown keys %s" % (kind, entry, ", ".join(unknown))]
    if kind == CPUFREQ:
        given = [k for k in ("policy", "cpus") if entry.get(k) is not None]
        if len(given) != 1:
            return ["cpufreq entry %r needs exactly one of policy, cpus" % (entry,)]
        if isinstance(entry[given[0]], bool) or not isinstance(entry[given[0]], int):
            return ["cpufreq entry %r: %s must be an integer" % (entry, given[0])]
    elif not isinstance(entry.get("node"), str) or not entry["node"]:
        return ["devfreq entry %r needs a node name" % (entry,)]
    return []


def select_targets(root, cpufreq, devfreq, fail_on_missing):
    """Map the option entries to Targets; returns (targets, skipped, errors)."""
    targets, skipped, errors = [], [], []
    policies = list_policies(root)
    nodes = list_devfreq(root)

    def missing(kind, name, msg, reason="missing"):
        if fail_on_missing:
            errors.append(msg)
        else:
            skipped.append({"kind": kind, "name": name, "msg": msg, "reason": reason})

    for entry in cpufreq:
        problems = entry_errors(CPUFREQ, entry)
        if problems:
            errors.extend(problems)
            continue
        number = entry.get("policy")
        if number is None:
            try:
                number = policy_for_cpu(root, entry["cpus"])
            except LookupError as exc:
                missing(CPUFREQ, "cpu%d" % entry["cpus"], str(exc))
                continue
        if number not in policies:
            missing(CPUFREQ, "policy%d" % number, "policy%d not found; present: %s"
                    % (number, describe_policies(root)))
            continue
        try:
            inactive = inactive_reason(root, number, policies[number])
        except OSError as exc:
            errors.append("policy%d: %s" % (number, exc))
            continue
        desired = _wanted(entry, ATTRS)
        target = Target(CPUFREQ, "policy%d" % number, number, policies[number], desired)
        if inactive:
            missing(CPUFREQ, "policy%d" % number, inactive, "inactive")
            if fail_on_missing:
                continue
            # Kept (not applied) so that the state file carries it to the next boot.
            target.inactive = inactive
        targets.append(target)

    for entry in devfreq:
        problems = entry_errors(DEVFREQ, entry)
        if problems:
            errors.extend(problems)
            continue
        node = entry["node"]
        if node not in nodes:
            missing(DEVFREQ, node, "devfreq node %s not found; present: %s"
                    % (node, " ".join(sorted(nodes)) or "none"))
            continue
        targets.append(Target(DEVFREQ, node, node, nodes[node], _wanted(entry, ATTRS)))

    seen = set()
    for target in targets:
        if (target.kind, target.name) in seen:
            errors.append("%s is given more than once (as policy or through cpus)" % target.name)
        seen.add((target.kind, target.name))
    return targets, skipped, errors


def _write(target, attr, old, new):
    path = os.path.join(target.directory, FILES[target.kind][attr])
    try:
        write_sysfs(path, new)
    except OSError as exc:
        raise EdgeError("writing %s to %s failed: %s" % (new, path, exc.strerror or exc)) from None
    target.writes.append((attr, old, new))


def apply_target(target):
    """Governor, then the limits planned against what the kernel shows after it, then read back."""
    target.writes = []
    current = target.current
    if "governor" in target.final and target.final["governor"] != current["governor"]:
        _write(target, "governor", current["governor"], target.final["governor"])
        current = read_state(target.kind, target.directory)
    for attr, old, new in limit_writes(current, target.final):
        _write(target, attr, old, new)
    target.after = read_state(target.kind, target.directory)
    errors = readback_errors(target.kind, target.directory, target.final)
    if errors:
        raise EdgeError(errors)


def _report(targets):
    """The module's ``settings`` result: per kind and name, what was found and done."""
    report = {CPUFREQ: {}, DEVFREQ: {}}
    for target in targets:
        if target.current is not None:
            report[target.kind][target.name] = target.report()
    return report


def run(root, cpufreq=(), devfreq=(), snap="exact", fail_on_missing=True, check_mode=False):
    """Read, validate, plan and (unless check_mode) apply and read back.

    Returns (result, targets); ``targets`` holds the applied ones and, with
    fail_on_missing=False, the inactive policies (``target.inactive`` set, nothing read or
    written) for the state file. Raises EdgeError; on a validation error nothing was written.
    """
    if snap not in SNAPS:
        raise EdgeError("snap %r is not one of %s" % (snap, ", ".join(SNAPS)))
    selected, skipped, errors = select_targets(root, cpufreq or [], devfreq or [], fail_on_missing)
    targets = [target for target in selected if not target.inactive]
    for target in targets:
        try:
            target.current = read_state(target.kind, target.directory)
            target.available = read_available(target.kind, target.directory, target.name)
            target.final = resolve(target.current, target.desired, target.available, snap)
            target.writes = plan(target.current, target.desired, target.available, snap)
        except (ValueError, OSError) as exc:
            errors.append(str(exc))
    if errors:
        raise EdgeError(errors, left_out=skipped)

    done = []
    for target in targets:
        if check_mode:
            target.after = apply_state(target.current, target.writes)
            continue
        try:
            apply_target(target)
        except (EdgeError, OSError, ValueError) as exc:
            messages = exc.errors if isinstance(exc, EdgeError) else [str(exc)]
            raise EdgeError(messages, settings=_report(done + [target]), left_out=skipped,
                            changed=any(t.writes for t in done + [target])) from None
        done.append(target)

    result = {
        "changed": any(target.writes for target in targets),
        "settings": _report(targets),
        "left_out": skipped,
    }
    return result, targets + [target for target in selected if target.inactive]


# --------------------------------------------------------------------------
# Boot-time state (kind "dvfs" of edge_boot)

def state_settings(targets, snap="exact"):
    """The settings saved for the boot: {cpufreq: [entries], devfreq: [entries]}, sorted.

    An entry is {policy or node, and the resolved governor, min_freq, max_freq managed}. An
    inactive policy is saved with its values as given; its frequencies are resolved at boot,
    with the entry's ``snap`` (saved when they are numbers and ``snap`` is not exact).
    """
    settings = {CPUFREQ: [], DEVFREQ: []}
    for target in targets:
        entry = {"policy" if target.kind == CPUFREQ else "node": target.key}
        if target.inactive:
            entry.update(target.desired)
            numbers = [v for k, v in target.desired.items() if k in FREQ_ATTRS and v not in ("min", "max")]
            if numbers and snap != "exact":
                entry["snap"] = snap
        else:
            entry.update(target.final)
        settings[target.kind].append(entry)
    settings[CPUFREQ].sort(key=lambda e: e["policy"])
    settings[DEVFREQ].sort(key=lambda e: e["node"])
    return settings


def settings_errors(settings):
    """What makes saved settings unusable: one message per problem (empty when they are fine)."""
    if not isinstance(settings, dict):
        return ["settings %r are not a mapping of cpufreq and devfreq entries" % (settings,)]
    problems = []
    unknown = sorted(set(settings) - {CPUFREQ, DEVFREQ})
    if unknown:
        problems.append("settings: unknown keys %s (known: %s, %s)" % (", ".join(unknown), CPUFREQ, DEVFREQ))
    for kind in (CPUFREQ, DEVFREQ):
        entries = settings.get(kind, [])
        if not isinstance(entries, list):
            problems.append("settings: %s is %r, not a list of entries" % (kind, entries))
            continue
        for entry in entries:
            found = entry_errors(kind, entry, extra=("snap",))
            if not found and entry.get("snap", "exact") not in SNAPS:
                found = ["%s entry %r: snap %r is not one of %s"
                         % (kind, entry, entry["snap"], ", ".join(SNAPS))]
            problems.extend(found)
    return problems


def boot_apply(settings, root="/"):
    """Re-apply saved settings (edge_boot's kind ``dvfs``): (changes, errors) as lines.

    Each entry on its own: a node whose driver did not load must not keep the others untuned.
    A missing policy or node is an error; a policy whose CPUs the power mode keeps offline is
    left as it is (a line among the changes). EdgeError when the settings are malformed.
    """
    problems = settings_errors(settings)
    if problems:
        raise EdgeError(problems)
    changes, errors = [], []
    for kind in (CPUFREQ, DEVFREQ):
        for saved in settings.get(kind, []):
            entry = dict(saved)
            snap = entry.pop("snap", "exact")
            lists = ([entry], []) if kind == CPUFREQ else ([], [entry])
            try:
                result, targets = run(root, lists[0], lists[1], snap, fail_on_missing=False)
            except EdgeError as exc:
                errors.extend(exc.errors)
                continue
            except Exception as exc:  # one line, and the other entries still applied
                errors.append("%s entry %r: %s" % (kind, entry, exc))
                continue
            for item in result["left_out"]:
                if item["reason"] == "inactive":
                    changes.append("%s left as it is: %s" % (item["name"], item["msg"]))
                else:
                    errors.append(item["msg"])
            for target in targets:
                if not target.inactive:
                    changes.extend("%s %s: %s -> %s" % (target.name, FILES[target.kind][attr], old, new)
                                   for attr, old, new in target.writes)
    return changes, errors


# ------------------------------------------------------------------ the drift audit's checks
def overridden_by_restore(settings, saved):
    """The attribute files a jetson_clocks restore writes back (``saved``: {path: value}, what it saved
    before pinning) with another value than this module's ``settings`` ({kind: {name: {managed, after}}},
    its result) set: in check mode, where the restore did not write, the settings a real run sets again
    after it. Sorted paths."""
    found = set()
    for kind in (CPUFREQ, DEVFREQ):
        for name, target in ((settings or {}).get(kind) or {}).items():
            for attr in target.get("managed") or []:
                suffix = "/%s/%s" % (name, FILES[kind][attr])
                found.update(path for path, value in (saved or {}).items()
                             if path.endswith(suffix) and str(value) != str(target["after"][attr]))
    return sorted(found)


def audit_checks(power, dvfs_plan, clusters, pending_boot=False):
    """Role edge_power's checks for the drift audit (plugins/module_utils/device/edge_audit.py's schema),
    from the plan's power part (``power``), this module's plan on the device (``dvfs_plan``:
    settings per kind and name with the managed attributes and their values after, and what was
    left out and why), the device's CPU clusters, and whether a pending power mode changes which
    CPUs are online at the next boot (``pending_boot``). Each managed governor and limit is a
    ``value`` (running); a policy offline only until that boot is checked as it will be, so the
    checks do not change across the reboot; one the mode keeps offline is unsupported, with the
    reason; then jetson_clocks and the nvpmodel mode, where the plan manages them."""
    values, others = [], []
    for kind in (CPUFREQ, DEVFREQ):
        for name, target in sorted(((dvfs_plan.get("settings") or {}).get(kind) or {}).items()):
            for attr in target.get("managed") or []:
                values.append({"setting": "%s %s %s" % (kind, name, attr), "role": "edge_power", "kind": "value",
                               "path": "%s/%s" % (target["path"], FILES[kind][attr]),
                               "desired": str(target["after"][attr])})
    for item in dvfs_plan.get("left_out") or []:
        if item.get("reason") == "inactive" and pending_boot:
            number = int(item["name"][len("policy"):])
            cluster = next((c for c in clusters or [] if c.get("policy") == number), {})
            for entry in power.get("cpufreq") or []:
                of_cluster = entry.get("cpus") is not None and entry["cpus"] in (cluster.get("cpus") or ())
                if entry.get("policy") != number and not of_cluster:
                    continue
                for attr in ATTRS:
                    wanted = entry.get(attr)
                    if wanted is not None and (attr == "governor" or (isinstance(wanted, (int, float))
                                                                      and not isinstance(wanted, bool))):
                        values.append({"setting": "cpufreq %s %s" % (item["name"], attr), "role": "edge_power",
                                       "kind": "value", "desired": str(wanted),
                                       "path": "/%s/%s/%s" % (CPUFREQ_DIR, item["name"], FILES[CPUFREQ][attr])})
        else:
            others.append({"setting": "%s %s" % (item["kind"], item["name"]), "role": "edge_power",
                           "kind": "unsupported", "reason": item.get("msg")})
    if power.get("jetson_clocks_managed"):
        others.append({"setting": "jetson_clocks", "role": "edge_power", "kind": "jetson_clocks",
                       "desired": "pinned" if power.get("jetson_clocks") else "restored"})
    if power.get("nvpmodel_managed"):
        others.append({"setting": "nvpmodel mode", "role": "edge_power", "kind": "nvpmodel",
                       "mode": power.get("nvpmodel_mode")})
    return sorted(values, key=lambda check: check["setting"]) + others
