# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI configuration space: parse it, find the Virtual Channel capabilities, plan and apply TC/VC writes.

Runs on the device (Python 3.8+, stdlib and edge_error only): the module
edge_pcie_vc maps a link with :func:`run`, and edgetune-boot.service
(module_utils/device/edge_boot.py) re-applies the saved mappings at boot with
:func:`boot_apply`; the ``edgetune pcie`` tool on the controller and the drift
audit load this same file.

Register layout (include/uapi/linux/pci_regs.h, pciutils lib/header.h): the
extended capability list starts at 0x100, each header is ID [15:0], version
[19:16], next [31:20].  A Virtual Channel capability (ID 0x0002; 0x0009 "VC9"
on a function that also has MFVC; 0x0008 MFVC has the same register layout)
has Port VC Capability 1 at +0x04 (Extended VC Count [2:0]), Port VC
Capability 2 at +0x08, Port VC Control at +0x0C, Port VC Status at +0x0E, then
per VC resource n (n = 0 .. Extended VC Count) 12 bytes at +0x10 + 12n:
Resource Capability, Resource Control (TC/VC map [7:0], VC ID [26:24], Enable
bit 31) and Resource Status (+0x0A, 16 bit; VC Negotiation Pending bit 1).

Planning follows how Linux (drivers/pci/vc.c) and setpci write these registers: a 32-bit
read-modify-write of each Resource Control register (value and mask, as setpci's
``value:mask``), TC0 always on VC0, a TC on one VC only, the same VC ID on both
ends of the link.
"""

import errno
import hashlib
import os
import re
import struct
import time

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, EdgeError

CONFIG_SIZES = (256, 4096)
STD_CONFIG_SIZE = 256
EXT_CONFIG_SIZE = 4096
EXT_CAP_START = 0x100

ECAP_VC = 0x0002
ECAP_MFVC = 0x0008
ECAP_VC9 = 0x0009
VC_CAP_TYPES = {ECAP_VC: "VC", ECAP_MFVC: "MFVC", ECAP_VC9: "VC9"}

# Offsets inside a VC capability (pci_regs.h PCI_VC_*).
VC_PORT_CAP1 = 0x04
VC_PORT_CAP2 = 0x08
VC_PORT_CTRL = 0x0C
VC_PORT_STATUS = 0x0E
VC_RES_CAP = 0x10
VC_RES_CTRL = 0x14
VC_RES_STATUS = 0x1A
VC_BASE_SIZE = 0x10
VC_PER_VC_SIZE = 0x0C

RES_CTRL_TC_MAP = 0x000000FF
RES_CTRL_ID = 0x07000000
RES_CTRL_ENABLE = 0x80000000
RES_STATUS_TABLE = 0x0001
RES_STATUS_NEGO = 0x0002
# TC0 stays on VC0: its bit is never part of a VC0 write.
VC0_MAP_WRITE_MASK = 0x000000FE
VCN_WRITE_MASK = RES_CTRL_ENABLE | RES_CTRL_ID | RES_CTRL_TC_MAP

PCIE_PORT_TYPES = {
    0x0: "Endpoint", 0x1: "Legacy Endpoint", 0x4: "Root Port", 0x5: "Upstream Port",
    0x6: "Downstream Port", 0x7: "PCIe-to-PCI Bridge", 0x8: "PCI-to-PCIe Bridge",
    0x9: "Root Complex Integrated Endpoint", 0xA: "Root Complex Event Collector",
}

SYSFS_PCI_DEVICES = "sys/bus/pci/devices"
BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])$")
SYSFS_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$")

# Seconds between two reads of VC Negotiation Pending.
POLL_INTERVAL = 0.01
# The keys of one mapping in the boot-time settings ({"mappings": [...]}).
STATE_KEYS = ("device", "device_class", "tcs", "vc_id", "timeout", "fail_unsupported")


class ConfigSpaceError(BadInput):
    """The bytes are not a usable configuration space image."""


class MappingError(BadInput):
    """The requested mapping does not fit this device (bad TC, VC ID not present...)."""


# --------------------------------------------------------------------------
# Raw access

def u8(data, offset):
    return data[offset]


def u16(data, offset):
    return struct.unpack_from("<H", data, offset)[0]


def u32(data, offset):
    return struct.unpack_from("<I", data, offset)[0]


def check_image(data, source="config space"):
    """Return ``data`` as bytes if it is a whole 256- or 4096-byte image, else raise."""
    if not isinstance(data, (bytes, bytearray)):
        raise ConfigSpaceError("%s: expected bytes, got %s" % (source, type(data).__name__))
    size = len(data)
    if size in CONFIG_SIZES:
        return bytes(data)
    if size < STD_CONFIG_SIZE:
        hint = (" (Linux returns only the first 64 bytes of a device's config file to a reader"
                " without CAP_SYS_ADMIN: read it as root)") if size == 64 else ""
        raise ConfigSpaceError("%s is truncated: %d bytes, a configuration space has 256 (PCI) or 4096"
                               " (PCI Express)%s" % (source, size, hint))
    raise ConfigSpaceError("%s has %d bytes, not a configuration space image (256 or 4096 bytes)"
                           % (source, size))


# --------------------------------------------------------------------------
# Standard header and capability list

def parse_header(data):
    """The fields of the first 64 bytes that identify a function."""
    header_type = u8(data, 0x0E)
    status = u16(data, 0x06)
    info = {
        "vendor": u16(data, 0x00),
        "device": u16(data, 0x02),
        "command": u16(data, 0x04),
        "status": status,
        "revision": u8(data, 0x08),
        "class": u32(data, 0x08) >> 8,
        "header_type": header_type & 0x7F,
        "multifunction": bool(header_type & 0x80),
        "capabilities_pointer": u8(data, 0x34) & 0xFC if status & 0x10 else None,
    }
    if info["header_type"] == 1:
        info["primary_bus"] = u8(data, 0x18)
        info["secondary_bus"] = u8(data, 0x19)
        info["subordinate_bus"] = u8(data, 0x1A)
    return info


def walk_capabilities(data):
    """The standard capability list: ([{id, offset}], problems).

    Pointers below 0x40 end the list, low two bits are ignored (as the
    kernel's and pciutils' walkers do), a pointer seen twice is a loop.
    """
    caps, problems = [], []
    header = parse_header(data)
    pos = header["capabilities_pointer"]
    seen = set()
    while pos:
        if pos < 0x40 or pos > STD_CONFIG_SIZE - 2:
            problems.append("capability pointer 0x%02x is outside 0x40-0xfe; list ends there" % pos)
            break
        if pos in seen:
            problems.append("capability list loops back to 0x%02x" % pos)
            break
        seen.add(pos)
        caps.append({"id": u8(data, pos), "offset": pos})
        pos = u8(data, pos + 1) & 0xFC
    return caps, problems


def pcie_info(data, caps):
    """PCI Express capability (ID 0x10): offset, version and device/port type."""
    for cap in caps:
        if cap["id"] == 0x10 and cap["offset"] + 4 <= STD_CONFIG_SIZE:
            flags = u16(data, cap["offset"] + 2)
            port_type = (flags >> 4) & 0xF
            return {"offset": cap["offset"], "version": flags & 0xF, "port_type": port_type,
                    "port_type_name": PCIE_PORT_TYPES.get(port_type, "type %d" % port_type)}
    return None


# --------------------------------------------------------------------------
# Extended capabilities

def vc_size(data, offset):
    """Bytes a VC capability at ``offset`` spans up to its last resource block."""
    evcc = u32(data, offset + VC_PORT_CAP1) & 0x7
    return VC_BASE_SIZE + VC_PER_VC_SIZE * (evcc + 1)


def walk_ext_capabilities(data):
    """The extended capability list from 0x100: ([{id, version, offset, size}], problems).

    Guards: a 256-byte image has no extended space; an all-zero or all-ones
    first header means an empty (or unreadable) list; a next pointer below
    0x100, past the end or pointing into a capability already walked (loop or
    overlap) ends the walk with a problem; a capability whose registers would
    run past 4096 ends it too.  The reserved low two bits of the next pointer
    are ignored, as PCI_EXT_CAP_NEXT() does.
    """
    caps, problems = [], []
    if len(data) < EXT_CONFIG_SIZE:
        return caps, problems
    pos = EXT_CAP_START
    spans = []
    while True:
        header = u32(data, pos)
        if header in (0, 0xFFFFFFFF):
            if pos != EXT_CAP_START:
                problems.append("extended capability at 0x%03x has an empty header 0x%08x" % (pos, header))
            break
        cap_id, version, nxt = header & 0xFFFF, (header >> 16) & 0xF, (header >> 20) & 0xFFC
        size = 4
        if cap_id in VC_CAP_TYPES:
            size = vc_size(data, pos) if pos + VC_PORT_CAP1 + 4 <= EXT_CONFIG_SIZE else EXT_CONFIG_SIZE
            if pos + size > EXT_CONFIG_SIZE:
                problems.append("%s capability at 0x%03x runs past the end of config space"
                                % (VC_CAP_TYPES[cap_id], pos))
                break
        caps.append({"id": cap_id, "version": version, "offset": pos, "size": size})
        spans.append((pos, pos + size))
        if not nxt:
            break
        if nxt < EXT_CAP_START or nxt > EXT_CONFIG_SIZE - 4:
            problems.append("extended capability at 0x%03x points to 0x%03x, outside 0x100-0xffc; list ends there"
                            % (pos, nxt))
            break
        inside = [start for start, end in spans if start <= nxt < end]
        if inside:
            what = "loops back to" if nxt in [s for s, _end in spans] else "overlaps the capability at"
            problems.append("extended capability at 0x%03x %s 0x%03x; list ends there"
                            % (pos, what, inside[0]))
            break
        pos = nxt
    return caps, problems


def decode_vc(data, offset, cap_id=None):
    """Decode the VC, VC9 or MFVC capability at ``offset``."""
    header = u32(data, offset)
    cap_id = header & 0xFFFF if cap_id is None else cap_id
    if cap_id not in VC_CAP_TYPES:
        raise ConfigSpaceError("no VC capability at 0x%03x (header 0x%08x)" % (offset, header))
    if offset + vc_size(data, offset) > len(data):
        raise ConfigSpaceError("%s capability at 0x%03x runs past the end of config space"
                               % (VC_CAP_TYPES[cap_id], offset))
    cap1 = u32(data, offset + VC_PORT_CAP1)
    cap2 = u32(data, offset + VC_PORT_CAP2)
    ctrl = u16(data, offset + VC_PORT_CTRL)
    status = u16(data, offset + VC_PORT_STATUS)
    evcc = cap1 & 0x7
    vcs = []
    for index in range(evcc + 1):
        block = offset + VC_RES_CAP + VC_PER_VC_SIZE * index
        res_cap = u32(data, block)
        res_ctrl = u32(data, block + 4)
        res_status = u16(data, block + 0xA)
        tc_map = res_ctrl & RES_CTRL_TC_MAP
        vcs.append({
            "index": index,
            "id": (res_ctrl & RES_CTRL_ID) >> 24,
            "tc_map": tc_map,
            "tcs": [tc for tc in range(8) if tc_map & (1 << tc)],
            "enabled": bool(res_ctrl & RES_CTRL_ENABLE),
            "negotiation_pending": bool(res_status & RES_STATUS_NEGO),
            "port_arb_table_status": bool(res_status & RES_STATUS_TABLE),
            "port_arb_capability": res_cap & 0xFF,
            "reject_snoop": bool(res_cap & 0x8000),
            "max_time_slots": ((res_cap >> 16) & 0x7F) + 1,
            "port_arb_table_offset": ((res_cap >> 24) & 0xFF) * 16,
            "port_arb_select": (res_ctrl >> 17) & 0x7,
            "capability_offset": block,
            "control_offset": block + 4,
            "status_offset": block + 0xA,
            "capability_register": res_cap,
            "control_register": res_ctrl,
            "status_register": res_status,
        })
    return {
        "offset": offset,
        "id": cap_id,
        "type": VC_CAP_TYPES[cap_id],
        "version": (header >> 16) & 0xF,
        "extended_vc_count": evcc,
        "low_priority_extended_vc_count": (cap1 >> 4) & 0x7,
        "reference_clock": (cap1 >> 8) & 0x3,
        "port_arb_table_entry_bits": 1 << ((cap1 >> 10) & 0x3),
        "vc_arb_capability": cap2 & 0xFF,
        "vc_arb_table_offset": ((cap2 >> 24) & 0xFF) * 16,
        "port_vc_control": ctrl,
        "vc_arb_select": (ctrl >> 1) & 0x7,
        "port_vc_status": status,
        "vc_arb_table_status": bool(status & 0x1),
        "vcs": vcs,
    }


def parse(data, source="config space"):
    """Everything this module reads from one image."""
    data = check_image(data, source)
    caps, problems = walk_capabilities(data)
    ext_caps, ext_problems = walk_ext_capabilities(data)
    return {
        "size": len(data),
        "header": parse_header(data),
        "pcie": pcie_info(data, caps),
        "capabilities": caps,
        "ext_capabilities": ext_caps,
        "vc_capabilities": [decode_vc(data, cap["offset"], cap["id"])
                            for cap in ext_caps if cap["id"] in VC_CAP_TYPES],
        "problems": problems + ext_problems,
    }


# --------------------------------------------------------------------------
# Planning a TC -> VC mapping

def tc_mask(tcs):
    mask = 0
    for tc in tcs:
        mask |= 1 << tc
    return mask


def check_request(tcs, vc_id):
    """Validate the TCs (1-7, not empty) and the VC ID (1-7); returns the sorted TC list."""
    if isinstance(vc_id, bool) or not isinstance(vc_id, int) or not 1 <= vc_id <= 7:
        raise MappingError("vc_id %r is not a VC ID of 1-7 (VC0 is the default VC and is always enabled)"
                           % (vc_id,))
    if not isinstance(tcs, (list, tuple)) or not tcs:
        raise MappingError("tcs must be a non-empty list of traffic classes 1-7, got %r" % (tcs,))
    for tc in tcs:
        if isinstance(tc, bool) or not isinstance(tc, int):
            raise MappingError("traffic class %r is not an integer 1-7" % (tc,))
        if tc == 0:
            raise MappingError("TC0 cannot be moved: TC0 is always mapped to VC0")
        if not 0 <= tc <= 7:
            raise MappingError("traffic class %d does not exist (TCs are 0-7; 1-7 can be mapped)" % tc)
    return sorted(set(tcs))


def resource_for_id(vc, vc_id):
    """The extended VC resource (index >= 1) whose VC ID is ``vc_id``, or None."""
    for res in vc["vcs"][1:]:
        if res["id"] == vc_id:
            return res
    return None


def merge(old, value, mask):
    """setpci's value:mask read-modify-write of one 32-bit register."""
    return (old & ~mask & 0xFFFFFFFF) | (value & mask)


def plan_mapping(vc, tcs, vc_id):
    """The 32-bit writes that move ``tcs`` to the VC with ID ``vc_id`` on one end of a link.

    ``vc`` is a decoded VC capability (:func:`decode_vc`).  Returns a list of
    writes ``{offset, value, mask, old, new, register}`` in the order to apply
    them; empty when the mapping is already in place.  The order keeps every
    TC on at most one VC at any moment:

    1. TCs leave the VCs they must no longer be on (other extended VCs lose the
       requested TCs; the target VC loses TCs no longer requested),
    2. VC0 gets back the TCs the target VC gave up and loses the requested ones,
    3. the target VC gets exactly the requested TCs, its VC ID and Enable
       (HARDWARE 7.3: ``value 81000002 mask 870000ff`` for TC1 on VC ID 1).
    """
    tcs = check_request(tcs, vc_id)
    target = resource_for_id(vc, vc_id)
    if target is None:
        raise MappingError("no extended VC resource with VC ID %d (IDs present: %s)"
                           % (vc_id, ", ".join(str(r["id"]) for r in vc["vcs"][1:]) or "none"))
    want = tc_mask(tcs)
    regs = {res["index"]: res["control_register"] for res in vc["vcs"]}
    offsets = {res["index"]: res["control_offset"] for res in vc["vcs"]}
    writes = []

    def write(index, value, mask):
        old = regs[index]
        new = merge(old, value, mask)
        if new != old:
            writes.append({"offset": offsets[index], "value": value & mask, "mask": mask,
                           "old": old, "new": new, "register": "VC%d Resource Control" % index})
            regs[index] = new

    returned = 0
    for res in vc["vcs"][1:]:
        current = regs[res["index"]] & RES_CTRL_TC_MAP
        keep = current & want if res["index"] == target["index"] else current & ~want
        if res["index"] == target["index"]:
            returned = current & ~want & VC0_MAP_WRITE_MASK
        if keep != current:
            write(res["index"], keep, RES_CTRL_TC_MAP)
    vc0_map = ((regs[0] & RES_CTRL_TC_MAP) | returned) & ~want
    write(0, vc0_map, VC0_MAP_WRITE_MASK)
    write(target["index"], RES_CTRL_ENABLE | (vc_id << 24) | want, VCN_WRITE_MASK)
    return writes


def expected_after(vc, writes):
    """Resource control registers after ``writes``: {control offset: value}."""
    regs = {res["control_offset"]: res["control_register"] for res in vc["vcs"]}
    for w in writes:
        regs[w["offset"]] = merge(regs[w["offset"]], w["value"], w["mask"])
    return regs


# --------------------------------------------------------------------------
# sysfs

def under(root, path):
    return os.path.join(root or "/", path.lstrip("/"))


def normalize_bdf(text):
    """'01:00.0' -> '0000:01:00.0'; raises ValueError for anything else."""
    match = BDF_RE.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise BadInput("%r is not a PCI address like 0000:01:00.0" % (text,))
    domain, bus, dev, fn = match.groups()
    return ("%s:%s:%s.%s" % (domain or "0000", bus, dev, fn)).lower()


def devices_dir(root):
    return under(root, SYSFS_PCI_DEVICES)


def list_devices(root):
    """BDFs listed in /sys/bus/pci/devices, sorted."""
    try:
        names = os.listdir(devices_dir(root))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
    return sorted(name for name in names if SYSFS_BDF_RE.match(name))


def device_path(root, bdf):
    return os.path.join(devices_dir(root), bdf)


def upstream_of(root, bdf):
    """The BDF of the bridge above ``bdf`` (its parent directory in sysfs), or None on a root bus."""
    real = os.path.realpath(device_path(root, bdf))
    parent = os.path.basename(os.path.dirname(real))
    return parent if SYSFS_BDF_RE.match(parent) else None


def read_class(root, bdf):
    """The 24-bit class code from sysfs ``class`` (0x010802 for an NVMe controller)."""
    with open(os.path.join(device_path(root, bdf), "class")) as handle:
        return int(handle.read().strip(), 16)


def parse_class(text):
    """'0x0108' -> (0x0108, 16 bits), '0x010802' -> (0x010802, 24 bits)."""
    value = text.strip().lower() if isinstance(text, str) else ""
    if value.startswith("0x"):
        value = value[2:]
    if len(value) not in (4, 6) or not re.match(r"^[0-9a-f]+$", value):
        raise BadInput("device_class %r is not a PCI class like 0x0108 (class and subclass) or 0x010802"
                       % (text,))
    return int(value, 16), len(value) * 4


def class_matches(code, wanted):
    value, bits = wanted
    return (code >> 8 if bits == 16 else code) == value


def read_config(path):
    """All bytes of a config file (sysfs ``config`` or a saved image)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, EXT_CONFIG_SIZE)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_register(path, offset, size=4):
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    if len(data) != size:
        raise OSError(errno.EIO, "short read of %d bytes at 0x%03x" % (len(data), offset))
    return struct.unpack("<I" if size == 4 else "<H", data)[0]


def write_register(path, offset, value):
    """One aligned 32-bit config write (the kernel turns a 4-byte aligned pwrite into a dword access).

    No O_CREAT: a missing config file is an error, never a new file.
    """
    if offset & 3:
        raise BadInput("unaligned 32-bit write at 0x%03x" % offset)
    fd = os.open(path, os.O_WRONLY)
    try:
        done = os.pwrite(fd, struct.pack("<I", value & 0xFFFFFFFF), offset)
    finally:
        os.close(fd)
    if done != 4:
        raise OSError(errno.EIO, "short write of %d bytes at 0x%03x" % (done, offset))


def rmw_register(path, offset, value, mask):
    """Read the register now, merge ``value`` under ``mask``, write only if it differs; returns (old, new)."""
    old = read_register(path, offset)
    new = merge(old, value, mask)
    if new != old:
        write_register(path, offset, new)
    return old, new


# --------------------------------------------------------------------------
# One link: the device and its upstream port, read and planned (run() applies
# the plan; the drift audit compares it with the device). Expected failures
# raise EdgeError (a message, and result keys for fail_json).

class End(object):
    """One end of the link: where its config space is, what it has, what is planned and done."""

    def __init__(self, role, bdf, path):
        self.role = role
        self.bdf = bdf
        self.path = path
        self.vc = self.resource = None
        self.writes = []
        self.before = self.after = None
        self.pending = None

    def label(self):
        return "%s (%s)" % (self.bdf, "upstream port" if self.role == "upstream" else "device")

    def registers(self, vc):
        """The registers the mapping touches or watches, by name, as hex text."""
        regs = {"VC%d Resource Control" % res["index"]: "0x%08x" % res["control_register"] for res in vc["vcs"]}
        target = vc["vcs"][self.resource["index"]]
        regs["VC%d Resource Status" % target["index"]] = "0x%04x" % target["status_register"]
        return regs

    def report(self):
        return {
            "role": self.role,
            "bdf": self.bdf,
            "capability": {"offset": self.vc["offset"], "type": self.vc["type"]},
            "resource": self.resource["index"],
            "negotiation_pending": self.pending,
            "before": self.before,
            "after": self.after,
            "writes": [dict(w, setpci="setpci -s %s 0x%x.l=%08x:%08x" % (self.bdf, w["offset"], w["value"], w["mask"]))
                       for w in self.writes],
        }

    def lines(self, regs):
        return ["%s %s@0x%03x %s: %s" % (self.bdf, self.vc["type"], self.vc["offset"], name, value)
                for name, value in sorted(regs.items())]


# --------------------------------------------------------------------------
# Read and check

def find_device(root, device, device_class):
    """(bdf or None, reason when not found). A missing explicit device is an error."""
    present = list_devices(root)
    if device is not None:
        try:
            bdf = normalize_bdf(device)
        except ValueError as exc:
            raise EdgeError(str(exc)) from None
        if bdf not in present:
            raise EdgeError("PCI device %s not found under %s; present: %s"
                            % (bdf, devices_dir(root), " ".join(present) or "none"))
        return bdf, None
    try:
        wanted = parse_class(device_class)
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    for bdf in present:
        try:
            code = read_class(root, bdf)
        except (OSError, ValueError):
            continue
        if class_matches(code, wanted):
            return bdf, None
    return None, "no PCI device of class %s on this host" % device_class


def read_end(end):
    try:
        data = read_config(end.path)
        return parse(data, end.path)
    except ConfigSpaceError as exc:
        raise EdgeError(str(exc)) from None
    except OSError as exc:
        raise EdgeError("cannot read %s: %s" % (end.path, exc.strerror or exc)) from None


def vc_capability(end, parsed):
    """Pick the VC capability to program, or return the reason there is none."""
    by_type = {vc["type"]: vc for vc in parsed["vc_capabilities"]}
    if "VC" not in by_type:
        if by_type:
            return None, ("%s has only %s (multi-function virtual channels), which this module does not program"
                          % (end.label(), " and ".join(sorted(by_type))))
        detail = "; config space walk: %s" % "; ".join(parsed["problems"]) if parsed["problems"] else ""
        return None, "%s has no Virtual Channel capability (VC0 only)%s" % (end.label(), detail)
    vc = by_type["VC"]
    if vc["extended_vc_count"] == 0:
        return None, ("%s has only VC0: its VC capability at 0x%03x reports Extended VC Count 0"
                      % (end.label(), vc["offset"]))
    return vc, None


def prepare(root, device=None, device_class=None, tcs=(), vc_id=1, timeout=1.0):
    """Check the request and the hardware; returns (ends, tcs, reasons, result). Writes nothing."""
    if (device is None) == (device_class is None):
        raise EdgeError("give exactly one of device and device_class")
    try:
        tcs = check_request(list(tcs) if tcs is not None else tcs, vc_id)
    except MappingError as exc:
        raise EdgeError(str(exc)) from None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise EdgeError("timeout must be a positive number of seconds, got %r" % (timeout,))
    result = {"changed": False, "vc_id": vc_id, "tcs": tcs}
    bdf, missing = find_device(root, device, device_class)
    if bdf is None:
        return [], tcs, [missing], result
    upstream = upstream_of(root, bdf)
    result.update(device=bdf, upstream=upstream)
    if upstream is None:
        return [], tcs, ["%s is on a root bus: it has no upstream port to negotiate a VC with"
                         " (a root port or a root-complex integrated endpoint)" % bdf], result

    device_end = End("device", bdf, os.path.join(device_path(root, bdf), "config"))
    upstream_end = End("upstream", upstream,
                       os.path.join(os.path.dirname(os.path.realpath(device_path(root, bdf))), "config"))
    ends = [upstream_end, device_end]
    reasons = []
    for end in ends:
        parsed = read_end(end)
        end.vc, reason = vc_capability(end, parsed)
        if reason:
            reasons.append(reason)
    if reasons:
        return [], tcs, reasons, result

    missing_id = []
    for end in ends:
        end.resource = resource_for_id(end.vc, vc_id)
        if end.resource is None:
            missing_id.append("%s has no extended VC with VC ID %d (its VC resources 1-%d carry VC IDs %s)"
                              % (end.label(), vc_id, end.vc["extended_vc_count"],
                                 ", ".join(str(r["id"]) for r in end.vc["vcs"][1:])))
    if missing_id:
        raise EdgeError("; ".join(missing_id) + "; both ends of the link need the same VC ID", **result)
    for end in ends:
        end.writes = plan_mapping(end.vc, tcs, vc_id)
        end.before = end.registers(end.vc)
    return ends, tcs, [], result


# --------------------------------------------------------------------------
# Apply, wait, read back

def apply_end(end, planned):
    """Make the planned writes; ``end.writes`` lists those done (with the values read just before)."""
    for write in planned:
        try:
            old, new = rmw_register(end.path, write["offset"], write["value"], write["mask"])
        except OSError as exc:
            raise EdgeError("writing %s of %s (0x%03x) failed: %s"
                            % (write["register"], end.label(), write["offset"], exc.strerror or exc)) from None
        end.writes.append(dict(write, old=old, new=new))


def wait_negotiation(ends, timeout, sleep=time.sleep, clock=time.monotonic):
    """Poll VC Negotiation Pending on both ends until clear or ``timeout``; returns the ends still pending."""
    deadline = clock() + timeout
    while True:
        pending = []
        for end in ends:
            status = read_register(end.path, end.resource["status_offset"], 2)
            end.pending = bool(status & RES_STATUS_NEGO)
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
    expected = expected_after(end.vc, planned)
    errors = []
    for res in vc["vcs"]:
        want = expected[res["control_offset"]]
        mask = VCN_WRITE_MASK if res["index"] else VC0_MAP_WRITE_MASK
        if (res["control_register"] ^ want) & mask:
            errors.append("%s VC%d Resource Control at 0x%03x reads 0x%08x, expected 0x%08x (bits 0x%08x)"
                          % (end.label(), res["index"], res["control_offset"], res["control_register"], want, mask))
    return errors


def simulated(end):
    """The VC capability as it will read after the planned writes (for check mode)."""
    regs = expected_after(end.vc, end.writes)
    vc = dict(end.vc)
    vc["vcs"] = [dict(res, control_register=regs[res["control_offset"]]) for res in end.vc["vcs"]]
    return vc


def run(root, device=None, device_class=None, tcs=(), vc_id=1, timeout=1.0, fail_unsupported=False,
        check_mode=False, sleep=time.sleep, clock=time.monotonic):
    """Read, check, plan and (unless check_mode) apply, wait and read back one link's mapping.

    Returns (result, ends): the module's result keys, and the ends with the writes made
    (none when the link is not supported). Raises EdgeError, whose details are result keys
    (with ``changed`` and ``ends`` once something was written); on a check error nothing was written.
    """
    ends, tcs, reasons, result = prepare(root, device, device_class, tcs, vc_id, timeout)
    if reasons:
        reason = "; ".join(reasons)
        if fail_unsupported:
            raise EdgeError("no extended virtual channel to map TCs %s to: %s"
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
    except (EdgeError, OSError) as exc:
        message = str(exc) if isinstance(exc, EdgeError) else "reading back failed: %s" % (exc.strerror or exc)
        details = dict(result)
        details.update(changed=any(end.writes for end in ends), ends=[end.report() for end in ends])
        raise EdgeError(message, **details) from None
    result["changed"] = any(end.writes for end in ends)
    result["ends"] = [end.report() for end in ends]
    if errors:
        raise EdgeError("; ".join(errors), **result)
    return result, ends


# --------------------------------------------------------------------------
# Boot-time settings: {"mappings": [{device or device_class, tcs, vc_id, timeout,
# fail_unsupported}, ...]}, written by the role edge_pcie_qos (boot_settings, through
# the filter edge_pcie_boot_settings) and re-applied by edgetune-boot.service (boot_apply).

def mapping_label(number, entry):
    """'mapping 2 (0000:01:00.0)', 'mapping 1 (class 0x0108)', or 'mapping 3' for a malformed entry."""
    if isinstance(entry, dict):
        if isinstance(entry.get("device"), str) and entry["device"]:
            return "mapping %d (%s)" % (number, entry["device"])
        if isinstance(entry.get("device_class"), str) and entry["device_class"]:
            return "mapping %d (class %s)" % (number, entry["device_class"])
    return "mapping %d" % number


def check_mapping(entry):
    """One saved mapping, checked without reading the hardware: the keyword arguments of run()
    (device or device_class, tcs sorted, vc_id, timeout, fail_unsupported). Raises EdgeError."""
    if not isinstance(entry, dict):
        raise EdgeError("%r is not a mapping (a dict of %s)" % (entry, ", ".join(STATE_KEYS)))
    unknown = sorted(str(key) for key in set(entry) - set(STATE_KEYS))
    if unknown:
        raise EdgeError("unknown keys %s (a mapping has %s)" % (", ".join(unknown), ", ".join(STATE_KEYS)))
    device, device_class = entry.get("device"), entry.get("device_class")
    if (device is None) == (device_class is None):
        raise EdgeError("give exactly one of device (a PCI address) and device_class (a PCI class like 0x0108)")
    try:
        if device is not None:
            device = normalize_bdf(device)
        else:
            parse_class(device_class)
        tcs = check_request(entry.get("tcs"), entry.get("vc_id", 1))
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    timeout = entry.get("timeout", 1.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise EdgeError("timeout must be a positive number of seconds, got %r" % (timeout,))
    fail_unsupported = entry.get("fail_unsupported", False)
    if not isinstance(fail_unsupported, bool):
        raise EdgeError("fail_unsupported must be true or false, got %r" % (fail_unsupported,))
    checked = {"device": device} if device is not None else {"device_class": device_class}
    checked.update(tcs=tcs, vc_id=entry.get("vc_id", 1), timeout=float(timeout), fail_unsupported=fail_unsupported)
    return checked


BOOLEANS = {"yes": True, "on": True, "true": True, "y": True, "t": True, "1": True,
            "no": False, "off": False, "false": False, "n": False, "f": False, "0": False}


def _as_int(value):
    """An integer as Ansible passes it (42 or '42'); anything else unchanged, for check_mapping to refuse."""
    if isinstance(value, str) and re.match(r"^\s*[0-9]+\s*$", value):
        return int(value)
    return value


def _as_float(value):
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _as_bool(value):
    if isinstance(value, str):
        return BOOLEANS.get(value.strip().lower(), value)
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


def boot_settings(mappings, timeout=1.0, fail_unsupported=False):
    """The boot-time settings of the role's mappings: {"mappings": [...]}, each mapping with the
    role's ``timeout`` and ``fail_unsupported`` and checked as boot_apply checks it (device or
    device_class, tcs 1-7, vc_id 1-7); an empty device or device_class counts as not given.
    Raises EdgeError with a message per problem, each naming its mapping."""
    if not isinstance(mappings, (list, tuple)):
        raise EdgeError("mappings must be a list of mappings (device or device_class, tcs, vc_id), got %r"
                        % (mappings,))
    settings, problems = [], []
    for number, entry in enumerate(mappings, 1):
        label = mapping_label(number, entry)
        if not isinstance(entry, dict):
            problems.append("%s: %r is not a mapping (device or device_class, tcs, vc_id)" % (label, entry))
            continue
        unknown = sorted(str(key) for key in set(entry) - {"device", "device_class", "tcs", "vc_id"})
        if unknown:
            problems.append("%s: unknown keys %s (a mapping has device or device_class, tcs, vc_id)"
                            % (label, ", ".join(unknown)))
            continue
        given = dict((key, value) for key, value in entry.items() if value not in (None, ""))
        tcs = given.get("tcs")
        if isinstance(tcs, (list, tuple)):
            given["tcs"] = [_as_int(tc) for tc in tcs]
        if "vc_id" in given:
            given["vc_id"] = _as_int(given["vc_id"])
        given.update(timeout=_as_float(timeout), fail_unsupported=_as_bool(fail_unsupported))
        try:
            settings.append(check_mapping(given))
        except EdgeError as exc:
            problems.extend("%s: %s" % (label, message) for message in exc.errors)
    if problems:
        raise EdgeError(problems)
    return {"mappings": settings}


def _write_lines(ends):
    """A change line per register write: '<bdf> <register> 0x<offset>: 0x<old> -> 0x<new>'."""
    return ["%s %s 0x%03x: 0x%08x -> 0x%08x"
            % (end["bdf"], write["register"], write["offset"], write["old"], write["new"])
            for end in ends for write in end["writes"]]


def boot_apply(settings, root="/"):
    """Re-apply the saved mappings (edgetune-boot.service); returns (changes, errors) as lines.

    Each mapping on its own: a device that did not come up does not keep the others unmapped.
    A link without an extended VC is a change line ("not supported, left as it is") unless its
    mapping has fail_unsupported. Raises EdgeError only when ``settings`` has no list of mappings.
    """
    if not isinstance(settings, dict) or not isinstance(settings.get("mappings"), list):
        raise EdgeError("pcie_vc settings must be {\"mappings\": [...]}, got %r: run the role edge_pcie_qos again"
                        % (settings,))
    unknown = sorted(str(key) for key in set(settings) - {"mappings"})
    if unknown:
        raise EdgeError("pcie_vc settings have unknown keys %s (only mappings): run the role edge_pcie_qos again"
                        % ", ".join(unknown))
    changes, errors = [], []
    for number, entry in enumerate(settings["mappings"], 1):
        label = mapping_label(number, entry)
        try:
            result, ends = run(root, **check_mapping(entry))
        except EdgeError as exc:
            changes.extend(_write_lines(exc.details.get("ends") or []))
            errors.append("%s: %s" % (label, exc))
            continue
        except Exception as exc:  # never a traceback in the boot log, and the next mappings still run
            errors.append("%s: unexpected %s: %s" % (label, type(exc).__name__, exc))
            continue
        if not result["supported"]:
            changes.append("%s: not supported, left as it is: %s" % (label, result["reason"]))
        changes.extend(_write_lines([end.report() for end in ends]))
    return changes, errors


# ------------------------------------------------------------------ the drift audit's checks
def audit_checks(mappings, state_file=None, state_content=None):
    """Role edge_pcie_qos's checks for the drift audit (plugins/module_utils/device/edge_audit.py's schema):
    each mapping on both ends of its link (kind ``pcie_vc``, planned on the device by this module's
    code, so a register it would rewrite is drift), and, where the mappings are re-applied at boot
    (``state_file``), the state file edgetune-boot.service reads, by the sha1 of ``state_content``."""
    checks = []
    for item in mappings or []:
        vc_id = item["vc_id"] if "vc_id" in item else 1
        where = item.get("device") or "class %s" % item.get("device_class")
        checks.append({"setting": "PCIe %s TC %s on VC ID %s" % (where, ",".join(str(tc) for tc in item["tcs"]), vc_id),
                       "role": "edge_pcie_qos", "kind": "pcie_vc", "device": item.get("device") or None,
                       "device_class": item.get("device_class") or None, "tcs": item["tcs"], "vc_id": vc_id})
    if mappings and state_file:
        checks.append({"setting": "PCIe QoS state file", "role": "edge_pcie_qos", "kind": "file", "path": state_file,
                       "sha1": hashlib.sha1(state_content.encode()).hexdigest()})
    return checks
