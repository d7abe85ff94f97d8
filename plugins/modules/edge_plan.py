#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_plan: the documentation of the action plugin plugins/action/edge_plan.py."""

DOCUMENTATION = r"""
---
module: edge_plan
short_description: Validate a host's edgetune intent and compute its plan, once, on the controller
description:
  - Runs on the controller (an action plugin). First validates every role's variables against the
    board, as M(edgetune.fleet.edge_validate) does (one message per bad variable, all at once;
    the task fails and nothing is planned).
  - Then computes the plan of the device from the validated intent and the board that role
    C(edge_facts) read (C(ansible_facts.edge) and C(edge_facts_profile)), and publishes it as the
    fact C(edge_plan). The roles apply their part of it; C(edgetune plan) prints it.
  - The plan holds every value derived from the intent, computed in one place
    (C(plugins/module_utils/plan/edge_plan.py)), the CPU partition (inference and housekeeping sets,
    the default IRQ affinity, the nohz_full and rcu_nocbs sets), the kernel arguments for the
    bootloader in use, the power settings (the nvpmodel mode resolved by name, jetson_clocks, the
    cpufreq and devfreq settings with C(auto) resolved), the inference slice and its limits in
    bytes and percent, the runtime's CPUs, thread count and scheduling, and the reboot policy.
  - Nothing is read from the device beyond the facts already gathered; what only the device can
    tell (the accelerator's NUMA node, whether the kernel grants SCHED_FIFO to the slice, the modes
    in C(/etc/nvpmodel.conf)) is asked by the role that needs it.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  role:
    description:
      - The role that asks for the plan because the preflight did not run (C(playbooks/preflight.yml)
        plans every host first); a refusal then says that this role changed nothing, where the
        preflight's says that nothing changed on any device. Every role's variables are validated
        either way.
    type: str
  warn_unknown:
    description: Warn about C(edge_*) variables no role or playbook knows.
    type: bool
    default: true
extends_documentation_fragment: edgetune.fleet.edge.planner
"""

EXAMPLES = r"""
- name: Validate the intent and plan every device before the first change
  edgetune.fleet.edge_plan:
  any_errors_fatal: true

- name: Plan the device when the preflight did not (in a role)
  edgetune.fleet.edge_plan:
    role: edge_cpu
  when: ansible_facts.edge_plan is not defined

- name: Show the inference CPUs
  ansible.builtin.debug:
    msg: "{{ ansible_facts.edge_plan.cpu.inference_list }}"
"""

RETURN = r"""
plan:
  description:
    - The plan (also published as the fact C(edge_plan)), with the parts C(board), C(cpu),
      C(bootargs), C(power), C(slice), C(runtime) and C(reboot). A part whose role is switched
      off has C(enabled=false).
  returned: success
  type: dict
  sample:
    version: 1
    board: {profile: jetson-orin-nx-16gb, title: NVIDIA Jetson Orin NX 16GB, family: jetson,
            bootloader: extlinux, cgroup: unified}
    cpu: {inference: [4, 5, 6, 7], inference_list: "4-7", housekeeping: [0, 1, 2, 3],
          housekeeping_list: "0-3", offline_inference: [], irq_default_list: "0-3",
          nohz_full_list: "4-7", rcu_nocbs_list: "4-7"}
    bootargs: {enabled: true, bootloader: extlinux, path: /boot/extlinux/extlinux.conf,
               args: ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7", "rcu_nocbs=4-7",
                      "irqaffinity=0-3"], absent: [], cgroup_v2: false}
    power: {enabled: true, jetson: true, nvpmodel_managed: true, nvpmodel_mode: MAXN,
            jetson_clocks_managed: true, jetson_clocks: true,
            cpufreq: [{policy: 4, governor: performance}],
            devfreq: [{node: 17000000.gpu, governor: performance}], notes: []}
    slice: {enabled: true, name: ai-infer.slice, cpus: [4, 5, 6, 7], cpulist: "4-7", cgroup: unified,
            v1: false, cpu_weight: 1000, cpu_quota: "400%", memory_max: "90%", memory_high: "80%",
            memory_max_bytes: 14495514624, memory_high_bytes: 12884901888, io_weight: 500,
            rt_runtime_us: 800000}
    runtime: {cpus: [4, 5, 6, 7], cpulist: "4-7", backend: cpu, threads: 4, slice: ai-infer.slice,
              sched_policy: other, sched_priority: 40, require_fifo: true, require_affinity: true}
    reboot: {policy: auto}
problems:
  description:
    - One entry per bad variable, with C(variable), C(value) and C(message), as M(edgetune.fleet.edge_validate)
      returns them.
  returned: always
  type: list
  elements: dict
  sample: []
"""
