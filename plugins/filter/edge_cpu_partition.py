# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU partitioning filters: housekeeping vs inference CPUs (controller side).

The CPU-list code is the modules' own (plugins/module_utils/edge_cpulist.py).
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.edgetune.fleet.plugins.module_utils import edge_cpulist as cpulist

DOCUMENTATION = r"""
name: edge_cpu_partition
short_description: Split a board's CPUs into housekeeping and inference sets
description:
  - From the edge facts and board profile, and the inventory's intent, returns the
    inference (isolated) and housekeeping CPU sets, validated.
  - C(auto) isolates the profile's C(inference_clusters) and keeps every other CPU for housekeeping.
  - Fails with one clear message on CPUs that do not exist, an empty or
    overlapping housekeeping set, offline housekeeping CPUs, or cpu0 isolated without C(allow_cpu0).
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


def _parse(value, what):
    try:
        return cpulist.parse_cpulist(str(value))
    except ValueError as exc:
        raise AnsibleFilterError("%s: %s" % (what, exc)) from None


def edge_cpu_partition(facts, profile, isolate, housekeeping, allow_cpu0=False):
    online = facts["cpu"]["online"]
    present = facts["cpu"]["present"] or online
    isolate, housekeeping = str(isolate).strip(), str(housekeeping).strip()
    if isolate == "auto":
        clusters = profile.get("clusters") or []
        inference = sorted(c for i in profile.get("inference_clusters") or [] for c in clusters[i])
    elif isolate in ("none", ""):
        inference = []
    else:
        inference = _parse(isolate, "edge_bootargs_isolate")
    if housekeeping == "auto":
        keep = [c for c in online if c not in inference]
    else:
        keep = _parse(housekeeping, "edge_bootargs_housekeeping")

    for name, cpus in (("inference", inference), ("housekeeping", keep)):
        missing = [c for c in cpus if c not in present]
        if missing:
            raise AnsibleFilterError("%s CPUs %s do not exist on this board (CPUs %s)" % (
                name, cpulist.format_cpulist(missing), cpulist.format_cpulist(present)))
    # Housekeeping work needs CPUs that are running now.  Isolated CPUs may be
    # offline (AGX Orin's MODE_30W takes cpu8-11 offline): isolcpus applies
    # when they come online, e.g. after a switch to MAXN.
    offline = [c for c in keep if c not in online]
    if offline:
        raise AnsibleFilterError("housekeeping CPUs %s are offline (online: %s); bring them online or choose others" % (
            cpulist.format_cpulist(offline), cpulist.format_cpulist(online)))
    if not keep:
        raise AnsibleFilterError("the housekeeping set is empty: keep at least one CPU for the system")
    overlap = sorted(set(keep) & set(inference))
    if overlap:
        raise AnsibleFilterError("CPUs %s are in both the inference and the housekeeping set" %
                                 cpulist.format_cpulist(overlap))
    if 0 in inference and not allow_cpu0:
        raise AnsibleFilterError("cpu0 handles boot-time and unmovable work; keep it for housekeeping "
                                 "or set edge_bootargs_allow_cpu0: true")
    return {
        "inference": inference,
        "housekeeping": keep,
        "inference_list": cpulist.format_cpulist(inference),
        "housekeeping_list": cpulist.format_cpulist(keep),
        "offline_inference": [c for c in inference if c not in online],
    }


class FilterModule(object):
    def filters(self):
        return {"edge_cpu_partition": edge_cpu_partition}
