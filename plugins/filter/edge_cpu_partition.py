# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU partitioning filters: housekeeping vs inference CPUs (controller side).

The CPU-list code is the modules' own (plugins/module_utils/common/edge_cpulist.py); the
partition and its rules are plugins/module_utils/plan/edge_intent.py's, which the
preflight's validation step (edgetune.fleet.edge_validate) runs too.
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_intent as intent

DOCUMENTATION = r"""
name: edge_cpu_partition
short_description: Split a board's CPUs into housekeeping and inference sets
description:
  - From the edge facts and board profile, and the inventory's intent, returns the
    inference (isolated) and housekeeping CPU sets, validated.
  - C(auto) isolates the profile's C(inference_clusters) and keeps every other CPU for housekeeping.
  - Fails with one clear message on CPUs that do not exist, an empty or
    overlapping housekeeping set, offline housekeeping CPUs, cpu0 isolated without C(allow_cpu0),
    or an empty O(isolate) or O(housekeeping) (an empty string is not V(none)).
  - Isolated CPUs may be offline (they are isolated when they come online); they are listed in C(offline_inference).
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, profile, isolate, housekeeping, allow_cpu0
options:
  _input:
    description: The C(edge) fact tree (edge_facts).
    type: dict
    required: true
  profile:
    description: The matched board profile.
    type: dict
    required: true
  isolate:
    description: V(auto), V(none) or a CPU list such as V(4-7).
    type: str
    required: true
  housekeeping:
    description: V(auto) (every online CPU not isolated) or a CPU list.
    type: str
    required: true
  allow_cpu0:
    description: Allow cpu0 in the inference set.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Split the CPUs into inference and housekeeping sets
  ansible.builtin.set_fact:
    cpus: "{{ ansible_facts.edge | edgetune.fleet.edge_cpu_partition(edge_facts_profile, 'auto', 'auto') }}"
"""

RETURN = r"""
_value:
  description:
    - C(inference) and C(housekeeping) (lists of CPU numbers), the same as kernel CPU lists
      (C(inference_list), C(housekeeping_list)), and C(offline_inference), the inference CPUs
      that are offline now.
  type: dict
"""


def edge_cpu_partition(facts, profile, isolate, housekeeping, allow_cpu0=False):
    # The rules are edge_intent's (the preflight's validation step uses the same function).
    try:
        return intent.cpu_partition(facts, profile, isolate, housekeeping, allow_cpu0)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule(object):
    def filters(self):
        return {"edge_cpu_partition": edge_cpu_partition}
