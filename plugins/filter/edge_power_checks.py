# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's checks of role edge_power (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_dvfs

DOCUMENTATION = r"""
name: edge_power_checks
short_description: The drift audit's checks of the power mode, the clocks and the governors and limits
description:
  - Turns the device's plan (its power part) and the edge_dvfs module's plan on the device into the checks
    role edge_power records for the drift audit; the logic is C(audit_checks) of
    plugins/module_utils/device/edge_dvfs.py, where the sysfs attribute of each setting is named once.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, dvfs_plan, facts, pending_boot
options:
  _input:
    description: The device's plan (C(ansible_facts.edge_plan)).
    type: dict
    required: true
  dvfs_plan:
    description: The result of the module edge_dvfs in check mode (C(settings), C(left_out)).
    type: dict
    required: true
  facts:
    description: The device's facts (C(ansible_facts.edge)), for its CPU clusters.
    type: dict
    required: true
  pending_boot:
    description: Whether the power mode switches at the next boot (the CPUs online then may differ).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Publish the power and DVFS checks
  ansible.builtin.set_fact:
    edge_power_audit: >-
      {{ ansible_facts.edge_plan | edgetune.fleet.edge_power_checks(dvfs_plan, ansible_facts.edge, false) }}
"""

RETURN = r"""
_value:
  description: The checks (C(value) per managed governor and limit, C(unsupported), C(jetson_clocks),
    C(nvpmodel)), as plugins/module_utils/device/edge_audit.py evaluates them.
  type: list
  elements: dict
"""


def edge_power_checks(plan, dvfs_plan, facts, pending_boot=False):
    return edge_dvfs.audit_checks(plan["power"], dvfs_plan or {}, ((facts or {}).get("cpu") or {}).get("clusters"),
                                  bool(pending_boot))


class FilterModule(object):
    def filters(self):
        return {"edge_power_checks": edge_power_checks}
