"""`edgetune-dev twin capture`: each built-in twin board, powered on into a directory
by the twin's own boot script, captured back (from the directory and over a
real SSH connection to a local paramiko server) gives the hand-written board
file; refusals are one clean line with exit 2; the device is not changed.
"""
import builtins
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import socket
import threading
import time
import types
from pathlib import Path

import pytest

from edgetune_dev import cli
from edgetune_dev.twin import capture, device, manager

# The test server's transport threads may see the client hang up first (the refusals close the
# connection at once): paramiko's server side then ends its thread with ConnectionResetError.
pytestmark = [pytest.mark.controller,
              pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")]
paramiko = pytest.importorskip("paramiko")

GUEST = manager.HERE / "guest"
BOARDS = sorted(manager.builtin_boards())
OS_RELEASE = {"bookworm": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
                          "VERSION_CODENAME=bookworm\n",
              "bullseye": 'PRETTY_NAME="Debian GNU/Linux 11 (bullseye)"\nID=debian\nVERSION_ID="11"\n'
                          "VERSION_CODENAME=bullseye\n"}
MOUNTINFO = {"unified": "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
             "hybrid": "35 24 0:30 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
                       "36 35 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"}


# --------------------------------------------------------------------------
# The twin's power-on, into a directory: the boot script itself, with its
# absolute paths redirected below ``root`` (its guest files read from the
# checkout) and its mounts, immutable flags and link-partner fork left out.
def power_on(board_name, root):
    loader = importlib.machinery.SourceFileLoader("twin_boot_%s" % board_name.replace("-", "_"),
                                                  str(GUEST / "edgetune-twin-boot"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    boot = importlib.util.module_from_spec(spec)
    loader.exec_module(boot)
    root = str(root)

    def at(path):
        path = os.fspath(path)
        if path.startswith(boot.GUEST + "/"):
            return str(GUEST) + path[len(boot.GUEST):]
        return os.path.join(root, path.lstrip("/")) if path.startswith("/") else path

    fake_path = types.SimpleNamespace(
        join=os.path.join, dirname=os.path.dirname, basename=os.path.basename, relpath=os.path.relpath,
        exists=lambda p: os.path.exists(at(p)), lexists=lambda p: os.path.lexists(at(p)),
        isdir=lambda p: os.path.isdir(at(p)), islink=lambda p: os.path.islink(at(p)))
    fake_os = types.SimpleNamespace(
        path=fake_path, makedirs=lambda p, **k: os.makedirs(at(p), **k), chmod=lambda p, m: os.chmod(at(p), m),
        symlink=lambda target, p: os.symlink(target, at(p)), unlink=lambda p: os.unlink(at(p)),
        listdir=lambda p: os.listdir(at(p)), mkdir=lambda p: os.makedirs(at(p), exist_ok=True),
        fork=lambda: 4242, devnull=os.devnull)
    boot.os = fake_os
    boot.open = lambda p, *a, **k: builtins.open(at(p), *a, **k)

    def copyfile(src, dst):
        os.makedirs(os.path.dirname(at(dst)), exist_ok=True)   # the image has /usr/sbin, /usr/bin
        shutil.copyfile(at(src), at(dst))
    boot.shutil = types.SimpleNamespace(copyfile=copyfile)

    def sh(*argv):   # a bind mount of a file over another: its content there
        if argv[:2] == ("mount", "--bind") and os.path.isfile(at(argv[2])):
            os.makedirs(os.path.dirname(at(argv[3])), exist_ok=True)
            shutil.copyfile(at(argv[2]), at(argv[3]))
    boot.sh = sh
    boot.cover = lambda path, keep=True, skip=(): os.makedirs(at(path), exist_ok=True)
    boot.bind_file = lambda content, target: boot.write(target, content, 0o444)
    boot.make_immutable = lambda path: None
    boot.make_network = lambda: None  # a veth pair needs the twin's network namespace (molecule's twins)
    boot.board_name = lambda: board_name
    boot.log = lambda msg: None
    boot.main()
    # What the running kernel and the image show beside the board's fakes.
    board = json.loads((GUEST / "boards" / (board_name + ".json")).read_text())
    extra = {"/proc/sys/kernel/ostype": "Linux\n", "/proc/sys/kernel/osrelease": board["kernel_release"] + "\n",
             "/etc/os-release": OS_RELEASE[board["distro"]], "/proc/self/mountinfo": MOUNTINFO[board["cgroup"]],
             "/proc/meminfo": "MemTotal:       15896536 kB\n", "/etc/machine-id": "0123456789abcdef0123456789abcdef\n"}
    for path, text in extra.items():
        os.makedirs(os.path.dirname(at(path)), exist_ok=True)
        Path(at(path)).write_text(text)
    return board


def normal(board):
    """A board file without what a capture cannot (and must not) reproduce: the
    names a person chose, the serial number, the fixture file names; frequency
    tables resolved into the clusters, lists in a stable order."""
    board = json.loads(json.dumps(board))
    for key in ("name", "title", "serial_number", "flash_cmdline"):
        board.pop(key, None)
    board["boot_files"] = sorted(board["boot_files"])
    for cluster in board["clusters"]:
        cluster["table"] = board["cpufreq_tables"][cluster["table"]]
    board.pop("cpufreq_tables")
    board["irqs"] = sorted(board["irqs"], key=lambda i: i["irq"])
    board["devfreq"] = sorted(board["devfreq"], key=lambda n: n["name"])
    return board


def tree_digest(root):
    digest = hashlib.sha256()
    for path in sorted(Path(root).rglob("*")):
        stat = path.lstat()
        digest.update(str(path.relative_to(root)).encode() + oct(stat.st_mode).encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(params=BOARDS)
def powered_on(request, tmp_path):
    root = tmp_path / "device"
    board = power_on(request.param, root)
    return request.param, board, root


def test_capture_of_each_twin_tree_gives_its_board_file(powered_on):
    name, board, root = powered_on
    before = tree_digest(root)
    result = capture.capture(device.LocalDevice(str(root)), "cap-" + name, str(root))
    assert tree_digest(root) == before  # read-only
    report = result["report"]
    assert report["complete"], report
    assert normal(result["board"]) == normal(board)
    # The boot file and nvpmodel.conf are the device's, in the layout twin up copies.
    (dest, fixture), = board["boot_files"].items()
    assert result["boot"][0] == dest
    assert result["boot"][2] == (GUEST / "bootfiles" / fixture).read_text()
    if board.get("nvpmodel_conf"):
        assert result["nvpmodel"] == (board["nvpmodel_conf"],
                                      (GUEST / "nvpmodel_confs" / board["nvpmodel_conf"]).read_text())
    # Not copied.
    text = json.dumps(result["board"]) + json.dumps(report) + result["profile"]
    assert board["serial_number"] not in text and "0123456789abcdef0123456789abcdef" not in text


def test_draft_profile_says_what_a_person_decides(powered_on, tmp_path):
    import yaml
    name, board, root = powered_on
    result = capture.capture(device.LocalDevice(str(root)), "cap-" + name, "board.example")
    profile = yaml.safe_load(result["profile"])
    assert profile["clusters"] == [c["cpus"] for c in board["clusters"]]
    assert profile["match"] == board["compatible"][:1] and profile["family"] == board["family"]
    for what in ("inference", "the mode for inference", "devfreq nodes by role", "compatible strings"):
        if what == "the mode for inference" and not board.get("nvpmodel_conf"):
            continue
        assert any(line.startswith("# TODO(person):") and what in line for line in result["profile"].splitlines()), what
    # The guesses are the curated profile's choices for these boards.
    profiles = [yaml.safe_load(p.read_text()) for p in capture.PROFILES_DIR.glob("*.yml")]
    curated = next(p for p in profiles if set(p["match"]) & set(board["compatible"]))
    assert profile["inference_clusters"] == curated["inference_clusters"]
    assert "already matches this board" in result["profile"]


def test_written_capture_boots_as_a_twin_board(powered_on, tmp_path, monkeypatch):
    name, board, root = powered_on
    out = tmp_path / "captured"
    monkeypatch.setattr(manager, "CAPTURED_DIR", out)
    code = cli.main(["twin", "capture", "--root", str(root), "--name", "cap-" + name, "--out", str(out)])
    assert code == 0
    target = out / ("cap-" + name)
    assert sorted(p.name for p in target.iterdir()) == ["boards", "bootfiles", "capture.json", "nvpmodel_confs",
                                                        "pcie", "profile"]
    known = manager.boards()
    assert normal(known["captured/cap-" + name]) == normal(board)
    assert manager.parse_fleet("captured/cap-%s:2" % name) == [("captured/cap-" + name, 2)]
    assert manager.twin_prefix("captured/cap-" + name) == "cap-" + name
    # The board file names files that are there, as the boot script reads them.
    captured = json.loads((target / "boards" / ("cap-%s.json" % name)).read_text())
    for fixture in captured["boot_files"].values():
        assert (target / "bootfiles" / fixture).is_file()
    if captured.get("nvpmodel_conf"):
        assert (target / "nvpmodel_confs" / captured["nvpmodel_conf"]).is_file()
    assert cli.main(["twin", "capture", "--root", str(root), "--name", "cap-" + name, "--out", str(out)]) == 2


# --------------------------------------------------------------------------
# Scrubbing
def test_macs_serials_and_passwords_are_scrubbed():
    scrub = capture.Scrubber()
    text = ("APPEND ${cbootargs} root=/dev/mmcblk0p1 mac=00:04:4b:aa:bb:cc androidboot.serialno=1423922012345 "
            "console=ttyTCU0,115200\n  MENU PASSWD hunter2\nethaddr=AA-BB-CC-DD-EE-FF\n")
    out = scrub(text, "boot")
    assert "4b:aa:bb" not in out and "1423922012345" not in out and "hunter2" not in out and "AA-BB" not in out
    assert "root=/dev/mmcblk0p1" in out and "console=ttyTCU0,115200" in out
    assert scrub.counts["boot"] == 4
    assert scrub("wlan0-aa:bb:cc:dd:ee:ff", "irq") == "wlan0-00:00:00:00:00:00"
    assert scrub("DATE: Wed Aug 28 09:12:27 UTC 2024 TARGET_USERSPACE_LIB_DIR=nvidia", "r") == \
        "DATE: Wed Aug 28 09:12:27 UTC 2024 TARGET_USERSPACE_LIB_DIR=nvidia"


def test_mac_in_interrupt_names_and_boot_args_does_not_reach_the_capture(tmp_path):
    root = tmp_path / "device"
    power_on("orin-nx-16gb-r36", root)
    interrupts = root / "proc" / "interrupts"
    os.chmod(interrupts, 0o644)
    interrupts.write_text(interrupts.read_text() + " 99:  1 0 0 0 0 0 0 0  GICv3 99 Level  wlan0-11:22:33:44:55:66\n")
    cmdline = root / "proc" / "cmdline"
    os.chmod(cmdline, 0o644)
    cmdline.write_text(cmdline.read_text().strip() + " eth0mac=11:22:33:44:55:66\n")
    result = capture.capture(device.LocalDevice(str(root)), "cap-mac", "here")
    dumped = json.dumps(result["board"])
    assert "11:22:33" not in dumped and "wlan0-00:00:00:00:00:00" in dumped
    assert result["report"]["scrubbed"]["/proc/interrupts"] == 1 and result["report"]["scrubbed"]["/proc/cmdline"] == 1


# --------------------------------------------------------------------------
# A local SSH server (paramiko) serving a directory as the device's root over SFTP.
class Server(paramiko.ServerInterface):
    def __init__(self, authorized, uname):
        self.authorized, self.uname = authorized, uname
        self.commands = []

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL if key == self.authorized else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username):
        return "publickey"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        self.commands.append(command.decode())

        def answer():
            time.sleep(0.1)   # after the server has accepted the request (sent once this method returns)
            if command == b"uname -s":
                channel.sendall(self.uname.encode() + b"\n")
                channel.send_exit_status(0)
            else:
                channel.sendall_stderr(b"not allowed here\n")
                channel.send_exit_status(1)
            channel.close()
        threading.Thread(target=answer, daemon=True).start()
        return True


def sftp_server_for(root):
    class Handle(paramiko.SFTPHandle):
        pass

    class Tree(paramiko.SFTPServerInterface):
        def _at(self, path):
            return os.path.join(root, path.lstrip("/"))

        def canonicalize(self, path):
            return device.LocalDevice(root).realpath(path)

        def list_folder(self, path):
            try:
                base = self._at(path)
                return [paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(base, n)), n)
                        for n in os.listdir(base)]
            except OSError as exc:
                return paramiko.SFTPServer.convert_errno(exc.errno)

        def stat(self, path):
            try:
                return paramiko.SFTPAttributes.from_stat(os.stat(self._at(device.LocalDevice(root).realpath(path))))
            except OSError as exc:
                return paramiko.SFTPServer.convert_errno(exc.errno)

        def lstat(self, path):
            try:
                return paramiko.SFTPAttributes.from_stat(os.lstat(self._at(path)))
            except OSError as exc:
                return paramiko.SFTPServer.convert_errno(exc.errno)

        def readlink(self, path):
            try:
                return os.readlink(self._at(path))
            except OSError as exc:
                return paramiko.SFTPServer.convert_errno(exc.errno)

        def open(self, path, flags, attr):
            if flags & (os.O_WRONLY | os.O_RDWR):
                return paramiko.SFTP_PERMISSION_DENIED
            try:
                handle = Handle(flags)
                handle.readfile = builtins.open(self._at(device.LocalDevice(root).realpath(path)), "rb")
                return handle
            except OSError as exc:
                return paramiko.SFTPServer.convert_errno(exc.errno)
    return Tree


@pytest.fixture
def ssh_server(tmp_path):
    """Start with serve(root, uname=...): returns (port, host key, client key file, server state)."""
    host_key = paramiko.Ed25519Key.from_private_key_file(str(_keyfile(tmp_path, "host")))
    client_file = _keyfile(tmp_path, "client")
    client_key = paramiko.Ed25519Key.from_private_key_file(str(client_file))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]
    state = {"servers": [], "transports": []}

    def serve(root, uname="Linux"):
        def loop():
            while True:
                try:
                    conn, _address = listener.accept()
                except OSError:
                    return
                transport = paramiko.Transport(conn)
                transport.add_server_key(host_key)
                transport.set_subsystem_handler("sftp", paramiko.SFTPServer, sftp_server_for(str(root)))
                server = Server(client_key, uname)
                state["servers"].append(server)
                state["transports"].append(transport)
                try:
                    transport.start_server(server=server)
                except (paramiko.SSHException, EOFError):
                    pass
        threading.Thread(target=loop, daemon=True).start()
        return port, host_key, client_file, state
    yield serve
    listener.close()
    for transport in state["transports"]:
        transport.close()


def _keyfile(tmp_path, name):
    path = tmp_path / ("%s_ed25519" % name)
    if not path.exists():
        import subprocess
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def known_hosts(tmp_path, port, key):
    path = tmp_path / "known_hosts"
    path.write_text("[127.0.0.1]:%d %s %s\n" % (port, key.get_name(), key.get_base64()))
    return path


def ssh_capture(tmp_path, port, client_file, *extra):
    return cli.main(["twin", "capture", "127.0.0.1", "-p", str(port), "-u", "edge", "--identity", str(client_file),
                     "--ssh-config", str(tmp_path / "no-ssh-config"), "--out", str(tmp_path / "out"),
                     "--timeout", "10", *extra])


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """No known_hosts, keys or agent of the machine's own user."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def test_capture_over_ssh_equals_the_local_capture(tmp_path, ssh_server, isolated_home, capsys):
    root = tmp_path / "device"
    board = power_on("rock5b-rk3588", root)
    before = tree_digest(root)
    port, host_key, client_file, state = ssh_server(root)
    kh = known_hosts(tmp_path, port, host_key)
    assert ssh_capture(tmp_path, port, client_file, "--known-hosts", str(kh), "--name", "cap-ssh") == 0, \
        capsys.readouterr().err
    assert tree_digest(root) == before
    captured = json.loads((tmp_path / "out" / "cap-ssh" / "boards" / "cap-ssh.json").read_text())
    assert normal(captured) == normal(board)
    # One connection; files over SFTP, no command needed on a Linux tree that shows ostype.
    assert len(state["transports"]) == 1 and state["servers"][0].commands == []


def one_line_error(capsys):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgetune-dev: error: ") and "Traceback" not in err, err
    return lines[0]


def test_unknown_host_key_is_refused(tmp_path, ssh_server, isolated_home, capsys):
    root = tmp_path / "device"
    power_on("orin-nx-16gb-r36", root)
    port, host_key, client_file, _server = ssh_server(root)
    assert ssh_capture(tmp_path, port, client_file) == 2
    line = one_line_error(capsys)
    assert "[127.0.0.1]:%d's host key (ssh-ed25519 SHA256:" % port in line and "is not in known_hosts" in line
    assert not (tmp_path / "out").exists()


def test_changed_host_key_is_refused(tmp_path, ssh_server, isolated_home, capsys):
    root = tmp_path / "device"
    power_on("orin-nx-16gb-r36", root)
    port, _host_key, client_file, _server = ssh_server(root)
    other = paramiko.Ed25519Key.from_private_key_file(str(_keyfile(tmp_path, "other")))
    kh = known_hosts(tmp_path, port, other)
    assert ssh_capture(tmp_path, port, client_file, "--known-hosts", str(kh)) == 2
    assert "does not match known_hosts" in one_line_error(capsys)


def test_host_key_alias_from_the_inventory(tmp_path, ssh_server, isolated_home, capsys):
    """The VM twin's inventory: UserKnownHostsFile and HostKeyAlias in ansible_ssh_common_args."""
    root = tmp_path / "device"
    board = power_on("agx-orin-64gb-r35", root)
    port, host_key, client_file, _server = ssh_server(root)
    kh = tmp_path / "alias_known_hosts"
    kh.write_text("my-board-alias %s %s\n" % (host_key.get_name(), host_key.get_base64()))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"board-7": {
        "ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "edge",
        "ansible_ssh_private_key_file": str(client_file),
        "ansible_ssh_common_args": "-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes "
                                   "-o HostKeyAlias=my-board-alias -o IdentitiesOnly=yes" % kh}}}}))
    code = cli.main(["twin", "capture", "-i", str(inventory), "board-7", "--out", str(tmp_path / "out"),
                     "--ssh-config", str(tmp_path / "none")])
    assert code == 0, capsys.readouterr().err
    assert normal(json.loads((tmp_path / "out" / "board-7" / "boards" / "board-7.json").read_text())) == normal(board)


def test_failed_login_is_refused(tmp_path, ssh_server, isolated_home, capsys):
    root = tmp_path / "device"
    power_on("orin-nx-16gb-r36", root)
    port, host_key, _client_file, _server = ssh_server(root)
    kh = known_hosts(tmp_path, port, host_key)
    wrong = _keyfile(tmp_path, "stranger")
    assert ssh_capture(tmp_path, port, wrong, "--known-hosts", str(kh)) == 2
    assert "authentication failed for edge@127.0.0.1:%d" % port in one_line_error(capsys)


def test_host_that_is_not_linux_is_refused(tmp_path, ssh_server, isolated_home, capsys):
    root = tmp_path / "mac"
    (root / "etc").mkdir(parents=True)
    port, host_key, client_file, state = ssh_server(root, uname="Darwin")
    kh = known_hosts(tmp_path, port, host_key)
    assert ssh_capture(tmp_path, port, client_file, "--known-hosts", str(kh)) == 2
    assert "127.0.0.1 is not Linux (it says 'Darwin')" in one_line_error(capsys)
    assert state["servers"][0].commands == ["uname -s"]
    assert not (tmp_path / "out").exists()


def test_nothing_listening_is_one_line(tmp_path, isolated_home, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert ssh_capture(tmp_path, port, _keyfile(tmp_path, "client")) == 2
    assert "cannot connect to 127.0.0.1:%d" % port in one_line_error(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_sysfs_records_what_it_could_and_says_what_it_could_not(tmp_path, capsys):
    root = tmp_path / "device"
    power_on("orin-nx-16gb-r36", root)
    cpufreq = root / "sys" / "devices" / "system" / "cpu" / "cpufreq"
    os.chmod(cpufreq, 0)
    try:
        assert cli.main(["twin", "capture", "--root", str(root), "--name", "cap-part", "--out",
                         str(tmp_path / "out")]) == 2
    finally:
        os.chmod(cpufreq, 0o755)
    _check_partial(tmp_path, capsys)


def test_unreadable_sysfs_as_root(tmp_path, capsys, monkeypatch):
    """The same refusal where the test runs as root: the device refuses the directory (EACCES)."""
    root = tmp_path / "device"
    power_on("orin-nx-16gb-r36", root)
    real_listdir = device.LocalDevice.listdir

    def refuse(self, path):
        if path.startswith("/sys/devices/system/cpu/cpufreq"):
            raise PermissionError(13, "Permission denied", path)
        return real_listdir(self, path)
    monkeypatch.setattr(device.LocalDevice, "listdir", refuse)
    assert cli.main(["twin", "capture", "--root", str(root), "--name", "cap-part", "--out",
                     str(tmp_path / "out")]) == 2
    _check_partial(tmp_path, capsys)


def _check_partial(tmp_path, capsys):
    line = one_line_error(capsys)
    assert "only in part: no cpufreq policies" in line
    assert "/sys/devices/system/cpu/cpufreq (Permission denied)" in line
    target = tmp_path / "out" / "cap-part"
    report = json.loads((target / "capture.json").read_text())
    assert report["complete"] is False and report["unreadable"]["/sys/devices/system/cpu/cpufreq"] == \
        "Permission denied"
    partial = json.loads((target / "boards" / "cap-part.json.incomplete").read_text())
    assert partial["model"] and partial["irqs"] and partial["devfreq"]   # what could be read is kept
    assert not (target / "boards" / "cap-part.json").exists()   # not offered to twin up


def test_local_tree_resolves_links_inside_the_root(tmp_path):
    (tmp_path / "etc" / "nvpmodel").mkdir(parents=True)
    (tmp_path / "etc" / "nvpmodel" / "a.conf").write_text("mode")
    os.symlink("/etc/nvpmodel/a.conf", str(tmp_path / "etc" / "nvpmodel.conf"))
    os.symlink("../../../../etc", str(tmp_path / "etc" / "nvpmodel" / "up"))
    dev = device.LocalDevice(str(tmp_path))
    assert dev.read("/etc/nvpmodel.conf") == b"mode"
    assert dev.realpath("/etc/nvpmodel/up/nvpmodel.conf") == "/etc/nvpmodel/a.conf"
    assert dev.readlink("/etc/nvpmodel.conf") == "/etc/nvpmodel/a.conf"
    assert dev.kind("/etc/nvpmodel.conf") == "link" and dev.kind("/nope") is None


def test_ssh_config_gives_address_port_user_key_and_known_hosts(tmp_path, ssh_server, isolated_home, capsys):
    root = tmp_path / "device"
    board = power_on("rock5b-rk3588", root)
    port, host_key, client_file, _server = ssh_server(root)
    kh = known_hosts(tmp_path, port, host_key)
    config = tmp_path / "ssh_config"
    config.write_text("Host camera-105\n  HostName 127.0.0.1\n  Port %d\n  User edge\n  IdentityFile %s\n"
                      "  UserKnownHostsFile %s\n  IdentitiesOnly yes\n" % (port, client_file, kh))
    code = cli.main(["twin", "capture", "camera-105", "--ssh-config", str(config), "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    assert normal(json.loads((tmp_path / "out" / "camera-105" / "boards" / "camera-105.json").read_text())) == \
        normal(board)


def test_inventory_host_not_reached_over_ssh_is_refused(tmp_path, capsys):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"twin-1": {"ansible_connection": "community.docker.docker"},
                                                       "tmpl": {"ansible_host": "{{ lookup('env', 'X') }}"}}}}))
    assert cli.main(["twin", "capture", "-i", str(inventory), "twin-1", "--out", str(tmp_path / "o")]) == 2
    assert "is reached with connection community.docker.docker, not SSH" in one_line_error(capsys)
    assert cli.main(["twin", "capture", "-i", str(inventory), "tmpl", "--out", str(tmp_path / "o")]) == 2
    assert "ansible_host of tmpl is a template" in one_line_error(capsys)
    assert cli.main(["twin", "capture", "-i", str(inventory), "nobody", "--out", str(tmp_path / "o")]) == 2
    assert "nobody is not a host of inventory" in one_line_error(capsys)
    assert cli.main(["twin", "capture", "--root", str(tmp_path), "--name", "orin-nx-16gb-r36"]) == 2
    assert "is a built-in twin board" in one_line_error(capsys)


def test_bootloader_arguments_around_the_append_line():
    notes = []
    append = "${cbootargs} root=PARTUUID=x rw console=ttyTCU0,115200"
    assert capture.l4t_bootloader_args(append, "root=PARTUUID=x rw console=ttyTCU0,115200 bl_prof=1", notes) == \
        "bl_prof=1"
    assert notes == []
    # syslinux (the VM twin) puts BOOT_IMAGE= first and initrd= last.
    got = capture.l4t_bootloader_args(append, "BOOT_IMAGE=/boot/vmlinuz root=PARTUUID=x rw console=ttyTCU0,115200 "
                                              "initrd=/boot/initrd.img", notes)
    assert got == "BOOT_IMAGE=/boot/vmlinuz initrd=/boot/initrd.img" and "before the APPEND arguments" in notes[0]
    # Not booted from this entry: what runs beyond the file is said, and noted.
    assert capture.l4t_bootloader_args(append, "root=/dev/sda1 quiet", notes) == "root=/dev/sda1 quiet"
    assert "does not start with the default entry's APPEND" in notes[-1]


def test_interrupt_rows_of_arm_and_x86_kernels():
    text = ("           CPU0       CPU1\n"
            " 11:      12345      23456     GICv3  30 Level     arch_timer\n"
            " 62:          7          0   PCI-MSI 524289 Edge      nvme0q1\n"
            "  0:         30          0   IO-APIC   2-edge      timer\n"
            " 24:          0          0   PCI-MSI 49152-edge      virtio0-config\n"
            " 60:          0          0   PCI-MSI   0 Edge      PCIe PME, aerdrv\n"
            "IPI0:       100        200       Rescheduling interrupts\n")
    rows = capture.parse_interrupts(text, 2)
    assert rows == [
        {"irq": 11, "chip": "GICv3", "hwirq": "30 Level", "name": "arch_timer"},
        {"irq": 62, "chip": "PCI-MSI", "hwirq": "524289 Edge", "name": "nvme0q1"},
        {"irq": 0, "chip": "IO-APIC", "hwirq": "2-edge", "name": "timer"},
        {"irq": 24, "chip": "PCI-MSI", "hwirq": "49152-edge", "name": "virtio0-config"},
        {"irq": 60, "chip": "PCI-MSI", "hwirq": "0 Edge", "name": "PCIe PME, aerdrv"}]


# --------------------------------------------------------------------------
# The parsers are the collection's (edge_cpulist, edge_pcie, edge_board, edge_cmdline, edge_nvpmodel):
# what edge_facts and the roles read on the device is what the capture reads; input they refuse is
# recorded in capture.json, never a traceback.
def test_cpu_lists_in_the_kernels_forms_and_a_bad_one_recorded(tmp_path):
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "present").write_text("0-3,6,8-11:2\n")
    (tmp_path / "sys" / "bad").write_text("0-3,x\n")
    (tmp_path / "sys" / "empty").write_text("\n")
    r = capture.Reader(device.LocalDevice(str(tmp_path)))
    assert r.cpus("/sys/present") == [0, 1, 2, 3, 6, 8, 10]   # the stride form a-b:step
    assert r.cpus("/sys/empty") == [] and r.cpus("/sys/missing") == []
    assert r.cpus("/sys/bad") == []
    assert r.unreadable == {"/sys/bad": "not a CPU list: invalid CPU list item 'x' in '0-3,x'"}


def test_capture_records_a_present_file_that_is_not_a_cpu_list(tmp_path):
    root = tmp_path / "device"
    board = power_on("orin-nx-16gb-r36", root)
    present = root / "sys" / "devices" / "system" / "cpu" / "present"
    os.chmod(present, 0o644)
    present.write_text("0-7,garbage\n")
    result = capture.capture(device.LocalDevice(str(root)), "cap-cpus", "here")
    assert result["report"]["unreadable"]["/sys/devices/system/cpu/present"].startswith("not a CPU list: ")
    assert normal(result["board"]) == normal(board)


def ext_cap(cfg, offset, cap_id, nxt, version=1):
    cfg[offset:offset + 4] = (cap_id | version << 16 | nxt << 20).to_bytes(4, "little")


def config_space(*chain):
    """4096 bytes with the extended capabilities (offset, id, next) of ``chain``; a VC (0x0002, 0x0009,
    0x0008) gets Extended VC Count 1."""
    cfg = bytearray(4096)
    for offset, cap_id, nxt in chain:
        ext_cap(cfg, offset, cap_id, nxt)
        if cap_id in (0x0002, 0x0008, 0x0009):
            cfg[offset + 4] = 1
    return bytes(cfg)


def test_vc_capability_by_the_walk_of_edge_pcie():
    # AER -> Secondary PCIe -> VC at 0x200: the VC capability is found along the chain.
    assert capture.vc_capability(config_space((0x100, 0x0001, 0x148), (0x148, 0x0019, 0x200),
                                              (0x200, 0x0002, 0x000))) == (True, [])
    # VC9 (a function that also has MFVC) counts; MFVC alone does not, nor a chain without a VC.
    assert capture.vc_capability(config_space((0x100, 0x0008, 0x180), (0x180, 0x0009, 0)))[0] is True
    assert capture.vc_capability(config_space((0x100, 0x0008, 0)))[0] is False
    assert capture.vc_capability(config_space((0x100, 0x0001, 0x148), (0x148, 0x0019, 0))) == (False, [])
    # An empty list (all zero, or all ones where the device did not answer).
    assert capture.vc_capability(bytes(4096)) == (False, [])
    assert capture.vc_capability(b"\xff" * 4096) == (False, [])
    # Not read: 64 bytes (a user without CAP_SYS_ADMIN), 256 (conventional PCI, or the user's limit).
    assert capture.vc_capability(bytes(64)) == (None, []) and capture.vc_capability(bytes(256)) == (None, [])


def test_vc_capability_walk_stops_where_edge_pcie_stops():
    # A loop: the walk ends and says so; a VC past it is not reached.
    has_vc, problems = capture.vc_capability(config_space((0x100, 0x0001, 0x148), (0x148, 0x0019, 0x100)))
    assert has_vc is False and problems == ["extended capability at 0x148 loops back to 0x100; list ends there"]
    # A next pointer below 0x100 ends the list: the standard header there is no extended capability
    # (a walk that followed it read the 0x0002 at 0x40 as a VC).
    cfg = bytearray(config_space((0x100, 0x0001, 0x040)))
    ext_cap(cfg, 0x40, 0x0002, 0)
    has_vc, problems = capture.vc_capability(bytes(cfg))
    assert has_vc is False and "points to 0x040, outside 0x100-0xffc" in problems[0]
    # A VC capability whose registers would run past the end of config space is not one.
    has_vc, problems = capture.vc_capability(config_space((0x100, 0x0001, 0xff8), (0xff8, 0x0002, 0)))
    assert has_vc is False and "VC capability at 0xff8 runs past the end of config space" in problems[0]


def test_capture_reports_the_twins_vc_capability_and_walk_problems(tmp_path):
    root = tmp_path / "device"
    board = power_on("agx-orin-64gb-r35", root)
    result = capture.capture(device.LocalDevice(str(root)), "cap-vc", "here")
    pcie = result["report"]["pcie"]
    assert len(pcie) == 2 and all(d["vc_capability"] is True and d["config_bytes_read"] == 4096 for d in pcie)
    assert not any("VC capability" in n for n in result["report"]["notes"])
    # The endpoint's AER now points back to itself: no VC, and the capture notes why.
    endpoint = next(d["bdf"] for d in pcie if d["class"].startswith("0x0108"))
    config = root / "sys" / "bus" / "pci" / "devices" / endpoint / "config"
    data = bytearray(config.read_bytes())
    ext_cap(data, 0x100, 0x0001, 0x100, version=2)
    os.chmod(config, 0o644)
    config.write_bytes(bytes(data))
    result = capture.capture(device.LocalDevice(str(root)), "cap-vc", "here")
    assert {d["bdf"]: d["vc_capability"] for d in result["report"]["pcie"]}[endpoint] is False
    assert "PCIe config space of %s: extended capability at 0x100 loops back to 0x100; list ends there" \
        % endpoint in result["report"]["notes"]
    assert normal(result["board"]) == normal(board)


# Mount tables as the boards show them (trimmed): Ubuntu 20.04 / L4T r35 (systemd 245: hybrid),
# Ubuntu 22.04 / L4T r36 (unified), and a cgroup v1 only system.
HYBRID_MOUNTINFO = """\
24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
36 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
37 31 0:32 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpuset
"""
UNIFIED_MOUNTINFO = """\
24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""
LEGACY_MOUNTINFO = """\
24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
33 31 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
36 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
"""


@pytest.mark.parametrize("mountinfo, mode", [
    (HYBRID_MOUNTINFO, "hybrid"), (UNIFIED_MOUNTINFO, "unified"), (LEGACY_MOUNTINFO, "legacy"),
    # A cgroup2 mounted over the hybrid tmpfs later: the last mount wins.
    (HYBRID_MOUNTINFO + "40 24 0:40 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "unified"),
    # Lines that are no mount (no fs type) are skipped, not a traceback.
    ("31 24 0:26 / /sys/fs/cgroup rw - \n" + UNIFIED_MOUNTINFO, "unified"),
    ("garbage\n31 24 0:26 / /sys/fs/cgroup rw -  \n", "legacy")])
def test_capture_reads_the_cgroup_mode_as_edge_facts_does(tmp_path, mountinfo, mode):
    root = tmp_path / "device"
    board = power_on("agx-orin-64gb-r35", root)
    (root / "proc" / "self" / "mountinfo").write_text(mountinfo)
    result = capture.capture(device.LocalDevice(str(root)), "cap-cgroup", "here")
    assert result["board"]["cgroup"] == mode
    assert dict(normal(result["board"]), cgroup=board["cgroup"]) == normal(board)
    assert "cgroup_default: {\"35\": \"%s\"}" % mode in result["profile"]


def test_unreadable_mountinfo_is_legacy_and_recorded(tmp_path):
    root = tmp_path / "device"
    power_on("orin-nx-16gb-r36", root)
    (root / "proc" / "self" / "mountinfo").unlink()
    result = capture.capture(device.LocalDevice(str(root)), "cap-cgroup", "here")
    assert result["board"]["cgroup"] == "legacy" and "/proc/self/mountinfo" in result["report"]["unreadable"]


# extlinux.conf as L4TLauncher reads it: the label DEFAULT names, '#' ends a line, case-sensitive keywords.
EXTLINUX = """\
TIMEOUT 30
# DEFAULT backup
DEFAULT {default}

MENU TITLE L4T boot options

LABEL backup
      MENU LABEL backup kernel
      LINUX /boot/Image.backup
      APPEND ${{cbootargs}} root=/dev/mmcblk0p1 rw quiet

LABEL primary
      MENU LABEL primary kernel
      LINUX /boot/Image
      INITRD /boot/initrd
      APPEND ${{cbootargs}} root=PARTUUID=4b8a73c4 rw rootwait console=ttyTCU0,115200  # isolcpus=4-7
"""
PRIMARY = "${cbootargs} root=PARTUUID=4b8a73c4 rw rootwait console=ttyTCU0,115200"


def test_extlinux_default_names_a_label_that_is_not_the_first():
    notes = []
    assert capture.extlinux_default_append(EXTLINUX.format(default="primary"), notes) == PRIMARY
    assert notes == []
    assert capture.extlinux_default_append(EXTLINUX.format(default="backup"), notes) == \
        "${cbootargs} root=/dev/mmcblk0p1 rw quiet"
    assert notes == []


@pytest.mark.parametrize("text, append, why", [
    # What L4TLauncher boots where the roles refuse to edit: the first label.
    (EXTLINUX.format(default="x").replace("DEFAULT x\n", ""), "${cbootargs} root=/dev/mmcblk0p1 rw quiet",
     "no DEFAULT line; refusing to guess which label boots"),
    (EXTLINUX.format(default="nosuch"), "${cbootargs} root=/dev/mmcblk0p1 rw quiet",
     "DEFAULT 'nosuch' names no label (labels: backup, primary)"),
    # Two APPEND lines: the last is the one read.
    (EXTLINUX.format(default="primary") + "      APPEND root=/dev/sda1\n", "root=/dev/sda1",
     "the default label 'primary' has 2 APPEND lines; keep one"),
    # L4TLauncher reads 10 labels: DEFAULT naming the 11th boots the first.
    ("DEFAULT l10\n" + "".join("LABEL l%d\n  APPEND root=/dev/l%d\n" % (i, i) for i in range(11)),
     "root=/dev/l0", "11 labels, but L4TLauncher reads at most 10"),
    # U-Boot's lowercase keywords: no label L4TLauncher sees.
    ("default primary\nlabel primary\n  append root=/dev/sda1\n", None, "lowercase U-Boot keywords"),
])
def test_extlinux_files_the_roles_refuse_are_noted_not_refused(text, append, why):
    notes = []
    assert capture.extlinux_default_append(text, notes) == append
    assert len(notes) == 1 and notes[0].startswith("edgetune's roles will refuse to edit this extlinux.conf as it "
                                                   "is: ") and why in notes[0], notes


def test_capture_takes_the_bootloader_args_from_the_label_default_names(tmp_path):
    root = tmp_path / "device"
    board = power_on("orin-nx-16gb-r36", root)
    conf = root / "boot" / "extlinux" / "extlinux.conf"
    text = conf.read_text()
    # A backup label first, with other arguments: the board still boots primary (DEFAULT).
    backup = "LABEL backup\n      LINUX /boot/Image.backup\n      APPEND ${cbootargs} root=/dev/sda1 quiet\n\n"
    os.chmod(conf, 0o644)
    conf.write_text(text.replace("LABEL primary", backup + "LABEL primary", 1))
    result = capture.capture(device.LocalDevice(str(root)), "cap-boot", "here")
    assert result["board"]["bootloader_args"] == board["bootloader_args"]
    assert not any("extlinux" in n or "APPEND" in n for n in result["report"]["notes"]), result["report"]["notes"]
    # DEFAULT names the backup: the running arguments are not that entry's.
    conf.write_text(text.replace("LABEL primary", backup + "LABEL primary", 1).replace("DEFAULT primary",
                                                                                       "DEFAULT backup"))
    result = capture.capture(device.LocalDevice(str(root)), "cap-boot", "here")
    assert any("does not start with the default entry's APPEND" in n for n in result["report"]["notes"])


# nvpmodel.conf as edge_nvpmodel (the role edge_power) reads it.
NVPMODEL_CONF = """\
# a comment: < POWER_MODEL ID=9 NAME=NOT_A_MODE >
< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_0 /sys/devices/system/cpu/cpu0/online
<PARAM TYPE=CLOCK NAME=EMC >
MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap

< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_0 1
EMC MAX_FREQ 0
<POWER_MODEL NAME=MODE_15W ID=1>\r
CPU_ONLINE CORE_0 1\r
EMC MAX_FREQ 2133000000

< PM_CONFIG DEFAULT=1 >
"""


def test_nvpmodel_modes_as_the_role_reads_them(tmp_path):
    r = capture.Reader(device.LocalDevice(str(tmp_path)))
    # Headers with or without spaces, NAME before ID, CRLF lines; comments are not modes.
    assert capture.nvpmodel_modes(r, "/etc/nvpmodel.conf", NVPMODEL_CONF) == ([(0, "MAXN"), (1, "MODE_15W")], 1)
    assert capture.nvpmodel_modes(r, "/etc/nvpmodel.conf", None) == ([], None)
    assert r.unreadable == {}
    # A file nvpmodel (and the role) refuses: no modes, recorded with the reason.
    broken = NVPMODEL_CONF.replace("< PM_CONFIG DEFAULT=1 >\n", "")
    assert capture.nvpmodel_modes(r, "/etc/nvpmodel.conf", broken) == ([], None)
    assert r.unreadable == {"/etc/nvpmodel.conf": "not an nvpmodel configuration: no '< PM_CONFIG DEFAULT=<id> >' "
                                                  "section: nvpmodel requires one"}


def test_capture_of_an_nvpmodel_conf_the_role_refuses(tmp_path, capsys):
    import yaml
    root = tmp_path / "device"
    board = power_on("agx-orin-64gb-r35", root)
    conf = root / "etc" / "nvpmodel" / board["nvpmodel_conf"]
    os.chmod(conf, 0o644)
    conf.write_text(NVPMODEL_CONF)
    result = capture.capture(device.LocalDevice(str(root)), "cap-nvp", "here")
    assert result["report"]["nvpmodel_modes"] == [(0, "MAXN"), (1, "MODE_15W")]
    profile = yaml.safe_load(result["profile"])
    assert profile["nvpmodel_modes"] == ["MAXN", "MODE_15W"] and profile["nvpmodel_recommended"] == "MAXN"
    assert "its default is ID 1" in result["profile"]
    conf.write_text(NVPMODEL_CONF.replace("CPU_ONLINE CORE_0 1\n", "CPU_ONLINE CORE_9 1\n", 1))
    out = tmp_path / "out"
    assert cli.main(["twin", "capture", "--root", str(root), "--name", "cap-nvp", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "/etc/nvpmodel.conf (not an nvpmodel configuration: line 8: CPU_ONLINE " \
        "CORE_9 is not defined by a PARAM section)" in err
    report = json.loads((out / "cap-nvp" / "capture.json").read_text())
    assert report["complete"] and report["nvpmodel_modes"] == []
    profile = yaml.safe_load((out / "cap-nvp" / "profile" / "cap-nvp.yml").read_text())
    assert profile["nvpmodel_modes"] == [] and profile["nvpmodel_recommended"] is None
