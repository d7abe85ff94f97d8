#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
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
    the running command line, the RT throttling, the kernel features the edgetune roles depend on,
    the installed TensorRT and RKNN runtimes and the Python the module runs with.
  - The preflight's one read of the device. Everything the intent is validated against before any
    change (CPUs, governors and frequencies, devfreq nodes, memory, RT throttling) is here.
  - Publishes them as C(ansible_facts.edge). Reads only, except the apply lease when O(lease) is given.
  - With O(lease) (every apply sets it in its first device execution), it first takes the device's apply
    lease (C(/run/edgetune/apply.lease)) so that two applies never interleave their writes; see
    P(edgetune.fleet.edge_lease#module). Its action plugin fills in the holder (the run of
    ansible-playbook on this controller) and takes over the lease of a run of this controller that has
    ended. In check mode it only reports a lease another run holds.
  - With O(profiles_dirs), the action plugin matches the board to a curated profile on the controller
    (the C(edge_board_profile) filter's rule), returns it as RV(profile) and fails, in the same task,
    on a board no profile matches or, with O(strict_topology), on CPU clusters that differ from the
    profile's; where it took the apply lease in that task, it gives it back.
version_added: "0.1.0"
requirements:
  - sysfs and procfs on the board
author:
  - edgetune contributors (!UNKNOWN)
options:
  root:
    description: Root of the tree to read, for tests on fixture trees.
    type: path
    default: /
  records:
    description:
      - The directory of the apply records (role edge_record). Given (an apply's first device execution),
        every recorded check is evaluated and each role's recorded inputs are returned as
        C(ansible_facts.edge_applied), so that the plan can skip the roles whose last apply is current
        and holds, in the same execution.
    type: path
  profiles_dirs:
    description:
      - Directories of board profiles on the controller (YAML files, one board a file), read by the action
        plugin in this order (an empty entry, an unset directory, is left out); the module itself never gets them.
    type: list
    elements: path
  strict_topology:
    description: With O(profiles_dirs), fail when the detected CPU clusters differ from the profile's.
    type: bool
    default: true
  numa_accelerator:
    description:
      - The inference accelerator whose NUMA node C(numa) names (a PCI address or a sysfs device directory);
        empty finds it by PCI class (3D controller, VGA, processing accelerator, co-processor).
    type: str
    default: ""
  lease:
    description:
      - Take the apply lease before reading (an apply's first device execution).
      - C(holder) and C(ended_run) are filled in by the action plugin.
    type: dict
    suboptions:
      ttl:
        description: Seconds the lease is valid; an apply longer than this can be taken over.
        type: int
        default: 3600
      wait:
        description: Seconds to wait while another run holds the lease, then fail naming it (0 returns at once).
        type: int
        default: 600
      holder:
        description: The run taking the lease (C(run_id), C(controller), C(user), C(playbook)).
        type: dict
      ended_run:
        description: The run id of a run the controller knows has ended; its lease is taken over.
        type: str
      path:
        description: The lease file (the one the module M(edgetune.fleet.edge_lease) renews and releases).
        type: path
        default: /run/edgetune/apply.lease
attributes:
  check_mode:
    description: >-
      Reads only (the lease too, which is never taken or waited for), so a check mode run gathers the
      same facts as a real one.
    support: full
  diff_mode:
    description: Gathers facts and changes no setting, so there is no difference to show.
    support: none
  facts:
    description: Returns C(ansible_facts.edge).
    support: full
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Detect the board
  edge_facts:

- name: Show the CPU clusters
  ansible.builtin.debug:
    var: ansible_facts.edge.cpu.clusters
"""

RETURN = r"""
profile:
  description: >-
    With O(profiles_dirs), the matched board profile, with the fields that differ by L4T release resolved
    (the role publishes it as C(edge_facts_profile)).
  returned: when O(profiles_dirs) is given and a profile matches
  type: dict
edge_autotune:
  description: >-
    The runtime's autotune record (C(/etc/edgetune/autotune.json): the measurements and the
    choice, which the plan applies), null when there is none, C({error}) when it cannot be read;
    published as C(ansible_facts.edge_autotune).
  returned: always
  type: dict
edge_applied:
  description: With O(records), per recorded role its recorded C(inputs), whether its checks all hold now
    (C(holds)) and the first settings that do not (C(not_holding)); published as C(ansible_facts.edge_applied).
  returned: when O(records) is given
  type: dict
lease:
  description: The apply lease, with O(lease).
  returned: when O(lease) is given
  type: dict
  contains:
    taken:
      description: Whether this run holds the lease now (false in check mode).
      type: bool
      returned: always
    held_by:
      description: The lease of another run that holds the device (described), else null.
      type: dict
      returned: always
    took_over:
      description: The ended, expired or earlier boot's lease this run took over, described; else null.
      type: str
      returned: always
    waited_s:
      description: Seconds waited for another run's lease.
      type: float
      returned: always
ansible_facts:
  description: Facts under the key C(edge).
  returned: always
  type: dict
  contains:
    edge:
      description: The fact tree describing the board.
      returned: always
      type: dict
      contains:
        model:
          description: The device tree model; null without a device tree.
          returned: always
          type: str
          sample: NVIDIA Jetson Orin NX Engineering Reference Developer Kit
        compatible:
          description: The device tree compatible strings, most specific first.
          returned: always
          type: list
          elements: str
          sample: ["nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"]
        devicetree_source:
          description:
            - Where the device tree was read (C(/sys/firmware/devicetree/base) or C(/proc/device-tree));
              null without one.
          returned: always
          type: str
          sample: /sys/firmware/devicetree/base
        soc:
          description:
            - The SoC family from the least specific compatible string (for example V(tegra234), V(rk3588));
              null when unknown.
          returned: always
          type: str
          sample: tegra234
        l4t:
          description:
            - The L4T release from C(/etc/nv_tegra_release), with C(major), C(revision) and C(version);
              null on boards without L4T.
            - When the file does not parse, C(major), C(revision) and C(version) are null and C(raw)
              holds its first line.
          returned: always
          type: dict
          sample: {major: 36, revision: "4.3", version: "36.4.3"}
        bsp:
          description:
            - The BSP release, C(name), C(version), C(branch), C(family) and C(board), from
              C(/etc/armbian-release); else the distribution's C(ID) and C(VERSION_ID) from
              C(/etc/os-release) (the other keys null).
          returned: always
          type: dict
          sample: {name: armbian, version: "24.5.1", branch: vendor, family: rk35xx, board: rock-5b}
        cpu:
          description:
            - The C(present), C(online) and C(isolated) CPUs (lists of CPU numbers), C(scheduled) (those the
              running kernel schedules on, the cpuN lines of C(/proc/stat)) and the cpufreq
              C(clusters), one per policy, with C(policy), C(cpus), C(governor), C(governors),
              C(frequencies) (kHz), C(min_freq) and C(max_freq).
          returned: always
          type: dict
          sample:
            present: [0, 1, 2, 3, 4, 5, 6, 7]
            online: [0, 1, 2, 3, 4, 5, 6, 7]
            isolated: []
            scheduled: [0, 1, 2, 3, 4, 5, 6, 7]
            clusters:
              - {policy: 0, cpus: [0, 1, 2, 3], governor: schedutil, governors: [performance, schedutil],
                 frequencies: [729600, 1984000], min_freq: 729600, max_freq: 1984000}
        devfreq:
          description: The devfreq nodes by name, each with C(governor), C(governors) and C(frequencies) (Hz).
          returned: always
          type: dict
          sample:
            17000000.gpu:
              governor: nvhost_podgov
              governors: [nvhost_podgov, performance]
              frequencies: [306000000, 918000000]
        bootloader:
          description:
            - The boot configuration in use, C(name) (V(extlinux), V(armbian), V(uboot_menu) or V(grub))
              and the C(path) of the file edgetune edits; when none is found, C(name) and C(path) are
              null and C(looked_for) lists what was tried.
          returned: always
          type: dict
          sample: {name: extlinux, path: /boot/extlinux/extlinux.conf, looked_for: null}
        cgroup:
          description: The cgroup mode, V(unified) (v2), V(hybrid) or V(legacy) (v1).
          returned: always
          type: str
          sample: unified
        systemd:
          description: The systemd version; null when C(systemctl --version) fails.
          returned: always
          type: int
          sample: 249
        device_units:
          description:
            - Whether systemd manages device units here (false where C(/sys) is mounted read-only, as in
              a container), so that a unit can be bound to a network interface's device unit.
          returned: always
          type: bool
          sample: true
        cmdline:
          description: The running kernel's command line (C(/proc/cmdline)).
          returned: always
          type: str
          sample: root=/dev/nvme0n1p1 rw rootwait isolcpus=4-7
        kernel:
          description:
            - The running kernel's C(release), the C(config_source) its configuration was read from
              (C(/proc/config.gz) or C(/boot/config-<release>), null when neither is readable) and
              C(features), the kernel options the roles depend on (V(htb), V(cls_bpf), V(bpf_syscall),
              V(rt_group_sched), ...), each true, false, or null when the configuration is not readable.
          returned: always
          type: dict
          sample:
            release: 5.15.148-tegra
            config_source: /proc/config.gz
            features: {htb: true, cls_bpf: true, rt_group_sched: false}
        memory_kb:
          description: C(MemTotal) from C(/proc/meminfo), in KiB.
          returned: always
          type: int
          sample: 15896536
        sched:
          description:
            - The kernel's RT throttling, C(rt_period_us) and C(rt_runtime_us) (C(/proc/sys/kernel/sched_rt_period_us)
              and C(sched_rt_runtime_us); -1 is unlimited), each null when not readable.
          returned: always
          type: dict
          sample: {rt_period_us: 1000000, rt_runtime_us: 950000}
        inference_runtime:
          description:
            - The installed C(tensorrt) version (from C(libnvinfer.so.X.Y.Z)'s name) and C(rknn) version (the
              string C(librknnrt.so) embeds), each null when not found.
          returned: always
          type: dict
          sample: {tensorrt: 10.3.0, rknn: null}
        architecture:
          description: The machine, as C(uname -m) names it.
          returned: always
          type: str
          sample: aarch64
        glibc:
          description: The C library's glibc version (C(getconf GNU_LIBC_VERSION)), null for another C library.
          returned: always
          type: str
          sample: "2.35"
        python:
          description:
            - The C(version) and C(executable) of the Python this module ran with, and C(executable_link),
              C(/usr/bin/python3) (or C(/usr/local/bin/python3)) when that is the same interpreter, else null.
          returned: always
          type: dict
          sample: {executable: /usr/bin/python3.10, executable_link: /usr/bin/python3, version: 3.10.12}
        nvpmodel:
          description: Whether the C(nvpmodel) command and C(/etc/nvpmodel.conf) are both present.
          returned: always
          type: bool
          sample: true
        numa:
          description: >-
            The NUMA nodes (C(nodes), id to CPU list), whether binding applies (more than one node), the
            accelerator's sysfs path and C(node) (null where none or one node), and the C(reason) in words.
          returned: always
          type: dict
          sample: {nodes: {"0": "0-7"}, node_count: 1, applicable: false, accelerator: null, node: null,
                   reason: "one NUMA node (node0): NUMA binding does not apply"}
"""

import os
import platform
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_artifact import (
    detect_architecture, detect_glibc, detect_rknn, detect_tensorrt)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_board import (
    bsp_release, cgroup_mode, cpu_topology, detect_bootloader, device_tree, devfreq_nodes,
    kernel_config, kernel_features, l4t_release, memory_kb, path, read, rt_throttle, soc_family,
    systemd_device_units, systemd_version)
from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_autotune
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_lease, edge_numa
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import applied_state
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError


def python_link(executable):
    """The usual name of the interpreter (/usr/bin/python3 for /usr/bin/python3.11), else None."""
    for name in ("/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            if os.path.realpath(name) == os.path.realpath(executable):
                return name
        except OSError:
            pass
    return None


def gather(root, run_command, which, numa_accelerator=""):
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
        "device_units": systemd_device_units(root),
        "cmdline": (read(root, "/proc/cmdline", "") or "").strip(),
        "kernel": {"release": release, "config_source": config_source,
                   "features": kernel_features(config),
                   # Whether the kernel has automatic NUMA balancing (the switch role edge_cpu sets).
                   "numa_balancing": os.path.exists(path(root, "/proc/sys/kernel/numa_balancing"))},
        "memory_kb": memory_kb(root),
        "sched": rt_throttle(root),
        "inference_runtime": {"tensorrt": detect_tensorrt(root), "rknn": detect_rknn(root)},
        # What a native runtime build needs (edge_runtime's "auto" picks the build by them).
        "architecture": detect_architecture(),
        "glibc": detect_glibc(),
        "python": {"executable": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
                   "executable_link": python_link(sys.executable)},
        "nvpmodel": bool(which("nvpmodel")) and os.path.exists(os.path.join(root, "etc/nvpmodel.conf")),
        # The NUMA nodes and the accelerator's node: the planner binds the inference slice to it.
        "numa": edge_numa.layout(root, numa_accelerator),
    }


LEASE_SPEC = {"ttl": {"type": "int", "default": 3600}, "wait": {"type": "int", "default": 600},
              "holder": {"type": "dict"}, "ended_run": {"type": "str"},
              "path": {"type": "path", "default": edge_lease.LEASE_FILE}}


def lease_step(options, check_mode):
    """Take (or, in check mode, look at) the apply lease: the module's ``lease`` result."""
    if check_mode:
        other = edge_lease.peek((options["holder"] or {}).get("run_id"), options["path"])
        return {"taken": False, "took_over": None, "waited_s": 0, "held_by": other}
    found = edge_lease.take(options["holder"] or {}, options["ttl"], options["wait"], options["path"],
                            ended_run=options["ended_run"])
    return {"taken": found["held_by"] is None, "took_over": found["took_over"], "waited_s": found["waited_s"],
            "held_by": found["held_by"]}


def main():
    module = AnsibleModule(argument_spec={"root": {"type": "path", "default": "/"},
                                          "records": {"type": "path"},
                                          # The action plugin's (the profiles are on the controller).
                                          "profiles_dirs": {"type": "list", "elements": "path"},
                                          "strict_topology": {"type": "bool", "default": True},
                                          "numa_accelerator": {"type": "str", "default": ""},
                                          "lease": {"type": "dict", "options": LEASE_SPEC}},
                           supports_check_mode=True)
    extra = {}
    if module.params["lease"]:
        try:
            extra["lease"] = lease_step(module.params["lease"], module.check_mode)
        except (EdgeError, OSError) as exc:
            module.fail_json(msg=str(exc), lease={"taken": False,
                                                  "held_by": getattr(exc, "details", {}).get("holder")})
        if extra["lease"]["held_by"] is not None and not module.check_mode:
            # Another run holds it and the action plugin asked not to wait yet: no facts this time.
            module.exit_json(changed=False, **extra)

    def run_command(argv):
        return module.run_command(argv)

    def which(name):
        return module.get_bin_path(name, opt_dirs=["/usr/sbin", "/sbin"])

    try:
        facts = gather(module.params["root"], run_command, which, module.params["numa_accelerator"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg="edge_facts could not read the board: %s" % exc)
    # The lease is bookkeeping of the run, not a setting: a run that changes nothing reports no change.
    # The runtime's autotune record (its measured choice), which the plan applies.
    published = {"edge": facts, "edge_autotune": edge_autotune.read_record(module.params["root"])}
    if module.params["records"]:
        published["edge_applied"] = applied_state(module.params["root"], module.params["records"])
    module.exit_json(changed=False, ansible_facts=published, **extra)


if __name__ == "__main__":
    main()
