"""`edgetune pcie show`: the PCIe Virtual Channel capabilities of devices, decoded.

Reads /sys/bus/pci/devices/*/config (under --sysfs-root, e.g. a copy of a board's
sysfs) or one saved config space image (--config, binary, 256 or 4096 bytes as
the sysfs file gives it to root), and shows per VC capability its Extended VC
Count and per VC its ID, TC/VC map, Enable and VC Negotiation Pending.  The
decoding is plugins/module_utils/device/edge_pcie.py, the code the edge_pcie_vc module runs on
the device.

Exit codes: 0 shown, 2 usage or environment error (no such device, unreadable
or truncated config space, e.g. read without root).
"""
import json
import os

from edgetune import ansible_setup
from edgetune.errors import UsageError

HEADER = ("DEVICE", "PORT TYPE", "CAPABILITY", "VC", "ID", "ENABLED", "TC/VC MAP", "TCS", "NEGOTIATION")


def load_parser():
    """The project's plugins/module_utils/device/edge_pcie.py (one implementation for the module and this tool)."""
    return ansible_setup.module_utils("device.edge_pcie")


def tc_list(tcs):
    """[0, 1, 2, 3, 5] -> '0-3,5' (the CPU lists' compact form, plugins/module_utils/common/edge_cpulist.py)."""
    return ansible_setup.module_utils("common.edge_cpulist").format_cpulist(tcs) or "-"


def describe(pcie, label, data, source):
    """One device's entry for the report; a bad image becomes an entry with an error."""
    entry = {"bdf": label, "source": source, "error": None, "vc_capabilities": [], "problems": []}
    try:
        parsed = pcie.parse(data, source)
    except pcie.ConfigSpaceError as exc:
        entry["error"] = str(exc)
        return entry
    header = parsed["header"]
    entry.update({
        "vendor": "0x%04x" % header["vendor"],
        "device": "0x%04x" % header["device"],
        "class": "0x%06x" % header["class"],
        "port_type": parsed["pcie"]["port_type_name"] if parsed["pcie"] else None,
        "config_size": parsed["size"],
        "problems": parsed["problems"],
    })
    for vc in parsed["vc_capabilities"]:
        entry["vc_capabilities"].append({
            "offset": vc["offset"],
            "type": vc["type"],
            "version": vc["version"],
            "extended_vc_count": vc["extended_vc_count"],
            "vcs": [{"index": res["index"], "id": res["id"], "tc_map": res["tc_map"], "tcs": res["tcs"],
                     "enabled": res["enabled"], "negotiation_pending": res["negotiation_pending"]}
                    for res in vc["vcs"]],
        })
    return entry


def read_file(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise UsageError("cannot read %s: %s" % (path, exc.strerror or exc)) from None


def collect(pcie, bdf=None, config=None, sysfs_root="/"):
    """The report's device entries, from a file or from sysfs."""
    if config:
        return [describe(pcie, bdf or os.path.basename(config), read_file(config), config)]
    present = pcie.list_devices(sysfs_root)
    if bdf:
        try:
            bdf = pcie.normalize_bdf(bdf)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if bdf not in present:
            raise UsageError("PCI device %s not found under %s; present: %s"
                             % (bdf, pcie.devices_dir(sysfs_root), " ".join(present) or "none"))
        wanted = [bdf]
    else:
        wanted = present
        if not wanted:
            raise UsageError("no PCI devices under %s" % pcie.devices_dir(sysfs_root))
    entries = []
    for name in wanted:
        path = os.path.join(pcie.device_path(sysfs_root, name), "config")
        try:
            data = pcie.read_config(path)
        except OSError as exc:
            entries.append({"bdf": name, "source": path, "error": "cannot read %s: %s" % (path, exc.strerror or exc),
                            "vc_capabilities": [], "problems": []})
            continue
        entries.append(describe(pcie, name, data, path))
    return entries


def table(entries):
    rows = [HEADER]
    for entry in entries:
        if entry["error"]:
            rows.append((entry["bdf"], "error: " + entry["error"]))
            continue
        first = [entry["bdf"], entry["port_type"] or "conventional PCI"]
        if not entry["vc_capabilities"]:
            rows.append(tuple(first + ["-", "no Virtual Channel capability (VC0 only)"]))
        for vc in entry["vc_capabilities"]:
            for res in vc["vcs"]:
                cap = "%s@0x%03x" % (vc["type"], vc["offset"]) if res["index"] == 0 else ""
                rows.append(tuple(first + [cap, "VC%d" % res["index"], str(res["id"]),
                                           "yes" if res["enabled"] else "no", "0x%02x" % res["tc_map"],
                                           tc_list(res["tcs"]),
                                           "pending" if res["negotiation_pending"] else "done"]))
                first = ["", ""]
        for problem in entry["problems"]:
            rows.append(("", "warning: " + problem))
    widths = [0] * len(HEADER)
    for row in rows:
        sized = row if len(row) == len(HEADER) else row[:-1]
        for i, cell in enumerate(sized):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in rows:
        if len(row) == len(HEADER):
            lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        else:
            lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths)) + row[-1])
    return "\n".join(lines)


def cmd_show(args):
    pcie = load_parser()
    entries = collect(pcie, args.bdf, args.config, args.sysfs_root)
    if args.json:
        print(json.dumps({"devices": entries}, indent=2))
    else:
        print(table(entries))
    errors = [entry for entry in entries if entry["error"]]
    if errors:
        if not args.json:
            hint = " (run as root: Linux gives other users only 64 bytes)" if any(
                "64 bytes" in entry["error"] for entry in errors) else ""
            raise UsageError("%d device(s) could not be decoded%s" % (len(errors), hint))
        return 2
    return 0


def add_parser(subparsers):
    pcie = subparsers.add_parser("pcie", help="PCIe virtual channels (TC/VC mapping) of devices")
    sub = pcie.add_subparsers(dest="pcie_command", required=True)
    p = sub.add_parser("show", help="decode the Virtual Channel capabilities of PCI devices")
    p.add_argument("bdf", nargs="?", help="one device, e.g. 0001:01:00.0 (default: every device)")
    p.add_argument("--config", metavar="FILE", help="a saved config space image (binary) instead of sysfs")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--sysfs-root", default="/", help="prefix for /sys (default /)")
    p.set_defaults(func=cmd_show)
