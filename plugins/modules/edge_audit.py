#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# -*- coding: utf-8 -*-
"""Ansible module edge_audit, and the on-device drift audit command."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: edge_audit
short_description: Classify every managed setting as ok, drifted, pending-reboot or unsupported
description:
  - Evaluates, in one pass on the device, the checks that the edgetune roles render on the
    controller from the same desired state they apply, and reports for each setting its desired,
    persisted and running values and its state.
  - A boot-only setting that is in the boot file but not yet running is C(pending-reboot), not drift.
  - Never writes the device, except the optional Prometheus textfile.
  - Also runs without Ansible, for a systemd timer on devices no controller reaches
    (C(python3 edge_audit.py --records DIR --prometheus FILE), which evaluates the checks of every apply
    record in DIR as recorded), with the module_utils it needs
    installed beside it in the collection's package layout
    (C(ansible_collections/edgetune/fleet/plugins/module_utils/)).
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  checks:
    description:
      - The checks, each with C(setting), C(role) and C(kind) (plugins/module_utils/device/edge_audit.py documents
        every key).
      - C(cmdline) boot arguments (boot file planned with the edge_kernel_cmdline code, and C(/proc/cmdline)).
      - C(value) a running value such as a sysfs, C(/proc/sys) or cgroup file (C(path), C(desired), C(compare)
        C(text), C(cpulist), or C(bytes) for a memory limit the kernel rounded down to whole pages).
      - C(file) a persisted file against the sha1 of what the role renders (C(path), C(sha1)).
      - C(irq_affinity) interrupt steering, classified by the code the edge_irq_affinity module moves
        interrupts with (plugins/module_utils/device/edge_irq.py), with C(cpus) (housekeeping), C(target) (C(irqs),
        C(default_affinity) or C(workqueue)), C(keep_subsets), C(unmovable_names), C(state_file),
        C(inference). A movable interrupt reaching CPUs outside C(cpus) is drift; per-CPU and managed
        interrupts (hinted by C(/proc/interrupts) or recorded as refused in C(state_file)) are not.
      - C(unsupported) a setting the role found the device cannot have (C(reason)).
      - Evaluated after the checks of O(records), when both are given.
    type: list
    elements: dict
  records:
    description:
      - The plan's audit part (C(ansible_facts.edge_plan.audit), from action edgetune.fleet.edge_plan), that is
        the record directory (C(record_dir)) and, per role (C(roles)), whether it is enabled and the C(inputs)
        its desired state is made of today.
      - The checks of every enabled role's record (written by the last apply, with the inputs of that apply) are
        evaluated; a role without a record, or whose recorded inputs differ from today's, is reported drifted
        (setting C(ROLE applied state)), naming the variables and plan parts that changed.
    type: dict
  evaluated:
    description:
      - With O(records), the records as the run's first device execution already read and evaluated them
        (C(ansible_facts.edge_applied), which role edge_facts publishes in an apply and in the audit's preflight).
        The action plugin then judges them against O(records) on the controller, and the module does not run, so
        the audit costs the device one execution, the facts' own.
      - Leave it out where the device changed since that execution (an apply's own checks).
    type: dict
  root:
    description: Root of the tree to read, for tests on fixture trees.
    type: path
    default: /
  prometheus_file:
    description: Also write the results as a node_exporter textfile here (atomically).
    type: path
  host:
    description: Host label for the Prometheus lines.
    type: str
    default: localhost
attributes:
  check_mode:
    description:
      - Reads only and evaluates every check as in a real run; the O(prometheus_file) is not written in check mode.
      - RV(ignore:changed) is always false, in both modes (the textfile is a report, not a managed setting).
    support: full
  diff_mode:
    description: Changes no setting, so there is no difference to show.
    support: none
  platform:
    description:
      - Runs on the board (Linux, Python 3.8 or later); also as a command without Ansible (see the description).
    support: full
    platforms: linux
"""

EXAMPLES = r"""
- name: Audit the boot arguments
  edge_audit:
    checks:
      - setting: bootargs
        role: edge_bootargs
        kind: cmdline
        bootloader: extlinux
        path: /boot/extlinux/extlinux.conf
        args: ["isolcpus=managed_irq,domain,4-7"]
        absent: []
      - setting: IRQ affinity
        role: edge_cpu
        kind: irq_affinity
        cpus: 0-3
        inference: 4-7
        state_file: /etc/edgetune/cpu-affinity.json
  register: audit
"""

RETURN = r"""
msg:
  description: What the audit found, on one line (the fleet summary shows it for each device with findings).
  returned: always
  type: str
  sample: "drifted: edgetune-probe unit, cpufreq policy0 governor; 41 ok, 1 unsupported"
results:
  description: One entry per check, in the order of O(checks).
  returned: always
  type: list
  elements: dict
  contains:
    setting:
      description: The setting's name (the check's C(setting)).
      returned: always
      type: str
      sample: bootargs
    role:
      description: The role that manages it (the check's C(role)).
      returned: always
      type: str
      sample: edge_bootargs
    state:
      description: V(ok), V(drifted), V(pending-reboot), V(unsupported) or V(error).
      returned: always
      type: str
      sample: pending-reboot
    detail:
      description: What differs, or why the setting is in this state, in words.
      returned: always
      type: str
      sample: "in the boot file, waiting for a reboot: to add: isolcpus=managed_irq,domain,4-7; to remove: quiet"
    desired:
      description: The desired value (its type depends on the check's C(kind)).
      returned: always
      type: raw
    persisted:
      description: The persisted value (the boot file's arguments, a file's sha1); null for kinds without one.
      returned: always
      type: raw
    running:
      description:
        - The running value (C(/proc/cmdline), the file's content, the interrupts' affinities);
          null for kinds without one.
      returned: always
      type: raw
judged_on:
  description: V(controller) where the action plugin judged O(evaluated) without running the module on the device.
  returned: when O(evaluated) is given
  type: str
  sample: controller
summary:
  description: The number of results in each state.
  returned: always
  type: dict
  sample: {ok: 12, drifted: 0, pending-reboot: 1, unsupported: 0, error: 0}
"""

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

# Run as the on-device command (the timer's), not as an Ansible module.
ON_DEVICE = __name__ == "__main__" and bool({"--checks", "--records"} & set(a.split("=")[0] for a in sys.argv[1:]))
if ON_DEVICE:
    # On-device command: the module_utils are installed beside this file.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import (  # noqa: E402
    audit, audit_records, findings_line, prometheus_text, task_results)
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_lease  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import atomic_write  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_metrics import with_new_timestamp  # noqa: E402


def cli(argv):
    import argparse
    import json
    import socket
    parser = argparse.ArgumentParser(prog="edge_audit", description="edgetune drift audit on the device")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--records", help="directory of the apply records (the checks of every role, as applied)")
    source.add_argument("--checks", help="JSON file of checks ({\"checks\": [...]})")
    parser.add_argument("--prometheus", help="write a node_exporter textfile here")
    parser.add_argument("--root", default="/")
    parser.add_argument("--lease", default=edge_lease.LEASE_FILE, help="the apply lease (an apply holds it: skip)")
    args = parser.parse_args(argv)
    held = edge_lease.peek(path=args.lease)
    if held is not None:
        # An apply is changing the device: its state is in flux. Skip, say so in the journal, and
        # stamp the last textfile so that a long apply does not look like a dead timer.
        sys.stdout.write("skipped: an apply holds the device: %s\n" % edge_lease.describe(held))
        if args.prometheus:
            try:
                with open(args.prometheus) as handle:
                    previous = handle.read()
            except OSError:
                previous = None
            atomic_write(args.prometheus, with_new_timestamp(previous, time.time()), backup=False, mode=0o644)
        return 0
    if args.records:
        results, summary = audit_records(args.root, args.records)
    else:
        try:
            with open(args.checks) as handle:
                checks = json.load(handle)["checks"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            sys.stderr.write("edge_audit: error: cannot read checks from %s: %s\n" % (args.checks, exc))
            return 2
        results, summary = audit(checks, args.root)
    for result in results:
        sys.stdout.write("%-16s %-40s %s\n" % (result["state"], result["setting"], result["detail"]))
    if args.prometheus:
        atomic_write(args.prometheus, prometheus_text(socket.gethostname(), results), backup=False, mode=0o644)
    return 0 if summary["drifted"] == summary["error"] == 0 else 1


def main():
    from ansible.module_utils.basic import AnsibleModule
    module = AnsibleModule(
        argument_spec={
            "checks": {"type": "list", "elements": "dict"},
            "records": {"type": "dict"},
            "evaluated": {"type": "dict"},
            "root": {"type": "path", "default": "/"},
            "prometheus_file": {"type": "path"},
            "host": {"type": "str", "default": "localhost"},
        },
        required_one_of=[("checks", "records")],
        supports_check_mode=True,
    )
    results, summary = task_results(module.params)
    if module.params["prometheus_file"] and not module.check_mode:
        try:
            atomic_write(module.params["prometheus_file"], prometheus_text(module.params["host"], results),
                         backup=False, mode=0o644)
        except OSError as exc:
            module.fail_json(msg="cannot write %s: %s" % (module.params["prometheus_file"], exc))
    module.exit_json(changed=False, results=results, summary=summary, msg=findings_line(results))


if __name__ == "__main__":
    if ON_DEVICE:
        raise SystemExit(cli(sys.argv[1:]))
    main()
