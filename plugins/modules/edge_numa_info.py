#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_numa_info: NUMA nodes and the node local to the accelerator."""

DOCUMENTATION = r"""
---
module: edge_numa_info
short_description: Read the NUMA nodes and find the node local to the inference accelerator
description:
  - Lists the NUMA nodes (C(/sys/devices/system/node/node<N>/cpulist)). One node (every Jetson Orin
    and RK3588) or no node directory (a kernel without C(CONFIG_NUMA)) means NUMA binding does not apply.
  - On a multi-node host it finds the accelerator's node from its PCI device's C(numa_node) file
    (C(/sys/bus/pci/devices/<address>/numa_node)). The accelerator is O(accelerator) when given (a
    PCI address or a sysfs device directory), else the first PCI device, by address, of class
    3D controller (C(0x0302)), VGA (C(0x0300)), processing accelerator (C(0x1200)) or
    co-processor (C(0x0b40)) whose C(numa_node) is not C(-1).
  - Reads only; never writes.
version_added: "0.1.0"
requirements:
  - sysfs on the board
author:
  - edgetune contributors (!UNKNOWN)
options:
  accelerator:
    description:
      - The accelerator as a PCI address (V(0000:01:00.0)) or a sysfs device directory with a
        C(numa_node) file. Empty to search the PCI devices by class.
    type: str
    default: ""
  cpus:
    description:
      - The inference CPUs (a CPU list). When the accelerator's node is known, RV(bind_cpus) is
        their part on that node; the module fails when none of them is on it.
    type: str
    default: ""
  root:
    description: Prefix for C(/sys) paths (for tests and fake trees).
    type: path
    default: /
attributes:
  check_mode:
    description: Reads only, so a check mode run returns the same as a real one.
    support: full
extends_documentation_fragment:
  - edgetune.fleet.edge
  - edgetune.fleet.edge.reads_only
"""

EXAMPLES = r"""
- name: Find the node local to the GPU
  edge_numa_info:
  register: numa

- name: Bind to it
  ansible.builtin.debug:
    msg: "node {{ numa.node }} (CPUs {{ numa.nodes[numa.node | string] }})"
  when: numa.applicable and numa.node is not none
"""

RETURN = r"""
nodes:
  description: NUMA node number (as a string) -> its CPU list.
  returned: always
  type: dict
  sample: {"0": "0-7", "1": "8-15"}
node_count:
  description: Number of NUMA nodes (0 without C(/sys/devices/system/node)).
  returned: always
  type: int
applicable:
  description: Whether the host has more than one NUMA node.
  returned: always
  type: bool
accelerator:
  description: The device found or given (its sysfs path), or null.
  returned: always
  type: str
node:
  description: The accelerator's NUMA node, or null when not applicable or not known.
  returned: always
  type: int
node_cpus:
  description: The CPUs of RV(node), or an empty list.
  returned: always
  type: list
  elements: int
bind_cpus:
  description: The O(cpus) on RV(node) (the slice's CPUs); O(cpus) itself when no node is chosen.
  returned: always
  type: list
  elements: int
bind_cpulist:
  description: RV(bind_cpus) in the kernel's list form.
  returned: always
  type: str
reason:
  description: One sentence on what was found and how.
  returned: always
  type: str
"""


from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist, parse_cpulist  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_numa import layout  # noqa: E402


def inspect(root="/", accelerator="", cpus=""):
    """What the host's NUMA layout is and where the inference slice belongs. EdgeError on bad input."""
    try:
        wanted = parse_cpulist(cpus)
    except ValueError as exc:
        raise EdgeError("cpus: %s" % exc) from None
    result = layout(root, accelerator)
    result["node_cpus"] = []
    result["bind_cpus"] = wanted
    if result["node"] is not None:
        try:
            result["node_cpus"] = parse_cpulist(result["nodes"][str(result["node"])])
        except ValueError as exc:
            raise EdgeError("node%s cpulist: %s" % (result["node"], exc)) from None
        result["bind_cpus"] = [c for c in wanted if c in result["node_cpus"]]
        if wanted and not result["bind_cpus"]:
            raise EdgeError("none of the inference CPUs %s is on node %s (CPUs %s), the accelerator's node: choose "
                            "inference CPUs on that node (edge_cpu_isolate) or name another accelerator"
                            % (format_cpulist(wanted), result["node"], format_cpulist(result["node_cpus"])))
    result["bind_cpulist"] = format_cpulist(result["bind_cpus"])
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(accelerator=dict(type="str", default=""), cpus=dict(type="str", default=""),
                           root=dict(type="path", default="/")),
        supports_check_mode=True,
    )
    try:
        result = inspect(module.params["root"], module.params["accelerator"], module.params["cpus"])
    except EdgeError as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:  # never a traceback
        module.fail_json(msg="edge_numa_info: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
