# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's checks of role edge_netqos (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader

DOCUMENTATION = r"""
name: edge_netqos_checks
short_description: The drift audit's checks of the inference traffic priority
description:
  - Turns what role edge_netqos applied (its status and the edge_netqos module's result) into the checks
    it records for the drift audit; the logic is C(audit_checks) in plugins/module_utils/device/edge_netqos_loader.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, result, options
options:
  _input:
    description: "The role's status: C(supported), or C(unsupported: ) and the reason."
    type: str
    required: true
  result:
    description: The edge_netqos module's result (C(config), C(config_sha1)); empty when it did not run.
    type: dict
    required: true
  options:
    description: >-
      C(interfaces) (the names it applied to), C(loader), C(python), C(source) (the classifier's C source on
      the device), C(config_file) and C(persist).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Publish the inference traffic priority checks
  ansible.builtin.set_fact:
    edge_netqos_audit: >-
      {{ edge_netqos_status | edgetune.fleet.edge_netqos_checks(edge_netqos_result, {'interfaces': ['eth0'],
         'loader': '/usr/local/lib/edgetune/netqos/edge_netqos_loader.py', 'python': '/usr/bin/python3',
         'source': '/usr/local/share/edgetune/netqos/edge_classifier.c',
         'config_file': '/etc/edgetune/netqos.json', 'persist': true}) }}
"""

RETURN = r"""
_value:
  description: The checks (C(netqos) and C(file), or one C(unsupported)), as plugins/module_utils/device/edge_audit.py
    evaluates them.
  type: list
  elements: dict
"""


def edge_netqos_checks(status, result, options):
    return edge_netqos_loader.audit_checks(status or "", result or {}, **dict(options))


class FilterModule(object):
    def filters(self):
        return {"edge_netqos_checks": edge_netqos_checks}
