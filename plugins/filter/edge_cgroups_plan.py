# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation of the inference slice's settings (controller side, role edge_cgroups).

One filter, ``edge_cgroups_plan``, checks every setting against the board
(the slice's CPUs, the RAM, the RT throttle) before the role changes anything,
and returns the values the unit files get. All problems are reported at once.
The rules are plugins/module_utils/plan/edge_intent.py's ``slice_plan``, which the
preflight's validation step runs too.
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_intent as intent

DOCUMENTATION = r"""
name: edge_cgroups_plan
short_description: Validate the inference slice's settings and resolve auto values
description:
  - Takes the role's settings and the board's numbers; returns the values for the slice unit.
  - Fails with one message listing every problem (a quota above what the slice's CPUs can give,
    a memory limit above the RAM, an RT budget not below the kernel's, ...).
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input
options:
  _input:
    description: >-
      A dict with slice, cpus (list of the slice's CPUs), cpulist, cpu_weight, cpu_quota,
      memory_max, memory_high, io_weight, rt_runtime_us, rt_global (kernel.sched_rt_runtime_us),
      ram_bytes, probe_priority.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Check the slice settings against the board
  ansible.builtin.set_fact:
    plan: >-
      {{ {'slice': 'ai-infer.slice', 'cpus': [4, 5, 6, 7], 'cpulist': '4-7', 'cpu_weight': 1000,
          'cpu_quota': 'auto', 'memory_max': '75%', 'memory_high': '', 'io_weight': 1000,
          'rt_runtime_us': 0, 'rt_global': 950000, 'ram_bytes': 16777216000,
          'probe_priority': 40} | edgetune.fleet.edge_cgroups_plan }}
"""

RETURN = r"""
_value:
  description:
    - C(cpu_quota) (V(auto) resolved to 100% per CPU of the slice, or empty), C(memory_max) and
      C(memory_high) as given, and C(memory_max_bytes) and C(memory_high_bytes) (null for no limit).
  type: dict
"""

# The rules are edge_intent's (the preflight's validation step uses the same function).
memory_bytes = intent.memory_bytes


def edge_cgroups_plan(settings):
    plan, problems = intent.slice_plan(settings)
    if problems:
        raise AnsibleFilterError("Invalid slice settings (edge_cgroups changed nothing): " + "; ".join(
            "%s %s %s" % (variable, value, message) if variable else message
            for variable, value, message in problems))
    return plan


class FilterModule(object):
    def filters(self):
        return {"edge_cgroups_plan": edge_cgroups_plan}
