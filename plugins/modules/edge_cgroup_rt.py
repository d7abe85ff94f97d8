#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_cgroup_rt: a real-time (SCHED_FIFO/RR) budget for a systemd slice.

The work is in plugins/module_utils/device/edge_rt.py, which the boot program (edge_boot) also runs.
"""

DOCUMENTATION = r"""
---
module: edge_cgroup_rt
short_description: Give a systemd slice an RT budget (cpu.rt_runtime_us) so SCHED_FIFO works in it, or say why not
description:
  - With RT group scheduling (C(CONFIG_RT_GROUP_SCHED)) the kernel refuses C(SCHED_FIFO)/C(SCHED_RR)
    (C(EPERM)) to a task whose cpu cgroup has C(cpu.rt_runtime_us) = 0, and every new cgroup starts
    at 0. systemd does not manage that file, so a slice with C(CPUQuota=) or C(CPUWeight=) on
    cgroup v1 gets no RT time at all.
  - On cgroup v1 this module writes C(cpu.rt_runtime_us) along the slice's cpu cgroup path below
    systemd's root cgroup (C(ai.slice), then C(ai.slice/ai-infer.slice)), parents first when
    raising, and reads every value back. The kernel only accepts a budget when the children of a
    cgroup together hold no more than the cgroup itself; the module checks that on every level
    first (including the siblings' budgets) and writes nothing when it does not fit.
  - It never writes systemd's root cgroup. When that root has no budget to give (a container
    started without one, as Docker gives its containers C(cpu.rt_runtime_us=0)) the module does not
    fail; it reports RV(ready=false) and the reason, with the fix (Docker's C(--cpu-rt-runtime)).
  - Without RT group scheduling any cgroup may run SCHED_FIFO (throttled only by
    C(kernel.sched_rt_runtime_us)), so RV(ready=true) and nothing is written. On cgroup v2 there is
    no RT budget file, so with RT group scheduling the slice cannot run SCHED_FIFO once systemd enables the
    cpu controller for it (RV(ready=false), reason given).
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  slice:
    description: The slice unit, for example V(ai-infer.slice) (its cgroup is C(/ai.slice/ai-infer.slice)).
    type: str
    required: true
  runtime_us:
    description:
      - RT time per period (microseconds, per CPU) the slice's tasks may use; must stay below the
        period (C(cpu.rt_period_us), 1000000 by default) so RT tasks can never starve the CPU.
    type: int
    required: true
  rt_group_sched:
    description:
      - Whether the kernel has C(CONFIG_RT_GROUP_SCHED) (the edge facts' C(kernel.features.rt_group_sched)).
        Used on cgroup v2 only, where no cgroup file shows it; on v1 the presence of
        C(cpu.rt_runtime_us) decides. Null when unknown.
    type: bool
  state_file:
    description:
      - Save the slice and budget to this file (only when ready with RT group scheduling on cgroup v1,
        atomically, only when its content changes) in edgetune's boot-time state format
        (plugins/module_utils/device/edge_boot.py), re-applied at every boot by C(edgetune-boot.service)
        (role edge_boot), since a slice's cgroup is created again at every boot with a budget of 0.
        Not written in check mode.
    type: path
  root:
    description: Prefix for C(/proc) and C(/sys/fs/cgroup) paths (for tests and fake trees).
    type: path
    default: /
attributes:
  check_mode:
    description: Reads and checks everything and reports the writes that would be made; writes nothing.
    support: full
  diff_mode:
    description:
      - "One C(path: value) line per cpu.rt_runtime_us on the slice's path, before and after."
      - The state file's content, when it changes.
    support: full
notes:
  - The slice must be active (its cgroup created) with a cpu setting (C(CPUQuota=), C(CPUWeight=)).
    A service in the slice that sets its own cpu settings gets its own cpu cgroup (budget 0), so
    RT services in the slice should not set C(CPUQuota=)/C(CPUWeight=)/C(CPUAccounting=) themselves on v1.
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Let services in ai-infer.slice run SCHED_FIFO for up to 80% of each second
  edge_cgroup_rt:
    slice: ai-infer.slice
    runtime_us: 800000
    rt_group_sched: "{{ ansible_facts.edge.kernel.features.rt_group_sched }}"
    state_file: /etc/edgetune/boot.d/rt-budget.json
  register: rt

- name: Say why SCHED_FIFO cannot work here
  ansible.builtin.debug:
    msg: "{{ rt.reason }}"
  when: not rt.ready
"""

RETURN = r"""
ready:
  description: Whether a task in the slice can be given SCHED_FIFO now (in check mode, after the planned writes).
  returned: success
  type: bool
mode:
  description:
    - C(v1-rt-group) (cgroup v1 cpu controller with RT group scheduling), C(no-rt-group) (no RT
      group scheduling), C(v2-rt-group) or C(v2) (cgroup v2, with or without it; C(v2-unknown) when
      O(rt_group_sched) is null).
  returned: success
  type: str
reason:
  description: One sentence saying what the module found and, when not ready, what to change.
  returned: success
  type: str
in_container:
  description: Whether systemd's root cgroup is not the hierarchy's root (systemd runs in a container).
  returned: success
  type: bool
levels:
  description:
    - The cpu cgroups on the slice's path with C(path), C(before) and C(after) budgets
      (v1 with RT group scheduling).
  returned: success
  type: list
  elements: dict
  sample: [{path: /sys/fs/cgroup/cpu,cpuacct/ai.slice, before: 0, after: 800000}]
parent:
  description: systemd's root cpu cgroup, its budget and what its other children already hold.
  returned: when mode is v1-rt-group
  type: dict
pending:
  description:
    - Check mode only; the slice is not active yet, a real run starts it and then sets the budget (C(levels)
      has what it will write). Where the budget would not fit (a container without RT time), the result is
      the real run's instead (not ready, with the reason) and nothing is pending.
  returned: when the slice's cgroup does not exist yet in check mode and its budget fits
  type: bool
state_file_changed:
  description: Whether the state file's content changed (or would change in check mode).
  returned: when O(state_file) is given and the slice is ready with RT group scheduling on cgroup v1
  type: bool
errors:
  description: Every error message.
  returned: failure
  type: list
  elements: str
missing_cgroup:
  description: The slice's cpu cgroup that does not exist (the slice is not active).
  returned: failure, when that is the error
  type: str
"""

# Ansible modules keep their imports after the documentation strings.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import exit_module  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_rt import (  # noqa: E402
    RUNTIME, boot_settings, run)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            slice=dict(type="str", required=True),
            runtime_us=dict(type="int", required=True),
            rt_group_sched=dict(type="bool"),
            state_file=dict(type="path"),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def work():
        result = run(p["root"], p["slice"], p["runtime_us"], p["rt_group_sched"], module.check_mode)
        result["changed"] = bool(result.get("pending")) or any(lv["after"] != lv["before"] for lv in result["levels"])
        diff = [{"before_header": "RT budgets", "after_header": "RT budgets",
                 "before": "".join("%s/%s: %d\n" % (lv["path"], RUNTIME, lv["before"]) for lv in result["levels"]),
                 "after": "".join("%s/%s: %d\n" % (lv["path"], RUNTIME, lv["after"]) for lv in result["levels"])}]
        if p["state_file"] and result["mode"] == "v1-rt-group" and result["ready"]:
            edge_boot.sync_into(result, diff, p["state_file"], "rt_budget", boot_settings(p["slice"], p["runtime_us"]),
                                "edge_cgroup_rt", module.check_mode)
        return result, diff

    exit_module(module, "edge_cgroup_rt", work)


if __name__ == "__main__":
    main()
