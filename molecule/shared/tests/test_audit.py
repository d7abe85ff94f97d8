"""Drift audit on a converged twin: clean, then each kind of drift caught and classified."""
import json
import os
import socket
import subprocess

from conftest import run_site


def audit(host, *extra):
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    argv = ["edgetune", "audit", "--json", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            "-l", host.backend.host, *extra]
    result = subprocess.run(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            check=False)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["hosts"]


def states(hosts, name):
    return {r["setting"]: r["state"] for r in hosts[name]["results"]}


def test_converged_twin_is_clean(host):
    code, hosts = audit(host)
    assert code == 0, hosts
    assert hosts[host.backend.host]["status"] == "clean"
    assert set(states(hosts, host.backend.host).values()) <= {"ok", "unsupported"}


def test_boot_argument_removed_from_boot_file_is_drift(host, expected):
    path = expected["bootloader"]
    original = host.file(path).content_string
    first = expected["bootargs"][1]
    host.run("sed -i 's/ %s//' %s" % (first, path))
    try:
        code, hosts = audit(host)
        assert code == 1
        assert states(hosts, host.backend.host)["kernel boot arguments"] == "drifted"
        assert first in next(r["detail"] for r in hosts[host.backend.host]["results"]
                             if r["setting"] == "kernel boot arguments")
    finally:
        result = run_site(host)  # the fix for drift is the ordinary run
        assert "failed=0" in result.stdout
    assert host.file(path).content_string == original


def test_pending_reboot_is_not_drift(host):
    run_site(host, "-e", "edge_reboot_policy=never", "-e", '{"edge_bootargs_extra": ["nosoftlockup"]}')
    try:
        code, hosts = audit(host, "-e", '{"edge_bootargs_extra": ["nosoftlockup"]}')
        assert states(hosts, host.backend.host)["kernel boot arguments"] == "pending-reboot"
        assert hosts[host.backend.host]["status"] == "pending-reboot"
        assert code == 0
    finally:
        run_site(host)
    assert audit(host)[0] == 0


def test_unreachable_device_is_reported_never_clean(host, tmp_path):
    # A device that does not answer SSH, as in a real fleet: a closed port on loopback.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    ghost = tmp_path / "ghost.yml"
    ghost.write_text("all:\n  hosts:\n    ghost-twin-that-does-not-exist:\n"
                     "      ansible_connection: ssh\n      ansible_host: 127.0.0.1\n"
                     "      ansible_port: %d\n" % closed_port)
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    result = subprocess.run(["edgetune", "audit", "--json", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                             "-i", str(ghost)], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, check=False)
    hosts = json.loads(result.stdout)["hosts"]
    assert result.returncode == 1
    assert hosts["ghost-twin-that-does-not-exist"]["status"] == "unreachable"
    assert hosts[host.backend.host]["status"] == "clean"


def test_on_device_timer_writes_the_textfile(host, expected):
    assert host.service("edgetune-audit.timer").is_enabled
    textfile = "/var/lib/prometheus/node-exporter/edgetune.prom"
    host.run_expect([0], "systemctl start edgetune-audit.service")
    assert 'setting="kernel boot arguments",role="edge_bootargs",state="ok"} 1' in host.file(textfile).content_string
    path, first = expected["bootloader"], expected["bootargs"][1]
    original = host.file(path).content_string
    host.run("sed -i 's/ %s//' %s" % (first, path))
    try:
        host.run_expect([0], "systemctl start edgetune-audit.service")  # drift found is not a unit failure
        assert 'setting="kernel boot arguments",role="edge_bootargs",state="drifted"} 1' in \
            host.file(textfile).content_string
    finally:
        run_site(host)
    assert host.file(path).content_string == original
