#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_pcie_vc: map PCIe traffic classes to a virtual channel on both ends of a link.

Also a command line for the boot-time re-apply unit, usable without Ansible:
``python3 edge_pcie_vc.py --apply-state FILE [--sysfs-root /]``.
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
  - The mapping is lost when the link is reset without the kernel restoring it, or at reboot. Re-apply
    it at boot with C(python3 edge_pcie_vc.py --apply-state FILE) (the edge_pcie_qos role installs
    such a unit).
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
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

try:
    from ansible.module_utils.basic import AnsibleModule
    from ansible_collections.edgetune.fleet.plugins.module_utils import edge_pcie as pcie
except ImportError:
    # Boot-time CLI on a board without Ansible: load the helper shipped next to
    # this file (module_utils/edge_pcie.py beside it on the device, or ../module_utils in the collection).
    if "--apply-state" not in sys.argv:
        raise
    import importlib.util

    AnsibleModule = None
    _here = os.path.dirname(os.path.abspath(__file__))
    for _candidate in (os.path.join(_here, "module_utils", "edge_pcie.py"),
                       os.path.join(_here, os.pardir, "module_utils", "edge_pcie.py")):
        if os.path.isfile(_candidate):
            _spec = importlib.util.spec_from_file_location("edge_pcie_utils", _candidate)
            pcie = importlib.util.module_from_spec(_spec)
            _spec.loader.exec_module(pcie)
            break
    else:
        sys.stderr.write("edge_pcie_vc: error: module_utils/edge_pcie.py not found next to %s\n" % _here)
        raise SystemExit(1)

STATE_FORMAT = 1
STATE_KEYS = ("device", "device_class", "tcs", "vc_id", "fail_unsupported", "timeout")
POLL_INTERVAL = 0.01


# The link's reading and planning live in module_utils/edge_pcie.py (the drift
# audit plans with the same code).
VcError = pcie.VcError
End = pcie.End
find_device = pcie.find_device
read_end = pcie.read_end
vc_capability = pcie.vc_capability
prepare = pcie.prepare


# --------------------------------------------------------------------------
# Apply, wait, read back

def apply_end(end, planned):
    """Make the planned writes; ``end.writes`` lists those done (with the values read just before)."""
    for write in planned:
        try:
            old, new = pcie.rmw_register(end.path, write["offset"], write["value"], write["mask"])
        except OSError as exc:
            raise VcError("writing %s of %s (0x%03x) failed: %s"
                          % (write["register"], end.label(), write["offset"], exc.strerror or exc)) from None
        end.writes.append(dict(write, old=old, new=new))


def wait_negotiation(ends, timeout, sleep=time.sleep, clock=time.monotonic):
    """Poll VC Negotiation Pending on both ends until clear or ``timeout``; returns the ends still pending."""
    deadline = clock() + timeout
    while True:
        pending = []
        for end in ends:
            status = pcie.read_register(end.path, end.resource["status_offset"], 2)
            end.pending = bool(status & pcie.RES_STATUS_NEGO)
            if end.pending:
                pending.append(end)
        if not pending or clock() >= deadline:
            return pending
        sleep(POLL_INTERVAL)


def read_back(end, planned):
    """Read the end's registers again; returns the errors for values that did not stick."""
    parsed = read_end(end)
    found = [v for v in parsed["vc_capabilities"] if v["offset"] == end.vc["offset"]]
    if not found:
        return ["%s no longer shows its VC capability at 0x%03x" % (end.label(), end.vc["offset"])]
    vc = found[0]
    end.after = end.registers(vc)
    expected = pcie.expected_after(end.vc, planned)
    errors = []
    for res in vc["vcs"]:
        want = expected[res["control_offset"]]
        mask = pcie.VCN_WRITE_MASK if res["index"] else pcie.VC0_MAP_WRITE_MASK
        if (res["control_register"] ^ want) & mask:
            errors.append("%s VC%d Resource Control at 0x%03x reads 0x%08x, expected 0x%08x (bits 0x%08x)"
                          % (end.label(), res["index"], res["control_offset"], res["control_register"], want, mask))
    return errors


def run(root, device=None, device_class=None, tcs=(), vc_id=1, timeout=1.0, fail_unsupported=False,
        check_mode=False, sleep=time.sleep, clock=time.monotonic):
    """Read, check, plan and (unless check_mode) apply, wait and read back.

    Returns (result, ends). Raises VcError; on a check error nothing was written.
    """
    ends, tcs, reasons, result = prepare(root, device, device_class, tcs, vc_id, timeout)
    if reasons:
        reason = "; ".join(reasons)
        if fail_unsupported:
            raise VcError("no extended virtual channel to map TCs %s to: %s"
                          % (",".join(map(str, tcs)), reason), supported=False, **result)
        result.update(supported=False, reason=reason)
        return result, []
    result["supported"] = True
    if check_mode:
        for end in ends:
            end.after = end.registers(simulated(end))
            end.pending = None if end.writes else end.resource["negotiation_pending"]
        result["changed"] = any(end.writes for end in ends)
        result["ends"] = [end.report() for end in ends]
        return result, ends

    planned = [end.writes for end in ends]
    for end in ends:
        end.writes = []
    try:
        for end, writes in zip(ends, planned):  # upstream port first, as pci_vc_enable() does
            apply_end(end, writes)
        pending = wait_negotiation(ends, timeout, sleep, clock)
        errors = []
        for end, writes in zip(ends, planned):
            errors.extend(read_back(end, writes))
        for end in pending:
            errors.append("VC%d negotiation is still pending on %s after %g s: the link partner did not"
                          " enable the same VC ID, or the link is down" % (vc_id, end.label(), timeout))
    except (VcError, OSError) as exc:
        message = str(exc) if isinstance(exc, VcError) else "reading back failed: %s" % (exc.strerror or exc)
        details = dict(result)
        details.update(changed=any(end.writes for end in ends), ends=[end.report() for end in ends])
        raise VcError(message, **details) from None
    result["changed"] = any(end.writes for end in ends)
    result["ends"] = [end.report() for end in ends]
    if errors:
        raise VcError("; ".join(errors), **result)
    return result, ends


def simulated(end):
    """The VC capability as it will read after the planned writes (for check mode)."""
    regs = pcie.expected_after(end.vc, end.writes)
    vc = dict(end.vc)
    vc["vcs"] = [dict(res, control_register=regs[res["control_offset"]]) for res in end.vc["vcs"]]
    return vc


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
    except VcError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except Exception as exc:  # never a traceback: report what went wrong in one line
        module.fail_json(msg="edge_pcie_vc: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


# --------------------------------------------------------------------------
# Boot-time re-apply (no Ansible)

def _entry_problem(entry):
    if not isinstance(entry, dict):
        return "mapping %r is not a mapping" % (entry,)
    unknown = sorted(set(entry) - set(STATE_KEYS))
    if unknown:
        return "mapping %r: unknown keys %s" % (entry, ", ".join(unknown))
    return None


def apply_state_file(path, root="/", out=sys.stdout, err=sys.stderr):
    """Re-apply every mapping of a state file; one line per write or finding. Returns 0/1."""
    try:
        with open(path, "r") as handle:
            doc = json.load(handle)
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError("not an edge_pcie_vc state file of format %d" % STATE_FORMAT)
        mappings = doc.get("mappings")
        if not isinstance(mappings, list):
            raise ValueError("'mappings' must be a list")
    except (OSError, ValueError) as exc:
        err.write("edge_pcie_vc: error: state file %s: %s\n" % (path, getattr(exc, "strerror", None) or exc))
        return 1
    status = 0
    # Each mapping on its own: a device that did not come up must not keep the others unmapped.
    for number, entry in enumerate(mappings, 1):
        problem = _entry_problem(entry)
        if problem:
            err.write("edge_pcie_vc: error: %s\n" % problem)
            status = 1
            continue
        what = "mapping %d (%s)" % (number, entry.get("device") or "class %s" % entry.get("device_class"))
        try:
            result, ends = run(root, entry.get("device"), entry.get("device_class"), entry.get("tcs"),
                               entry.get("vc_id", 1), entry.get("timeout", 1.0),
                               entry.get("fail_unsupported", False))
        except VcError as exc:
            err.write("edge_pcie_vc: error: %s: %s\n" % (what, exc))
            status = 1
            continue
        except Exception as exc:  # never a traceback in the boot log
            err.write("edge_pcie_vc: error: %s: %s: %s\n" % (what, type(exc).__name__, exc))
            status = 1
            continue
        if not result["supported"]:
            out.write("edge_pcie_vc: %s: not supported, left as it is: %s\n" % (what, result["reason"]))
        for end in ends:
            for write in end.writes:
                out.write("edge_pcie_vc: %s %s 0x%03x: 0x%08x -> 0x%08x\n"
                          % (end.bdf, write["register"], write["offset"], write["old"], write["new"]))
    return status


def cli(argv):
    parser = argparse.ArgumentParser(
        prog="edge_pcie_vc.py", description="Re-apply PCIe TC/VC mappings saved by the edge_pcie_qos role.")
    parser.add_argument("--apply-state", metavar="FILE", required=True,
                        help="state file with the mappings (JSON: format, mappings)")
    parser.add_argument("--sysfs-root", default="/", help="prefix for sysfs paths (default /)")
    args = parser.parse_args(argv)
    return apply_state_file(args.apply_state, args.sysfs_root)


if __name__ == "__main__":
    if "--apply-state" in sys.argv:
        raise SystemExit(cli(sys.argv[1:]))
    main()
