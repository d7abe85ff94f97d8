#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_irq_affinity: keep interrupts and unbound kernel work on the housekeeping CPUs.

The reading, planning and writing are in plugins/module_utils/device/edge_irq.py, shared with the
drift audit and with the boot program (plugins/module_utils/device/edge_boot.py) that re-applies
the module's state file at every boot.
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
  - With O(state_file), the settings and the interrupts that refused are saved in edgetune's
    boot-time state format (plugins/module_utils/device/edge_boot.py, kind C(irq_affinity)), re-applied at
    every boot by C(edgetune-boot.service) (role edge_boot; no Ansible needed on the board);
    IRQ affinity does not survive a reboot by itself.
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
      - Also save the settings and the interrupts that refused to this file (atomically, only
        when its content changes), in edgetune's boot-time state format (plugins/module_utils/device/edge_boot.py,
        kind C(irq_affinity)), re-applied at every boot by C(edgetune-boot.service) (role edge_boot);
        the recorded refusals also predict refusals in check mode. Not written in check mode or when
        the run fails.
      - The roles point it at C(/etc/edgetune/boot.d/irq-affinity.json). A file there that is not an
        C(irq_affinity) state of that format is replaced.
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
notes:
  - The kernel argument C(irqaffinity=) (role edge_bootargs) sets the default affinity at boot;
    this module moves what drivers registered anyway and keeps the setting at run time.
  - A running irqbalance moves interrupts again; ban the inference CPUs in its configuration
    (C(IRQBALANCE_BANNED_CPULIST)) or stop it (role edge_cpu, O(cpus) stays the truth).
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Keep interrupts and unbound workqueues on the A55 cores of an RK3588
  edge_irq_affinity:
    cpus: 0-3
    state_file: /etc/edgetune/boot.d/irq-affinity.json

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
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import (  # noqa: E402
    format_cpulist, parse_cpulist)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError, exit_module  # noqa: E402
# The reading, the classification and the writes of interrupts are shared with the
# drift audit and the boot program (plugins/module_utils/device/edge_irq.py).
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_irq import (  # noqa: E402
    GENERATED_BY, KIND, known_refusals, read_state, run, state_settings)


def summary(plan, cpus_text, check_mode=False):
    verb = "would move" if check_mode else "moved"
    text = "%s %d IRQ(s) to CPUs %s" % (verb, len(plan.moved), cpus_text)
    if plan.unmovable:
        text += "; %d unmovable left as they are (per-CPU or managed): %s" % (
            len(plan.unmovable), ", ".join("%d %s" % (u["irq"], u["name"] or "?") for u in plan.unmovable))
    outside = [u for u in plan.unmovable if u.get("outside")]
    if outside:
        text += ("; %d of the unmovable reach CPUs outside %s (the kernel places per-CPU and managed IRQs; "
                 "isolcpus=managed_irq keeps managed ones off isolated CPUs where it can): %s" % (
                     len(outside), cpus_text, ", ".join("%d %s %s" % (u["irq"], u["name"] or "?", u["affinity"])
                                                        for u in outside)))
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

    def work():
        saved = read_state(p["state_file"])[1] if p["state_file"] else None
        plan = run(p["root"], p["cpus"], p["keep_subsets"], p["default_affinity"], p["workqueue"],
                   p["unmovable_names"], known_refusals(saved), module.check_mode)
        cpus_text = format_cpulist(parse_cpulist(p["cpus"]))
        result = result_of(plan, cpus_text)
        result["changed"] = bool(plan.moved) or any(
            r and r.get("changed") for r in (plan.default_affinity, plan.workqueue))
        if plan.errors:
            raise EdgeError(plan.errors, **dict(result, changed=result["changed"]))
        diff = [{"before_header": "IRQ affinity", "after_header": "IRQ affinity",
                 "before": "".join(line + "\n" for line in plan.lines_before),
                 "after": "".join(line + "\n" for line in plan.lines_after)}]
        if p["state_file"]:
            settings = state_settings(cpus_text, p["keep_subsets"], p["default_affinity"], p["workqueue"],
                                      p["unmovable_names"], plan)
            edge_boot.sync_into(result, diff, p["state_file"], KIND, settings, GENERATED_BY, module.check_mode)
        result["msg"] = summary(plan, cpus_text, module.check_mode)
        return result, diff

    exit_module(module, "edge_irq_affinity", work)


if __name__ == "__main__":
    main()
