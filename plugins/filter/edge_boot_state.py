# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A kind's boot-time state file, rendered on the controller (any role can use it).

The text is plugins/module_utils/device/edge_boot.py's ``document``: the file
edgetune-boot.service (role edge_boot) reads at every boot, byte for byte what
the modules' ``edge_boot.sync`` writes for the same settings.
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

DOCUMENTATION = r"""
name: edge_boot_state
short_description: Render a boot-time state file in edgetune's format
description:
  - Returns the text of a state file in edgetune's boot-time state format
    (plugins/module_utils/device/edge_boot.py), re-applied at every boot by edgetune-boot.service (role edge_boot);
    JSON with C(format), C(kind), C(generated_by) and C(settings), sorted keys, ending with a newline.
  - Fails when O(kind) is not a kind the boot program knows or O(_input) is not a dict.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, kind, generated_by
options:
  _input:
    description: The settings, as the kind's module utility takes them in C(boot_apply) (e.g. the result of
      the edgetune.fleet.edge_pcie_boot_settings filter).
    type: dict
    required: true
  kind:
    description: The kind of state, one of V(irq_affinity), V(jetson_clocks), V(dvfs), V(pcie_vc), V(rt_budget).
    type: str
    required: true
  generated_by:
    description: What wrote the file (the role's name), recorded in it.
    type: str
    required: true
"""

EXAMPLES = r"""
# The settings of any kind, as its module utility's boot_apply takes them.
- name: Show what the boot program would read for a slice's RT budget
  ansible.builtin.debug:
    msg: "{{ budget | edgetune.fleet.edge_boot_state('rt_budget', 'my_play') }}"
  vars:
    budget: {slice: ai-infer.slice, runtime_us: 800000}
"""

RETURN = r"""
_value:
  description: The state file's text (JSON, sorted keys, a newline at the end).
  type: str
"""


def edge_boot_state(settings, kind, generated_by):
    if not isinstance(settings, dict):
        raise AnsibleFilterError("edge_boot_state: the settings must be a dict, got %s" % type(settings).__name__)
    try:
        return edge_boot.document(kind, settings, generated_by)
    except EdgeError as exc:
        raise AnsibleFilterError("edge_boot_state: %s" % exc) from None
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError("edge_boot_state: the %s settings cannot be saved as JSON: %s" % (kind, exc)) \
            from None


class FilterModule(object):
    def filters(self):
        return {"edge_boot_state": edge_boot_state}
