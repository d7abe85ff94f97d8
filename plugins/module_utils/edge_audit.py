# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drift audit: compare the desired state with what the device persists and runs.

The desired state is rendered on the controller by the same role logic that
applies it; each role hands over a list of *checks*, and this file evaluates
them all on the device in one pass, writing nothing.  Python 3.8+, stdlib.

Check kinds:

``cmdline``  boot arguments: the boot file is planned with the same code the
             edge_kernel_cmdline module writes with (a planned edit means the
             persisted state drifted) and /proc/cmdline is the running state.
             Keys: bootloader, path, args, absent, record and keep (the
             record of managed arguments, read as edge_kernel_cmdline reads
             it: a key the intent dropped must have its old tokens back, or be
             gone; an out-of-date record is drift too).
``value``    a runtime value such as a sysfs attribute: running only.  Keys:
             path, desired, compare (``text``, ``cpulist``, or ``bytes``: a
             memory limit the kernel rounded down to whole pages).
``file``     a persisted file (unit, config, state file): its sha1 against the
             sha1 of the content the role renders.  Keys: path, sha1.
``irq_affinity``  interrupt steering (role edge_cpu), running only, classified by
             the same code the edge_irq_affinity module moves interrupts with
             (plugins/module_utils/edge_irq.py).  Keys: cpus (the housekeeping CPUs),
             target (``irqs``, ``default_affinity`` or ``workqueue``), and for
             irqs keep_subsets, unmovable_names, state_file (the module's record
             of the interrupts the kernel refused to move), inference (CPU list,
             named in the detail).  A movable interrupt that reaches CPUs outside
             the housekeeping set is drift; a per-CPU or managed one the kernel
             places itself (hinted by /proc/interrupts, or refused earlier) is not.
``unsupported``  the role found the feature missing; Keys: reason.

States: ok, drifted, pending-reboot (persisted but not running: a boot-only
setting waiting for its reboot, not drift), unsupported, error.
"""
import hashlib
import os

from ansible_collections.edgetune.fleet.plugins.module_utils.edge_bootfile import plan_files, plan_managed
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_cmdline import (
    pending_changes, split_cmdline, token_key)
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_cpulist import (
    format_cpulist, parse_cpulist, parse_cpumask)

try:
    from ansible_collections.edgetune.fleet.plugins.module_utils.edge_irq import (
        DEFAULT_AFFINITY, WORKQUEUE_MASK, IrqError, classify, compile_patterns, known_refusals, mask_target,
        read_interrupts, read_irqs, read_state, validate_cpus)
except ImportError:  # an on-device install without edge_irq.py: only the irq_affinity checks fail
    classify = None

# The largest page size a memory limit is rounded down to (arm64 64 KiB pages).
PAGE_ROUNDING = 65536
STATES = ("ok", "drifted", "pending-reboot", "unsupported", "error")


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _read(root, path):
    with open(_under(root, path)) as handle:
        return handle.read()


def check_cmdline(check, root):
    args, absent = list(check.get("args") or []), list(check.get("absent") or [])
    path = _under(root, check["path"])
    record = _under(root, check["record"]) if check.get("record") else None
    managed = plan_managed(check["bootloader"], path, args, absent, record, check.get("keep") or ())
    args, absent, plans = managed.args, managed.absent, managed.plans
    persisted = plan_files(check["bootloader"], path, [], [])[0].persisted  # the file as it is
    boot_file_ok = all(plan.after == plan.before for plan in plans)
    running = split_cmdline(_read(root, "/proc/cmdline"))
    pending = pending_changes(running, args, absent)
    if not boot_file_ok:
        missing = pending_changes(persisted, args, absent)
        if not missing:  # the right tokens, in another order or number
            planned = plans[0].persisted
            missing = ["%s= as %s" % (key, " ".join(t for t in planned if token_key(t) == key))
                       for key in sorted(set(map(token_key, persisted + planned)))
                       if [t for t in persisted if token_key(t) == key] != [t for t in planned if token_key(t) == key]]
        missing = missing or ["fallback entry or formatting"]
        return "drifted", "boot file %s lacks: %s" % (check["path"], " ".join(missing)), persisted, running
    if managed.record is not None and managed.record.after != managed.record.before:
        return "drifted", "record %s does not list the managed arguments" % check["record"], persisted, running
    if pending:
        return "pending-reboot", "in the boot file, not running yet: %s" % " ".join(pending), persisted, running
    return "ok", "", persisted, running


def check_value(check, root):
    try:
        running = _read(root, check["path"]).strip()
    except OSError as exc:
        return "drifted", "cannot read %s: %s" % (check["path"], exc.strerror), None, None
    desired = str(check["desired"])
    if check.get("compare") == "cpulist":
        same = parse_cpulist(running) == parse_cpulist(desired)
    elif check.get("compare") == "bytes" and running.isdigit() and desired.isdigit():
        # The kernel rounds a memory limit down to whole pages (4-64 KiB).
        same = 0 <= int(desired) - int(running) < PAGE_ROUNDING
    else:
        same = running == desired
    detail = "" if same else "%s is %r, desired %r" % (check["path"], running, desired)
    return ("ok" if same else "drifted"), detail, None, running


def check_file(check, root):
    path = _under(root, check["path"])
    if not os.path.exists(path):
        return "drifted", "%s is missing" % check["path"], None, None
    with open(path, "rb") as handle:
        digest = hashlib.sha1(handle.read()).hexdigest()
    same = digest == check["sha1"]
    return ("ok" if same else "drifted"), ("" if same else "%s was changed" % check["path"]), digest, None


def _irqs_state(check, root, wanted):
    state_file = check.get("state_file")
    doc = read_state(_under(root, state_file))[1] if state_file else None
    classified = classify(read_irqs(root), read_interrupts(root), wanted, check.get("keep_subsets", True),
                          compile_patterns(check.get("unmovable_names")), known_refusals(doc))
    movable = [c for c in classified if not (c["status"] == "move" and (c["hint"] or c["known_refused"]))]
    stray = [c for c in movable if c["status"] == "move"]
    running = ["%d %s: %s" % (c["irq"], c["name"] or "?", format_cpulist(c["affinity"])) for c in movable]
    if not stray:
        return "ok", "", None, running
    inference = set(parse_cpulist(str(check.get("inference") or "")))
    parts = []
    for c in stray:
        outside = sorted(set(c["affinity"]) - set(wanted))
        reached = sorted(set(outside) & inference)
        parts.append("IRQ %d (%s) on %s, reaches %s CPUs %s" % (
            c["irq"], c["name"] or "?", format_cpulist(c["affinity"]), "inference" if reached else "non-housekeeping",
            format_cpulist(reached or outside)))
    return "drifted", "%s; desired %s" % ("; ".join(parts), format_cpulist(wanted)), None, running


def check_irq_affinity(check, root):
    if classify is None:
        return "error", "module_utils/edge_irq.py is not installed beside the audit", None, None
    target = check.get("target", "irqs")
    try:
        wanted = validate_cpus(root, str(check["cpus"]))
        if target == "irqs":
            return _irqs_state(check, root, wanted)
        relpath = {"default_affinity": DEFAULT_AFFINITY, "workqueue": WORKQUEUE_MASK}[target]
        path = _under(root, relpath)
        if not os.path.exists(path):
            if target == "workqueue":
                return "unsupported", "this kernel has no unbound workqueue cpumask (/%s)" % relpath, None, None
            return "drifted", "/%s is missing" % relpath, None, None
        before = parse_cpumask(_read(root, relpath).strip())
    except IrqError as exc:
        return "error", str(exc), None, None
    running = format_cpulist(before)
    if mask_target(before, wanted, check.get("keep_subsets", True)) == before:
        return "ok", "", None, running
    return "drifted", "/%s is %s, desired %s" % (relpath, running, format_cpulist(wanted)), None, running


CHECKERS = {"cmdline": check_cmdline, "value": check_value, "file": check_file, "irq_affinity": check_irq_affinity}


def evaluate(check, root="/"):
    """One check -> a result dict (setting, role, state, detail, desired, persisted, running)."""
    result = {"setting": check["setting"], "role": check.get("role", ""),
              "desired": check.get("desired", check.get("args", check.get("sha1", check.get("cpus"))))}
    if check["kind"] == "unsupported":
        result.update(state="unsupported", detail=check.get("reason", ""), persisted=None, running=None)
        return result
    checker = CHECKERS.get(check["kind"])
    if checker is None:
        result.update(state="error", detail="unknown check kind %r" % check["kind"], persisted=None, running=None)
        return result
    try:
        state, detail, persisted, running = checker(check, root)
    except (OSError, ValueError, KeyError) as exc:
        state, detail, persisted, running = "error", "%s: %s" % (type(exc).__name__, exc), None, None
    result.update(state=state, detail=detail, persisted=persisted, running=running)
    return result


def audit(checks, root="/"):
    results = [evaluate(check, root) for check in checks]
    summary = dict((state, sum(1 for r in results if r["state"] == state)) for state in STATES)
    return results, summary


def prometheus_text(host, results):
    """node_exporter textfile lines: edgetune_drift{host,setting,state} 1."""
    def label(value):
        return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    lines = ["# HELP edgetune_drift 1 for the state each managed setting is in.",
             "# TYPE edgetune_drift gauge"]
    for result in results:
        lines.append('edgetune_drift{host="%s",setting="%s",role="%s",state="%s"} 1' % (
            label(host), label(result["setting"]), label(result["role"]), result["state"]))
    return "\n".join(lines) + "\n"
