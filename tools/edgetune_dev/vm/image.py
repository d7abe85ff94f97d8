"""Build the VM twin's disk image (cached under ~/.cache/edgetune/vm/<digest>/).

A raw disk with one msdos partition (ext4 without metadata_csum and 64bit, so
syslinux reads it), a debootstrapped Debian with its distribution kernel,
syslinux's extlinux as the bootloader reading /boot/extlinux/extlinux.conf in
L4T's layout, SSH with a host key and a root key made here, and the board
identity of the container twins (tools/edgetune_dev/twin/guest) in VM mode.
Packages come only from the machine's own apt mirror (read at run time).
"""
import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

from edgetune_dev import host_packages
from edgetune.errors import UsageError
from edgetune_dev.twin import manager

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
# The image is shared by every checkout on the machine (a few GiB and minutes
# to build, so a fresh clone does not build it again): the user's cache, one
# directory per digest of the image's inputs.
CACHE = Path(os.environ.get("EDGETUNE_VM_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgetune" / "vm")
TWIN_GUEST = manager.HERE / "guest"
VM_GUEST = HERE / "guest"

BOARD = "orin-nx-16gb-r36"
DISTRO = "bookworm"
DISK_BYTES = 4 << 30
PART_OFFSET = 1 << 20
# With bcc, pyroute2 and the kernel's headers, as edge_netqos installs them on a
# board: the classifier is compiled and attached on the VM's own kernel.
PACKAGES = sorted(set(manager.BASE_PACKAGES) | {
    "linux-image-amd64", "initramfs-tools", "udev", "openssh-server",
    "linux-headers-amd64", "python3-bpfcc", "python3-pyroute2"})
# The host key's name in known_hosts: the VM answers on a port chosen at `up`.
HOST_KEY_ALIAS = "edgetune-vm-" + BOARD
MBR_BIN = Path("/usr/lib/syslinux/mbr/mbr.bin")
# Host packages, as host_packages.require() takes them: {package: commands or files it provides}.
RUN_PACKAGES = {"qemu-system-x86": ["qemu-system-x86_64"], "qemu-utils": ["qemu-img"]}
BUILD_PACKAGES = {"debootstrap": ["debootstrap"], "extlinux": ["extlinux"], "syslinux-common": [str(MBR_BIN)],
                  "mount": ["losetup"], "e2fsprogs": ["mkfs.ext4"], "openssh-client": ["ssh-keygen"]}


def run(argv, **kwargs):
    return manager.run(argv, **kwargs)


def check(argv, what, **kwargs):
    result = run(argv, **kwargs)
    if result.returncode != 0:
        tail = " | ".join(((result.stdout or "") + (result.stderr or "")).strip().splitlines()[-3:])
        raise UsageError("%s failed: %s" % (what, tail))
    return result


def require_loop():
    if os.geteuid() != 0:
        raise UsageError("building the VM image needs root (loop devices, mount, debootstrap)")
    if not Path("/dev/loop-control").exists() or run(["losetup", "-f"]).returncode != 0:
        raise UsageError("no free loop device: load the loop module (modprobe loop) or run where /dev/loop* exist")


def inputs_digest():
    """Digest of everything that goes into the image (not the mirror)."""
    h = hashlib.sha256()
    h.update(json.dumps({"distro": DISTRO, "board": BOARD, "packages": PACKAGES,
                         "disk": DISK_BYTES}).encode())
    files = [Path(__file__).resolve()] + sorted(VM_GUEST.rglob("*")) + sorted(TWIN_GUEST.rglob("*"))
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(HERE.parent)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def image_dir():
    return CACHE / inputs_digest()


def cached():
    """The cached image's directory if it is complete, else None."""
    d = image_dir()
    return d if (d / "image.json").exists() else None


# ---------------------------------------------------------------- boot file
def extlinux_conf(root_uuid, kernel, initrd):
    """NVIDIA's r36 extlinux.conf (the twin's fixture) made bootable on x86:
    syslinux's serial directives first, the primary entry's LINUX/INITRD at the
    Debian kernel, no FDT, APPEND without ${cbootargs} (syslinux passes text
    as is) and the args an x86 kernel with a virtio disk needs."""
    fixture = (TWIN_GUEST / "bootfiles" / "l4t-r36-orin-nx.extlinux.conf").read_text()
    head = ("# syslinux: boot prompt and messages on the first serial port (edgetune VM twin)\n"
            "SERIAL 0 115200\nPROMPT 1\n")
    append = ("root=UUID=%s rw rootwait rootfstype=ext4 console=tty0 console=ttyS0,115200n8 "
              "net.ifnames=0" % root_uuid)
    out, in_primary = [], False
    for line in fixture.splitlines():
        code = line.split("#", 1)[0].strip()
        if code.startswith("LABEL"):
            in_primary = code.split(None, 1)[1] == "primary"
        if in_primary and code.startswith("FDT"):
            continue
        if in_primary and code.startswith("LINUX"):
            line = line[:line.index("LINUX")] + "LINUX " + kernel
        elif in_primary and code.startswith("INITRD"):
            line = line[:line.index("INITRD")] + "INITRD " + initrd
        elif in_primary and code.startswith("APPEND"):
            line = line[:line.index("APPEND")] + "APPEND " + append
        out.append(line)
    return head + "\n".join(out) + "\n"


def mbr_partition_table(disk_bytes):
    """One bootable Linux partition from 1 MiB to the end (msdos label)."""
    start = PART_OFFSET // 512
    count = disk_bytes // 512 - start
    entry = struct.pack("<B3sB3sII", 0x80, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff", start, count)
    return entry + b"\0" * 48, struct.pack("<I", int.from_bytes(os.urandom(4), "little") or 1)


# ---------------------------------------------------------------- build
def build(say=print, force=False):
    """Build (or reuse) the image; returns its cache directory."""
    # qemu too, though only `vm up` runs it: make test builds the image before
    # it starts the VM scenario beside other work that may use apt. One apt run.
    done = cached()
    if done and not force:
        host_packages.require(RUN_PACKAGES, say)
        return done
    host_packages.require(dict(RUN_PACKAGES, **BUILD_PACKAGES), say)
    require_loop()
    mirror = manager.apt_mirror()
    target = image_dir()
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=str(CACHE)))
    mnt = work / "root"
    mnt.mkdir()
    disk = work / "disk.img"
    loop = None
    mounted = []
    try:
        with open(disk, "wb") as f:
            f.truncate(DISK_BYTES)
            table, signature = mbr_partition_table(DISK_BYTES)
            f.seek(440)
            f.write(signature + b"\0\0" + table + b"\x55\xaa")
        loop = check(["losetup", "-f", "--show", "-o", str(PART_OFFSET), "--sizelimit",
                      str(DISK_BYTES - PART_OFFSET), str(disk)], "losetup").stdout.strip()
        check(["mkfs.ext4", "-q", "-F", "-O", "^metadata_csum,^64bit", "-L", "edgetune-root", loop], "mkfs.ext4")
        uuid = check(["blkid", "-s", "UUID", "-o", "value", loop], "blkid").stdout.strip()
        check(["mount", loop, str(mnt)], "mount")
        mounted.append(mnt)
        say("debootstrap %s with %s (a few minutes)" % (DISTRO, ", ".join(PACKAGES)))
        check(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), DISTRO, str(mnt), mirror],
              "debootstrap %s" % DISTRO)
        for deb in (mnt / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        configure(mnt, work, uuid, say)
        for sub in ("dev", "proc", "sys"):
            if (mnt / sub).is_mount():
                run(["umount", "-l", str(mnt / sub)])
        check(["extlinux", "--install", str(mnt / "boot/extlinux")], "extlinux --install")
        check(["umount", str(mnt)], "umount")
        mounted.remove(mnt)
        check(["losetup", "-d", loop], "losetup -d")
        loop = None
        with open(disk, "r+b") as f, open(MBR_BIN, "rb") as mbr:
            f.write(mbr.read()[:440])
        (work / "image.json").write_text(json.dumps({
            "board": BOARD, "distro": DISTRO, "root_uuid": uuid, "host_key_alias": HOST_KEY_ALIAS,
            "packages": PACKAGES}, indent=2) + "\n")
        (mnt).rmdir()
        if target.exists():
            shutil.rmtree(target)
        os.rename(work, target)
        work = None
        prune(keep=target)
        say("VM image %s" % (target / "disk.img"))
        return target
    finally:
        for path in reversed(mounted):
            for sub in ("dev", "proc", "sys"):
                run(["umount", "-l", str(path / sub)])
            run(["umount", "-l", str(path)])
        if loop:
            run(["losetup", "-d", loop])
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def prune(keep):
    """Drop images built from older inputs (a few GiB each, sparse)."""
    for old in CACHE.glob("*/image.json"):
        if old.parent != keep:
            shutil.rmtree(old.parent, ignore_errors=True)


def chroot(mnt, *argv):
    return check(["chroot", str(mnt), *argv], " ".join(argv[:3]),
                 env=dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C"))


def configure(mnt, work, uuid, say):
    for sub, fstype in (("proc", "proc"), ("sys", "sysfs"), ("dev", None)):
        if fstype:
            check(["mount", "-t", fstype, fstype, str(mnt / sub)], "mount " + sub)
        else:
            check(["mount", "--bind", "/dev", str(mnt / sub)], "mount dev")
    etc = mnt / "etc"
    (etc / "hostname").write_text("orin-nx-vm\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 orin-nx-vm\n")
    (etc / "fstab").write_text("UUID=%s / ext4 defaults,errors=remount-ro 0 1\n" % uuid)
    (etc / "systemd/network").mkdir(exist_ok=True)
    (etc / "systemd/network/20-wired.network").write_text(
        "[Match]\nName=eth* en*\n\n[Network]\nDHCP=ipv4\n")
    # Under emulation, nothing periodic that competes with the tests.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "systemd-networkd-wait-online.service",
                 "e2scrub_all.timer", "fstrim.timer", "getty@tty1.service"):
        masked = etc / "systemd/system" / unit
        if not masked.exists():
            masked.symlink_to("/dev/null")
    chroot(mnt, "systemctl", "enable", "systemd-networkd", "ssh")

    # SSH: one host key made here and recorded; root logs in with a key made here.
    for old in (etc / "ssh").glob("ssh_host_*"):
        old.unlink()
    check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", HOST_KEY_ALIAS,
           "-f", str(etc / "ssh/ssh_host_ed25519_key")], "ssh-keygen host key")
    (etc / "ssh/sshd_config.d").mkdir(exist_ok=True)
    (etc / "ssh/sshd_config.d/edgetune-vm.conf").write_text(
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nUseDNS no\n")
    check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edgetune-vm-root",
           "-f", str(work / "id_ed25519")], "ssh-keygen root key")
    ssh_dir = mnt / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(work / "id_ed25519.pub", ssh_dir / "authorized_keys")
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    host_pub = (etc / "ssh/ssh_host_ed25519_key.pub").read_text().split()
    (work / "known_hosts").write_text("%s %s %s\n" % (HOST_KEY_ALIAS, host_pub[0], host_pub[1]))

    # Board identity: the container twin's guest files, its persistent-file
    # installer run once here (without its boot file: the VM boots its own),
    # and the VM-mode power-on unit.
    guest = mnt / "usr/lib/edgetune-twin"
    shutil.copytree(TWIN_GUEST, guest, ignore=shutil.ignore_patterns("__pycache__"))
    vm_guest = mnt / "usr/lib/edgetune-vm"
    shutil.copytree(VM_GUEST, vm_guest, ignore=shutil.ignore_patterns("__pycache__"))
    (etc / "edgetune-twin").mkdir(exist_ok=True)
    (etc / "edgetune-twin/board").write_text(BOARD + "\n")
    chroot(mnt, "python3", "-c", (
        "import importlib.machinery as m, importlib.util as u\n"
        "l = m.SourceFileLoader('t', '/usr/lib/edgetune-twin/edgetune-twin-boot')\n"
        "t = u.module_from_spec(u.spec_from_loader('t', l)); l.exec_module(t)\n"
        "b = t.load_board(t.board_name()); b.pop('boot_files', None)\n"
        "t.install_persistent_files(b)\n"))
    # nvpmodel: the twin's simulator, minus what the real kernel does itself.
    shutil.copyfile(vm_guest / "nvpmodel", mnt / "usr/sbin/nvpmodel")
    os.chmod(mnt / "usr/sbin/nvpmodel", 0o755)
    shutil.copyfile(vm_guest / "edgetune-twin-boot.service", etc / "systemd/system/edgetune-twin-boot.service")
    shutil.copyfile(guest / "nvpmodel.service", etc / "systemd/system/nvpmodel.service")
    chroot(mnt, "systemctl", "enable", "edgetune-twin-boot.service", "nvpmodel.service")

    # The bootloader file, in L4T's layout, at the Debian kernel.
    kernels = sorted((mnt / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise UsageError("debootstrap installed no kernel in /boot")
    version = kernels[-1].name[len("vmlinuz-"):]
    (mnt / "boot/extlinux").mkdir(exist_ok=True)
    (mnt / "boot/extlinux/extlinux.conf").write_text(
        extlinux_conf(uuid, "/boot/vmlinuz-" + version, "/boot/initrd.img-" + version))
    say("image configured: kernel %s, root UUID %s" % (version, uuid))
