# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NUMA layout of a device and where the inference slice belongs on it: read on the device by
edge_facts (``layout``) and the edge_numa_info module, and turned into the slice's and the
runtime's CPUs by the planner (``binding``). Python 3.8+, stdlib only.

The nodes are /sys/devices/system/node/node<N>/cpulist; the accelerator's node is its device's
``numa_node`` file. One node (every Jetson Orin and RK3588) or none (a kernel without CONFIG_NUMA):
NUMA binding does not apply and the slice is bound by cluster.
"""
import os
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist, parse_cpulist

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


def layout(root="/", accelerator=""):
    """{nodes: {id: cpulist}, node_count, applicable, accelerator (its sysfs path), node (its node, or
    None), reason}: what the device's NUMA layout is and which node the accelerator is on."""
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


def binding(found, inference, bind=True):
    """The inference slice's NUMA binding from ``found`` (layout's answer; None: not read) and the
    inference CPUs: {applicable, node, cpus, cpulist, reason, problem}. With a node, the CPUs are
    the inference CPUs on it (the slice, the runtime and the probe all take them); ``problem`` says
    why none of them is."""
    inference = sorted(inference or [])
    out = {"applicable": False, "node": None, "cpus": inference, "cpulist": format_cpulist(inference),
           "reason": "edge_cpu_numa_bind is false", "problem": None}
    if not bind:
        return out
    found = found or {"reason": "the NUMA layout was not read"}
    out.update(applicable=bool(found.get("applicable")), reason=found.get("reason") or "")
    node = found.get("node")
    if node is None:
        return out
    try:
        node_cpus = parse_cpulist((found.get("nodes") or {}).get(str(node)) or "")
    except ValueError as exc:
        out["problem"] = "node%s cpulist: %s" % (node, exc)
        return out
    cpus = [cpu for cpu in inference if cpu in node_cpus]
    if inference and not cpus:
        out["problem"] = ("none of the inference CPUs %s is on node %s (CPUs %s), the accelerator's node: choose "
                          "inference CPUs on that node (edge_cpu_isolate) or name another accelerator"
                          % (format_cpulist(inference), node, format_cpulist(node_cpus)))
        return out
    out.update(node=node, cpus=cpus, cpulist=format_cpulist(cpus))
    return out
