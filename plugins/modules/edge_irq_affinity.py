#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_irq_affinity: keep interrupts and unbound kernel work on the housekeeping CPUs.

Also a command line for the boot-time re-apply unit, usable without Ansible:
``python3 edge_irq_affinity.py --apply-state FILE [--root /]``.
"""

DOCUMENTATION = r"""
---
module: edge_irq_affinity
short_description: Move movable IRQs (and unbound workqueues) to the housekeeping CPUs, with read-back
description:
  - Sets C(/proc/irq/<n>/smp_affinity_list) of every interrupt to the housekeeping CPUs given in
    O(cpus), so that device interrupts stay off the CPUs isolated for inference.
  - Per-CPU interrupts (arch timer, PMU) and managed interrupts (NVMe I/O queues, virtio-blk
    request queues) cannot be moved; the kernel refuses the write with C(EIO) (C(EPERM) or
    C(ENOSPC) on some setups). Like irqbalance, the module treats a refused write as "this
    interrupt is not movable", leaves it as it is and reports it in RV(unmovable) with the reason.
    C(/proc/interrupts) names and chips are used as hints to label them (GIC PPIs, known
    per-CPU names, NVMe and virtio queue names) and, in check mode, to predict refusals.
  - Also sets C(/proc/irq/default_smp_affinity) (interrupts registered later start on the
    housekeeping CPUs) and, with O(workqueue), C(/sys/devices/virtual/workqueue/cpumask) (unbound
    kernel workqueues run on the housekeeping CPUs).
  - Everything is read and validated first; a bad O(cpus) fails with one message and nothing
    is written. Every write is read back; a value that did not stick is an error naming the file.
  - With O(state_file), the settings and the interrupts that refused are saved as JSON, so
    that a boot-time unit can re-apply them with C(python3 edge_irq_affinity.py --apply-state FILE)
    (no Ansible needed on the board); IRQ affinity does not survive a reboot by itself.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  cpus:
    description: The housekeeping CPUs as a kernel CPU list, for example V(0-3).
    type: str
    required: true
  keep_subsets:
    description:
      - Leave an interrupt whose affinity already lies inside O(cpus) as it is (someone pinned it
        to one housekeeping CPU on purpose). With V(false) every movable interrupt is set to
        exactly O(cpus).
    type: bool
    default: true
  default_affinity:
    description: Also set C(/proc/irq/default_smp_affinity), used for interrupts registered later.
    type: bool
    default: true
  workqueue:
    description:
      - Also set the unbound workqueue cpumask (C(/sys/devices/virtual/workqueue/cpumask)).
        A kernel without that file is reported in RV(workqueue) and not an error.
    type: bool
    default: true
  unmovable_names:
    description:
      - More regular expressions (matched against the action names in C(/proc/interrupts))
        naming interrupts known not to move, to label them and predict them in check mode.
        The write is still tried in a real run; the kernel's answer decides.
    type: list
    elements: str
    default: []
  state_file:
    description:
      - Also save the settings and the interrupts that refused to this JSON file (atomically,
        only when its content changes) for the boot-time re-apply, and to predict refusals in
        check mode. Not written in check mode or when the run fails.
    type: path
  root:
    description: Prefix for C(/proc) and C(/sys) paths (for tests and fake trees).
    type: path
    default: /
attributes:
  check_mode:
    description:
      - Reads everything and reports exactly which writes would be made; writes nothing.
        An interrupt that needs a change is predicted unmovable when the hints or the
        state file's record of earlier refusals say so, else reported as would-move.
    support: full
  diff_mode:
    description: "One C(path: value) line per interrupt and mask file, before and after; and the state file."
    support: full
  platform:
    description: Runs on the board (Linux, Python 3.8 or later).
    support: full
    platforms: linux
notes:
  - The kernel argument C(irqaffinity=) (role edge_bootargs) sets the default affinity at boot;
    this module moves what drivers registered anyway and keeps the setting at run time.
  - A running irqbalance moves interrupts again; ban the inference CPUs in its configuration
    (C(IRQBALANCE_BANNED_CPULIST)) or stop it (role edge_cpu, O(cpus) stays the truth).
"""

EXAMPLES = r"""
- name: Keep interrupts and unbound workqueues on the A55 cores of an RK3588
  edge_irq_affinity:
    cpus: 0-3
    state_file: /etc/edgetune/cpu-affinity.json

- name: See what would move, without writing
  edge_irq_affinity:
    cpus: 0-3
  check_mode: true
  diff: true
"""

RETURN = r"""
cpus:
  description: The housekeeping CPUs, in the kernel's compact form.
  returned: success
  type: str
  sample: 0-3
moved:
  description: Interrupts moved (in check mode, that would move), with the affinity before and after.
  returned: success
  type: list
  elements: dict
  sample: [{irq: 40, name: "xhci-hcd:usb1", before: "0-7", after: "0-3"}]
unmovable:
  description:
    - Interrupts left as they are because the kernel refused the write (in check mode, predicted),
      with chip, current affinity, whether it reaches CPUs outside O(cpus), and the reason.
  returned: success
  type: list
  elements: dict
  sample: [{irq: 11, name: arch_timer, chip: GICv3, affinity: "0-7", outside: true,
            reason: "refused (EIO): per-CPU interrupt (GIC PPI 26)"}]
unmovable_count:
  description: Number of entries in RV(unmovable).
  returned: success
  type: int
kept:
  description: Interrupts already confined to a subset of O(cpus), left as they are (O(keep_subsets)).
  returned: success
  type: list
  elements: dict
default_affinity:
  description: "C(path), C(before), C(after) of C(/proc/irq/default_smp_affinity) (CPU lists); null when not managed."
  returned: success
  type: dict
workqueue:
  description:
    - "C(path), C(before), C(after) of the unbound workqueue cpumask, or C(absent: true)."
    - Null when not managed.
  returned: success
  type: dict
state_file_changed:
  description: Whether the state file's content changed (or would change in check mode).
  returned: when O(state_file) is given
  type: bool
errors:
  description: Every error message (the same text as C(msg), split).
  returned: failure
  type: list
  elements: str
"""

# Ansible modules keep their imports after the documentation strings.
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

try:
    from ansible.module_utils.basic import AnsibleModule
    from ansible_collections.edgetune.fleet.plugins.module_utils import edge_cpulist as cpulist
    from ansible_collections.edgetune.fleet.plugins.module_utils import edge_irq
    from ansible_collections.edgetune.fleet.plugins.module_utils.edge_fileio import atomic_write
except ImportError:
    # Boot-time CLI on a board without Ansible: import the helpers shipped next to
    # this file (module_utils/ beside it on the device, or ../module_utils in the collection).
    if "--apply-state" not in sys.argv:
        raise
    AnsibleModule = atomic_write = None
    _here = os.path.dirname(os.path.abspath(__file__))
    for _candidate in (os.path.join(_here, "module_utils"), os.path.join(_here, os.pardir, "module_utils")):
        if all(os.path.isfile(os.path.join(_candidate, n)) for n in ("edge_cpulist.py", "edge_irq.py")):
            sys.path.insert(0, _candidate)
            import edge_cpulist as cpulist
            import edge_irq
            break
    else:
        sys.stderr.write("edge_irq_affinity: error: module_utils/edge_cpulist.py and edge_irq.py not found next to %s\n"
                         % _here)
        raise SystemExit(1)

# The reading and the classification of interrupts are shared with the drift
# audit (plugins/module_utils/edge_irq.py); this module adds the writes.
STATE_FORMAT = edge_irq.STATE_FORMAT
IRQ_DIR = edge_irq.IRQ_DIR
INTERRUPTS = edge_irq.INTERRUPTS
CPU_ONLINE = edge_irq.CPU_ONLINE
WORKQUEUE_MASK = edge_irq.WORKQUEUE_MASK
REFUSALS = edge_irq.REFUSALS
IrqError = edge_irq.IrqError
under = edge_irq.under
read_value = edge_irq.read_value
parse_interrupts = edge_irq.parse_interrupts
read_irqs = edge_irq.read_irqs
hint = edge_irq.hint
validate_cpus = edge_irq.validate_cpus
read_state = edge_irq.read_state
known_refusals = edge_irq.known_refusals


def write_value(path, value):
    """``echo value > path``: no O_CREAT, a missing file is an error. Tests replace it."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, ("%s\n" % value).encode("ascii"))
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# Planning and applying

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
        before = cpulist.parse_cpumask(text)
    except ValueError as exc:
        raise IrqError(["%s: %s" % (path, exc)]) from None
    target = edge_irq.mask_target(before, cpus, keep_subsets)
    report = {"path": path, "before": cpulist.format_cpulist(before), "after": cpulist.format_cpulist(target)}
    if target != before and not check_mode:
        width = max(len(text.replace(",", "")) * 4, max(cpus) + 1)
        value = cpulist.format_cpumask(target, width)
        try:
            write_value(path, value)
        except OSError as exc:
            raise IrqError(["writing %s to %s failed: %s" % (value, path, exc.strerror or exc)]) from None
        after = cpulist.parse_cpumask(read_value(path))
        report["after"] = cpulist.format_cpulist(after)
        if after != target:
            raise IrqError(["%s reads %s after writing %s" % (path, report["after"], cpulist.format_cpulist(target))])
    report["changed"] = report["before"] != report["after"]
    return report


def run(root="/", cpus="", keep_subsets=True, default_affinity=True, workqueue=True,
        unmovable_names=(), known_refused=(), check_mode=False):
    """Read, validate, plan and (unless check_mode) apply and read back. Returns a Plan."""
    wanted = validate_cpus(root, cpus)
    patterns = edge_irq.compile_patterns(unmovable_names)
    irqs = edge_irq.classify(read_irqs(root), edge_irq.read_interrupts(root), wanted, keep_subsets, patterns,
                             known_refused)
    plan = Plan()
    wanted_text = cpulist.format_cpulist(wanted)
    known = set(known_refused or ())

    for item in irqs:
        irq, path, current, name, reason = item["irq"], item["path"], item["affinity"], item["name"], item["hint"]
        current_text = cpulist.format_cpulist(current)
        plan.lines_before.append("%s: %s" % (path, current_text))
        entry = {"irq": irq, "name": name}
        if item["status"] in ("ok", "kept"):
            if edge_irq.refused_key(irq, name) in known:
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
        value = wanted_text if path.endswith("_list") else cpulist.format_cpumask(
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
            after = cpulist.parse_cpulist(text) if path.endswith("_list") else cpulist.parse_cpumask(text)
        except (OSError, ValueError) as exc:
            plan.errors.append("reading back %s failed: %s" % (path, exc))
            continue
        plan.lines_after.append("%s: %s" % (path, cpulist.format_cpulist(after)))
        if after != wanted:
            plan.errors.append("%s reads %s after writing %s" % (path, cpulist.format_cpulist(after), wanted_text))
            continue
        plan.moved.append(dict(entry, before=current_text, after=wanted_text))

    for enabled, relpath, attr in ((default_affinity, edge_irq.DEFAULT_AFFINITY, "default_affinity"),
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
        except IrqError as exc:
            plan.errors.extend(exc.errors)
            continue
        except OSError as exc:
            plan.errors.append("%s: %s" % (under(root, relpath), exc.strerror or exc))
            continue
        setattr(plan, attr, report)
        plan.lines_before.append("%s: %s" % (report["path"], report["before"]))
        plan.lines_after.append("%s: %s" % (report["path"], report["after"]))
    return plan


def summary(plan, cpus_text, check_mode=False):
    verb = "would move" if check_mode else "moved"
    text = "%s %d IRQ(s) to CPUs %s" % (verb, len(plan.moved), cpus_text)
    if plan.unmovable:
        text += "; %d unmovable left as they are (per-CPU or managed): %s" % (
            len(plan.unmovable), ", ".join("%d %s" % (u["irq"], u["name"] or "?") for u in plan.unmovable))
    if plan.kept:
        text += "; %d already on a subset of the housekeeping CPUs" % len(plan.kept)
    if plan.workqueue and plan.workqueue.get("absent"):
        text += "; this kernel has no unbound workqueue cpumask"
    return text


def result_of(plan, cpus_text):
    return {
        "cpus": cpus_text,
        "moved": plan.moved,
        "unmovable": plan.unmovable,
        "unmovable_count": len(plan.unmovable),
        "kept": plan.kept,
        "default_affinity": plan.default_affinity,
        "workqueue": plan.workqueue,
    }


def state_document(cpus_text, keep_subsets, default_affinity, workqueue, unmovable_names, plan):
    refused = sorted({(u["irq"], u["name"]) for u in plan.unmovable + plan.remembered})
    doc = {"format": STATE_FORMAT, "generated_by": "edge_irq_affinity", "cpus": cpus_text,
           "keep_subsets": bool(keep_subsets), "default_affinity": bool(default_affinity),
           "workqueue": bool(workqueue), "unmovable_names": list(unmovable_names or []),
           "refused": [{"irq": irq, "name": name} for irq, name in refused]}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cpus=dict(type="str", required=True),
            keep_subsets=dict(type="bool", default=True),
            default_affinity=dict(type="bool", default=True),
            workqueue=dict(type="bool", default=True),
            unmovable_names=dict(type="list", elements="str", default=[]),
            state_file=dict(type="path"),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        before_text, doc = read_state(p["state_file"]) if p["state_file"] else (None, None)
        plan = run(p["root"], p["cpus"], p["keep_subsets"], p["default_affinity"], p["workqueue"],
                   p["unmovable_names"], known_refusals(doc), module.check_mode)
        cpus_text = cpulist.format_cpulist(cpulist.parse_cpulist(p["cpus"]))
        result = result_of(plan, cpus_text)
        result["changed"] = bool(plan.moved) or any(
            r and r.get("changed") for r in (plan.default_affinity, plan.workqueue))
        if plan.errors:
            raise IrqError(plan.errors, **dict(result, changed=result["changed"]))
        diff = [{"before_header": "IRQ affinity", "after_header": "IRQ affinity",
                 "before": "".join(line + "\n" for line in plan.lines_before),
                 "after": "".join(line + "\n" for line in plan.lines_after)}]
        if p["state_file"]:
            after_text = state_document(cpus_text, p["keep_subsets"], p["default_affinity"], p["workqueue"],
                                        p["unmovable_names"], plan)
            result["state_file_changed"] = before_text != after_text
            if before_text != after_text:
                result["changed"] = True
                diff.append({"before_header": p["state_file"], "after_header": p["state_file"],
                             "before": before_text or "", "after": after_text})
                if not module.check_mode:
                    try:
                        directory = os.path.dirname(p["state_file"])
                        if directory:
                            os.makedirs(directory, 0o755, exist_ok=True)
                        atomic_write(p["state_file"], after_text, backup=False, mode=0o644)
                    except OSError as exc:
                        raise IrqError(["writing state file %s failed: %s" % (p["state_file"], exc.strerror or exc)],
                                       **result) from None
        result["msg"] = summary(plan, cpus_text, module.check_mode)
        if module._diff:
            result["diff"] = diff
    except IrqError as exc:
        module.fail_json(msg=str(exc), errors=exc.errors, **exc.details)
    except Exception as exc:  # never a traceback: report what went wrong in one line
        module.fail_json(msg="edge_irq_affinity: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


# --------------------------------------------------------------------------
# Boot-time re-apply (no Ansible)

def apply_state_file(path, root="/", out=sys.stdout, err=sys.stderr):
    """Re-apply a state file; one line per move on ``out``, per error on ``err``. Returns 0/1."""
    try:
        _text, doc = read_state(path)
        if doc is None:
            raise IrqError(["state file %s: missing or not an edge_irq_affinity state file of format %d"
                            % (path, STATE_FORMAT)])
        if not isinstance(doc.get("cpus"), str):
            raise IrqError(["state file %s: cpus must be a CPU list" % path])
        plan = run(root, doc["cpus"], doc.get("keep_subsets", True), doc.get("default_affinity", True),
                   doc.get("workqueue", True), doc.get("unmovable_names") or [], (), False)
    except IrqError as exc:
        for message in exc.errors:
            err.write("edge_irq_affinity: error: %s\n" % message)
        return 1
    except Exception as exc:  # never a traceback in the boot log
        err.write("edge_irq_affinity: error: %s\n" % exc)
        return 1
    for moved in plan.moved:
        out.write("edge_irq_affinity: irq %d (%s): %s -> %s\n"
                  % (moved["irq"], moved["name"] or "?", moved["before"], moved["after"]))
    for attr in ("default_affinity", "workqueue"):
        report = getattr(plan, attr)
        if report and report.get("changed"):
            out.write("edge_irq_affinity: %s: %s -> %s\n" % (report["path"], report["before"], report["after"]))
    if plan.unmovable:
        out.write("edge_irq_affinity: %d unmovable IRQ(s) left as they are: %s\n" % (
            len(plan.unmovable), ", ".join("%d %s" % (u["irq"], u["name"] or "?") for u in plan.unmovable)))
    for message in plan.errors:
        err.write("edge_irq_affinity: error: %s\n" % message)
    return 1 if plan.errors else 0


def cli(argv):
    parser = argparse.ArgumentParser(
        prog="edge_irq_affinity.py",
        description="Re-apply the IRQ and workqueue affinity saved by the edge_irq_affinity module.")
    parser.add_argument("--apply-state", metavar="FILE", required=True,
                        help="state file written by the module's state_file option")
    parser.add_argument("--root", default="/", help="prefix for /proc and /sys paths (default /)")
    args = parser.parse_args(argv)
    return apply_state_file(args.apply_state, args.root)


if __name__ == "__main__":
    if "--apply-state" in sys.argv:
        raise SystemExit(cli(sys.argv[1:]))
    main()
