# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe TC/VC mappings of the role edge_pcie_qos as boot-time settings (runs on the controller).

The checks and the shape are plugins/module_utils/device/edge_pcie.py's ``boot_settings``,
the settings its ``boot_apply`` re-applies at boot.
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_pcie
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

DOCUMENTATION = r"""
name: edge_pcie_boot_settings
short_description: The PCIe TC/VC mappings as edgetune-boot.service re-applies them
description:
  - Returns the C(pcie_vc) settings of edgetune's boot-time state format (plugins/module_utils/device/edge_boot.py),
    a dict with the list C(mappings), each mapping with the given O(timeout) and O(fail_unsupported).
  - Each mapping is checked as the boot program checks it (exactly one of C(device) and C(device_class),
    C(tcs) 1-7, C(vc_id) 1-7); an empty C(device) or C(device_class) counts as not given. Fails with one
    message naming every bad mapping.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, timeout, fail_unsupported
options:
  _input:
    description: The mappings, each with C(device) or C(device_class), C(tcs) and optionally C(vc_id) (default 1).
    type: list
    elements: dict
    required: true
  timeout:
    description: Seconds to wait for VC negotiation on both ends of each link.
    type: float
    default: 1.0
  fail_unsupported:
    description: Report a link without an extended VC as an error at boot instead of leaving it as it is.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Save the PCIe TC/VC mappings for the boot-time re-apply
  edgetune.fleet.edge_files:
    files:
      - dest: /etc/edgetune/boot.d/pcie-vc.json
        content: >-
          {{ edge_pcie_qos_mappings
             | edgetune.fleet.edge_pcie_boot_settings(edge_pcie_qos_timeout, edge_pcie_qos_fail_unsupported)
             | edgetune.fleet.edge_boot_state('pcie_vc', 'edge_pcie_qos') }}
"""

RETURN = r"""
_value:
  description:
    - A dict with the list C(mappings), each mapping with C(device) (the full PCI address) or C(device_class),
      C(tcs) (sorted), C(vc_id), C(timeout) and C(fail_unsupported).
  type: dict
"""


def edge_pcie_boot_settings(mappings, timeout=1.0, fail_unsupported=False):
    try:
        return edge_pcie.boot_settings(mappings, timeout, fail_unsupported)
    except EdgeError as exc:
        raise AnsibleFilterError("Invalid PCIe TC/VC mappings: %s" % exc) from None


class FilterModule(object):
    def filters(self):
        return {"edge_pcie_boot_settings": edge_pcie_boot_settings}
