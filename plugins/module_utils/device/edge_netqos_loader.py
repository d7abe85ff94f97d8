# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""edgetune-netqos: put inference traffic into a high-priority HTB class with an eBPF classifier.

Runs on the device with the system Python (3.8+) and the distribution's
python3-bpfcc and python3-pyroute2. It is part of edgetune's device package:
role edge_package installs it with what it imports (edge_package.DEVICE_PROGRAMS)
in the collection's package layout, and the command
/usr/local/sbin/edgetune-netqos (``launcher()``, role edge_netqos) runs it from there.
`edgetune bpf ...` (tools/edgetune/bpf.py) calls into it, or runs it with
``command()``; no module imports it.

  edgetune-netqos apply  --interface eth0 --rate 100mbit --ports 8000,50051 [--cgroup ai-infer.slice]
  edgetune-netqos apply  --config /etc/edgetune/netqos.json [--interface eth0]
  edgetune-netqos status [--interface eth0] [--json]
  edgetune-netqos check  --config FILE|- [--json]        exit 1 when the live state differs
  edgetune-netqos detach --interface eth0 | --config FILE

On each interface: root qdisc HTB 1: with class 1:1 (the link rate), a
high-priority leaf (default 1:10, prio 0) and a default leaf (default 1:20,
prio 1; the HTB default), both allowed to borrow up to the link rate; a
clsact qdisc; and bpf/edge_classifier.c attached to clsact egress in
direct-action mode. The program sets skb->priority to the high class id for
packets to or from the configured TCP/UDP ports and for packets of sockets in
the configured cgroup v2; htb_classify() takes a leaf class id found in
skb->priority. See bpf/README.md.

Exit codes: 0 done / in sync, 1 check found differences, 2 usage or
environment error (one line on stderr; nothing was changed, or the message
says exactly what remains).
"""
import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_slice
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

MAX_PORTS = 16
ROOT_HANDLE = 0x10000          # 1:
PARENT_CLASS = 0x10001         # 1:1
TC_H_ROOT = 0xFFFFFFFF
CLSACT_HANDLE = 0xFFFF0000
CLSACT_INGRESS = 0xFFFFFFF2
CLSACT_EGRESS = 0xFFFFFFF3
FILTER_PREF = 49
FILTER_HANDLE = 1
FILTER_PREFIX = "edgetune-netqos:"
PROG_FUNC = "edge_classify"
PORTS_MAP = "edge_ports"
CONFIG_MAP = "edge_config"
MAX_BYTES_PER_SEC = 0xFFFFFFFF  # HTB's 32-bit rate field (about 34 Gbit/s)
DEFAULTS = {
    "rate": None,
    "high_rate": "20%",
    "default_rate": "rest",
    "high_ceil": "100%",
    "default_ceil": "100%",
    "high_class": "1:10",
    "default_class": "1:20",
    "ports": [],
    "cgroup": "",
}
SETTING_KEYS = tuple(DEFAULTS)
SOURCE_CANDIDATES = (
    "/usr/local/share/edgetune/bpf/edge_classifier.c",
    # In a checkout: plugins/module_utils/device/ -> the collection's bpf/.
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir, "bpf",
                 "edge_classifier.c"),
)
# Link types (include/uapi/linux/if_arp.h) -> bytes before the IP header at clsact egress.
L2_LEN = {1: 14, 772: 14, 65534: 0, 512: 0, 519: 0}  # ether, loopback, none (wg/tun), ppp, rawip
# Test hook: raise after the named step of apply, to prove the rollback.
FAULT_ENV = "EDGETUNE_NETQOS_FAULT"


class NetQosError(EdgeError):
    """One line saying what is wrong and what to do."""


# The loader's file in the collection: the entry of the device program "netqos" (edge_package.DEVICE_PROGRAMS).
PROGRAM = "plugins/module_utils/device/edge_netqos_loader.py"
# Runs the loader from a directory that holds the collection's package layout (the device package
# role edge_package installs, or a controller's collections path), with the arguments that follow.
_RUN_LINES = ("import sys",
              "sys.path.insert(0, %r)",
              "from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_netqos_loader import main",
              "sys.exit(main())")


def command(python, root):
    """The argv that runs the loader with ``python`` from ``root`` (its arguments follow)."""
    return [python, "-c", "; ".join(_RUN_LINES) % root]


def launcher(python, root):
    """The text of the edgetune-netqos command: the loader of the device package in ``root``."""
    return "#!%s\n# edgetune-netqos (role edge_netqos): the network priority loader installed in %s\n%s\n" % (
        python, root, "\n".join(_RUN_LINES) % root)


def collections_root():
    """The sys.path entry this loader was imported from by its collection name."""
    path = os.path.abspath(__file__)
    for _part in __name__.split("."):
        path = os.path.dirname(path)
    return path


# ---------------------------------------------------------------- parsing

_RATE_UNITS = {
    "bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9, "tbit": 10 ** 12,
    "kibit": 2 ** 10, "mibit": 2 ** 20, "gibit": 2 ** 30, "tibit": 2 ** 40,
    "bps": 8, "kbps": 8 * 10 ** 3, "mbps": 8 * 10 ** 6, "gbps": 8 * 10 ** 9, "tbps": 8 * 10 ** 12,
    "kibps": 8 * 2 ** 10, "mibps": 8 * 2 ** 20, "gibps": 8 * 2 ** 30, "tibps": 8 * 2 ** 40,
}


def parse_ports(value):
    """A port list -> sorted unique ports. Accepts "8000,50051,9000-9002", or a
    list of ints / such strings. At most MAX_PORTS ports, each 1..65535."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    ports = set()
    for item in items:
        if isinstance(item, bool):
            raise NetQosError("invalid port %r: not a number" % (item,))
        if isinstance(item, int):
            parts = [str(item)]
        elif isinstance(item, str):
            parts = [p.strip() for p in item.split(",")]
            if item.strip() == "":
                continue
        else:
            raise NetQosError("invalid port %r: give numbers or a list like 8000,50051,9000-9002" % (item,))
        for part in parts:
            match = re.match(r"^(\d+)(?:-(\d+))?$", part)
            if not match:
                raise NetQosError("invalid port %r: give numbers or a list like 8000,50051,9000-9002" % part)
            low = int(match.group(1))
            high = int(match.group(2)) if match.group(2) else low
            for number in (low, high):
                if not 1 <= number <= 65535:
                    raise NetQosError("invalid port %d: ports are 1..65535" % number)
            if high < low:
                raise NetQosError("invalid port range %s: the end is below the start" % part)
            if high - low >= MAX_PORTS:
                raise NetQosError("port range %s has more than %d ports" % (part, MAX_PORTS))
            ports.update(range(low, high + 1))
    if len(ports) > MAX_PORTS:
        raise NetQosError("%d ports given; the classifier's map holds at most %d" % (len(ports), MAX_PORTS))
    return sorted(ports)


def parse_rate(value, total=None, what="rate"):
    """A tc-style rate ("100mbit", "12.5mbps", bare number = bit/s) or, with
    total (bytes/s), a percentage of it ("20%") -> bytes per second (int)."""
    if isinstance(value, bool) or value is None:
        raise NetQosError("%s is missing or not a rate: %r (e.g. 100mbit)" % (what, value))
    if isinstance(value, (int, float)):
        bits = float(value)
    else:
        text = str(value).strip().lower()
        match = re.match(r"^(\d+(?:\.\d+)?)\s*(%|[a-z]*)$", text)
        if not match:
            raise NetQosError("%s %r is not a rate: use e.g. 100mbit, 800kbit, 12mbps or a percentage" % (what, value))
        number, unit = float(match.group(1)), match.group(2)
        if unit == "%":
            if total is None:
                raise NetQosError("%s %r: a percentage needs the link rate (rate)" % (what, value))
            if not 0 < number <= 100:
                raise NetQosError("%s %r: a percentage must be above 0 and at most 100" % (what, value))
            return max(1, int(total * number / 100))
        if unit not in _RATE_UNITS and unit != "":
            raise NetQosError("%s %r: unknown unit %r (bit, kbit, mbit, gbit, bps, kbps, mbps, ...)"
                              % (what, value, unit))
        bits = number * _RATE_UNITS.get(unit, 1)
    rate = int(bits // 8)
    if rate <= 0:
        raise NetQosError("%s %r is zero; give a positive rate such as 100mbit" % (what, value))
    if rate > MAX_BYTES_PER_SEC:
        raise NetQosError("%s %r is above HTB's 32-bit limit (about 34gbit)" % (what, value))
    return rate


def format_rate(bytes_per_sec):
    bits = bytes_per_sec * 8
    for unit, size in (("gbit", 10 ** 9), ("mbit", 10 ** 6), ("kbit", 10 ** 3)):
        if bits >= size and bits % size == 0:
            return "%d%s" % (bits // size, unit)
    for unit, size in (("gbit", 10 ** 9), ("mbit", 10 ** 6), ("kbit", 10 ** 3)):
        if bits >= size:
            return "%.6g%s" % (bits / size, unit)
    return "%dbit" % bits


def parse_classid(value, what="class"):
    """tc notation (hex, as tc reads it): "1:10" -> 0x00010010. The major must
    be 1 (the HTB root is 1:); minor 1 is the parent class."""
    text = str(value).strip().lower()
    match = re.match(r"^([0-9a-f]{1,4}):([0-9a-f]{1,4})$", text)
    if not match:
        raise NetQosError("%s %r is not a class id like 1:10 (hexadecimal, as tc writes it)" % (what, value))
    major, minor = int(match.group(1), 16), int(match.group(2), 16)
    if major != 1:
        raise NetQosError("%s %s: the HTB root is 1:, so the class must be 1:<minor>" % (what, text))
    if minor in (0, 1):
        raise NetQosError("%s %s: 1:0 is the qdisc and 1:1 the parent class; use another minor" % (what, text))
    return (major << 16) | minor


def format_classid(classid):
    return "%x:%x" % (classid >> 16, classid & 0xFFFF)


def format_handle(handle):
    """A qdisc handle as tc prints it: 1: (a class id keeps its minor)."""
    return "%x:" % (handle >> 16) if handle & 0xFFFF == 0 else format_classid(handle)


def slice_path(name):
    """Where systemd puts a slice: "ai-infer.slice" is the cgroup ai.slice/ai-infer.slice."""
    try:
        path = edge_slice.slice_cgroup(name).lstrip("/")
    except ValueError:
        path = ""
    if not path:  # not a slice name, or the root slice
        raise NetQosError("cgroup %r is not a slice name systemd would nest" % name)
    return path


def normalize_cgroup(value, mount=None):
    """A cgroup v2 path relative to the v2 root ("edge.slice/inference",
    "/system.slice/foo.service"); an absolute path under the v2 mount is cut
    to that. A bare systemd slice name (no "/") is expanded the way systemd
    nests slices: "ai-infer.slice" -> "ai.slice/ai-infer.slice". Returns ""
    for none."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise NetQosError("cgroup %r is not a path" % (value,))
    text = value.strip()
    if text.endswith(".slice") and "/" not in text:
        return slice_path(text)
    if mount and (text == mount or text.startswith(mount.rstrip("/") + "/")):
        text = text[len(mount.rstrip("/")):]
    parts = [p for p in text.split("/") if p]
    for part in parts:
        if part in (".", ".."):
            raise NetQosError("cgroup %r: '.' and '..' are not allowed" % value)
    return "/".join(parts)


def load_config(path):
    """The JSON config file (or "-" for stdin): top-level settings and an
    "interfaces" mapping of name -> per-interface overrides."""
    try:
        if path == "-":
            data = json.load(sys.stdin)
        else:
            with open(path) as handle:
                data = json.load(handle)
    except OSError as exc:
        raise NetQosError("cannot read the config %s: %s" % (path, exc.strerror or exc)) from None
    except ValueError as exc:
        raise NetQosError("the config %s is not valid JSON: %s" % (path, exc)) from None
    if not isinstance(data, dict):
        raise NetQosError("the config %s must be a JSON object" % path)
    unknown = sorted(set(data) - set(SETTING_KEYS) - {"interfaces", "version", "managed_by"})
    if unknown:
        raise NetQosError("the config %s has unknown keys: %s" % (path, ", ".join(unknown)))
    interfaces = data.get("interfaces", {})
    if isinstance(interfaces, list):
        interfaces = dict((name, {}) for name in interfaces)
    if not isinstance(interfaces, dict):
        raise NetQosError("the config %s: interfaces must be an object of name -> settings" % path)
    for name, overrides in interfaces.items():
        if not isinstance(overrides, dict):
            raise NetQosError("the config %s: interface %s must map to an object" % (path, name))
        unknown = sorted(set(overrides) - set(SETTING_KEYS))
        if unknown:
            raise NetQosError("the config %s: interface %s has unknown keys: %s" % (path, name, ", ".join(unknown)))
    data["interfaces"] = interfaces
    return data


def resolve(ifname, config=None, overrides=None, mount=None):
    """Settings for one interface: defaults <- config top level <- the
    config's entry for the interface <- command-line overrides. Validated;
    rates in bytes/s, classes as ints."""
    if not ifname or not re.match(r"^[^/\s:]{1,15}$", ifname):
        raise NetQosError("invalid interface name %r" % (ifname,))
    raw = dict(DEFAULTS)
    config = config or {}
    for key in SETTING_KEYS:
        if key in config:
            raw[key] = config[key]
    raw.update((config.get("interfaces") or {}).get(ifname, {}))
    for key, value in (overrides or {}).items():
        if value is not None:
            raw[key] = value
    where = "interface %s: " % ifname
    try:
        rate = parse_rate(raw["rate"], what="rate")
        high_rate = parse_rate(raw["high_rate"], rate, what="high_rate")
        if str(raw["default_rate"]).strip().lower() == "rest":
            default_rate = rate - high_rate
            if default_rate <= 0:
                raise NetQosError("high_rate takes the whole link rate; leave some for the default class")
        else:
            default_rate = parse_rate(raw["default_rate"], rate, what="default_rate")
        if high_rate + default_rate > rate:
            raise NetQosError("high_rate %s + default_rate %s exceed the link rate %s"
                              % (format_rate(high_rate), format_rate(default_rate), format_rate(rate)))
        high_ceil = parse_rate(raw["high_ceil"], rate, what="high_ceil")
        default_ceil = parse_rate(raw["default_ceil"], rate, what="default_ceil")
        for name, ceil, floor in (("high", high_ceil, high_rate), ("default", default_ceil, default_rate)):
            if not floor <= ceil <= rate:
                raise NetQosError("%s_ceil %s must lie between the class rate %s and the link rate %s"
                                  % (name, format_rate(ceil), format_rate(floor), format_rate(rate)))
        high_class = parse_classid(raw["high_class"], "high_class")
        default_class = parse_classid(raw["default_class"], "default_class")
        if high_class == default_class:
            raise NetQosError("high_class and default_class are both %s" % format_classid(high_class))
        ports = parse_ports(raw["ports"])
        cgroup = normalize_cgroup(raw["cgroup"], mount)
    except NetQosError as exc:
        raise NetQosError(where + str(exc)) from None
    if not ports and not cgroup:
        raise NetQosError(where + "nothing to classify: give ports and/or a cgroup")
    return {"interface": ifname, "rate": rate, "high_rate": high_rate, "default_rate": default_rate,
            "high_ceil": high_ceil, "default_ceil": default_ceil,
            "high_class": high_class, "default_class": default_class, "ports": ports, "cgroup": cgroup}


# ------------------------------------------------------------ bpf syscall

class BpfSys(object):
    """The few bpf(2) commands the loader needs to read and write the maps of
    an attached program by id (stdlib only, through ctypes)."""

    MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_DELETE_ELEM, MAP_GET_NEXT_KEY = 1, 2, 3, 4
    PROG_GET_FD_BY_ID, MAP_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD = 13, 14, 15
    NR = {"x86_64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280, "armv7l": 386, "armv8l": 386,
          "i686": 357, "i386": 357}

    def __init__(self):
        machine = os.uname().machine
        if machine not in self.NR:
            raise NetQosError("the bpf syscall number for %s is not known to this loader" % machine)
        self.nr = self.NR[machine]
        self.libc = ctypes.CDLL(None, use_errno=True)

    def call(self, cmd, attr):
        buf = ctypes.create_string_buffer(bytes(attr), len(attr))
        ret = self.libc.syscall(ctypes.c_long(self.nr), ctypes.c_int(cmd), buf, ctypes.c_uint(len(attr)))
        if ret < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ret, buf

    def fd_by_id(self, kind, obj_id):
        cmd = self.PROG_GET_FD_BY_ID if kind == "prog" else self.MAP_GET_FD_BY_ID
        fd, _buf = self.call(cmd, struct.pack("=III", obj_id, 0, 0))
        return fd

    def _info(self, fd, size, prefill=b""):
        info = ctypes.create_string_buffer(prefill.ljust(size, b"\0"), size)
        self.call(self.OBJ_GET_INFO_BY_FD, struct.pack("=IIQ", fd, size, ctypes.addressof(info)))
        return info.raw

    def prog_map_ids(self, prog_id):
        fd = self.fd_by_id("prog", prog_id)
        try:
            ids = (ctypes.c_uint32 * 16)()
            # struct bpf_prog_info: nr_map_ids at 52, map_ids (u64 pointer) at 56
            prefill = b"\0" * 52 + struct.pack("=IQ", 16, ctypes.addressof(ids))
            raw = self._info(fd, 80, prefill)
            count = struct.unpack_from("=I", raw, 52)[0]
            return list(ids[:min(count, 16)])
        finally:
            os.close(fd)

    def map_info(self, fd):
        # struct bpf_map_info: type, id, key_size, value_size, max_entries, map_flags, name[16]
        raw = self._info(fd, 40)
        mtype, mid, key_size, value_size, max_entries, _flags = struct.unpack_from("=IIIIII", raw, 0)
        name = raw[24:40].split(b"\0", 1)[0].decode("ascii", "replace")
        return {"type": mtype, "id": mid, "key_size": key_size, "value_size": value_size,
                "max_entries": max_entries, "name": name}

    def _elem(self, cmd, fd, key, value=None, flags=0):
        key_buf = ctypes.create_string_buffer(key, len(key)) if key is not None else None
        attr = struct.pack("=IIQQQ", fd, 0, ctypes.addressof(key_buf) if key_buf is not None else 0,
                           ctypes.addressof(value) if value is not None else 0, flags)
        self.call(cmd, attr)

    def lookup(self, fd, key, value_size):
        value = ctypes.create_string_buffer(value_size)
        try:
            self._elem(self.MAP_LOOKUP_ELEM, fd, key, value)
        except OSError as exc:
            if exc.errno == 2:
                return None
            raise
        return value.raw

    def keys(self, fd, key_size, limit=1024):
        result, key = [], None
        for _attempt in range(limit):
            nxt = ctypes.create_string_buffer(key_size)
            try:
                self._elem(self.MAP_GET_NEXT_KEY, fd, key, nxt)
            except OSError as exc:
                if exc.errno == 2:
                    break
                raise
            key = nxt.raw
            result.append(key)
        return result

    def update(self, fd, key, value):
        self._elem(self.MAP_UPDATE_ELEM, fd, key, ctypes.create_string_buffer(value, len(value)))

    def delete(self, fd, key):
        self._elem(self.MAP_DELETE_ELEM, fd, key)


def audit_checks(status, result, interfaces, loader, python, source, config_file, persist):
    """Role edge_netqos's checks for the drift audit: each interface's live qdiscs, classes and classifier
    as the loader compares them with the settings the module built (``result["config"]``; not with the
    device's config file, which an edit could change), and that file where the boot unit applies it
    (``persist``). ``status`` "unsupported: WHY": one unsupported check with the reason; no settings
    built (a check run with packages still to install): nothing to check yet."""
    if status.startswith("unsupported"):
        reason = status[len("unsupported: "):] if status.startswith("unsupported: ") else status
        return [{"setting": "network priority", "role": "edge_netqos", "kind": "unsupported", "reason": reason}]
    if not result or result.get("config_sha1") is None:
        return []
    checks = [{"setting": "network priority", "role": "edge_netqos", "kind": "netqos", "config": result["config"],
               "interfaces": list(interfaces), "loader": loader, "python": python, "source": source}]
    if persist:
        checks.append({"setting": "network priority config", "role": "edge_netqos", "kind": "file",
                       "path": config_file, "sha1": result["config_sha1"]})
    return checks


def _port_key(port):
    return struct.pack("!H", port)


def _config_value(cgroup):
    if not cgroup:
        return struct.pack("=QII", 0, 0, 0)
    return struct.pack("=QII", cgroup["id"], cgroup["level"], cgroup["classid"])


def open_prog_maps(bpfsys, prog_id):
    """{map name: (fd, info)} of the program's maps; the caller closes the fds."""
    maps = {}
    for map_id in bpfsys.prog_map_ids(prog_id):
        fd = bpfsys.fd_by_id("map", map_id)
        info = bpfsys.map_info(fd)
        if info["name"] in (PORTS_MAP, CONFIG_MAP) and info["name"] not in maps:
            maps[info["name"]] = (fd, info)
        else:
            os.close(fd)
    return maps


def read_prog_maps(bpfsys, prog_id):
    """The classifier's live map contents: {"ports": {port: classid}, "cgroup": {...} or None}."""
    maps = open_prog_maps(bpfsys, prog_id)
    try:
        if PORTS_MAP not in maps:
            raise NetQosError("program id %d has no %s map; it is not edge_classifier" % (prog_id, PORTS_MAP))
        fd, info = maps[PORTS_MAP]
        ports = {}
        for key in bpfsys.keys(fd, info["key_size"]):
            value = bpfsys.lookup(fd, key, info["value_size"])
            if value is not None:
                ports[struct.unpack("!H", key)[0]] = struct.unpack("=I", value[:4])[0]
        cgroup = None
        # A build without EDGE_MATCH_CGROUP does not reference the config map.
        value = None
        if CONFIG_MAP in maps:
            fd, info = maps[CONFIG_MAP]
            value = bpfsys.lookup(fd, struct.pack("=I", 0), info["value_size"])
        if value is not None:
            cg_id, level, classid = struct.unpack("=QII", value[:16])
            if cg_id:
                cgroup = {"id": cg_id, "level": level, "classid": classid}
        return {"ports": ports, "cgroup": cgroup}
    finally:
        for fd, _info in maps.values():
            os.close(fd)


def write_prog_maps(bpfsys, maps, desired):
    """Make the maps hold exactly desired["ports"] and desired["cgroup"].
    maps: {name: (fd, info)}."""
    fd, info = maps[PORTS_MAP]
    wanted = dict((_port_key(p), struct.pack("=I", c)) for p, c in desired["ports"].items())
    for key in bpfsys.keys(fd, info["key_size"]):
        if key not in wanted:
            bpfsys.delete(fd, key)
    for key, value in wanted.items():
        bpfsys.update(fd, key, value)
    if CONFIG_MAP in maps:
        fd, _info = maps[CONFIG_MAP]
        bpfsys.update(fd, struct.pack("=I", 0), _config_value(desired["cgroup"]))
    elif desired["cgroup"]:
        raise NetQosError("the attached program was built without cgroup matching")


# ------------------------------------------------------------- cgroup v2

def cgroup2_mount(mountinfo="/proc/self/mountinfo"):
    """Mount point of the cgroup v2 hierarchy (/sys/fs/cgroup when unified,
    /sys/fs/cgroup/unified when hybrid), or None."""
    try:
        with open(mountinfo) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        left, _sep, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            found.append(left.split()[4].replace("\\040", " "))
    for preferred in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if preferred in found:
            return preferred
    return found[0] if found else None


def cgroup_id(path):
    """The 64-bit cgroup id of a cgroup v2 directory: the file handle from
    name_to_handle_at(2) (as the bpf helper docs say), else the inode."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)

        class FileHandle(ctypes.Structure):
            _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                        ("f_handle", ctypes.c_ubyte * 8)]

        handle = FileHandle(8, 0)
        mount_id = ctypes.c_int(0)
        ret = libc.name_to_handle_at(-100, path.encode(), ctypes.byref(handle), ctypes.byref(mount_id), 0)
        if ret == 0 and handle.handle_bytes == 8:
            return struct.unpack("=Q", bytes(handle.f_handle))[0]
    except (AttributeError, OSError):
        pass
    return os.stat(path).st_ino


def systemd_cgroup_root(proc_cgroup="/proc/1/cgroup"):
    """The v2 cgroup systemd (PID 1) runs its tree in, relative to the v2 root: "" on a
    device, "docker/<id>" in a container that shares the host's cgroup tree, where
    ai.slice/ai-infer.slice is docker/<id>/ai.slice/ai-infer.slice."""
    try:
        with open(proc_cgroup) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        if line.startswith("0::"):
            path = line[3:].strip("/")
            head, _sep, tail = path.rpartition("/")
            return head if tail == "init.scope" else ""
    return ""


def resolve_cgroup(relpath, classid):
    """{"path", "dir", "id", "level", "classid"} for a cgroup v2 path relative to systemd's own
    cgroup (the v2 root on a device; below it in a container on the host's cgroup tree)."""
    mount = cgroup2_mount()
    if mount is None:
        raise NetQosError("no cgroup v2 hierarchy is mounted; matching cgroup %s needs one "
                          "(unified, or hybrid with /sys/fs/cgroup/unified)" % relpath)
    # Where systemd runs below the v2 root (a container on the host's cgroup tree, a twin), its
    # slices are below its own cgroup: a slice of that name at the root, or in another container,
    # is someone else's and never taken.
    below_systemd = systemd_cgroup_root()
    found = relpath
    if below_systemd and relpath != below_systemd and not relpath.startswith(below_systemd + "/"):
        found = "%s/%s" % (below_systemd, relpath)
    directory = os.path.join(mount, found)
    if not os.path.isdir(directory):
        raise NetQosError("cgroup v2 %s not found (%s); start it first (e.g. systemctl start %s) "
                          "or fix the cgroup setting" % (relpath, directory, relpath.split("/")[-1]))
    # bpf_skb_ancestor_cgroup_id() counts levels from the root of the whole hierarchy.
    return {"path": relpath, "dir": directory, "id": cgroup_id(directory), "level": len(found.split("/")),
            "classid": classid}


def find_cgroup_path(cg_id, level):
    """The path (relative to the v2 root) of the cgroup with this id at this depth, or None."""
    mount = cgroup2_mount()
    if mount is None or level < 1:
        return None
    frontier = [""]
    for _level in range(level):
        nxt = []
        for rel in frontier:
            try:
                entries = os.scandir(os.path.join(mount, rel))
            except OSError:
                continue
            with entries:
                nxt.extend(os.path.join(rel, e.name) for e in entries if e.is_dir(follow_symlinks=False))
        frontier = nxt
        if len(frontier) > 5000:
            return None
    for rel in frontier:
        try:
            if cgroup_id(os.path.join(mount, rel)) == cg_id:
                return rel
        except OSError:
            continue
    return None


# ---------------------------------------------------------- live state

def _ipr():
    try:
        from pyroute2 import IPRoute
    except ImportError:
        raise NetQosError("pyroute2 is not installed for %s: install python3-pyroute2" % sys.executable) from None
    return IPRoute()


def _attr(msg, name, default=None):
    value = msg.get_attr(name)
    return default if value is None else value


def link_index(ipr, ifname):
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        names = sorted(_attr(link, "IFLA_IFNAME", "?") for link in ipr.get_links())
        raise NetQosError("interface %s not found (present: %s)" % (ifname, " ".join(names)))
    return found[0]


def link_l2_len(ipr, index, ifname):
    link_type = ipr.get_links(index)[0]["ifi_type"]
    if link_type not in L2_LEN:
        raise NetQosError("interface %s has link type %d; the classifier handles Ethernet-like and "
                          "L3 (none, ppp, rawip) devices" % (ifname, link_type))
    return L2_LEN[link_type]


def tc_filters(ifname, hook):
    """Filters of a clsact hook ("egress"/"ingress") as `tc -j` shows them."""
    try:
        result = subprocess.run(["tc", "-j", "filter", "show", "dev", ifname, hook], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, universal_newlines=True, check=False)
    except OSError as exc:
        raise NetQosError("cannot run tc (install iproute2): %s" % exc) from None
    if result.returncode != 0:
        if "Cannot find specified qdisc" in result.stderr or not result.stderr.strip():
            return []
        raise NetQosError("tc filter show dev %s %s failed: %s" % (ifname, hook, result.stderr.strip()))
    try:
        rows = json.loads(result.stdout or "[]")
    except ValueError:
        raise NetQosError("tc -j filter show printed no JSON; iproute2 is too old") from None
    return [row for row in rows if "options" in row]


def read_live(ifname, with_maps=True):
    """What the kernel has on the interface: root qdisc, HTB classes with
    counters, clsact, our filter(s) with program id/tag and map contents."""
    ipr = _ipr()
    try:
        index = link_index(ipr, ifname)
        live = {"interface": ifname, "index": index, "root": None, "clsact": False, "classes": {},
                "leaves": {}, "filters": [], "foreign_filters": 0}
        inner = {}
        for qdisc in ipr.get_qdiscs(index=index):
            kind = _attr(qdisc, "TCA_KIND")
            if qdisc["parent"] == TC_H_ROOT:
                root = {"kind": kind, "handle": qdisc["handle"]}
                if kind == "htb":
                    init = dict(_attr(qdisc, "TCA_OPTIONS", {}).get("attrs", []))
                    root["default"] = (init.get("TCA_HTB_INIT") or {}).get("defcls")
                live["root"] = root
            elif kind == "clsact":
                live["clsact"] = True
            elif kind != "ingress":
                inner[qdisc["parent"]] = {"kind": kind, "handle": qdisc["handle"]}
        if live["root"] and live["root"]["kind"] == "htb":
            for cls in ipr.get_classes(index=index):
                if _attr(cls, "TCA_KIND") != "htb":
                    continue
                opts = dict(_attr(cls, "TCA_OPTIONS", {}).get("attrs", []))
                parms = opts.get("TCA_HTB_PARMS") or {}
                stats = dict(_attr(cls, "TCA_STATS2", {}).get("attrs", []))
                basic = stats.get("TCA_STATS_BASIC") or {}
                queue = stats.get("TCA_STATS_QUEUE") or {}
                live["classes"][cls["handle"]] = {
                    "parent": cls["parent"], "rate": parms.get("rate"), "ceil": parms.get("ceil"),
                    "prio": parms.get("prio"), "leaf": parms.get("level") == 0,
                    "bytes": basic.get("bytes", 0), "packets": basic.get("packets", 0),
                    "drops": queue.get("drops", 0), "backlog": queue.get("backlog", 0)}
            # A queue someone put behind a class (HTB's own leaf queue is not listed).
            live["leaves"] = dict((classid, qdisc) for classid, qdisc in inner.items() if classid in live["classes"])
        if live["clsact"]:
            for hook in ("egress", "ingress"):
                for row in tc_filters(ifname, hook):
                    opts = row.get("options") or {}
                    name = opts.get("bpf_name") or ""
                    if hook == "egress" and row.get("kind") == "bpf" and name.startswith(FILTER_PREFIX):
                        prog = opts.get("prog") or {}
                        live["filters"].append({
                            "pref": row.get("pref"), "handle": int(str(opts.get("handle", "0")), 0),
                            "name": name, "direct_action": bool(opts.get("direct-action")),
                            "prog_id": prog.get("id"), "prog_name": prog.get("name"), "tag": prog.get("tag"),
                            "jited": prog.get("jited")})
                    else:
                        live["foreign_filters"] += 1
        if with_maps:
            bpfsys = None
            for flt in live["filters"]:
                if flt["prog_id"]:
                    bpfsys = bpfsys or BpfSys()
                    try:
                        flt["maps"] = read_prog_maps(bpfsys, flt["prog_id"])
                    except OSError as exc:
                        raise NetQosError("reading the maps of program %d failed: %s"
                                          % (flt["prog_id"], exc.strerror)) from None
        return live
    finally:
        ipr.close()


# ------------------------------------------------------ desired vs live

def read_source(path=None):
    candidates = [path] if path else list(SOURCE_CANDIDATES)
    for candidate in candidates:
        try:
            with open(candidate) as handle:
                return os.path.realpath(candidate), handle.read()
        except OSError:
            continue
    raise NetQosError("classifier source not found (looked at %s); pass --source" % ", ".join(candidates))


def cflags_for(l2_len, match_cgroup):
    return ["-DEDGE_L2_LEN=%d" % l2_len, "-DEDGE_MAX_PORTS=%d" % MAX_PORTS,
            "-DEDGE_MATCH_CGROUP=%d" % (1 if match_cgroup else 0)]


def fingerprint(source_text, cflags):
    digest = hashlib.sha256(source_text.encode() + b"\0" + "\0".join(cflags).encode()).hexdigest()
    return FILTER_PREFIX + digest[:16]


def desired_state(settings, source_text, l2_len, cgroup=None):
    rate = settings["rate"]
    cflags = cflags_for(l2_len, bool(cgroup))
    return {
        "default_minor": settings["default_class"] & 0xFFFF,
        "classes": {
            PARENT_CLASS: {"parent": TC_H_ROOT, "rate": rate, "ceil": rate, "prio": 0, "leaf": False},
            settings["high_class"]: {"parent": PARENT_CLASS, "rate": settings["high_rate"],
                                     "ceil": settings["high_ceil"],
                                     "prio": 0, "leaf": True},
            settings["default_class"]: {"parent": PARENT_CLASS, "rate": settings["default_rate"],
                                        "ceil": settings["default_ceil"],
                                        "prio": 1, "leaf": True},
        },
        # Each leaf class queues in HTB's own FIFO, the only leaf queue the network bench could measure
        # (its host's kernel has no fq_codel, cake or fq); a queue put there by hand is drift.
        "leaves": {},
        "cflags": cflags,
        "filter_name": fingerprint(source_text, cflags),
        "ports": dict((port, settings["high_class"]) for port in settings["ports"]),
        "cgroup": ({"id": cgroup["id"], "level": cgroup["level"], "classid": cgroup["classid"]}
                   if cgroup else None),
    }


def compare(desired, live):
    """(plan, differences): what apply has to do, and one line per difference."""
    plan = {"root": "ok", "clsact": live["clsact"], "filter": "ok", "extra_filters": [], "maps": False,
            "leaves": []}
    diffs = []
    root = live["root"]
    if not root or root["kind"] != "htb" or root["handle"] != ROOT_HANDLE:
        if root and root["handle"] != 0:
            plan["root"] = "foreign"
            diffs.append("root qdisc is %s %s, not edgetune's htb 1:" % (root["kind"], format_handle(root["handle"])))
        else:
            plan["root"] = "create"
            diffs.append("root qdisc is %s, not htb 1:" % (root["kind"] if root else "none"))
    else:
        if root.get("default") != desired["default_minor"]:
            plan["root"] = "rebuild"
            diffs.append("htb default class is %x, want %x" % (root.get("default") or 0, desired["default_minor"]))
        if set(live["classes"]) != set(desired["classes"]):
            plan["root"] = "rebuild"
            diffs.append("htb classes are %s, want %s" % (
                " ".join(format_classid(c) for c in sorted(live["classes"])) or "none",
                " ".join(format_classid(c) for c in sorted(desired["classes"]))))
        else:
            for classid, want in sorted(desired["classes"].items()):
                have = live["classes"][classid]
                parent_ok = (have["parent"] in (TC_H_ROOT, ROOT_HANDLE)) if want["parent"] == TC_H_ROOT \
                    else have["parent"] == want["parent"]
                if not parent_ok or have["leaf"] != want["leaf"]:
                    plan["root"] = "rebuild"
                    diffs.append("class %s has the wrong parent" % format_classid(classid))
                    continue
                for key in ("rate", "ceil", "prio"):
                    if have[key] != want[key]:
                        if plan["root"] == "ok":
                            plan["root"] = "rates"
                        shown = format_rate if key != "prio" else str
                        diffs.append("class %s %s is %s, want %s" % (format_classid(classid), key,
                                                                     shown(have[key] or 0), shown(want[key])))
        if plan["root"] in ("ok", "rates"):
            for classid, queue in sorted(live.get("leaves", {}).items()):
                if queue["kind"] != desired["leaves"].get(classid, {}).get("kind"):
                    plan["leaves"].append((classid, queue))
                    diffs.append("class %s queues in %s %s, want HTB's own" % (
                        format_classid(classid), queue["kind"], format_handle(queue["handle"])))
    if not live["clsact"]:
        diffs.append("no clsact qdisc")
    ours = [f for f in live["filters"] if f["pref"] == FILTER_PREF and f["handle"] == FILTER_HANDLE]
    plan["extra_filters"] = [f for f in live["filters"] if f not in ours]
    if plan["extra_filters"]:
        diffs.append("%d stale edgetune filter(s) on egress" % len(plan["extra_filters"]))
    current = ours[0] if ours else None
    if current is None:
        plan["filter"] = "replace"
        diffs.append("no edge_classifier on clsact egress")
    elif current["name"] != desired["filter_name"] or not current["direct_action"]:
        plan["filter"] = "replace"
        diffs.append("egress program %s is %s, want %s" % (current.get("prog_id"), current["name"],
                                                           desired["filter_name"]))
    else:
        maps = current.get("maps")
        if maps is not None:
            if maps["ports"] != desired["ports"]:
                plan["maps"] = True
                diffs.append("ports map holds %s, want %s" % (_ports_text(maps["ports"]),
                                                              _ports_text(desired["ports"])))
            if maps["cgroup"] != desired["cgroup"]:
                plan["maps"] = True
                diffs.append("cgroup match is %s, want %s" % (_cgroup_text(maps["cgroup"]),
                                                              _cgroup_text(desired["cgroup"])))
    return plan, diffs


def _ports_text(ports):
    if not ports:
        return "none"
    return " ".join("%d->%s" % (p, format_classid(c)) for p, c in sorted(ports.items()))


def _cgroup_text(cgroup):
    if not cgroup:
        return "off"
    return "id %d level %d ->%s" % (cgroup["id"], cgroup["level"], format_classid(cgroup["classid"]))


# --------------------------------------------------------------- compile

def kernel_headers_present():
    release = os.uname().release
    return (os.path.isdir("/lib/modules/%s/build/include" % release)
            or os.path.exists("/sys/kernel/kheaders.tar.xz")
            or os.path.isdir("/lib/modules/%s/source/include" % release))


@contextlib.contextmanager
def _captured_stderr():
    """bcc's compiler writes diagnostics to fd 2; keep them for the error message."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        box = {"text": ""}
        try:
            yield box
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            box["text"] = tmp.read().decode("utf-8", "replace")


class Program(object):
    """The classifier compiled by bcc and loaded into the kernel (not attached)."""

    def __init__(self, source_path, source_text, cflags):
        try:
            from bcc import BPF
        except ImportError:
            raise NetQosError("bcc is not installed for %s: install python3-bpfcc (and the kernel headers)"
                              % sys.executable) from None
        if not kernel_headers_present():
            raise NetQosError("no kernel headers for %s at /lib/modules/%s/build (nor /sys/kernel/kheaders.tar.xz): "
                              "install the headers of the running kernel" % ((os.uname().release,) * 2))
        self.cflags = cflags
        with _captured_stderr() as log:
            try:
                self.bpf = BPF(text=source_text, cflags=cflags)
                self.fn = self.bpf.load_func(PROG_FUNC, BPF.SCHED_CLS)
            except Exception as exc:  # bcc raises plain Exception for compile and verifier errors
                self.error = exc
            else:
                self.error = None
        if self.error is not None:
            lines = [ln for ln in log["text"].splitlines() if "error" in ln.lower()] or log["text"].splitlines()
            raise NetQosError("compiling/loading %s failed: %s%s" % (
                source_path, self.error, (": " + lines[0].strip()) if lines else ""))
        self.maps = {PORTS_MAP: (self.bpf[PORTS_MAP].map_fd, {"key_size": 2, "value_size": 4}),
                     CONFIG_MAP: (self.bpf[CONFIG_MAP].map_fd, {"key_size": 4, "value_size": 16})}

    def close(self):
        self.bpf.cleanup()


# ----------------------------------------------------------------- apply

def _fault(step):
    if os.environ.get(FAULT_ENV) == step:
        raise NetQosError("injected failure after %s (%s)" % (step, FAULT_ENV))


def _htb_class(ipr, command, index, classid, want):
    # An explicit quantum inside the kernel's bounds (1000..200000 bytes) spares the
    # "quantum of class ... is big/small" warnings that rate/r2q gives on fast/slow links.
    ipr.tc(command, "htb", index, classid, parent=ROOT_HANDLE if want["parent"] == TC_H_ROOT else want["parent"],
           rate=want["rate"], ceil=want["ceil"], prio=want["prio"], quantum=max(1514, min(want["rate"] // 10, 200000)))


def _build_tree(ipr, index, desired, command):
    ipr.tc(command, "htb", index, ROOT_HANDLE, default=desired["default_minor"])
    for classid, want in sorted(desired["classes"].items()):
        _htb_class(ipr, "add-class", index, classid, want)


def _netlink_error(exc):
    code = getattr(exc, "code", None)
    return "%s%s" % (os.strerror(code) if isinstance(code, int) and code > 0 else exc,
                     " (is the kernel module missing? CONFIG_NET_SCH_HTB, CONFIG_NET_CLS_BPF, "
                     "CONFIG_NET_SCH_INGRESS)" if code in (2, 95) else "")


def apply_interface(settings, source=None, replace_root=False):
    """Bring one interface to the desired state; returns a report dict.
    Validates and compiles before touching anything; undoes its own changes
    when a later step fails."""
    ifname = settings["interface"]
    source_path, source_text = read_source(source)
    cgroup = resolve_cgroup(settings["cgroup"], settings["high_class"]) if settings["cgroup"] else None
    ipr = _ipr()
    try:
        index = link_index(ipr, ifname)
        l2_len = link_l2_len(ipr, index, ifname)
    finally:
        ipr.close()
    desired = desired_state(settings, source_text, l2_len, cgroup)
    live = read_live(ifname)
    plan, diffs = compare(desired, live)
    report = {"interface": ifname, "changed": bool(diffs), "differences": diffs, "actions": []}
    if not diffs:
        report["program"] = _program_summary(live)
        return report
    if plan["root"] == "foreign" and not replace_root:
        raise NetQosError("%s has root qdisc %s %s that edgetune did not make; nothing changed "
                          "(pass --replace-root to replace it)" % (ifname, live["root"]["kind"],
                                                                   format_handle(live["root"]["handle"])))
    program = None
    if plan["filter"] == "replace":
        program = Program(source_path, source_text, desired["cflags"])
    bpfsys = BpfSys()
    undo = []
    ipr = _ipr()
    try:
        index = live["index"]
        if program is not None:
            write_prog_maps(bpfsys, program.maps, desired)
        if plan["root"] in ("create", "foreign", "rebuild"):
            previous = live["root"]
            if plan["root"] == "rebuild":  # a replace of htb 1: by htb 1: would only change its options
                ipr.tc("del", "htb", index, ROOT_HANDLE, parent=TC_H_ROOT)
                previous = dict(previous, handle=0x10000, rebuilt=True)
            _build_tree(ipr, index, desired, "replace")
            note = ("the previous root qdisc %s %s is gone; the kernel default replaced it"
                    % (previous["kind"], format_handle(previous["handle"]))
                    if previous and previous["handle"] != 0 else None)
            if previous and previous.get("rebuilt"):
                note = "the previous htb 1: tree (which did not match) was removed; the kernel default replaced it"
            undo.append((lambda: ipr.tc("del", "htb", index, ROOT_HANDLE, parent=TC_H_ROOT), note))
            report["actions"].append("root qdisc htb 1: default 1:%x with classes %s" % (
                desired["default_minor"], " ".join(format_classid(c) for c in sorted(desired["classes"]))))
        elif plan["root"] == "rates":
            for classid, want in sorted(desired["classes"].items()):
                have = live["classes"][classid]
                if any(have[k] != want[k] for k in ("rate", "ceil", "prio")):
                    _htb_class(ipr, "change-class", index, classid, want)
                    old = dict(want, rate=have["rate"], ceil=have["ceil"], prio=have["prio"])
                    undo.append(((lambda c=classid, o=old: _htb_class(ipr, "change-class", index, c, o)), None))
                    report["actions"].append("class %s rate %s ceil %s prio %d" % (
                        format_classid(classid), format_rate(want["rate"]), format_rate(want["ceil"]), want["prio"]))
        for classid, queue in plan["leaves"]:
            ipr.tc("del", index=index, handle=queue["handle"], parent=classid)
            named = (queue["kind"], format_classid(classid))
            undo.append((lambda: None, "the %s queue behind class %s was removed" % named))
            report["actions"].append("class %s back to HTB's own queue (was %s)" % named[::-1])
        _fault("qdisc")
        if not live["clsact"]:
            ipr.tc("add", "clsact", index)
            undo.append((lambda: ipr.tc("del", "clsact", index), None))
            report["actions"].append("clsact qdisc")
        _fault("clsact")
        if program is not None:
            old = [f for f in live["filters"] if f not in plan["extra_filters"]]
            ipr.tc("replace-filter", "bpf", index, FILTER_HANDLE, fd=program.fn.fd, name=desired["filter_name"],
                   parent=CLSACT_EGRESS, classid=1, direct_action=True, prio=FILTER_PREF)
            if old and old[0]["prog_id"]:
                undo.append((lambda o=old[0]: _reattach(ipr, bpfsys, index, o),
                             "the previous program %s could not be put back" % old[0]["prog_id"]))
            else:
                undo.append((lambda: ipr.tc("del-filter", "bpf", index, FILTER_HANDLE, parent=CLSACT_EGRESS,
                                            prio=FILTER_PREF), None))
            report["actions"].append("program %s attached to clsact egress (direct-action)" % desired["filter_name"])
        _fault("filter")
        for stale in plan["extra_filters"]:
            ipr.tc("del-filter", "bpf", index, stale["handle"], parent=CLSACT_EGRESS, prio=stale["pref"])
            report["actions"].append("removed stale filter pref %s" % stale["pref"])
        if program is None and plan["maps"]:
            current = [f for f in live["filters"] if f not in plan["extra_filters"]][0]
            maps = open_prog_maps(bpfsys, current["prog_id"])
            try:
                write_prog_maps(bpfsys, maps, desired)
            finally:
                for fd, _info in maps.values():
                    os.close(fd)
            report["actions"].append("maps of program %s updated: ports %s, cgroup %s" % (
                current["prog_id"], _ports_text(desired["ports"]), _cgroup_text(desired["cgroup"])))
    except Exception as exc:
        message = str(exc) if isinstance(exc, NetQosError) else _netlink_error(exc)
        left = _rollback(undo)
        raise NetQosError("%s: applying failed (%s); %s" % (
            ifname, message, "previous qdisc state restored" if not left else "left behind: " + "; ".join(left))) \
            from None
    finally:
        ipr.close()
        if program is not None:
            program.close()
    after = read_live(ifname)
    _plan, remaining = compare(desired, after)
    if remaining:
        raise NetQosError("%s: read-back after apply still differs: %s" % (ifname, "; ".join(remaining)))
    report["program"] = _program_summary(after)
    return report


def _reattach(ipr, bpfsys, index, old):
    fd = bpfsys.fd_by_id("prog", old["prog_id"])
    try:
        ipr.tc("replace-filter", "bpf", index, FILTER_HANDLE, fd=fd, name=old["name"], parent=CLSACT_EGRESS,
               classid=1, direct_action=True, prio=FILTER_PREF)
    finally:
        os.close(fd)


def _rollback(undo):
    left = []
    for action, note in reversed(undo):
        try:
            action()
            if note:
                left.append(note)
        except Exception as exc:  # report every step that could not be undone
            left.append("undo failed (%s)%s" % (_netlink_error(exc), ": " + note if note else ""))
    return left


def _program_summary(live):
    ours = [f for f in live["filters"] if f["pref"] == FILTER_PREF]
    if not ours:
        return None
    flt = ours[0]
    return {"id": flt["prog_id"], "tag": flt["tag"], "name": flt["prog_name"], "filter": flt["name"],
            "pref": flt["pref"], "direct_action": flt["direct_action"]}


def detach_interface(ifname):
    """Remove edgetune's filter(s); the clsact qdisc when no other filter is
    left on it; the root qdisc when it is htb 1:. Returns a report."""
    live = read_live(ifname, with_maps=False)
    report = {"interface": ifname, "changed": False, "actions": []}
    ipr = _ipr()
    try:
        index = live["index"]
        for flt in live["filters"]:
            ipr.tc("del-filter", "bpf", index, flt["handle"], parent=CLSACT_EGRESS, prio=flt["pref"])
            report["actions"].append("removed filter %s (program %s)" % (flt["name"], flt["prog_id"]))
        if live["clsact"] and live["foreign_filters"] == 0:
            ipr.tc("del", "clsact", index)
            report["actions"].append("removed clsact")
        if live["root"] and live["root"]["kind"] == "htb" and live["root"]["handle"] == ROOT_HANDLE:
            ipr.tc("del", "htb", index, ROOT_HANDLE, parent=TC_H_ROOT)
            report["actions"].append("removed root htb 1:")
    except Exception as exc:
        raise NetQosError("%s: detach failed (%s) after: %s" % (
            ifname, _netlink_error(exc), "; ".join(report["actions"]) or "nothing")) from None
    finally:
        ipr.close()
    report["changed"] = bool(report["actions"])
    return report


# ---------------------------------------------------------------- status

def status_interface(ifname):
    live = read_live(ifname)
    classes = []
    for classid, cls in sorted(live["classes"].items()):
        classes.append({"class": format_classid(classid), "parent": format_classid(cls["parent"])
                        if cls["parent"] != TC_H_ROOT else "root", "rate": cls["rate"], "ceil": cls["ceil"],
                        "prio": cls["prio"], "bytes": cls["bytes"], "packets": cls["packets"],
                        "drops": cls["drops"], "queue": live["leaves"][classid]["kind"]
                        if classid in live["leaves"] else ("htb" if cls["leaf"] else None)})
    program = _program_summary(live)
    maps = None
    ours = [f for f in live["filters"] if f["pref"] == FILTER_PREF]
    if ours and ours[0].get("maps") is not None:
        maps = ours[0]["maps"]
        if maps["cgroup"]:
            maps["cgroup"]["path"] = find_cgroup_path(maps["cgroup"]["id"], maps["cgroup"]["level"])
    root = live["root"]
    return {"interface": ifname,
            "root": None if not root else {
                "kind": root["kind"], "handle": format_handle(root["handle"]),
                "default": None if root.get("default") is None else "%x:%x" % (root["handle"] >> 16, root["default"])},
            "clsact": live["clsact"], "program": program,
            "ports": None if maps is None else dict(
                (str(p), format_classid(c)) for p, c in sorted(maps["ports"].items())),
            "cgroup": None if maps is None or not maps["cgroup"] else dict(
                maps["cgroup"], classid=format_classid(maps["cgroup"]["classid"])),
            "classes": classes}


def _echo(text, stream=None):
    """One line of the command's output, on stdout unless ``stream`` is given."""
    (stream or sys.stdout).write(text + "\n")


def print_status(report):
    root = report["root"]
    _echo("%s: root %s%s, clsact %s" % (
        report["interface"], "%s %s" % (root["kind"], root["handle"]) if root else "none",
        (" default %s" % root["default"]) if root and root.get("default") is not None else "",
        "yes" if report["clsact"] else "no"))
    prog = report["program"]
    if prog:
        _echo("  program id %s tag %s (%s) on clsact egress pref %s%s, %s" % (
            prog["id"], prog["tag"], prog["name"], prog["pref"], " direct-action" if prog["direct_action"] else "",
            prog["filter"]))
        _echo("  ports: %s" % (" ".join("%s->%s" % kv for kv in report["ports"].items()) or "none"))
        cg = report["cgroup"]
        _echo("  cgroup: %s" % ("%s (id %d, level %d) -> %s" % (cg.get("path") or "?", cg["id"], cg["level"],
                                                                cg["classid"]) if cg else "off"))
    else:
        _echo("  no edgetune classifier attached")
    for cls in report["classes"]:
        _echo("  class %-6s parent %-5s rate %-10s ceil %-10s prio %s  %12d bytes %9d packets %6d dropped%s" % (
            cls["class"], cls["parent"], format_rate(cls["rate"] or 0), format_rate(cls["ceil"] or 0), cls["prio"],
            cls["bytes"], cls["packets"], cls["drops"], "" if cls.get("queue") in (None, "htb")
            else ", queue %s" % cls["queue"]))


# ------------------------------------------------------------------- CLI

def _targets(args, config):
    names = list(args.interface or [])
    if not names and config is not None:
        names = list(config["interfaces"])
    return names


def _settings_for(args, config, names):
    overrides = {"rate": args.rate, "high_rate": args.high_rate, "default_rate": args.default_rate,
                 "high_ceil": args.high_ceil, "default_ceil": args.default_ceil,
                 "high_class": args.high_class, "default_class": args.default_class,
                 "ports": args.ports, "cgroup": args.cgroup}
    return [resolve(name, config, overrides, cgroup2_mount()) for name in names]


def cmd_apply(args):
    config = load_config(args.config) if args.config else None
    names = _targets(args, config)
    if not names:
        raise NetQosError("no interface: pass --interface or a config with interfaces")
    all_settings = _settings_for(args, config, names)  # every interface validated before any is touched
    ipr = _ipr()
    try:
        for settings in all_settings:
            link_index(ipr, settings["interface"])
    finally:
        ipr.close()
    reports = [apply_interface(s, args.source, args.replace_root) for s in all_settings]
    if args.json:
        _echo(json.dumps({"changed": any(r["changed"] for r in reports), "interfaces": reports}, indent=2))
    else:
        for rep in reports:
            if not rep["changed"]:
                _echo("%s: already in the desired state" % rep["interface"])
            for action in rep["actions"]:
                _echo("%s: %s" % (rep["interface"], action))
    return 0


def cmd_check(args):
    config = load_config(args.config)
    names = _targets(args, config)
    if not names:
        raise NetQosError("no interface: the config lists none")
    source_path, source_text = read_source(args.source)
    results = {}
    ipr = _ipr()
    try:
        prepared = []
        for settings in _settings_for(args, config, names):
            index = link_index(ipr, settings["interface"])
            prepared.append((settings, link_l2_len(ipr, index, settings["interface"])))
    finally:
        ipr.close()
    for settings, l2_len in prepared:
        missing = None
        cgroup = None
        if settings["cgroup"]:
            try:
                cgroup = resolve_cgroup(settings["cgroup"], settings["high_class"])
            except NetQosError as exc:  # not an error for a check: apply will need it
                missing = str(exc)
                cgroup = {"id": 0, "level": len(settings["cgroup"].split("/")), "classid": settings["high_class"]}
        desired = desired_state(settings, source_text, l2_len, cgroup)
        live = read_live(settings["interface"])
        plan, diffs = compare(desired, live)
        if missing:
            diffs.insert(0, missing)
        results[settings["interface"]] = {"in_sync": not diffs, "differences": diffs,
                                          "foreign_root": plan["root"] == "foreign",
                                          "program": _program_summary(live)}
    in_sync = all(r["in_sync"] for r in results.values())
    if args.json:
        _echo(json.dumps({"in_sync": in_sync, "interfaces": results}, indent=2))
    else:
        for name, res in results.items():
            _echo("%s: %s" % (name, "in sync" if res["in_sync"] else "differs"))
            for line in res["differences"]:
                _echo("  " + line)
    return 0 if in_sync else 1


def cmd_status(args):
    names = list(args.interface or [])
    if not names:
        names = discover_interfaces()
    reports = [status_interface(name) for name in names]
    if args.json:
        _echo(json.dumps({"interfaces": reports}, indent=2))
    else:
        if not reports:
            _echo("no interface has the edgetune classifier")
        for rep in reports:
            print_status(rep)
    return 0


def discover_interfaces():
    """Interfaces whose clsact egress has an edgetune filter."""
    ipr = _ipr()
    try:
        found = []
        for link in ipr.get_links():
            try:
                filters = ipr.get_filters(index=link["index"], parent=CLSACT_EGRESS)
            except Exception:  # no clsact on this link
                continue
            for flt in filters:
                opts = dict(_attr(flt, "TCA_OPTIONS", {}).get("attrs", []) or [])
                if str(opts.get("TCA_BPF_NAME", "")).startswith(FILTER_PREFIX):
                    found.append(_attr(link, "IFLA_IFNAME"))
                    break
        return found
    finally:
        ipr.close()


def cmd_detach(args):
    config = load_config(args.config) if args.config else None
    names = _targets(args, config)
    if not names:
        raise NetQosError("no interface: pass --interface or a config with interfaces")
    reports = [detach_interface(name) for name in names]
    if args.json:
        _echo(json.dumps({"changed": any(r["changed"] for r in reports), "interfaces": reports}, indent=2))
    else:
        for rep in reports:
            _echo("%s: %s" % (rep["interface"], "; ".join(rep["actions"]) or "nothing of edgetune's to remove"))
    return 0


def build_parser(parser, wrap=None):
    """The apply/check/status/detach subcommands on parser; wrap(func) wraps
    each command function (the `edgetune` CLI uses it)."""
    wrap = wrap or (lambda func: func)
    sub = parser.add_subparsers(dest="netqos_command", metavar="{apply,status,check,detach}")
    sub.required = True

    def common(p, config_required=False):
        p.add_argument("--interface", "-i", action="append", metavar="IF",
                       help="interface (repeatable); default: the config's interfaces")
        p.add_argument("--config", "-c", required=config_required, metavar="FILE",
                       help="JSON config (see bpf/README.md); - reads stdin")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    def settings(p):
        p.add_argument("--rate", help="link rate for class 1:1, e.g. 100mbit (required)")
        p.add_argument("--high-rate", help="guaranteed rate of the inference class (default 20%%)")
        p.add_argument("--default-rate", help="guaranteed rate of the default class (default: the rest)")
        p.add_argument("--high-ceil", help="what the inference class may borrow up to (default 100%%: the link)")
        p.add_argument("--default-ceil", help="what the default class may borrow up to (default 100%%)")
        p.add_argument("--ports", help="inference TCP/UDP ports, e.g. 8000,50051,9000-9002 (at most 16)")
        p.add_argument("--cgroup", help="cgroup v2 path under the v2 root whose sockets are inference, "
                                        "e.g. ai-infer.slice")
        p.add_argument("--high-class", help="high-priority class id (default 1:10)")
        p.add_argument("--default-class", help="default class id (default 1:20)")
        p.add_argument("--source", help="classifier C source (default: the installed edge_classifier.c)")

    p = sub.add_parser("apply", help="set up HTB + clsact and attach the classifier (idempotent)")
    common(p)
    settings(p)
    p.add_argument("--replace-root", action="store_true",
                   help="replace a root qdisc that edgetune did not make (default: refuse)")
    p.set_defaults(func=wrap(cmd_apply))
    p = sub.add_parser("check", help="compare the live state with a config; exit 1 when it differs")
    common(p, config_required=True)
    settings(p)
    p.set_defaults(func=wrap(cmd_check))
    p = sub.add_parser("status", help="program id/tag, map contents and class counters")
    common(p)
    p.set_defaults(func=wrap(cmd_status))
    p = sub.add_parser("detach", help="remove the classifier, clsact (if unused) and the root htb")
    common(p)
    p.set_defaults(func=wrap(cmd_detach))
    return parser


def run(args):
    try:
        return args.func(args)
    except NetQosError as exc:
        _echo("edgetune-netqos: error: %s" % exc, sys.stderr)
        return 2
    except PermissionError as exc:
        _echo("edgetune-netqos: error: %s: run as root" % exc, sys.stderr)
        return 2
    except Exception as exc:  # one line, not a traceback; nothing after the failing step was done
        _echo("edgetune-netqos: error: unexpected %s: %s" % (type(exc).__name__, exc), sys.stderr)
        return 2


def main(argv=None):
    parser = build_parser(argparse.ArgumentParser(prog="edgetune-netqos", description=__doc__.splitlines()[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
