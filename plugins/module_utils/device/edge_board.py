# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the board is, read from the device itself (Python 3.8+, stdlib only).

Every reader takes ``root`` (default ``/``) so unit tests run on fixture
trees.  Nothing here writes.  Sources of each fact are the ones documented in
the project's HARDWARE notes: device tree for identity, /etc/nv_tegra_release
or /etc/armbian-release for the BSP, cpufreq policies for clusters, the kernel
config for the features the roles depend on.
"""
import gzip
import os
import re
import shutil

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import parse_cpulist

# Kernel options the roles depend on, by the feature name the roles use.
KERNEL_FEATURES = {
    "bpf_syscall": "CONFIG_BPF_SYSCALL",
    "cgroup_bpf": "CONFIG_CGROUP_BPF",
    "sock_cgroup_data": "CONFIG_SOCK_CGROUP_DATA",
    "htb": "CONFIG_NET_SCH_HTB",
    "cls_bpf": "CONFIG_NET_CLS_BPF",
    "act_bpf": "CONFIG_NET_ACT_BPF",
    "clsact": "CONFIG_NET_SCH_INGRESS",
    "rt_group_sched": "CONFIG_RT_GROUP_SCHED",
    "cpusets": "CONFIG_CPUSETS",
    "no_hz_full": "CONFIG_NO_HZ_FULL",
    "rcu_nocb": "CONFIG_RCU_NOCB_CPU",
}


def path(root, *parts):
    return os.path.join(root, *[p.lstrip("/") for p in parts])


def read(root, name, default=None, binary=False):
    try:
        with open(path(root, name), "rb" if binary else "r") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return default


def device_tree(root="/"):
    """Model and compatible strings (NUL separated in the device tree)."""
    for base in ("/sys/firmware/devicetree/base", "/proc/device-tree"):
        model = read(root, base + "/model", binary=True)
        if model is not None:
            compatible = read(root, base + "/compatible", default=b"", binary=True)
            return {
                "model": model.rstrip(b"\0").decode("utf-8", "replace").strip(),
                "compatible": [c.decode("utf-8", "replace") for c in compatible.split(b"\0") if c],
                "source": base,
            }
    return {"model": None, "compatible": [], "source": None}


def soc_family(compatible):
    """The SoC from the least specific compatible string, e.g. tegra234, rk3588."""
    for entry in reversed(compatible):
        vendor, _sep, chip = entry.partition(",")
        if vendor in ("nvidia", "rockchip") and re.match(r"^(tegra\d+|rk\d+\w*)$", chip):
            return chip
    return None


def l4t_release(root="/"):
    """'# R36 (release), REVISION: 4.3, ...' -> {'major': 36, 'revision': '4.3', 'version': '36.4.3'}."""
    text = read(root, "/etc/nv_tegra_release")
    if text is None:
        return None
    match = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    if not match:
        return {"major": None, "revision": None, "version": None, "raw": text.splitlines()[0] if text else ""}
    major, revision = int(match.group(1)), match.group(2)
    return {"major": major, "revision": revision, "version": "%d.%s" % (major, revision)}


def key_value_file(root, name):
    text = read(root, name)
    if text is None:
        return None
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip().strip('"')
    return values


def bsp_release(root="/"):
    """Armbian (or the distribution) release for non-Jetson boards."""
    armbian = key_value_file(root, "/etc/armbian-release")
    if armbian is not None:
        return {"name": "armbian", "version": armbian.get("VERSION"), "branch": armbian.get("BRANCH"),
                "family": armbian.get("LINUXFAMILY"), "board": armbian.get("BOARD")}
    osrel = key_value_file(root, "/etc/os-release") or {}
    return {"name": osrel.get("ID"), "version": osrel.get("VERSION_ID"), "branch": None,
            "family": None, "board": None}


def cpu_topology(root="/"):
    """Online/present CPUs and the cpufreq clusters (one per policy)."""
    base = "/sys/devices/system/cpu"
    topo = {
        "present": parse_cpulist(read(root, base + "/present", "")),
        "online": parse_cpulist(read(root, base + "/online", "")),
        "isolated": parse_cpulist(read(root, base + "/isolated", "")),
        # The CPUs the running kernel schedules on (the cpuN lines of /proc/stat): a device twin
        # fakes the board's sysfs but runs on its host's CPUs.
        "scheduled": sorted(int(n) for n in re.findall(r"(?m)^cpu([0-9]+) ", read(root, "/proc/stat", "") or "")),
        "clusters": [],
    }
    policies_dir = path(root, base, "cpufreq")
    names = os.listdir(policies_dir) if os.path.isdir(policies_dir) else []
    for name in sorted((n for n in names if re.match(r"^policy\d+$", n)), key=lambda n: int(n[6:])):
        pdir = base + "/cpufreq/" + name

        def attr(key, pdir=pdir):
            value = read(root, pdir + "/" + key)
            return value.strip() if value is not None else None

        cpus = [int(c) for c in (attr("related_cpus") or "").split()]
        freqs = [int(f) for f in (attr("scaling_available_frequencies") or "").split()]
        topo["clusters"].append({
            "policy": int(name[6:]),
            "cpus": cpus,
            "governor": attr("scaling_governor"),
            "governors": (attr("scaling_available_governors") or "").split(),
            "frequencies": freqs,
            "min_freq": int(attr("cpuinfo_min_freq") or 0),
            "max_freq": int(attr("cpuinfo_max_freq") or 0),
        })
    return topo


def devfreq_nodes(root="/"):
    base = path(root, "/sys/class/devfreq")
    nodes = {}
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        def attr(key, name=name):
            value = read(root, "/sys/class/devfreq/%s/%s" % (name, key))
            return value.strip() if value is not None else None
        nodes[name] = {
            "governor": attr("governor"),
            "governors": (attr("available_governors") or "").split(),
            "frequencies": [int(f) for f in (attr("available_frequencies") or "").split()],
        }
    return nodes


def cgroup_mode(root="/"):
    """unified (v2), hybrid (v1 + v2 at /sys/fs/cgroup/unified) or legacy (v1)."""
    return cgroup_mode_of(read(root, "/proc/self/mountinfo"))


def cgroup_mode_of(mountinfo):
    """The cgroup mode a /proc/self/mountinfo text shows (see :func:`cgroup_mode`); None or
    text without a cgroup mount -> legacy.  For readers that get the text another way
    (``edgetune twin capture`` reads it over SSH)."""
    mounts = {}
    for line in (mountinfo or "").splitlines():
        left, _sep, right = line.partition(" - ")
        fields, fstype = left.split(), right.split()[:1]
        if len(fields) >= 5 and fstype:  # the last mount on a point is the one seen
            mounts[fields[4]] = fstype[0]
    if mounts.get("/sys/fs/cgroup") == "cgroup2":
        return "unified"
    if mounts.get("/sys/fs/cgroup/unified") == "cgroup2":
        return "hybrid"
    return "legacy"


def systemd_device_units(root="/"):
    """Whether systemd can manage device units (sys-subsystem-net-devices-eth0.device): not
    where /sys is mounted read-only, as in a container (systemd's device_supported(),
    src/core/device.c), where a unit bound to one fails at once ("Dependency failed").
    True when the mount table does not say (a board)."""
    read_only = False
    for line in (read(root, "/proc/self/mountinfo") or "").splitlines():
        left, _sep, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) >= 6 and fields[4] == "/sys":  # the last mount on /sys is the one seen
            read_only = "ro" in fields[5].split(",") or (len(after) >= 3 and "ro" in after[2].split(","))
    return not read_only


def kernel_config(root="/", release=None):
    """The running kernel's config items, from /proc/config.gz or /boot."""
    raw = read(root, "/proc/config.gz", binary=True)
    source = "/proc/config.gz"
    text = None
    if raw is not None:
        try:
            text = gzip.decompress(raw).decode("utf-8", "replace")
        except (OSError, EOFError):
            text = None
    if text is None and release:
        source = "/boot/config-%s" % release
        text = read(root, source)
    if text is None:
        return None, None
    return parse_kernel_config(text), source


def parse_kernel_config(text):
    """A kernel config's ``CONFIG_X=value`` lines -> {CONFIG_X: value} (quotes stripped; unset items absent)."""
    config = {}
    for line in text.splitlines():
        match = re.match(r"^(CONFIG_\w+)=(.*)$", line)
        if match:
            config[match.group(1)] = match.group(2).strip('"')
    return config


def kernel_features(config):
    """Feature -> True/False, or None when the kernel config is not readable."""
    if config is None:
        return dict((name, None) for name in KERNEL_FEATURES)
    return dict((name, config.get(option) in ("y", "m")) for name, option in KERNEL_FEATURES.items())


def detect_bootloader(root="/", which=shutil.which):
    """The boot configuration this board really uses, in the order of the
    HARDWARE notes (Jetson first, then Armbian, u-boot-menu, GRUB, plain
    extlinux).  Returns (name, path) or (None, list of what was looked for)."""
    def exists(name):
        return os.path.exists(path(root, name))

    if exists("/etc/nv_tegra_release") and exists("/boot/extlinux/extlinux.conf"):
        return "extlinux", "/boot/extlinux/extlinux.conf"
    if exists("/boot/armbianEnv.txt"):
        return "armbian", "/boot/armbianEnv.txt"
    if which("u-boot-update"):
        if exists("/etc/kernel/cmdline"):
            return "uboot_menu", "/etc/kernel/cmdline"
        if exists("/etc/default/u-boot"):
            return "uboot_menu", "/etc/default/u-boot"
    if exists("/etc/default/grub") and (which("update-grub") or which("grub-mkconfig")):
        return "grub", "/etc/default/grub.d/99-edgetune.cfg"
    if exists("/boot/extlinux/extlinux.conf"):
        return "extlinux", "/boot/extlinux/extlinux.conf"
    return None, ["/etc/nv_tegra_release + /boot/extlinux/extlinux.conf", "/boot/armbianEnv.txt",
                  "/etc/kernel/cmdline or /etc/default/u-boot with u-boot-update",
                  "/etc/default/grub with update-grub", "/boot/extlinux/extlinux.conf"]


def rt_throttle(root="/"):
    """The kernel's RT throttling, kernel.sched_rt_period_us and sched_rt_runtime_us (-1: unlimited)."""
    values = {}
    for key in ("rt_period_us", "rt_runtime_us"):
        text = (read(root, "/proc/sys/kernel/sched_" + key) or "").strip()
        values[key] = int(text) if re.match(r"^-?\d+$", text) else None
    return values


def memory_kb(root="/"):
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", read(root, "/proc/meminfo", ""), re.M)
    return int(match.group(1)) if match else None


def systemd_version(run_command):
    rc, out, _err = run_command(["systemctl", "--version"])
    match = re.match(r"systemd (\d+)", out or "")
    return int(match.group(1)) if rc == 0 and match else None
