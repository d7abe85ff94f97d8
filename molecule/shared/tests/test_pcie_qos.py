"""PCIe QoS: the inventory's TC -> VC mapping on both ends of the NVMe link, and again after a reboot.

The intent is read from the scenario's inventory (``edge_pcie_qos_mappings``,
set for the twins in molecule.yml's provisioner.inventory.group_vars); without
it the role must leave the link alone. The registers are read back from the
twin's config space files with a small decoder written here from the PCIe
register layout (Linux include/uapi/linux/pci_regs.h, pciutils lib/header.h), not with the project's parser.
"""
import base64
import json
import re
import struct
import subprocess
import time

import pytest
from conftest import VERIFY_PLAN, inventory_file

NVME_CLASS = "0x0108"
STATE_FILE = "/etc/edgetune/boot.d/pcie-vc.json"
UNIT = "edgetune-boot.service"
HOW_TO = ('set it in molecule.yml: provisioner.inventory.group_vars.all.edge_pcie_qos_mappings: '
          '[{device_class: "0x0108", tcs: [1], vc_id: 1}]')


def intent(host):
    """The host's edge_pcie_qos_mappings as the converge saw them (the scenario's inventory, or verify's)."""
    done = subprocess.run(["ansible-inventory", "-i", inventory_file(), "--host",
                           host.backend.host], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=True)
    return json.loads(done.stdout).get("edge_pcie_qos_mappings") or []


def config_space(host, bdf):
    text = host.check_output("base64 -w0 /sys/bus/pci/devices/%s/config" % bdf)
    return base64.b64decode(text)


def vc_registers(data, vc_id):
    """{'vc0': VC0 control, 'vcn': (control, status) of the resource with ``vc_id``} of the VC capability."""
    pos, seen = 0x100, set()
    while pos and pos not in seen and 0x100 <= pos <= 0xFFC:
        seen.add(pos)
        header = struct.unpack_from("<I", data, pos)[0]
        if header & 0xFFFF == 0x0002:
            evcc = struct.unpack_from("<I", data, pos + 4)[0] & 7
            found = {"vc0": struct.unpack_from("<I", data, pos + 0x14)[0], "vcn": None}
            for n in range(1, evcc + 1):
                ctrl = struct.unpack_from("<I", data, pos + 0x14 + 12 * n)[0]
                if (ctrl >> 24) & 7 == vc_id:
                    found["vcn"] = (ctrl, struct.unpack_from("<H", data, pos + 0x1A + 12 * n)[0])
            return found
        pos = (header >> 20) & 0xFFC
    return None


@pytest.fixture
def link(host):
    """(upstream BDF, NVMe BDF) of the twin's NVMe link."""
    found = host.run("grep -l '^%s' /sys/bus/pci/devices/*/class" % NVME_CLASS).stdout.split()
    if not found:
        pytest.skip("this twin has no NVMe controller")
    nvme = found[0].split("/")[-2]
    upstream = host.check_output("basename $(readlink -f /sys/bus/pci/devices/%s/..)" % nvme)
    return upstream, nvme


@pytest.fixture
def mapping(host):
    """The one mapping the twins get: NVMe by class (other shapes are covered by the unit tests)."""
    mappings = intent(host)
    if not mappings:
        pytest.skip("edge_pcie_qos_mappings is not set for this scenario; " + HOW_TO)
    if VERIFY_PLAN and not (len(mappings) == 1 and mappings[0].get("device_class") == NVME_CLASS):
        pytest.skip("these checks know one mapping shape (NVMe by class); this device's: %s" % mappings)
    assert len(mappings) == 1 and mappings[0].get("device_class") == NVME_CLASS, mappings
    wanted = mappings[0]
    tc_map = sum(1 << tc for tc in wanted["tcs"])
    return {"tcs": wanted["tcs"], "tc_map": tc_map, "vc_id": wanted.get("vc_id", 1)}


def assert_mapped(host, link, mapping):
    for bdf in link:
        regs = vc_registers(config_space(host, bdf), mapping["vc_id"])
        assert regs and regs["vcn"], "%s has no VC with VC ID %d" % (bdf, mapping["vc_id"])
        ctrl, status = regs["vcn"]
        assert ctrl >> 31 == 1, "%s: VC ID %d is not enabled (0x%08x)" % (bdf, mapping["vc_id"], ctrl)
        assert ctrl & 0xFF == mapping["tc_map"], "%s: VC map 0x%02x" % (bdf, ctrl & 0xFF)
        assert regs["vc0"] & 0xFF == 0xFF & ~mapping["tc_map"], "%s: VC0 map 0x%02x" % (bdf, regs["vc0"] & 0xFF)
        # The twin's link-partner model clears Negotiation Pending only when both
        # ends have the VC ID enabled.
        assert not status & 0x2, "%s: VC negotiation still pending" % bdf


@pytest.mark.device
def test_without_a_mapping_the_link_is_left_alone(host, link):
    if intent(host):
        pytest.skip("this scenario maps TCs (see the other tests)")
    assert not host.file(STATE_FILE).exists
    for bdf in link:
        regs = vc_registers(config_space(host, bdf), 1)
        if VERIFY_PLAN and not (regs and regs["vcn"]):
            continue   # a real device's port without VC1 (the twins all have one)
        assert regs["vc0"] & 0xFF == 0xFF and not regs["vcn"][0] >> 31  # power-on: all TCs on VC0


@pytest.mark.device
def test_nvme_link_is_mapped_on_both_ends(host, link, mapping):
    assert link[0] != link[1]
    assert_mapped(host, link, mapping)


@pytest.mark.device
def test_boot_unit_and_state_file(host, link, mapping):
    state = json.loads(host.file(STATE_FILE).content_string)
    assert (state["format"], state["kind"]) == (1, "pcie_vc")
    assert [(m["device_class"], m["tcs"], m.get("vc_id", 1)) for m in state["settings"]["mappings"]] == \
        [(NVME_CLASS, mapping["tcs"], mapping["vc_id"])]
    assert host.service(UNIT).is_enabled


def test_mapping_is_reapplied_after_a_reboot(host, link, mapping):
    name = host.backend.host
    boot_id = host.file("/proc/sys/kernel/random/boot_id").content_string.strip()
    # The twin fakes its boot id, journald keeps the host kernel's one: select this boot's lines by time.
    since = int(time.time()) - 1
    subprocess.run(["docker", "exec", name, "systemctl", "reboot"], check=False)
    deadline = time.time() + 180
    while True:
        assert time.time() < deadline, "%s did not come back from the reboot" % name
        time.sleep(2)
        probe = subprocess.run(["docker", "exec", name, "systemctl", "is-system-running"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
        if probe.stdout.strip() not in ("running", "degraded"):
            continue
        new = subprocess.run(["docker", "exec", name, "cat", "/proc/sys/kernel/random/boot_id"],
                             stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
        if new and new != boot_id:
            break
    assert sorted(host.check_output("systemctl show -p ActiveState -p Result %s" % UNIT).split()) == \
        ["ActiveState=active", "Result=success"]
    # The twin powered on with the VC disabled on both ends; the unit mapped it again in this boot.
    log = host.check_output("journalctl -u %s --since @%d --no-pager -o cat" % (UNIT, since))
    enabled = 0x80000000 | (mapping["vc_id"] << 24) | mapping["tc_map"]
    for bdf in link:
        assert re.search(r"^edgetune-boot: pcie_vc: %s VC\d Resource Control 0x[0-9a-f]{3}: 0x[0-9a-f]{8} -> 0x%08x$"
                         % (re.escape(bdf), enabled), log, re.M), log
    assert_mapped(host, link, mapping)
