# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's check of role edge_bootargs (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_cmdline

DOCUMENTATION = r"""
name: edge_bootargs_checks
short_description: The drift audit's check of the kernel boot arguments
description:
  - Turns the device's plan (its bootargs part) and the role's options into the check role edge_bootargs
    records for the drift audit; the logic is C(audit_checks) in plugins/module_utils/device/edge_cmdline.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, options
options:
  _input:
    description: The plan's bootargs part (C(ansible_facts.edge_plan.bootargs)).
    type: dict
    required: true
  options:
    description: C(absent), C(record) (the role's state file) and C(keep) (the keys never dropped).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Publish the boot argument checks
  ansible.builtin.set_fact:
    edge_bootargs_audit: >-
      {{ ansible_facts.edge_plan.bootargs | edgetune.fleet.edge_bootargs_checks({'absent': [],
         'record': '/etc/edgetune/bootargs-replaced.json', 'keep': ['root']}) }}
"""

RETURN = r"""
_value:
  description: One C(cmdline) check, as plugins/module_utils/device/edge_audit.py evaluates it.
  type: list
  elements: dict
"""


def edge_bootargs_checks(bootargs, options):
    return edge_cmdline.audit_checks(bootargs, **dict(options))


class FilterModule(object):
    def filters(self):
        return {"edge_bootargs_checks": edge_bootargs_checks}
