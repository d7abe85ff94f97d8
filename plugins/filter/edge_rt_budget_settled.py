# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the slice's RT budget means for the probe and the boot program (runs on the controller)."""
from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_settle import settle_rt_budget

DOCUMENTATION = r"""
name: edge_rt_budget_settled
short_description: The probe's policy and the boot program's slice from the inference slice's RT budget
description:
  - Turns the module edge_cgroup_rt's result into what role edge_cgroups does next. The logic is
    C(settle_rt_budget) of plugins/module_utils/plan/edge_settle.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, probe_policy, slice_name
options:
  _input:
    description: The result of the module edge_cgroup_rt (C(mode), C(ready), C(pending), C(reason)).
    type: dict
    required: true
  probe_policy:
    description: C(edge_cgroups_probe_policy); V(auto) is V(fifo) where SCHED_FIFO works in the slice, else V(other).
    type: str
    required: true
  slice_name:
    description: The slice's unit name, for the report.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Settle the probe's policy
  ansible.builtin.set_fact:
    rt_settled: "{{ edge_cgroups_rt | edgetune.fleet.edge_rt_budget_settled('auto', 'ai-infer.slice') }}"
"""

RETURN = r"""
_value:
  description:
    - C(probe_policy) the probe's policy (C(probe_realtime) whether it is a real-time one); C(probe_can_run)
      whether that policy can work in the slice; C(boot_in_slice) whether the boot program must run in the
      slice (cgroup v1 RT group scheduling); C(report) the line the run reports.
  type: dict
"""


class FilterModule(object):
    def filters(self):
        return {"edge_rt_budget_settled": settle_rt_budget}
