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
  diff_mode:
    description: Changes nothing, so there is no difference to show.
    support: none
  platform:
    description: Runs on the board (Linux with sysfs, Python 3.8 or later).
    support: full
    platforms: linux
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

import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_cpulist import format_cpulist, parse_cpulist  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_error import EdgeError  # noqa: E402

NODE_DIR = "sys/devices/system/node"
PCI_DIR = "sys/bus/pci/devices"
ACCELERATOR_CLASSES = ("0x0302", "0x0300", "0x1200", "0x0b40")
_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def under(root, path):
    return os.path.join(root or "/", path.lstrip("/"))


def _read(path):
    with open(path, "r") as handle:
        return handle.read().strip()


def read_nodes(root):
    base = under(root, NODE_DIR)
    nodes = {}
    if not os.path.isdir(base):
        return nodes
    for entry in os.listdir(base):
        match = re.match(r"^node(\d+)$", entry)
        if match:
            try:
                nodes[match.group(1)] = _read(os.path.join(base, entry, "cpulist"))
            except OSError:
                nodes[match.group(1)] = ""
    return dict(sorted(nodes.items(), key=lambda kv: int(kv[0])))


def device_node(path):
    try:
        return int(_read(os.path.join(path, "numa_node")))
    except (OSError, ValueError):
        return None


def find_accelerator(root, given):
    """(sysfs path, node, how) of the accelerator; path None when none was found."""
    if given:
        path = under(root, os.path.join(PCI_DIR, given)) if _PCI_ADDRESS.match(given) else under(root, given)
        if not os.path.isdir(path):
            return None, None, "the accelerator %s does not exist" % given
        return path, device_node(path), "given as %s" % given
    base = under(root, PCI_DIR)
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return None, None, "no PCI devices (%s)" % base
    for cls in ACCELERATOR_CLASSES:
        for entry in entries:
            path = os.path.join(base, entry)
            try:
                if not _read(os.path.join(path, "class")).lower().startswith(cls):
                    continue
            except OSError:
                continue
            node = device_node(path)
            if node is not None and node >= 0:
                return path, node, "PCI device %s of class %s" % (entry, cls)
    return None, None, "no PCI accelerator (classes %s) with a NUMA node" % ", ".join(ACCELERATOR_CLASSES)


def inspect(root="/", accelerator="", cpus=""):
    """What the host's NUMA layout is and where the inference slice belongs. EdgeError on bad input."""
    try:
        wanted = parse_cpulist(cpus)
    except ValueError as exc:
        raise EdgeError("cpus: %s" % exc) from None
    result = _inspect(root, accelerator)
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


def _inspect(root, accelerator):
    nodes = read_nodes(root)
    result = {"nodes": nodes, "node_count": len(nodes), "applicable": len(nodes) > 1,
              "accelerator": None, "node": None}
    if not nodes:
        result["reason"] = "no NUMA nodes in /%s (kernel without CONFIG_NUMA): NUMA binding does not apply" % NODE_DIR
        return result
    if len(nodes) == 1:
        result["reason"] = "one NUMA node (node%s): NUMA binding does not apply" % next(iter(nodes))
        return result
    path, node, how = find_accelerator(root, accelerator)
    result["accelerator"] = path
    if path is None:
        result["reason"] = "%d NUMA nodes but %s: set the accelerator's PCI address to bind" % (len(nodes), how)
    elif node is None or node < 0 or str(node) not in nodes:
        result["reason"] = "%d NUMA nodes; the accelerator (%s) reports no node (numa_node %s)" % (
            len(nodes), how, node)
    else:
        result["node"] = node
        result["reason"] = "%d NUMA nodes; the accelerator (%s, %s) is on node %d (CPUs %s)" % (
            len(nodes), how, path, node, nodes[str(node)])
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
