#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module edge_facts: one fact tree describing an edge AI board."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: edge_facts
short_description: Detect what an edge AI board is and what its kernel supports
description:
  - Reads, on the device, the board identity (device tree model and compatible strings),
    the SoC family, the L4T release (C(/etc/nv_tegra_release)) or the BSP release
    (C(/etc/armbian-release), else C(/etc/os-release)), CPU clusters from the cpufreq
    policies, devfreq nodes, the bootloader in use, the cgroup mode, the systemd version,
    the running command line and the kernel features the edgetune roles depend on.
  - Publishes them as C(ansible_facts.edge). Reads only; never writes.
  - Matching the board to a curated profile is done by the C(edge_facts) role, on the controller.
version_added: "0.1.0"
author: edgetune
options:
  root:
    description: Root of the tree to read, for tests on fixture trees.
    type: path
    default: /
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Detect the board
  edge_facts:

- name: Show the CPU clusters
  ansible.builtin.debug:
    var: ansible_facts.edge.cpu.clusters
"""

RETURN = r"""
ansible_facts:
  description: Facts under the key C(edge).
  returned: always
  type: dict
  contains:
    edge:
      description: The fact tree.
      type: dict
      contains:
        model: {description: Device tree model, type: str}
        compatible: {description: Device tree compatible strings, most specific first, type: list}
        soc: {description: SoC family (tegra234, rk3588), type: str}
        l4t: {description: L4T release (major, revision, version) on Jetson, else null, type: dict}
        bsp: {description: BSP or distribution release, type: dict}
        cpu: {description: present/online/isolated CPUs and clusters (policy, cpus, governors, frequencies), type: dict}
        devfreq: {description: devfreq nodes with governors and frequencies, type: dict}
        bootloader: {description: bootloader in use and its file, type: dict}
        cgroup: {description: cgroup mode (unified, hybrid, legacy), type: str}
        systemd: {description: systemd version, type: int}
        cmdline: {description: running kernel command line, type: str}
        kernel: {description: release, config source and features (htb, cls_bpf, bpf_syscall, ...), type: dict}
        memory_kb: {description: MemTotal, type: int}
        nvpmodel: {description: whether nvpmodel and its conf are present, type: bool}
"""

import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_board import (
    bsp_release, cgroup_mode, cpu_topology, detect_bootloader, device_tree, devfreq_nodes,
    kernel_config, kernel_features, l4t_release, memory_kb, read, soc_family, systemd_version)


def gather(root, run_command, which):
    tree = device_tree(root)
    release = platform.release()
    config, config_source = kernel_config(root, release)
    loader, loader_path = detect_bootloader(root, which)
    return {
        "model": tree["model"],
        "compatible": tree["compatible"],
        "devicetree_source": tree["source"],
        "soc": soc_family(tree["compatible"]),
        "l4t": l4t_release(root),
        "bsp": bsp_release(root),
        "cpu": cpu_topology(root),
        "devfreq": devfreq_nodes(root),
        "bootloader": {"name": loader, "path": loader_path if loader else None,
                       "looked_for": None if loader else loader_path},
        "cgroup": cgroup_mode(root),
        "systemd": systemd_version(run_command),
        "cmdline": (read(root, "/proc/cmdline", "") or "").strip(),
        "kernel": {"release": release, "config_source": config_source,
                   "features": kernel_features(config)},
        "memory_kb": memory_kb(root),
        "nvpmodel": bool(which("nvpmodel")) and os.path.exists(os.path.join(root, "etc/nvpmodel.conf")),
    }


def main():
    module = AnsibleModule(argument_spec={"root": {"type": "path", "default": "/"}},
                           supports_check_mode=True)

    def run_command(argv):
        return module.run_command(argv)

    def which(name):
        return module.get_bin_path(name, opt_dirs=["/usr/sbin", "/sbin"])

    try:
        facts = gather(module.params["root"], run_command, which)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="edge_facts could not read the board: %s" % exc)
    module.exit_json(changed=False, ansible_facts={"edge": facts})


if __name__ == "__main__":
    main()
