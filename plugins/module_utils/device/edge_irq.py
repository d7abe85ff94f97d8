# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which interrupts may move, and where they should be: shared by the edge_irq_affinity
module (which moves them), the boot program edge_boot (which moves them again at every
boot, through boot_apply) and the drift audit (which only reads).

Reads /proc/irq/<n>/smp_affinity_list (or smp_affinity), /proc/interrupts, the online
CPUs and the module's state file; run() (unless in check mode) and boot_apply() write
the affinity files, default_smp_affinity and the unbound workqueue cpumask.  Python 3.8+,
stdlib and the collection's own module utilities only.

Classification of one interrupt against the housekeeping CPUs:

``ok``    its affinity is exactly the housekeeping CPUs;
``kept``  it lies inside them (pinned to a subset on purpose; with keep_subsets);
``move``  it reaches other CPUs.  Per-CPU and managed interrupts refuse a move
          (the kernel answers EIO): ``hint`` names why when /proc/interrupts
          says so, ``known_refused`` when the state file recorded a refusal.
"""
import errno
import os
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import (
    format_cpulist, format_cpumask, parse_cpulist, parse_cpumask)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import (
    read_kernel_value as read_value, under, write_kernel_value as write_value)

# The kind of boot-time state (plugins/module_utils/device/edge_boot.py) the module saves.
KIND = "irq_affinity"
GENERATED_BY = "edge_irq_affinity"
IRQ_DIR = "proc/irq"
INTERRUPTS = "proc/interrupts"
CPU_ONLINE = "sys/devices/system/cpu/online"
DEFAULT_AFFINITY = IRQ_DIR + "/default_smp_affinity"
WORKQUEUE_MASK = "sys/devices/virtual/workqueue/cpumask"

# What the kernel answers to an affinity write it will not do (irq_can_set_affinity_usr()
# is false for per-CPU and managed interrupts: EIO); EPERM where the file is locked,
# ENOSPC where the target CPUs have no free vector (x86).
REFUSALS = {errno.EIO: "EIO", errno.EPERM: "EPERM", errno.ENOSPC: "ENOSPC"}

# Hints from /proc/interrupts. GIC PPIs (hwirq 16-31) are per-CPU by definition.
PERCPU_NAMES = re.compile(r"^(arch_timer|arch_mem_timer|arm-pmu|arm_pmu|kvm guest [pv]timer|vgic)$")
MANAGED_NAMES = (re.compile(r"^nvme\d+q[1-9]\d*$"), re.compile(r"^virtio\d+-(req|request)\.\d+$"))
_ROW = re.compile(r"^\s*(\d+):\s+(.*)$")
_DESC = re.compile(r"^(?P<chip>\S+)\s+(?P<hwirq>\d+)(?:-|\s+)(?P<trigger>[A-Za-z]+)(?:\s+(?P<name>.*))?$")


def parse_interrupts(text):
    """/proc/interrupts -> {irq: {chip, hwirq, trigger, name}} for the numbered rows.

    The columns after the per-CPU counts differ by architecture: arm64 prints
    ``GICv3  30 Level  arch_timer``, x86 ``IR-PCI-MSI 524288-edge  nvme0q0``.
    Rows without a number (IPI0, LOC, NMI, ...) have no /proc/irq entry and are skipped.
    """
    lines = text.splitlines()
    if not lines:
        return {}
    ncpus = len(re.findall(r"CPU\d+", lines[0]))
    found = {}
    for line in lines[1:]:
        match = _ROW.match(line)
        if not match:
            continue
        fields = match.group(2).split()
        rest = fields[ncpus:] if all(f.isdigit() for f in fields[:ncpus]) else fields
        desc = " ".join(rest)
        parsed = _DESC.match(desc)
        if parsed:
            info = {"chip": parsed.group("chip"), "hwirq": int(parsed.group("hwirq")),
                    "trigger": parsed.group("trigger"), "name": (parsed.group("name") or "").strip()}
        else:
            info = {"chip": rest[0] if rest else "", "hwirq": None, "trigger": "",
                    "name": " ".join(rest[1:])}
        found[int(match.group(1))] = info
    return found


def read_interrupts(root):
    try:
        return parse_interrupts(read_value(under(root, INTERRUPTS)))
    except OSError:
        return {}


def read_irqs(root):
    """Every /proc/irq/<n> with its affinity file: list of dicts sorted by number."""
    base = under(root, IRQ_DIR)
    try:
        names = os.listdir(base)
    except OSError as exc:
        raise EdgeError(["cannot read %s: %s (is /proc mounted?)" % (base, exc.strerror or exc)]) from None
    irqs = []
    for name in sorted((n for n in names if n.isdigit()), key=int):
        directory = os.path.join(base, name)
        listfile = os.path.join(directory, "smp_affinity_list")
        maskfile = os.path.join(directory, "smp_affinity")
        if os.path.exists(listfile):
            path, text = listfile, read_value(listfile)
            cpus = parse_cpulist(text)
        elif os.path.exists(maskfile):
            path, text = maskfile, read_value(maskfile)
            cpus = parse_cpumask(text)
        else:
            continue  # an interrupt without an affinity file cannot be steered at all
        irqs.append({"irq": int(name), "path": path, "affinity": cpus, "mask_width": len(text.replace(",", ""))})
    return irqs


def hint(info, patterns):
    """Why this interrupt is probably not movable, or None."""
    name, chip, hwirq = info.get("name", ""), info.get("chip", ""), info.get("hwirq")
    if chip.upper().startswith("GIC") and hwirq is not None and 16 <= hwirq <= 31:
        return "per-CPU interrupt (GIC PPI %d)" % hwirq
    if PERCPU_NAMES.match(name):
        return "per-CPU interrupt (%s)" % name
    if any(p.match(name) for p in MANAGED_NAMES):
        return "managed interrupt (multi-queue device: %s)" % name
    for pattern in patterns:
        if pattern.search(name):
            return "named unmovable by unmovable_names (%s)" % pattern.pattern
    return None


def compile_patterns(unmovable_names):
    try:
        return [re.compile(p) for p in unmovable_names or []]
    except re.error as exc:
        raise EdgeError(["unmovable_names: bad regular expression: %s" % exc]) from None


def refused_key(irq, name):
    return "%d %s" % (irq, name)


def validate_cpus(root, text):
    """The housekeeping CPU list -> sorted CPUs; EdgeError when empty, malformed or offline."""
    try:
        cpus = parse_cpulist(text)
    except ValueError as exc:
        raise EdgeError(["cpus: %s" % exc]) from None
    if not cpus:
        raise EdgeError(["cpus is empty: give the housekeeping CPUs, for example 0-3"])
    online_path = under(root, CPU_ONLINE)
    try:
        online = parse_cpulist(read_value(online_path))
    except (OSError, ValueError) as exc:
        raise EdgeError(["cannot read the online CPUs from %s: %s" % (online_path, exc)]) from None
    offline = [c for c in cpus if c not in online]
    if offline:
        raise EdgeError(["housekeeping CPUs %s are not online (online: %s); nothing was changed"
                        % (format_cpulist(offline), format_cpulist(online))])
    return cpus


def classify(irqs, interrupts, wanted, keep_subsets=True, patterns=(), known_refused=()):
    """Each interrupt of read_irqs() with name, chip, status (ok, kept, move), hint and known_refused."""
    known = set(known_refused or [])
    classified = []
    for item in irqs:
        info = interrupts.get(item["irq"], {})
        entry = dict(item, name=info.get("name", ""), chip=info.get("chip", ""), hint=None, known_refused=False)
        current = item["affinity"]
        if current == wanted:
            entry["status"] = "ok"
        elif keep_subsets and current and set(current) <= set(wanted):
            entry["status"] = "kept"
        else:
            entry["status"] = "move"
            entry["hint"] = hint(info, patterns)
            entry["known_refused"] = refused_key(item["irq"], entry["name"]) in known
        classified.append(entry)
    return classified


def mask_target(before, wanted, keep_subsets=True):
    """Where a mask file (default_smp_affinity, workqueue cpumask) should be."""
    return before if (keep_subsets and before and set(before) <= set(wanted)) else list(wanted)


def read_state(path):
    """(text, settings) of the module's state file: (None, None) when it does not exist,
    settings None when it is not an irq_affinity state of edge_boot's format."""
    return edge_boot.read(path, KIND)


def known_refusals(settings):
    """The "irq name" keys of the interrupts the state file's settings record as refused."""
    refused = (settings or {}).get("refused")
    if not isinstance(refused, list):
        return set()
    return {refused_key(r["irq"], r.get("name", "")) for r in refused
            if isinstance(r, dict) and isinstance(r.get("irq"), int)}


# --------------------------------------------------------------------------
# Writing: the module's run and the boot-time re-apply

class Plan(object):
    def __init__(self):
        self.moved, self.unmovable, self.kept, self.lines_before, self.lines_after = [], [], [], [], []
        self.errors = []
        # Refused on an earlier run and in place now (e.g. after a reboot with
        # irqaffinity=): still remembered, so the state file does not change.
        self.remembered = []
        self.default_affinity = None
        self.workqueue = None


def _mask_file(root, relpath, cpus, keep_subsets, check_mode):
    """Plan/apply one hex-mask file; returns a report dict and the diff lines."""
    path = under(root, relpath)
    text = read_value(path)
    try:
        before = parse_cpumask(text)
    except ValueError as exc:
        raise EdgeError(["%s: %s" % (path, exc)]) from None
    target = mask_target(before, cpus, keep_subsets)
    report = {"path": path, "before": format_cpulist(before), "after": format_cpulist(target)}
    if target != before and not check_mode:
        width = max(len(text.replace(",", "")) * 4, max(cpus) + 1)
        value = format_cpumask(target, width)
        try:
            write_value(path, value)
        except OSError as exc:
            raise EdgeError(["writing %s to %s failed: %s" % (value, path, exc.strerror or exc)]) from None
        after = parse_cpumask(read_value(path))
        report["after"] = format_cpulist(after)
        if after != target:
            raise EdgeError(["%s reads %s after writing %s" % (path, report["after"], format_cpulist(target))])
    report["changed"] = report["before"] != report["after"]
    return report


def run(root="/", cpus="", keep_subsets=True, default_affinity=True, workqueue=True,
        unmovable_names=(), known_refused=(), check_mode=False):
    """Read, validate, plan and (unless check_mode) apply and read back. Returns a Plan.

    EdgeError (nothing written) for bad cpus or unmovable_names and an unreadable /proc/irq;
    a failure of one write is in plan.errors and the others are still done."""
    wanted = validate_cpus(root, cpus)
    patterns = compile_patterns(unmovable_names)
    irqs = classify(read_irqs(root), read_interrupts(root), wanted, keep_subsets, patterns, known_refused)
    plan = Plan()
    wanted_text = format_cpulist(wanted)
    known = set(known_refused or ())

    for item in irqs:
        irq, path, current, name, reason = item["irq"], item["path"], item["affinity"], item["name"], item["hint"]
        current_text = format_cpulist(current)
        plan.lines_before.append("%s: %s" % (path, current_text))
        entry = {"irq": irq, "name": name}
        if item["status"] in ("ok", "kept"):
            if refused_key(irq, name) in known:
                plan.remembered.append(entry)
            if item["status"] == "kept":
                plan.kept.append(dict(entry, affinity=current_text))
            plan.lines_after.append("%s: %s" % (path, current_text))
            continue
        unmovable = dict(entry, chip=item["chip"], affinity=current_text,
                         outside=bool(set(current) - set(wanted)))
        if check_mode:
            if reason or item["known_refused"]:
                why = reason or "refused on an earlier run (state file)"
                plan.unmovable.append(dict(unmovable, reason="predicted: " + why))
                plan.lines_after.append("%s: %s" % (path, current_text))
            else:
                plan.moved.append(dict(entry, before=current_text, after=wanted_text))
                plan.lines_after.append("%s: %s" % (path, wanted_text))
            continue
        value = wanted_text if path.endswith("_list") else format_cpumask(
            wanted, max(item["mask_width"] * 4, max(wanted) + 1))
        try:
            write_value(path, value)
        except OSError as exc:
            if exc.errno in REFUSALS:
                plan.unmovable.append(dict(unmovable, reason="refused (%s): %s" % (
                    REFUSALS[exc.errno], reason or "not movable (per-CPU or managed)")))
                plan.lines_after.append("%s: %s" % (path, current_text))
            else:
                plan.errors.append("writing %s to %s failed: %s" % (value, path, exc.strerror or exc))
                plan.lines_after.append("%s: %s" % (path, current_text))
            continue
        try:
            text = read_value(path)
            after = parse_cpulist(text) if path.endswith("_list") else parse_cpumask(text)
        except (OSError, ValueError) as exc:
            plan.errors.append("reading back %s failed: %s" % (path, exc))
            continue
        plan.lines_after.append("%s: %s" % (path, format_cpulist(after)))
        if after != wanted:
            plan.errors.append("%s reads %s after writing %s" % (path, format_cpulist(after), wanted_text))
            continue
        plan.moved.append(dict(entry, before=current_text, after=wanted_text))

    for enabled, relpath, attr in ((default_affinity, DEFAULT_AFFINITY, "default_affinity"),
                                   (workqueue, WORKQUEUE_MASK, "workqueue")):
        if not enabled:
            continue
        if not os.path.exists(under(root, relpath)):
            if attr == "workqueue":
                plan.workqueue = {"path": under(root, relpath), "absent": True, "changed": False}
                continue
            plan.errors.append("%s is missing" % under(root, relpath))
            continue
        try:
            report = _mask_file(root, relpath, wanted, keep_subsets, check_mode)
        except EdgeError as exc:
            plan.errors.extend(exc.errors)
            continue
        except OSError as exc:
            plan.errors.append("%s: %s" % (under(root, relpath), exc.strerror or exc))
            continue
        setattr(plan, attr, report)
        plan.lines_before.append("%s: %s" % (report["path"], report["before"]))
        plan.lines_after.append("%s: %s" % (report["path"], report["after"]))
    return plan


# --------------------------------------------------------------------------
# The boot-time state (edge_boot kind irq_affinity)

# settings key -> (type, default when absent; None: required), what boot_apply accepts.
SETTINGS = {
    "cpus": (str, None),
    "keep_subsets": (bool, True),
    "default_affinity": (bool, True),
    "workqueue": (bool, True),
    "unmovable_names": (list, []),
    "refused": (list, []),
}


def state_settings(cpus_text, keep_subsets, default_affinity, workqueue, unmovable_names, plan):
    """The settings the module saves: what to apply at boot, and the interrupts that refused
    (refused on this run, or on an earlier one and in place now) for check mode and the audit."""
    refused = sorted({(u["irq"], u["name"]) for u in plan.unmovable + plan.remembered})
    return {"cpus": cpus_text, "keep_subsets": bool(keep_subsets), "default_affinity": bool(default_affinity),
            "workqueue": bool(workqueue), "unmovable_names": list(unmovable_names or []),
            "refused": [{"irq": irq, "name": name} for irq, name in refused]}


def check_settings(settings):
    """The settings with defaults filled in; EdgeError naming every bad key and what is allowed."""
    if not isinstance(settings, dict):
        raise EdgeError("irq_affinity settings must be a mapping of %s, not %s"
                        % (", ".join(sorted(SETTINGS)), type(settings).__name__))
    errors = []
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        errors.append("unknown irq_affinity setting(s) %s (allowed: %s)"
                      % (", ".join(unknown), ", ".join(sorted(SETTINGS))))
    checked = {}
    for key in sorted(SETTINGS):
        kind, default = SETTINGS[key]
        if key not in settings:
            if default is None:
                errors.append("irq_affinity setting %s is missing: give the housekeeping CPUs as a CPU list "
                              "string, for example \"0-3\"" % key)
            checked[key] = list(default) if isinstance(default, list) else default
            continue
        value = settings[key]
        if kind is str and not isinstance(value, str):
            errors.append("irq_affinity setting %s must be a CPU list string such as \"0-3\", not %r" % (key, value))
        elif kind is bool and not isinstance(value, bool):
            errors.append("irq_affinity setting %s must be true or false, not %r" % (key, value))
        elif key == "unmovable_names" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            errors.append("irq_affinity setting unmovable_names must be a list of regular expressions (strings), "
                          "not %r" % (value,))
        elif key == "refused" and not isinstance(value, list):
            errors.append("irq_affinity setting refused must be a list of {irq, name}, not %r" % (value,))
        checked[key] = value
    if errors:
        raise EdgeError(errors)
    return checked


def boot_apply(settings, root="/"):
    """Re-apply saved settings at boot (edge_boot): (changes, errors) as lines.

    The same run as the module's, for real: every movable interrupt, default_smp_affinity
    and the workqueue cpumask each on its own. EdgeError (nothing written) for malformed
    settings, housekeeping CPUs that are not online, or no /proc/irq."""
    checked = check_settings(settings)
    plan = run(root, checked["cpus"], checked["keep_subsets"], checked["default_affinity"], checked["workqueue"],
               checked["unmovable_names"], (), False)
    changes = ["irq %d (%s): %s -> %s" % (m["irq"], m["name"] or "?", m["before"], m["after"]) for m in plan.moved]
    for report in (plan.default_affinity, plan.workqueue):
        if report and report.get("changed"):
            changes.append("%s: %s -> %s" % (report["path"], report["before"], report["after"]))
    if plan.unmovable:
        changes.append("%d unmovable IRQ(s) left as they are: %s" % (
            len(plan.unmovable), ", ".join("%d %s" % (u["irq"], u["name"] or "?") for u in plan.unmovable)))
    return changes, list(plan.errors)
