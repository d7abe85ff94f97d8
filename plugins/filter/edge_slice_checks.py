# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's checks of the inference slice's live cgroup values (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_slice_checks as edge_slice_checks_util

DOCUMENTATION = r"""
name: edge_slice_checks
short_description: The drift audit's checks of the inference slice's live cgroup values
description:
  - Turns the device's plan (its slice part) into the checks role edge_cgroups records for the drift audit,
    one per cgroup value systemd writes for the slice, at the paths below systemd's own cgroup (from
    C(/proc/1/cgroup)); on cgroup v1 or hybrid, one C(unsupported) check names the cgroup-v2-only settings
    and why. The logic is plugins/module_utils/plan/edge_slice_checks.py.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, proc1_cgroup, rt, facts
options:
  _input:
    description: The device's plan (C(ansible_facts.edge_plan)).
    type: dict
    required: true
  proc1_cgroup:
    description: The device's C(/proc/1/cgroup), as text.
    type: str
    required: true
  rt:
    description: The result of the module edge_cgroup_rt (C(mode), C(ready)) for the RT budget's check.
    type: dict
    required: true
  facts:
    description: The device's facts (C(ansible_facts.edge)) for the cgroup mode and the running command line.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Publish the slice checks
  ansible.builtin.set_fact:
    edge_cgroups_audit: >-
      {{ ansible_facts.edge_plan | edgetune.fleet.edge_slice_checks(proc1 | b64decode, edge_cgroups_rt,
                                                                    ansible_facts.edge) }}
"""

RETURN = r"""
_value:
  description: The checks (C(setting), C(role), C(kind) C(value) with C(path), C(desired), C(compare), or
    C(unsupported) with C(reason)), as plugins/module_utils/device/edge_audit.py evaluates them.
  type: list
  elements: dict
"""


def edge_slice_checks(plan, proc1_cgroup, rt, facts):
    rt, facts = rt or {}, facts or {}
    return edge_slice_checks_util.value_checks(
        plan["slice"], proc1_cgroup, rt.get("mode") == "v1-rt-group" and bool(rt.get("ready")),
        mode=facts.get("cgroup"), planned_args=(plan.get("bootargs") or {}).get("args") or [],
        cmdline=facts.get("cmdline") or "")


class FilterModule(object):
    def filters(self):
        return {"edge_slice_checks": edge_slice_checks}
