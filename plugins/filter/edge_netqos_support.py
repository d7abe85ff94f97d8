# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a host can run the inference traffic classifier (runs on the controller)."""
from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_settle import netqos_support

DOCUMENTATION = r"""
name: edge_netqos_support
short_description: Whether a host can run the inference traffic classifier, and why not
description:
  - Turns the device's kernel facts and role edge_netqos' reads and package installs into one decision, the
    first reason that applies. The logic is C(netqos_support) of plugins/module_utils/plan/edge_settle.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, answers
options:
  _input:
    description: The device's kernel facts (C(ansible_facts.edge.kernel), with C(release) and C(features)).
    type: dict
    required: true
  answers:
    description:
      - The registered results C(imports), C(imports_after) (the Python's C(import bcc, pyroute2)), C(tc) (a
        stat), C(installed), C(headers_installed) (package installs) and C(headers) (a loop of stats), each
        left out until it ran; and C(uses_cgroup), C(check_mode), C(python), C(packages), C(header_packages).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Find the kernel options the classifier lacks
  ansible.builtin.set_fact:
    missing: >-
      {{ (ansible_facts.edge.kernel | edgetune.fleet.edge_netqos_support({'uses_cgroup': true})).missing_config }}
"""

RETURN = r"""
_value:
  description:
    - C(missing_config) the kernel options missing (from the facts alone); C(status) the first reason that
      applies (starting V(unsupported)), else V(pending) in a check run that would install packages first, else
      V(supported); C(changed) what the role changed on a host it skips.
  type: dict
"""


class FilterModule(object):
    def filters(self):
        return {"edge_netqos_support": netqos_support}
