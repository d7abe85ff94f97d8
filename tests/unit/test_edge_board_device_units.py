"""Whether systemd manages device units (edge_board.systemd_device_units, the fact edge.device_units),
and the edgetune-netqos@ unit each answer gives (roles/edge_netqos/templates).

systemd supports device units only where /sys is writable (src/core/device.c,
device_supported()); in a container /sys is read-only, and a unit bound to a
device fails at once. The mount tables are real ones: a board's, and Docker's
for a container without --privileged.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_board import systemd_device_units

ROOT = Path(__file__).resolve().parents[2]

BOARD = """\
22 28 0:20 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
23 28 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw
28 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
"""
CONTAINER = """\
1120 1012 0:98 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X
1124 1120 0:102 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1125 1124 0:29 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw
1200 1124 0:140 / /sys/devices rw,relatime - tmpfs edgetune-twin rw,mode=755
"""


def root_with(tmp_path, mountinfo):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    return str(tmp_path)


@pytest.mark.parametrize("mountinfo, expected", [
    (BOARD, True),
    (CONTAINER, False),
    # Read-only at the superblock only (the mount's own options say rw).
    ("30 1 0:20 / /sys rw,relatime - sysfs sysfs ro\n", False),
    # A later mount on /sys hides the earlier one: the last one counts.
    ("30 1 0:20 / /sys ro,relatime - sysfs sysfs ro\n31 1 0:30 / /sys rw,relatime - sysfs sysfs rw", True),
    # Mounts below /sys (a tmpfs, cgroups) say nothing of /sys itself; tabs and a missing newline are read.
    ("30\t1 0:20 / /sys rw - sysfs sysfs rw\n31 30 0:40 / /sys/fs/cgroup ro - cgroup2 cgroup ro", True),
])
def test_device_units_follow_whether_sys_is_read_only(tmp_path, mountinfo, expected):
    assert systemd_device_units(root_with(tmp_path, mountinfo)) is expected


def test_no_mount_table_is_a_board(tmp_path):
    assert systemd_device_units(str(tmp_path)) is True


RENDER = r"""
import json, sys
from ansible.template import Templar, trust_as_template
from ansible.parsing.dataloader import DataLoader
variables = json.loads(sys.argv[2])
templar = Templar(loader=DataLoader(), variables=variables)
print(templar.template(trust_as_template(open(sys.argv[1]).read())), end="")
"""


def render_unit(device_units):
    variables = {"ansible_managed": "Ansible managed", "ansible_facts": {"edge": {"device_units": device_units}},
                 "edge_netqos_config_file": "/etc/edgetune/netqos.json", "edge_netqos_share_dir": "/usr/share/x",
                 "__edge_netqos_slice": "ai-infer.slice", "edge_netqos_python": "/usr/bin/python3",
                 "edge_netqos_loader_path": "/usr/local/sbin/edgetune-netqos", "edge_netqos_replace_root": False}
    template = ROOT / "roles/edge_netqos/templates/edgetune-netqos@.service.j2"
    done = subprocess.run([sys.executable, "-c", RENDER, str(template), json.dumps(variables)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=True)
    return done.stdout


def directives(unit):
    return [line for line in unit.splitlines() if line and not line.startswith(("#", "["))]


@pytest.mark.controller
def test_the_netqos_unit_follows_the_interface_where_systemd_has_device_units():
    unit = directives(render_unit(True))
    assert "BindsTo=sys-subsystem-net-devices-%i.device" in unit
    assert "After=sys-subsystem-net-devices-%i.device" in unit
    assert "WantedBy=sys-subsystem-net-devices-%i.device" in unit
    assert not [line for line in unit if "multi-user" in line or line.startswith("Condition")]


@pytest.mark.controller
def test_the_netqos_unit_starts_at_boot_where_systemd_has_none():
    unit = directives(render_unit(False))
    assert not [line for line in unit if "sys-subsystem-net-devices" in line], unit
    assert "ConditionPathExists=/sys/class/net/%i" in unit
    assert "WantedBy=multi-user.target" in unit
    # The rest is the same unit.
    assert [line for line in unit if line.startswith(("ExecStart", "Wants=ai-infer", "Type="))] == [
        line for line in directives(render_unit(True)) if line.startswith(("ExecStart", "Wants=ai-infer", "Type="))]
