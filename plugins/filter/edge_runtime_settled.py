# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the runtime's unit asks for once the kernel was asked (runs on the controller)."""
from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_settle import settle_runtime

DOCUMENTATION = r"""
name: edge_runtime_settled
short_description: The runtime's scheduling, CPUs and threads once the device's kernel was asked
description:
  - Turns the plan's runtime part and the module edge_runtime_probe's answer into what the runtime's unit
    asks for. Where the kernel refused the real-time policy or the CPUs and the inventory allows running
    without them (C(edge_runtime_require_fifo), C(edge_runtime_require_affinity) false), the unit runs
    SCHED_OTHER or unpinned, and the result says why. The logic is C(settle_runtime) of
    plugins/module_utils/plan/edge_settle.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, probe
options:
  _input:
    description: The plan's runtime part (C(ansible_facts.edge_plan.runtime)).
    type: dict
    required: true
  probe:
    description: The result of the module edge_runtime_probe (C(fifo), C(affinity), C(unpinned_threads)).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Settle what the unit asks for
  ansible.builtin.set_fact:
    runtime: "{{ ansible_facts.edge_plan.runtime | edgetune.fleet.edge_runtime_settled(probe) }}"

- name: Render the unit's scheduling
  ansible.builtin.debug:
    msg: "{{ 'CPUSchedulingPolicy=' ~ runtime.expect.policy if runtime.realtime else 'SCHED_OTHER' }}"
"""

RETURN = r"""
_value:
  description:
    - C(expect) (C(policy), C(priority), C(cpus), C(fallback_reason), C(cpus_fallback_reason)) is what the
      gates check of the running threads; C(realtime) whether the unit sets a real-time policy; C(threads) the
      compute threads; C(sched_note) and C(affinity_note) why the unit runs without a real-time policy or
      CPUs; C(scheduling) the policy and priority as the run reports them; C(fallbacks) the fallbacks, one
      line each.
  type: dict
"""


class FilterModule(object):
    def filters(self):
        return {"edge_runtime_settled": settle_runtime}
