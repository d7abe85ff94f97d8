"""The node exporter edge_audit_timer installs when asked (edge_audit_timer_node_exporter).

A twin has no network, so the package is Debian's .deb of this host's release, fetched once on the
host with apt-get and given to the role as a file on the controller, as an operator without a
package mirror would. Proven as a user checks it: the service runs with the textfile directory,
its /metrics on the twin's loopback carries the metrics the on-device audit wrote; check mode on the
converged twin changes nothing; the settings file edited by hand is reported by check mode, named by
the audit and put back by the next apply.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgetune_dev import host_packages
from edgetune_dev.twin import manager

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TWIN = "it-node-exporter"
BOARD = "rock5b-rk3588"  # a bookworm twin
DEBS = REPO / ".cache" / "debs"

PLAYBOOK = """\
- name: The on-device audit and the node exporter that reads its textfile
  hosts: all
  gather_facts: false
  roles:
    - role: edgetune.fleet.edge_facts
    - role: edgetune.fleet.edge_audit_timer
  tasks:
    - name: Audit the role's files
      edgetune.fleet.edge_audit:
        checks: "{{ edge_audit_timer_audit }}"
      register: audit
      tags: [audit]

    - name: Show the audit
      ansible.builtin.copy:
        content: "{{ audit.results | to_json }}"
        dest: "{{ audit_out }}"
        mode: "0644"
      delegate_to: localhost
      check_mode: false
      changed_when: false
      tags: [audit]
"""


def debian_release(command):
    return subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False).stdout.strip().split(".")[0]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    if not host_packages.is_debian_root():
        pytest.skip("needs a Debian host as root to fetch the package")
    manager.ensure_images(["bookworm"])
    manager.remove(TWIN)
    manager.create(TWIN, BOARD)
    if debian_release(["cat", "/etc/debian_version"]) != debian_release(
            ["docker", "exec", TWIN, "cat", "/etc/debian_version"]):
        manager.remove(TWIN)
        pytest.skip("the host's Debian release is not the twin's: its .deb would not fit")
    deb = host_packages.download("prometheus-node-exporter", str(DEBS))
    tmp = tmp_path_factory.mktemp("node-exporter")
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {TWIN: {
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
        "edge_audit_timer_node_exporter": True, "edge_audit_timer_node_exporter_package": deb,
        "edge_audit_timer_node_exporter_listen": "127.0.0.1:9100", "audit_out": str(tmp / "audit.json")}}}}))
    (tmp / "play.yml").write_text(PLAYBOOK)
    yield tmp
    manager.remove(TWIN)


def play(tmp, *extra):
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp / "hosts.yml"), str(tmp / "play.yml"),
                           *extra], cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def on_twin(*argv):
    return subprocess.run(["docker", "exec", TWIN, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)


def metrics():
    return on_twin("python3", "-c", "import urllib.request; print(urllib.request.urlopen("
                   "'http://127.0.0.1:9100/metrics', timeout=10).read().decode())").stdout


def changed(output):
    return int(output.rsplit("changed=", 1)[1].split()[0])


def drifted(tmp):
    return sorted(r["setting"] for r in json.loads((tmp / "audit.json").read_text()) if r["state"] != "ok")


def test_the_node_exporter_serves_the_audit_textfile(twin):
    play(twin)
    assert on_twin("systemctl", "is-active", "prometheus-node-exporter").stdout.strip() == "active"
    assert on_twin("systemctl", "is-enabled", "prometheus-node-exporter").stdout.strip() == "enabled"
    args = on_twin("cat", "/etc/default/prometheus-node-exporter").stdout
    assert 'ARGS="--collector.textfile.directory=/var/lib/prometheus/node-exporter ' \
           '--web.listen-address=127.0.0.1:9100"' in args
    # The process runs with those arguments (the unit reads ARGS from that file).
    cmdline = on_twin("sh", "-c", "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value "
                                  "prometheus-node-exporter)/cmdline").stdout
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in cmdline, cmdline
    # The on-device audit runs once: its metrics are what the exporter serves.
    assert on_twin("systemctl", "start", "edgetune-audit.service").returncode == 0
    served = metrics()
    assert "node_textfile_scrape_error 0" in served
    assert "edgetune_audit_last_run_timestamp_seconds" in served, served[-2000:]
    assert drifted(twin) == []


def test_check_mode_is_clean_then_an_edited_setting_is_named_and_put_back(twin):
    assert changed(play(twin, "--check", "--diff")) == 0
    on_twin("sh", "-c", "echo 'ARGS=\"\"' > /etc/default/prometheus-node-exporter")
    # Check mode reports the change a real run makes, and the audit names the setting.
    assert changed(play(twin, "--check", "--diff")) >= 1
    assert drifted(twin) == ["node exporter settings"]
    output = play(twin)
    assert changed(output) >= 1 and drifted(twin) == []
    cmdline = on_twin("sh", "-c", "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value "
                                  "prometheus-node-exporter)/cmdline").stdout
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in cmdline, cmdline
