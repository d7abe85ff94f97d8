"""Run the VM twin under qemu (software emulation) and reach it over SSH.

One VM at a time, its run state in .cache/vm/run/: a copy-on-write overlay on
the cached image (the image stays clean), the serial console as a unix socket
with everything it printed in serial.log, qemu's monitor socket, and the SSH
port and the runtime's port forwarded on 127.0.0.1 only (user-mode networking
with restrict=on: the VM reaches nothing beyond its own DHCP; packets it sends
elsewhere still leave its eth0, where the inference QoS counts them).
"""
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import yaml

from edgetune_dev import host_packages
from edgetune.errors import UsageError
from edgetune_dev.vm import image

NAME = "vm-" + image.BOARD
RUN = image.REPO / ".cache" / "vm" / "run"   # this checkout's VM, not the shared image cache
HOST_VARS = Path(__file__).resolve().parent / "host_vars" / (NAME + ".yml")
CPUS = 8          # the board's CPU count: isolcpus=4-7 means what it says
MEMORY_MB = 2048
BOOT_TIMEOUT = 600   # boot under emulation on a loaded 2-core machine: 1-2.5 min seen
INVENTORY_FILE = "vm.yml"
RUNTIME_PORT = 8470   # edge_runtime_port's default; the VM's host vars may set another


def run(argv, **kwargs):
    return image.run(argv, **kwargs)


# ---------------------------------------------------------------- state
def state():
    """The running VM's state, or None when no qemu of ours is running."""
    try:
        data = json.loads((RUN / "state.json").read_text())
        pid = int((RUN / "qemu.pid").read_text().strip())
        cmdline = Path("/proc/%d/cmdline" % pid).read_bytes()
    except (OSError, ValueError):
        return None
    if b"qemu-system" not in cmdline or str(RUN).encode() not in cmdline:
        return None
    data["pid"] = pid
    return data


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ssh_argv(st, *command, connect_timeout=5):
    img = Path(st["image"])
    return ["ssh", "-p", str(st["port"]), "-i", str(img / "id_ed25519"),
            "-o", "UserKnownHostsFile=" + str(img / "known_hosts"),
            "-o", "StrictHostKeyChecking=yes", "-o", "HostKeyAlias=" + image.HOST_KEY_ALIAS,
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=%d" % connect_timeout, "root@127.0.0.1", *command]


def ssh_answers(st):
    return run(ssh_argv(st, "true"), timeout=30).returncode == 0


def serial_tail(lines=8):
    try:
        text = (RUN / "serial.log").read_bytes().decode("utf-8", "replace")
    except OSError:
        return "no serial output"
    tail = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return "\n".join(tail[-lines:]) or "no serial output"


# ---------------------------------------------------------------- up / down
def up(inventory_dir="inventory/twin", timeout=BOOT_TIMEOUT, port=None, say=print):
    """Boot the cached image (built first if need be), wait for SSH, write the inventory."""
    host_packages.require(image.RUN_PACKAGES, say)
    st = state()
    if st is None:
        img = image.cached() or image.build(say)
        st = start(img, port or free_port(), say)
    else:
        say("VM %s already running (pid %d, port %d)" % (NAME, st["pid"], st["port"]))
    wait_ssh(st, timeout, say)
    path = write_inventory(st, inventory_dir)
    return st, path


def start(img, port, say):
    if RUN.exists():
        shutil.rmtree(RUN)
    RUN.mkdir(parents=True)
    overlay = RUN / "overlay.qcow2"
    image.check(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(img / "disk.img"),
                 str(overlay)], "qemu-img create")
    runtime_port = (yaml.safe_load(HOST_VARS.read_text()) or {}).get("edge_runtime_port", RUNTIME_PORT)
    forwards = {"22": port, str(runtime_port): free_port()}
    st = {"name": NAME, "port": port, "forwards": forwards, "image": str(img), "started": time.time()}
    argv = ["qemu-system-x86_64", "-accel", "tcg", "-name", NAME, "-cpu", "max",
            "-smp", str(CPUS), "-m", str(MEMORY_MB),
            "-drive", "file=%s,if=virtio,format=qcow2" % overlay,
            "-netdev", "user,id=n0,restrict=on," + ",".join(
                "hostfwd=tcp:127.0.0.1:%d-:%s" % (host, guest) for guest, host in sorted(forwards.items())),
            "-device", "virtio-net-pci,netdev=n0",
            "-chardev", "socket,id=s0,path=%s,server=on,wait=off,logfile=%s,logappend=on"
            % (RUN / "serial.sock", RUN / "serial.log"),
            "-serial", "chardev:s0",
            "-monitor", "unix:%s,server=on,wait=off" % (RUN / "monitor.sock"),
            # No display: a framebuffer console costs minutes of boot under emulation.
            "-display", "none", "-vga", "none", "-daemonize", "-pidfile", str(RUN / "qemu.pid")]
    # The recorded host key, at a stable path for tools that cannot know the
    # image's digest (molecule's ssh options).
    shutil.copyfile(img / "known_hosts", RUN / "known_hosts")
    (RUN / "state.json").write_text(json.dumps(st) + "\n")
    result = run(argv)
    if result.returncode != 0:
        raise UsageError("qemu did not start: %s" % (result.stderr.strip().splitlines() or ["?"])[-1])
    st = state()
    if st is None:
        raise UsageError("qemu exited at once; serial log %s:\n%s" % (RUN / "serial.log", serial_tail()))
    say("VM %s booting under emulation (pid %d, ssh on 127.0.0.1:%d)" % (NAME, st["pid"], port))
    return st


def wait_ssh(st, timeout, say=print):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if state() is None:
            break
        if ssh_answers(st):
            return
        time.sleep(3)
    saved = RUN.parent / ("serial-failed-%d.log" % int(time.time()))
    if (RUN / "serial.log").exists():
        shutil.copyfile(RUN / "serial.log", saved)
    alive = state() is not None
    raise UsageError("VM %s %s within %d s; serial console log saved to %s, last lines:\n%s"
                     % (NAME, "did not answer on SSH" if alive else "stopped", timeout, saved, serial_tail()))


def down(inventory_dir="inventory/twin"):
    st = state()
    if st is not None:
        os.kill(st["pid"], signal.SIGTERM)
        deadline = time.time() + 20
        while time.time() < deadline and state() is not None:
            time.sleep(0.5)
        if state() is not None:
            os.kill(st["pid"], signal.SIGKILL)
    for name in ("overlay.qcow2", "serial.sock", "monitor.sock", "qemu.pid", "state.json"):
        try:
            (RUN / name).unlink()
        except FileNotFoundError:
            pass
    try:
        (Path(inventory_dir) / INVENTORY_FILE).unlink()
    except FileNotFoundError:
        pass
    return st is not None


# ---------------------------------------------------------------- inventory
def host_vars(st):
    img = Path(st["image"])
    connection = {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": st["port"],
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(img / "id_ed25519"),
        "ansible_ssh_common_args": " ".join([
            "-o UserKnownHostsFile=%s" % (img / "known_hosts"), "-o StrictHostKeyChecking=yes",
            "-o HostKeyAlias=%s" % image.HOST_KEY_ALIAS, "-o IdentitiesOnly=yes",
            # A VM that reboots into a kernel without network never resets the
            # old TCP connection behind user-mode networking: without keep-alives
            # Ansible's SSH control master waits on it forever.
            "-o ServerAliveInterval=5", "-o ServerAliveCountMax=6"]),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    connection.update(yaml.safe_load(HOST_VARS.read_text()) or {})
    return connection


def write_inventory(st, directory):
    inventory = {"all": {"children": {"twins": {"children": {
        "orin-fleet": {"hosts": {NAME: host_vars(st)}},
        "vm-twins": {"hosts": {NAME: None}},
    }}}}}
    path = Path(directory) / INVENTORY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by `edgetune-dev vm up`: the VM twin (removed by `edgetune-dev vm down`).\n"
                    + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False))
    return path


# ---------------------------------------------------------------- console
def monitor(command):
    """One qemu monitor command (e.g. system_reset: the board's reset button)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(RUN / "monitor.sock"))
        s.settimeout(5)
        s.recv(4096)
        s.sendall(command.encode() + b"\n")
        time.sleep(0.5)


def serial_socket():
    if state() is None:
        raise UsageError("no VM twin is running; start it with `edgetune-dev vm up`")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(RUN / "serial.sock"))
    except OSError as exc:
        raise UsageError("cannot open the serial console %s: %s (is another console attached?)"
                         % (RUN / "serial.sock", exc)) from None
    return s


def boot_label(label, reset=False, timeout=120, say=print):
    """Type a label at the syslinux boot: prompt over the serial console, as a
    user at the board's serial port would (after pressing reset if asked)."""
    s = serial_socket()
    try:
        if reset:
            monitor("system_reset")
            say("VM reset")
        seen = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            ready, _, _ = select.select([s], [], [], 1)
            if ready:
                chunk = s.recv(4096)
                if not chunk:
                    break
                seen = (seen + chunk)[-4096:]
                if b"boot:" in seen:
                    for char in label.encode() + b"\r":
                        s.sendall(bytes([char]))
                        time.sleep(0.02)
                    say("typed %r at the boot: prompt" % label)
                    return True
        raise UsageError("no syslinux boot: prompt on the serial console within %d s; last lines:\n%s"
                         % (timeout, serial_tail()))
    finally:
        s.close()


def interactive_console():
    """Attach the terminal to the serial console; Ctrl-] detaches."""
    s = serial_socket()
    stdin = sys.stdin.fileno()
    old = None
    if os.isatty(stdin):
        import termios
        import tty
        old = termios.tcgetattr(stdin)
        tty.setraw(stdin)
    print("edgetune: serial console of %s (Ctrl-] detaches)\r" % NAME, file=sys.stderr)
    try:
        while True:
            ready, _, _ = select.select([s, stdin], [], [])
            if s in ready:
                data = s.recv(4096)
                if not data:
                    return
                os.write(sys.stdout.fileno(), data)
            if stdin in ready:
                data = os.read(stdin, 1024)
                if not data or b"\x1d" in data:
                    return
                s.sendall(data)
    finally:
        if old is not None:
            import termios
            termios.tcsetattr(stdin, termios.TCSADRAIN, old)
        s.close()
