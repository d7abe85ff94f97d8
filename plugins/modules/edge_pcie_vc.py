#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_pcie_vc: map PCIe traffic classes to a virtual channel on both ends of a link.

The reading, planning and applying are plugins/module_utils/device/edge_pcie.py's, which
edgetune-boot.service also runs at boot (edge_pcie.boot_apply).
"""

DOCUMENTATION = r"""
---
module: edge_pcie_vc
short_description: Map PCIe traffic classes (TCs) to a virtual channel (VC) on a device and its upstream port
description:
  - Moves the given traffic classes from VC0 to the extended virtual channel with O(vc_id), on the
    device and on the port above it (the link partner), through the Virtual Channel extended
    capability (ID 0x0002) in PCI configuration space. Linux has no other interface for this;
    C(drivers/pci/vc.c) only saves and restores these registers.
  - Where the hardware has no extended VC (no VC capability, or Extended VC Count 0, which is what
    most endpoints and many root ports have), nothing is written and the result says
    RV(supported=false) with the reason; the task fails only with O(fail_unsupported=true).
  - Everything is read and checked first. A device that does not exist, a TC outside 1-7 (TC0
    always stays on VC0) or a VC ID that one end of the link does not carry fails the task with one
    message, and nothing is written.
  - Writes are 32-bit read-modify-writes of the VC Resource Control registers through the sysfs
    C(config) file, upstream port first and then the device (the order C(pci_vc_enable()) uses).
    On each end the TCs first leave any VC they must not be on, VC0 gives them up, then the target
    VC gets exactly these TCs, its VC ID and Enable. The module then waits, at most O(timeout) seconds, for VC
    Negotiation Pending to clear on both ends and reads every register back; a value that did not
    stick or a negotiation still pending is an error.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  device:
    description:
      - PCI address of the device, C(0000:01:00.0) (the domain may be left out).
      - Exactly one of O(device) and O(device_class) is required.
    type: str
  device_class:
    description:
      - PCI class of the device, as class and subclass (V(0x0108) is an NVM Express controller)
        or with the programming interface (V(0x010802)). The first matching device in address
        order is used.
      - When no device has this class, the result is RV(supported=false).
    type: str
  tcs:
    description: Traffic classes to map to the VC; each 1-7. The VC carries exactly these TCs afterwards.
    type: list
    elements: int
    required: true
  vc_id:
    description:
      - VC ID of the extended virtual channel (1-7). Both ends must have an extended VC resource
        carrying this ID.
    type: int
    default: 1
  fail_unsupported:
    description: Fail instead of reporting RV(supported=false) when a link has no extended VC.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for VC Negotiation Pending to clear on both ends.
    type: float
    default: 1.0
  sysfs_root:
    description: Prefix for every sysfs path (for tests and fake trees).
    type: path
    default: /
attributes:
  check_mode:
    description: Reads and checks everything and reports exactly the register writes a real run makes; writes nothing.
    support: full
  diff_mode:
    description: "One line per VC Resource Control and Status register of both ends, before and after."
    support: full
  platform:
    description: Runs on the board (Linux, Python 3.8 or later, as root to read and write config space).
    support: full
    platforms: linux
notes:
  - The mapping is lost when the link is reset without the kernel restoring it, or at reboot. The role
    edge_pcie_qos saves its mappings in edgetune's boot-time state format
    (plugins/module_utils/device/edge_boot.py), re-applied at every boot by edgetune-boot.service (role edge_boot).
  - A TC moved off an enabled VC must have no transactions in flight on the link; map TCs before the
    traffic that uses them starts.
  - Mapping a TC does nothing for traffic that does not carry it. The TC of a transaction is chosen by
    the device or driver that issues it, and NVMe controllers issue TC0.
  - Kernel lockdown (secure boot) can refuse config space writes; the task then fails naming the file.
"""

EXAMPLES = r"""
- name: Give TC1 its own virtual channel on the NVMe link, if the hardware has one
  edge_pcie_vc:
    device_class: "0x0108"
    tcs: [1]
    vc_id: 1
  register: nvme_vc

- name: Map TC5-TC7 to VC ID 2 on a switch port's device and insist that it works
  edge_pcie_vc:
    device: "0000:03:00.0"
    tcs: [5, 6, 7]
    vc_id: 2
    fail_unsupported: true
"""

RETURN = r"""
supported:
  description: Whether both ends of the link have an extended VC to map to. With V(false) nothing was written.
  returned: always
  type: bool
reason:
  description: Why the link is not supported (every reason, joined by "; ").
  returned: when RV(supported) is false
  type: str
  sample: "0000:04:00.0 (upstream port) has no Virtual Channel capability"
device:
  description: The device's PCI address (resolved from O(device_class) when given).
  returned: when a device was found
  type: str
  sample: "0001:01:00.0"
upstream:
  description: The PCI address of the port above the device, or null on a root bus.
  returned: when a device was found
  type: str
  sample: "0001:00:00.0"
vc_id:
  description: The VC ID the TCs are mapped to.
  returned: always
  type: int
tcs:
  description: The TCs mapped, sorted.
  returned: always
  type: list
  elements: int
ends:
  description:
    - One entry per end of the link, upstream port first, with the address, the VC capability
      offset and type, the index of the VC resource with the VC ID, the registers C(before) and
      C(after) (read back, or in check mode the planned values) and the C(writes) made in order,
      each with C(offset), C(value), C(mask), C(old), C(new) and the equivalent C(setpci) command.
  returned: when RV(supported) is true
  type: list
  elements: dict
  sample:
    - role: upstream
      bdf: "0001:00:00.0"
      capability: {offset: 328, type: VC}
      resource: 1
      negotiation_pending: false
      before: {VC0 Resource Control: "0x800000ff", VC1 Resource Control: "0x01000000", VC1 Resource Status: "0x0002"}
      after: {VC0 Resource Control: "0x800000fd", VC1 Resource Control: "0x81000002", VC1 Resource Status: "0x0000"}
      writes:
        - {offset: 348, value: 252, mask: 254, old: 2147483903, new: 2147483901, register: VC0 Resource Control,
           setpci: "setpci -s 0001:00:00.0 0x15c.l=000000fc:000000fe"}
diff:
  description: Register lines of both ends before and after.
  returned: diff mode, when RV(supported) is true
  type: dict
"""

# Ansible modules keep their imports after the documentation strings.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError  # noqa: E402
# The link's reading, planning and applying live in module_utils/device/edge_pcie.py (the drift
# audit plans with the same code, and edgetune-boot.service re-applies with it).
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_pcie import run  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            device=dict(type="str"),
            device_class=dict(type="str"),
            tcs=dict(type="list", elements="int", required=True),
            vc_id=dict(type="int", default=1),
            fail_unsupported=dict(type="bool", default=False),
            timeout=dict(type="float", default=1.0),
            sysfs_root=dict(type="path", default="/"),
        ),
        mutually_exclusive=[("device", "device_class")],
        required_one_of=[("device", "device_class")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        result, ends = run(p["sysfs_root"], p["device"], p["device_class"], p["tcs"], p["vc_id"], p["timeout"],
                           p["fail_unsupported"], module.check_mode)
        if module._diff and ends:
            result["diff"] = {
                "before_header": "PCI config space", "after_header": "PCI config space",
                "before": "".join(line + "\n" for end in ends for line in end.lines(end.before)),
                "after": "".join(line + "\n" for end in ends for line in end.lines(end.after)),
            }
    except EdgeError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except Exception as exc:  # never a traceback: report what went wrong in one line
        module.fail_json(msg="edge_pcie_vc: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
