# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's checks of role edge_cpu (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_cpu_checks

DOCUMENTATION = r"""
name: edge_cpu_checks
short_description: The drift audit's checks of the CPU partitioning
description:
  - Turns the device's plan (its cpu and boot parts) and the sysctls the role set into the checks role
    edge_cpu records for the drift audit; the logic is plugins/module_utils/plan/edge_cpu_checks.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, settings, options
options:
  _input:
    description: The device's plan (C(ansible_facts.edge_plan)).
    type: dict
    required: true
  settings:
    description: The sysctls the role set (C(name), C(value)), in the order of its sysctl.d file.
    type: list
    elements: dict
    required: true
  options:
    description: >-
      C(irq_affinity), C(workqueue), C(keep_subsets), C(unmovable_names), C(sysctl), C(sysctl_file) (the
      role's variables without their prefix) and C(numa_balancing_present) (whether the kernel has it).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Publish the CPU partitioning checks
  ansible.builtin.set_fact:
    edge_cpu_audit: >-
      {{ ansible_facts.edge_plan | edgetune.fleet.edge_cpu_checks(settings, {'irq_affinity': true,
         'workqueue': true, 'sysctl': true, 'sysctl_file': '/etc/sysctl.d/60-edgetune-cpu.conf'}) }}
"""

RETURN = r"""
_value:
  description: The checks (C(irq_affinity), C(value) per sysctl, C(unsupported), C(file)), as
    plugins/module_utils/device/edge_audit.py evaluates them.
  type: list
  elements: dict
"""


def edge_cpu_checks_filter(plan, settings, options):
    return edge_cpu_checks.audit_checks(plan, settings or [], **dict(options or {}))


class FilterModule(object):
    def filters(self):
        return {"edge_cpu_checks": edge_cpu_checks_filter}
