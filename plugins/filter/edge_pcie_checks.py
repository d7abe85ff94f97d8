# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's checks of role edge_pcie_qos (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_pcie

DOCUMENTATION = r"""
name: edge_pcie_checks
short_description: The drift audit's checks of the PCIe TC/VC mappings
description:
  - Turns the role's mappings into the checks role edge_pcie_qos records for the drift audit (one per
    mapping, both ends of its link, planned on the device by the code edge_pcie_vc maps with) and, where
    the mappings are re-applied at boot, the state file edgetune-boot.service reads; the logic is
    C(audit_checks) of plugins/module_utils/device/edge_pcie.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, state_file, state_content, persist
options:
  _input:
    description: The mappings (C(device) or C(device_class), C(tcs), C(vc_id)), as edge_pcie_qos_mappings.
    type: list
    elements: dict
    required: true
  state_file:
    description: The boot program's state file of the mappings; empty where they are not persisted.
    type: str
    default: ""
  state_content:
    description: Its content, as the role writes it.
    type: str
    default: ""
  persist:
    description:
      - Whether the role saves the mappings for the boot (C(edge_pcie_qos_persist)); false checks no state file.
    type: bool
    default: true
    version_added: "0.3.0"
"""

EXAMPLES = r"""
- name: Publish the PCIe QoS checks
  ansible.builtin.set_fact:
    edge_pcie_qos_audit: "{{ [{'device_class': '0x0108', 'tcs': [1], 'vc_id': 1}] | edgetune.fleet.edge_pcie_checks }}"
"""

RETURN = r"""
_value:
  description: The checks (C(pcie_vc) per mapping, C(file) for the state file), as
    plugins/module_utils/device/edge_audit.py evaluates them.
  type: list
  elements: dict
"""


def edge_pcie_checks(mappings, state_file="", state_content="", persist=True):
    return edge_pcie.audit_checks(mappings, (state_file if persist else "") or None, state_content)


class FilterModule(object):
    def filters(self):
        return {"edge_pcie_checks": edge_pcie_checks}
