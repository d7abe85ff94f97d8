"""`edgetune-dev twin capture`: read a real board (read-only) and write a twin of it.

What is read, through a Device (SSH, or a local directory holding the
device's root): the device tree identity, the BSP release files, the CPU
topology and cpufreq policies, devfreq nodes, /proc/interrupts, the PCIe
devices (config space as far as the login user can read it), the boot file
in use, /etc/nvpmodel.conf, the kernel config items the roles check and the
cgroup mode. Nothing on the device is written; the only commands run are
``uname -s`` (when /proc/sys/kernel/ostype is not readable) and, with
``--sudo``, ``sudo -n cat`` of root-only files.

What is written, into ``<captured>/<NAME>/`` (default captured directory:
the checkout's ``.cache/captured``, or $EDGETUNE_CAPTURED_DIR):

* ``boards/NAME.json``, ``bootfiles/``, ``nvpmodel_confs/``: the twin board in
  the layout of tools/edgetune_dev/twin/guest (``twin up --fleet captured/NAME``
  copies them into the twin);
* ``profile/NAME.yml``: a draft edge_facts board profile, with what detection
  cannot decide marked ``# TODO(person):``;
* ``capture.json``: what was read, what could not be and why, which values
  are guesses, what was scrubbed;
* ``pcie/<BDF>.config``: each PCIe device's config space as read.

Not copied: the device tree serial number, /etc/machine-id, host keys, MAC
addresses and serial numbers in boot arguments, interrupt names and boot
files (replaced by placeholders).
"""
import datetime
import gzip
import json
import os
import re
import shutil
import sys
from pathlib import Path

from edgetune.errors import UsageError
from edgetune_dev.twin import device as devices
from edgetune_dev.twin import manager

# The parsers edge_facts and the roles use on the device: the capture reads what they read.
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_pcie
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_board import (
    cgroup_mode_of, parse_kernel_config)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import ExtlinuxConfig
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import parse_cpulist
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_nvpmodel import parse_conf

# The board profiles of the collection these tools import (a checkout, or the installed one Ansible finds).
PROFILES_DIR = Path(edge_pcie.__file__).resolve().parents[3] / "roles" / "edge_facts" / "files" / "board_profiles"
DT_BASES = ("/sys/firmware/devicetree/base", "/proc/device-tree")
CPU = "/sys/devices/system/cpu"
# The kernel options the roles check (edge_facts' features) and the twins carry.
KERNEL_CONFIG_KEYS = ["CONFIG_BPF_SYSCALL", "CONFIG_CGROUP_BPF", "CONFIG_SOCK_CGROUP_DATA", "CONFIG_NET_SCH_HTB",
                      "CONFIG_NET_CLS_BPF", "CONFIG_NET_ACT_BPF", "CONFIG_NET_SCH_INGRESS", "CONFIG_RT_GROUP_SCHED",
                      "CONFIG_CGROUPS", "CONFIG_CPUSETS", "CONFIG_NO_HZ_FULL", "CONFIG_RCU_NOCB_CPU",
                      "CONFIG_IKCONFIG_PROC", "CONFIG_PREEMPT"]
EMC_CAP_FILES = ("/sys/kernel/nvpmodel_clk_cap/emc", "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap")
EMC_CLK = "/sys/kernel/debug/bpmp/debug/clk/emc"
# Tegra234's lowest EMC rate, used when debugfs is not readable (noted in capture.json).
EMC_MIN_DEFAULT = 204000000
# Userlands the twin images stand in for (the README: bookworm for Ubuntu 22.04, bullseye for 20.04).
DISTROS = {("ubuntu", "20.04"): "bullseye", ("ubuntu", "22.04"): "bookworm", ("ubuntu", "24.04"): "trixie",
           ("debian", "11"): "bullseye", ("debian", "12"): "bookworm", ("debian", "13"): "trixie"}
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
MAC_RE = re.compile(r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}(?![0-9A-Fa-f:])")
SECRET_KEYS = (r"(?:androidboot\.)?serial(?:no|_?number)?|(?:\w+[_.])?mac(?:_?addr(?:ess)?)?|eth\d*addr|"
               r"password|passwd|psk|secret|token")
SECRET_RE = re.compile(r"(?i)(?<![\w.-])(%s)=(\"[^\"]*\"|\S+)" % SECRET_KEYS)
PASSWD_RE = re.compile(r"(?im)^(\s*MENU\s+(?:MASTER\s+)?PASSWD\s+)\S.*$")
REDACTED = "REDACTED"
# What the module utilities raise for input they refuse: recorded in capture.json, never a traceback.
BAD_INPUT = (ValueError, EdgeError)


class CaptureError(UsageError):
    """Raised for a device edgetune will not capture (not Linux, unreachable)."""


# ---------------------------------------------------------------- scrubbing
class Scrubber:
    """Replaces what must not leave the device, counting where."""

    def __init__(self):
        self.counts = {}

    def __call__(self, text, where):
        count = 0

        def secret(match):
            return "%s=%s" % (match.group(1), REDACTED)
        text, n = SECRET_RE.subn(secret, text)
        count += n
        text, n = MAC_RE.subn("00:00:00:00:00:00", text)
        count += n
        text, n = PASSWD_RE.subn(lambda m: m.group(1) + REDACTED, text)
        count += n
        if count:
            self.counts[where] = self.counts.get(where, 0) + count
        return text


# ---------------------------------------------------------------- reading
class Reader:
    """Reads through a device and remembers what it could not read."""

    def __init__(self, dev, sudo=False):
        self.dev, self.sudo = dev, sudo
        self.unreadable = {}
        self.read_paths = []
        self.sudo_paths = []

    def bytes(self, path, required=False, root_only=False):
        attempts = [(self.dev.read, self.read_paths)]
        if self.sudo and root_only:
            attempts.append((self.dev.sudo_read, self.sudo_paths))
        for read, read_with in attempts:
            try:
                data = read(path)
            except OSError as exc:
                failure = exc
                continue
            read_with.append(path)
            return data
        if required or failure.errno not in (2, None):
            self.unreadable[path] = failure.strerror or str(failure)
        return None

    def sudo_paths_pcie(self):
        """BDFs whose config space was read through sudo."""
        return {p.split("/")[-2] for p in self.sudo_paths if p.endswith("/config")}

    def text(self, path, required=False, root_only=False):
        data = self.bytes(path, required, root_only)
        return None if data is None else data.decode("utf-8", "replace")

    def value(self, path, required=False):
        text = self.text(path, required)
        return None if text is None else text.strip().rstrip("\0").strip()

    def cpus(self, path, required=False):
        """A CPU list file ('0-3,6') as [0, 1, 2, 3, 6]; [] when it is missing or not a CPU list (recorded)."""
        text = self.value(path, required)
        try:
            return parse_cpulist(text)
        except BAD_INPUT as exc:
            self.unreadable[path] = "not a CPU list: %s" % exc
            return []

    def listdir(self, path, required=False):
        try:
            return self.dev.listdir(path)
        except OSError as exc:
            if required or exc.errno not in (2, None):
                self.unreadable[path] = exc.strerror or str(exc)
            return []


def key_values(text):
    values = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip().strip('"')
    return values


def read_identity(r):
    for base in DT_BASES:
        model = r.bytes(base + "/model")
        if model is not None:
            compatible = r.bytes(base + "/compatible") or b""
            return {"model": model.rstrip(b"\0").decode("utf-8", "replace").strip(),
                    "compatible": [c.decode("utf-8", "replace") for c in compatible.split(b"\0") if c],
                    "source": base}
    return None


def read_cpus(r, notes):
    present = r.cpus(CPU + "/present", required=True)
    policies = sorted((n for n in r.listdir(CPU + "/cpufreq", required=True) if re.match(r"^policy\d+$", n)),
                      key=lambda n: int(n[6:]))
    clusters = []
    for name in policies:
        pdir = CPU + "/cpufreq/" + name

        def attr(key, required=True, pdir=pdir):
            return r.value(pdir + "/" + key, required=required)
        related = attr("related_cpus")
        if related is None:
            continue
        freqs = [int(f) for f in (attr("scaling_available_frequencies", required=False) or "").split()]
        low, high = attr("cpuinfo_min_freq"), attr("cpuinfo_max_freq")
        if not freqs and low and high:
            freqs = sorted({int(low), int(high)})
            notes.append("%s has no scaling_available_frequencies: its table is cpuinfo_min_freq and "
                         "cpuinfo_max_freq only" % name)
        clusters.append({"policy": int(name[6:]), "cpus": [int(c) for c in related.split()],
                         "frequencies": sorted(freqs), "governor": attr("scaling_governor"),
                         "governors": attr("scaling_available_governors") or "",
                         "driver": attr("scaling_driver", required=False) or "unknown"})
    return present, clusters


def read_devfreq(r):
    nodes = []
    for name in r.listdir("/sys/class/devfreq"):
        link = "/sys/class/devfreq/" + name
        try:
            real = r.dev.realpath(link)
        except OSError as exc:
            r.unreadable[link] = exc.strerror or str(exc)
            continue
        # .../<device>/devfreq/<name>: the device is two levels up.
        device_dir = os.path.dirname(os.path.dirname(real))
        freqs = [int(f) for f in (r.value(link + "/available_frequencies", required=True) or "").split()]
        of_name = r.value(device_dir + "/of_node/name") or name.split(".")[-1]
        nodes.append({"name": name, "device": device_dir, "of_node_name": of_name,
                      "governor": r.value(link + "/governor", required=True) or "",
                      "governors": r.value(link + "/available_governors", required=True) or "",
                      "frequencies": sorted(freqs)})
    return nodes


IRQ_ROW = re.compile(r"^\s*(\d+):\s+((?:\d+\s+)*)(.*)$")


def parse_interrupts(text, ncpus):
    """/proc/interrupts -> [{irq, chip, hwirq, name}] (numbered rows only)."""
    rows = []
    lines = (text or "").splitlines()
    if not lines:
        return rows
    columns = len(lines[0].split()) or ncpus
    for line in lines[1:]:
        match = IRQ_ROW.match(line)
        if not match:
            continue
        counts = match.group(2).split()
        rest = match.group(3)
        if len(counts) > columns:   # a count-like chip name (rare): give the extra back
            rest = " ".join(counts[columns:]) + " " + rest
        parts = re.match(r"^(\S+)\s+(\d+)\s+(Level|Edge)\s*(.*)$", rest) or \
            re.match(r"^(\S+)\s+(\S+-(?:level|edge|fasteoi))\s*(.*)$", rest)
        if parts and len(parts.groups()) == 4:
            chip, hwirq, name = parts.group(1), "%s %s" % (parts.group(2), parts.group(3)), parts.group(4)
        elif parts:
            chip, hwirq, name = parts.group(1), parts.group(2), parts.group(3)
        else:
            words = rest.split(None, 1)
            chip, hwirq, name = (words[0] if words else ""), "", (words[1] if len(words) > 1 else "")
        rows.append({"irq": int(match.group(1)), "chip": chip, "hwirq": hwirq, "name": name.strip()})
    return rows


MANAGED_NAME = re.compile(r"^nvme\d+q[1-9]\d*$")


def read_irqs(r, ncpus, scrub, heuristics, root=False):
    rows = parse_interrupts(r.text("/proc/interrupts", required=True), ncpus)
    irqs = []
    debug_ok = None   # the kernel's IRQ flags in debugfs: root only, and only with CONFIG_GENERIC_IRQ_DEBUGFS
    for row in sorted(rows, key=lambda x: x["irq"]):
        number = row["irq"]
        hw = row["hwirq"].split()
        flags = None
        if debug_ok is not False:
            path = "/sys/kernel/debug/irq/irqs/%d" % number
            try:
                flags = r.dev.read(path).decode("utf-8", "replace")
            except OSError:
                try:
                    flags = r.dev.sudo_read(path).decode("utf-8", "replace") if r.sudo else None
                except OSError:
                    flags = None
            debug_ok = flags is not None
        if flags is not None:
            kind = "percpu" if "IRQD_PER_CPU" in flags or "PER_CPU" in flags else \
                "managed" if "AFFINITY_MANAGED" in flags else "movable"
        elif row["chip"].startswith("GIC") and hw and hw[0].isdigit() and int(hw[0]) < 32:
            kind = "percpu"   # SGIs and PPIs: banked per CPU
        elif "MSI" in row["chip"] and MANAGED_NAME.match(row["name"]):
            kind = "managed"  # the NVMe driver's I/O queues get managed affinity
        else:
            kind = "movable"
        entry = {"irq": number, "chip": row["chip"], "hwirq": row["hwirq"],
                 "name": scrub(row["name"], "/proc/interrupts"), "kind": kind}
        if kind == "managed":
            cpus = r.cpus("/proc/irq/%d/smp_affinity_list" % number)
            if cpus:
                entry["cpus"] = cpus
        irqs.append(entry)
    if debug_ok is not True:
        heuristics.append("IRQ kinds guessed without /sys/kernel/debug/irq (not readable: root only, and only in "
                          "kernels with CONFIG_GENERIC_IRQ_DEBUGFS%s): GIC interrupts below 32 are per-CPU, MSI "
                          "NVMe I/O queues (nvmeNqM, M >= 1) managed, the rest movable"
                          % ("" if r.sudo or root else "; --sudo reads it as root"))
    return irqs


def vc_capability(config):
    """Whether a config space image has a VC capability (ID 0x0002, or 0x0009 beside an MFVC), by
    edge_pcie's walk of the extended capability list: (True/False, the walk's problems) when the
    extended config space was read (4096 bytes), (None, []) when it was not."""
    if len(config) < edge_pcie.EXT_CONFIG_SIZE:
        return None, []
    caps, problems = edge_pcie.walk_ext_capabilities(config)
    return any(cap["id"] in (edge_pcie.ECAP_VC, edge_pcie.ECAP_VC9) for cap in caps), problems


def read_pcie(r):
    base = "/sys/bus/pci/devices"
    found = []
    for bdf in r.listdir(base):
        path = base + "/" + bdf
        try:
            real = r.dev.realpath(path)
        except OSError as exc:
            r.unreadable[path] = exc.strerror or str(exc)
            continue
        # A normal user reads the first 64 or 256 bytes without an error: with --sudo, root reads it all.
        config = None
        if r.sudo:
            try:
                config = r.dev.sudo_read(path + "/config")
                r.sudo_paths.append(path + "/config")
            except OSError:
                config = None
        if config is None:
            config = r.bytes(path + "/config") or b""
        try:
            driver = os.path.basename(r.dev.readlink(path + "/driver"))
        except OSError:
            driver = None
        has_vc, problems = vc_capability(config)
        found.append({"bdf": bdf, "path": real, "vendor": r.value(path + "/vendor"),
                      "device": r.value(path + "/device"), "class": r.value(path + "/class"), "driver": driver,
                      "config": config, "config_problems": problems,
                      "config_bytes_read": len(config), "vc_capability": has_vc})
    return found


def twin_pcie(found):
    """The twin's root port + endpoint pair: an NVMe endpoint (else the first endpoint) below a root port."""
    by_path = {d["path"]: d for d in found}
    endpoints = [d for d in found if d["class"] and not d["class"].startswith("0x0604")]
    endpoints.sort(key=lambda d: (not (d["class"] or "").startswith("0x0108"), d["bdf"]))
    for ep in endpoints:
        port = by_path.get(os.path.dirname(ep["path"]))
        if port is None or not (port["class"] or "").startswith("0x0604"):
            continue
        name = "nvme" if ep["class"].startswith("0x0108") else (ep["driver"] or "endpoint")
        return {"domain": int(port["bdf"].split(":")[0], 16),
                "host_bridge": os.path.dirname(os.path.dirname(port["path"])),
                "root_port": {k: port[k] for k in ("vendor", "device", "class")},
                "endpoint": dict({k: ep[k] for k in ("vendor", "device", "class")}, name=name)}, (port, ep)
    return None, None


def read_kernel_config(r, release):
    raw = r.bytes("/proc/config.gz")
    text, source = None, None
    if raw is not None:
        try:
            text, source = gzip.decompress(raw).decode("utf-8", "replace"), "/proc/config.gz"
        except (OSError, EOFError):
            r.unreadable["/proc/config.gz"] = "not a gzip file"
    if text is None and release:
        text, source = r.text("/boot/config-%s" % release), "/boot/config-%s" % release
    if text is None:
        r.unreadable["kernel config"] = "neither /proc/config.gz nor /boot/config-%s is readable" % release
        return None, None
    config = parse_kernel_config(text)
    return {key: config.get(key) for key in KERNEL_CONFIG_KEYS}, source


def extlinux_default_append(text, notes):
    """The APPEND of the label L4TLauncher boots (edge_cmdline's parser: the label DEFAULT names, else the
    first); a file the roles would refuse to edit is noted, not refused."""
    try:
        ExtlinuxConfig(text)
    except BAD_INPUT as exc:
        notes.append("edgetune's roles will refuse to edit this extlinux.conf as it is: %s" % exc)
    return ExtlinuxConfig(text, check=False).booted_append()


def l4t_bootloader_args(append, cmdline, notes):
    """What the bootloader appended after the APPEND line (L4TLauncher adds platform arguments at the end)."""
    if append is None:
        return ""
    written = re.sub(r"\$\{cbootargs\} *", "", append, count=1).split()
    running = cmdline.split()
    for start in range(len(running) - len(written) + 1):
        if running[start:start + len(written)] == written:
            if start:
                notes.append("the bootloader put %s before the APPEND arguments; the twin appends them after"
                             % " ".join(running[:start]))
            return " ".join(running[:start] + running[start + len(written):])
    notes.append("the running command line does not start with the default entry's APPEND (booted another "
                 "entry, or not yet rebooted since the file changed): bootloader_args are the running "
                 "arguments missing from APPEND")
    return " ".join(t for t in running if t not in written)


def nvpmodel_modes(r, path, text):
    """[(id, name)] and the default id of an nvpmodel.conf (edge_nvpmodel's parser, as the role reads it);
    ([], None) for a file it refuses, recorded as unreadable with the reason."""
    if text is None:
        return [], None
    try:
        conf = parse_conf(text)
    except BAD_INPUT as exc:
        r.unreadable[path] = "not an nvpmodel configuration: %s" % exc
        return [], None
    return [(mode.id, mode.name) for mode in conf.modes], conf.default_id


def tables_for(clusters):
    """Distinct frequency tables named after the first policy that uses each."""
    tables, names = {}, {}
    for cl in clusters:
        key = tuple(cl["frequencies"])
        if key not in names:
            names[key] = "policy%d" % cl["policy"]
            tables[names[key]] = list(key)
        cl["table"] = names[key]
    return tables


# ---------------------------------------------------------------- the capture
def capture(dev, name, host_label, sudo=False):
    """Read the device; returns a dict with the board, files and report (nothing written)."""
    r = Reader(dev, sudo)
    scrub = Scrubber()
    notes, heuristics, missing = [], [], []

    ostype = r.value("/proc/sys/kernel/ostype")
    if ostype is None:
        status, out, _err = dev.run(["uname", "-s"])
        ostype = out.decode("utf-8", "replace").strip() if status == 0 else None
        if ostype is None:
            raise CaptureError("%s does not look like Linux: no /proc/sys/kernel/ostype and no `uname -s`; "
                               "edgetune captures Linux boards only" % host_label)
    if ostype != "Linux":
        raise CaptureError("%s is not Linux (it says %r); edgetune captures Linux boards only" % (host_label, ostype))
    r.unreadable.pop("/proc/sys/kernel/ostype", None)

    identity = read_identity(r)
    if identity is None:
        missing.append("device tree identity (%s/model)" % " or ".join(DT_BASES))
        identity = {"model": None, "compatible": [], "source": None}
    release = r.value("/proc/sys/kernel/osrelease") or ""
    cmdline = scrub(r.value("/proc/cmdline", required=True) or "", "/proc/cmdline")
    nv_release = r.text("/etc/nv_tegra_release")
    armbian = r.text("/etc/armbian-release")
    osrel = key_values(r.text("/etc/os-release") or r.text("/usr/lib/os-release"))

    compatible = identity["compatible"]
    if nv_release is not None or any(c.startswith("nvidia,tegra") for c in compatible):
        family = "jetson"
    elif any(c.startswith("rockchip,") for c in compatible):
        family = "rockchip"
    else:
        family = None
        missing.append("a board family edgetune knows (Jetson: nvidia,tegra*; Rockchip: rockchip,*) in "
                       "compatible %s" % (compatible or "(none)"))
    soc = next((c.split(",", 1)[1] for c in reversed(compatible)
                if re.match(r"^(nvidia,tegra\d+|rockchip,rk\d+\w*)$", c)), None)

    distro_key = (osrel.get("ID", ""), osrel.get("VERSION_ID", ""))
    distro = DISTROS.get(distro_key) or (osrel.get("VERSION_CODENAME") if osrel.get("ID") == "debian" else None)
    if not distro:
        distro = "bookworm"
        notes.append("userland %s %s has no twin image of its own: the twin uses bookworm" % distro_key)

    present, clusters = read_cpus(r, notes)
    if not clusters:
        missing.append("cpufreq policies (%s/cpufreq/policy*)" % CPU)
    tables = tables_for(clusters)
    devfreq = read_devfreq(r)
    # The login's own uid (the SFTP server runs as the login user).
    uid = re.search(r"^Uid:\s+\d+\s+(\d+)", r.text("/proc/self/status") or "", re.M)
    root = bool(uid) and uid.group(1) == "0"
    irqs = read_irqs(r, len(present), scrub, heuristics, root)
    pcie_found = read_pcie(r)
    pcie, pair = twin_pcie(pcie_found)
    short = [d["bdf"] for d in pcie_found if d["config_bytes_read"] < 4096]
    sizes = "/".join(sorted({str(d["config_bytes_read"]) for d in pcie_found if d["bdf"] in short}))
    if short and (root or (sudo and all(d["bdf"] in r.sudo_paths_pcie() for d in pcie_found if d["bdf"] in short))):
        notes.append("PCIe config space of %s is %s bytes read as root: conventional PCI, no extended config "
                     "space (no VC capability)" % (", ".join(short), sizes))
    elif short:
        notes.append("PCIe config space of %s read as far as this user may (%s bytes; the extended space from "
                     "0x100, where the VC capability is, needs root%s)"
                     % (", ".join(short), sizes, "" if sudo else ": give --sudo"))
    for d in pcie_found:
        if d["config_problems"]:
            notes.append("PCIe config space of %s: %s" % (d["bdf"], "; ".join(d["config_problems"])))
    if pair and pair[0]["vc_capability"] is not True:
        notes.append("the twin models a VC capability with VC1 on both ends of its PCIe link; %s's is %s on this "
                     "device" % (pair[0]["bdf"], "absent" if pair[0]["vc_capability"] is False else "not readable"))
    kernel_config, config_source = read_kernel_config(r, release)
    if kernel_config is None:
        missing.append("kernel config (/proc/config.gz or /boot/config-%s)" % release)
    cgroup = cgroup_mode_of(r.text("/proc/self/mountinfo", required=True))
    meminfo = re.search(r"^MemTotal:\s+(\d+)\s+kB", r.text("/proc/meminfo") or "", re.M)

    # The boot file in use (edge_facts' order).
    boot, bootloader, bootloader_args, partuuid = None, None, "", None
    if dev.exists("/boot/extlinux/extlinux.conf") and (family == "jetson" or nv_release is not None):
        text = r.text("/boot/extlinux/extlinux.conf", required=True)
        if text is not None:
            boot = ("/boot/extlinux/extlinux.conf", "%s.extlinux.conf" % name, scrub(text, "extlinux.conf"))
            bootloader = "l4t"
            bootloader_args = l4t_bootloader_args(extlinux_default_append(boot[2], notes), cmdline, notes)
    elif dev.exists("/boot/armbianEnv.txt"):
        text = r.text("/boot/armbianEnv.txt", required=True)
        if text is not None:
            boot = ("/boot/armbianEnv.txt", "%s.armbianEnv.txt" % name, scrub(text, "armbianEnv.txt"))
            bootloader = "armbian"
            partuuid = next((t.split("=", 1)[1] for t in cmdline.split() if t.startswith("ubootpart=")), "")
    else:
        for path, kind in (("/etc/kernel/cmdline", "u-boot-menu"), ("/etc/default/grub", "GRUB"),
                           ("/boot/extlinux/extlinux.conf", "plain extlinux")):
            if dev.exists(path):
                missing.append("a boot file the twin can model: this board boots with %s (%s); twins model "
                               "L4T's extlinux.conf and Armbian's armbianEnv.txt" % (kind, path))
                break
        else:
            missing.append("the boot file (/boot/extlinux/extlinux.conf, /boot/armbianEnv.txt, /etc/kernel/cmdline, "
                           "/etc/default/grub)")

    nvpmodel = None
    if dev.exists("/etc/nvpmodel.conf"):
        text = r.text("/etc/nvpmodel.conf")
        if text is not None:
            try:
                conf_name = os.path.basename(dev.readlink("/etc/nvpmodel.conf"))
            except OSError:
                conf_name = "nvpmodel_%s.conf" % name
            nvpmodel = (conf_name, scrub(text, "nvpmodel.conf"))
    modes = nvpmodel_modes(r, "/etc/nvpmodel.conf", nvpmodel[1] if nvpmodel else None)

    emc = None
    if family == "jetson":
        cap_file = next((p for p in EMC_CAP_FILES if dev.exists(p)), None)
        if cap_file:
            low = r.value(EMC_CLK + "/min_rate") or (r.text(EMC_CLK + "/min_rate", root_only=True) or "").strip()
            high = r.value(EMC_CLK + "/max_rate") or (r.text(EMC_CLK + "/max_rate", root_only=True) or "").strip()
            if not high:
                caps = [int(v) for v in re.findall(r"^\s*EMC\s+MAX_FREQ\s+(\d+)", (nvpmodel or ("", ""))[1], re.M)]
                high = str(max(caps)) if caps and max(caps) > 0 else None
                heuristics.append("EMC max rate from nvpmodel.conf's EMC MAX_FREQ caps (%s is root only%s)"
                                  % (EMC_CLK, "" if sudo else "; give --sudo") if high else
                                  "EMC clock rates unknown (%s is root only)" % EMC_CLK)
            if not low:
                low = str(EMC_MIN_DEFAULT)
                heuristics.append("EMC min rate assumed %d (Tegra234's lowest; %s/min_rate not readable)"
                                  % (EMC_MIN_DEFAULT, EMC_CLK))
            if high:
                emc = {"cap_file": cap_file, "min_rate": int(low), "max_rate": int(high)}

    releases = {}
    if nv_release is not None:
        releases["/etc/nv_tegra_release"] = scrub(nv_release, "/etc/nv_tegra_release")
    if armbian is not None:
        releases["/etc/armbian-release"] = scrub(armbian, "/etc/armbian-release")

    board = {
        "name": name,
        "title": "%s (captured from %s)" % (identity["model"] or "unknown board", host_label),
        "family": family, "distro": distro,
        "model": identity["model"], "compatible": compatible,
        # Not copied from the device: a placeholder of the twins' kind.
        "serial_number": "000000000000",
        "release_files": releases,
        "boot_files": {boot[0]: boot[1]} if boot else {},
        "bootloader": bootloader, "bootloader_args": bootloader_args,
        "kernel_release": release, "cgroup": cgroup,
        "clusters": [{"policy": c["policy"], "cpus": c["cpus"], "table": c["table"], "governor": c["governor"]}
                     for c in clusters],
        "cpufreq_driver": clusters[0]["driver"] if clusters else "unknown",
        "cpufreq_governors": clusters[0]["governors"] if clusters else "",
        "cpufreq_tables": tables,
        "devfreq": devfreq,
        "irqs": irqs,
        "kernel_config": kernel_config or {},
    }
    if partuuid is not None:
        board["partuuid"] = scrub(partuuid, "/proc/cmdline")
    if emc:
        board["emc"] = emc
    if nvpmodel:
        board["nvpmodel_conf"] = nvpmodel[0]
    if pcie:
        board["pcie"] = pcie
    if len({c["governors"] for c in clusters}) > 1:
        notes.append("cpufreq policies offer different governors; the twin offers policy%d's on all"
                     % clusters[0]["policy"])
    if dev.exists("/etc/edgetune"):
        notes.append("this device was already tuned by edgetune (/etc/edgetune exists): governors, IRQ affinity "
                     "and boot arguments were captured as it runs now, not as it powers on")

    not_read = dict(r.unreadable)
    report = {
        "format": 1, "name": name, "host": host_label,
        "captured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "complete": not missing, "missing": missing, "unreadable": not_read,
        "read_as_root": r.sudo_paths, "heuristics": heuristics, "notes": notes,
        "scrubbed": scrub.counts,
        "not_copied": ["device tree serial-number (placeholder in the board file)", "/etc/machine-id", "host keys",
                       "MAC addresses and serial numbers (replaced in boot files, boot arguments, interrupt names)"],
        "kernel_config_source": config_source, "devicetree_source": identity["source"],
        "memory_kb": int(meminfo.group(1)) if meminfo else None,
        "pcie": [{k: d[k] for k in ("bdf", "vendor", "device", "class", "driver", "config_bytes_read",
                                    "vc_capability")} for d in pcie_found],
        "nvpmodel_modes": modes[0],
    }
    return {"board": board, "boot": boot, "nvpmodel": nvpmodel, "report": report,
            "pcie_configs": {d["bdf"]: d["config"] for d in pcie_found},
            "profile": draft_profile(board, report, modes, soc, host_label)}


# ---------------------------------------------------------------- the draft profile
def matching_profile(compatible):
    try:
        import yaml
        for path in sorted(PROFILES_DIR.glob("*.yml")):
            profile = yaml.safe_load(path.read_text()) or {}
            for entry in compatible:
                if entry in profile.get("match", []):
                    return profile.get("name"), entry
    except (OSError, ValueError):
        pass
    return None, None


def draft_profile(board, report, power_modes, soc, host_label):
    clusters = [c["cpus"] for c in board["clusters"]]
    tops = [max(board["cpufreq_tables"][c["table"]] or [0]) for c in board["clusters"]]
    best = max(tops[1:]) if len(tops) > 1 else None
    guess = [i for i in range(1, len(tops)) if tops[i] == best] if best is not None else []
    modes, default = power_modes
    major = None
    match = re.search(r"#\s*R(\d+)\s*\(release\)", board["release_files"].get("/etc/nv_tegra_release", ""))
    if match:
        major = match.group(1)
    existing, via = matching_profile(board["compatible"])
    roles = {"gpu": "gpu", "npu": "npu", "dmc": "memory", "emc": "memory"}
    devfreq = [(roles.get(n["of_node_name"]), n["name"]) for n in board["devfreq"]]
    memory = report["memory_kb"]
    lines = [
        "---",
        "# Draft edge_facts board profile, captured from %s by `edgetune-dev twin capture` (%s)." % (
            host_label, report["captured_at"]),
        "# Detection filled in what the device shows; a person decides each TODO(person) below, then",
        "# puts the file in a directory named by edge_facts_profiles_dir (see the README, \"Adding a board\").",
    ]
    if existing:
        lines.append("# Note: the collection's profile %s already matches this board (%s): this draft is only"
                     % (existing, via))
        lines.append("# needed if that profile is wrong for it (a profile matched first wins).")
    lines += [
        "name: %s" % board["name"],
        "title: %s" % json.dumps(board["model"] or board["name"]),
        "family: %s" % (board["family"] or "null  # TODO(person): jetson or rockchip"),
        "soc: %s" % (soc or "null  # TODO(person): the SoC (tegra234, rk3588, ...)"),
        "# TODO(person): the compatible strings that identify this board model (the module's, not the",
        "# carrier's, if every carrier with that module should match); the device lists %s." % json.dumps(
            board["compatible"]),
        "match: %s" % json.dumps(board["compatible"][:1]),
        "cpus: %d" % sum(len(c) for c in clusters),
        "clusters: %s" % json.dumps(clusters),
        "# TODO(person): which clusters run inference (isolated when edge_cpu_isolate is \"auto\").",
        "# Guessed: the clusters with the highest top frequency, cluster 0 left for housekeeping.",
        "inference_clusters: %s" % json.dumps(guess),
        "memory_gb: %s" % (str(int(round(memory / 1048576.0))) + "  # from MemTotal" if memory else "null"),
    ]
    if modes:
        lines.append("# From /etc/nvpmodel.conf (ID: NAME): %s; its default is ID %s." % (
            ", ".join("%d: %s" % m for m in modes), default))
        lines.append("nvpmodel_modes: %s" % json.dumps([n for _, n in modes]))
        lines.append("# TODO(person): the mode for inference (edge_power_nvpmodel_mode: recommended).")
        lines.append("# Guessed: ID 0, usually the uncapped MAXN; check its caps in nvpmodel.conf.")
        lines.append("nvpmodel_recommended: %s" % next((n for i, n in modes if i == 0), modes[0][1]))
    else:
        lines += ["nvpmodel_modes: []", "nvpmodel_recommended: null"]
    lines.append("# TODO(person): the devfreq nodes by role (gpu, npu, memory); guessed from each node's device-tree")
    lines.append("# name. %s" % ("Jetson profiles key them by L4T major release where they differ "
                                "({\"35\": ..., \"36\": ...})." if board["family"] == "jetson" else
                                "Nodes without a known role are left as comments."))
    lines.append("devfreq:" if any(role for role, _ in devfreq) else "devfreq: {}")
    for role, node in devfreq:
        if role:
            lines.append("  %s: %s" % (role, json.dumps({major: node}) if major else node))
        else:
            lines.append("  # ?: %s  # TODO(person): its role" % node)
    if board["family"] == "jetson" and major:
        lines.append("# The cgroup mode this release boots with, as captured.")
        lines.append("cgroup_default: %s" % json.dumps({major: board["cgroup"]}))
    else:
        lines.append("cgroup_default: null")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- writing
def captured_root():
    return manager.CAPTURED_DIR


def write(result, out_dir, force=False):
    """Write the capture into out_dir/NAME; returns that directory."""
    board, report = result["board"], result["report"]
    target = Path(out_dir) / board["name"]
    if target.exists():
        if not force:
            raise UsageError("%s exists; give --force to replace it" % target)
        shutil.rmtree(str(target))
    tmp = target.with_name("." + board["name"] + ".tmp")
    if tmp.exists():
        shutil.rmtree(str(tmp))
    for sub in ("boards", "bootfiles", "nvpmodel_confs", "profile", "pcie"):
        (tmp / sub).mkdir(parents=True)
    suffix = ".json" if report["complete"] else ".json.incomplete"
    (tmp / "boards" / (board["name"] + suffix)).write_text(json.dumps(board, indent=1) + "\n")
    if result["boot"]:
        (tmp / "bootfiles" / result["boot"][1]).write_text(result["boot"][2])
    if result["nvpmodel"]:
        (tmp / "nvpmodel_confs" / result["nvpmodel"][0]).write_text(result["nvpmodel"][1])
    (tmp / "profile" / (board["name"] + ".yml")).write_text(result["profile"])
    for bdf, data in result["pcie_configs"].items():
        (tmp / "pcie" / (bdf + ".config")).write_bytes(data)
    (tmp / "capture.json").write_text(json.dumps(report, indent=1) + "\n")
    os.replace(str(tmp), str(target))
    return target


# ---------------------------------------------------------------- inventory
def from_inventory(inventory, host):
    """SSH settings of one host from an Ansible inventory (ansible-inventory --list)."""
    import subprocess
    tool = shutil.which("ansible-inventory") or os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    try:
        done = subprocess.run([tool, "-i", inventory, "--list"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, check=False)
    except FileNotFoundError:
        raise UsageError("ansible-inventory not found; run `make venv` and use .venv/bin/edgetune") from None
    if done.returncode != 0:
        raise UsageError("ansible-inventory -i %s failed: %s" % (inventory, (done.stderr.strip().splitlines()
                                                                            or ["?"])[-1]))
    hostvars = json.loads(done.stdout).get("_meta", {}).get("hostvars", {})
    if host not in hostvars:
        raise UsageError("%s is not a host of inventory %s" % (host, inventory))
    hv = hostvars[host]
    for key, value in hv.items():
        if key.startswith("ansible_") and isinstance(value, str) and "{{" in value:
            raise UsageError("%s of %s is a template (%s); give the SSH settings on the command line"
                             % (key, host, value))
    connection = hv.get("ansible_connection", "ssh")
    if connection not in ("ssh", "smart", "paramiko", "paramiko_ssh", "ansible.builtin.ssh"):
        raise UsageError("%s is reached with connection %s, not SSH: capture reads boards over SSH"
                         % (host, connection))
    settings = {"host": hv.get("ansible_host", host), "user": hv.get("ansible_user"), "port": hv.get("ansible_port"),
                "identity_files": [], "known_hosts": [], "alias": None, "identities_only": None}
    key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
    if key:
        settings["identity_files"].append(key)
    for args in (hv.get("ansible_ssh_common_args", ""), hv.get("ansible_ssh_extra_args", "")):
        words = args.split()
        for i, word in enumerate(words):
            option = word[2:] if word.startswith("-o") and len(word) > 2 else \
                (words[i + 1] if word == "-o" and i + 1 < len(words) else None)
            if not option or "=" not in option:
                continue
            name, value = option.split("=", 1)
            if name.lower() == "userknownhostsfile":
                settings["known_hosts"] += value.split()
            elif name.lower() == "hostkeyalias":
                settings["alias"] = value
            elif name.lower() == "identitiesonly":
                settings["identities_only"] = value.lower() == "yes"
    return settings


# ---------------------------------------------------------------- command
def say(message):
    print("edgetune: " + message, file=sys.stderr, flush=True)


def cmd_capture(args):
    if bool(args.host) == bool(args.root):
        raise UsageError("give a HOST to capture over SSH, or --root DIR for a device's root directory")
    settings = {"host": args.host, "user": None, "port": None, "identity_files": [], "known_hosts": [],
                "alias": None, "identities_only": None}
    if args.inventory:
        if not args.host:
            raise UsageError("-i INVENTORY needs the HOST's inventory name")
        settings = from_inventory(args.inventory, args.host)
    name = args.name or (os.path.basename(os.path.abspath(args.root)) if args.root else args.host).lower()
    name = re.sub(r"[^a-z0-9-]+", "-", name).strip("-")
    if not NAME_RE.match(name):
        raise UsageError("cannot make a board name of %r; give --name (lower-case letters, digits, -)" % name)
    if name in manager.builtin_boards():
        raise UsageError("%s is a built-in twin board; give the capture another --name" % name)
    out_dir = Path(args.out) if args.out else captured_root()
    if (out_dir / name).exists() and not args.force:
        raise UsageError("%s exists; give --force to replace it" % (out_dir / name))
    try:
        if args.root:
            dev = devices.LocalDevice(args.root)
            label = dev.label
        else:
            dev = devices.SSHDevice(settings["host"], user=args.user or settings["user"],
                                    port=args.port or settings["port"],
                                    identity_files=(args.identity or []) + settings["identity_files"],
                                    known_hosts=(args.known_hosts or []) + settings["known_hosts"],
                                    host_key_alias=settings["alias"], identities_only=settings["identities_only"],
                                    ssh_config=args.ssh_config, timeout=args.timeout)
            label = args.host
    except devices.DeviceError as exc:
        raise UsageError(str(exc)) from None
    try:
        result = capture(dev, name, label, sudo=args.sudo)
    finally:
        dev.close()
    target = write(result, out_dir, force=args.force)
    report = result["report"]
    if not report["complete"]:
        unread = ["%s (%s)" % item for item in sorted(report["unreadable"].items())]
        raise UsageError("captured %s only in part: no %s%s; what could be read is in %s (board file %s)"
                         % (label, "; no ".join(report["missing"]),
                            ("; unreadable: " + ", ".join(unread)) if unread else "", target,
                            "boards/%s.json.incomplete, not bootable" % name))
    board = result["board"]
    say("captured %s as %s: %s, %d CPUs in %d clusters, %d devfreq nodes, %d IRQs, %d PCIe devices, boot file %s"
        % (label, name, board["model"], sum(len(c["cpus"]) for c in board["clusters"]), len(board["clusters"]),
           len(board["devfreq"]), len(board["irqs"]), len(report["pcie"]),
           next(iter(board["boot_files"]), "none")))
    for line in report["heuristics"] + report["notes"]:
        say("note: " + line)
    if report["unreadable"]:
        say("not readable (left out): " + ", ".join("%s (%s)" % i for i in sorted(report["unreadable"].items())))
    where = "" if not args.out else "EDGETUNE_CAPTURED_DIR=%s " % out_dir
    say("wrote %s; draft profile %s (see its TODO(person) lines); boot twins of it with `%sedgetune-dev twin up "
        "--fleet captured/%s:2`" % (target, target / "profile" / (name + ".yml"), where, name))
    print(target)
    return 0


def add_parser(twin_sub):
    p = twin_sub.add_parser("capture", help="read a real board over SSH (read-only) and write a twin board of it")
    p.add_argument("host", nargs="?", help="the board: an SSH host (or its inventory name with -i)")
    p.add_argument("-i", "--inventory", help="take host, user, port, key and known_hosts from this Ansible inventory")
    p.add_argument("--name", help="the captured board's name (default: the host's)")
    p.add_argument("--out", help="captured-boards directory (default: $EDGETUNE_CAPTURED_DIR or .cache/captured)")
    p.add_argument("-u", "--user", help="SSH user (default: inventory, ~/.ssh/config, $USER)")
    p.add_argument("-p", "--port", type=int, help="SSH port")
    p.add_argument("--identity", action="append", metavar="KEY", help="private key file (repeatable)")
    p.add_argument("--known-hosts", action="append", metavar="FILE",
                   help="also trust the host keys in FILE (repeatable); keys are always checked")
    p.add_argument("--ssh-config", metavar="FILE", help="ssh config file (default ~/.ssh/config)")
    p.add_argument("--sudo", action="store_true",
                   help="read root-only files (full PCIe config space, debugfs) with sudo -n; never prompts")
    p.add_argument("--root", metavar="DIR", help="capture a device's root directory instead of a host")
    p.add_argument("--timeout", type=int, default=devices.DEFAULT_TIMEOUT, help="SSH timeout in seconds")
    p.add_argument("--force", action="store_true", help="replace an earlier capture of the same name")
    p.set_defaults(func=cmd_capture)
