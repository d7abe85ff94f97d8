"""PCIe QoS: the inventory's TC -> VC mapping on both ends of the NVMe link (edge_pcie_qos_mappings); without
one, the link left alone. The registers are read back from the config space with a small decoder written here
from the PCIe register layout (Linux include/uapi/linux/pci_regs.h, pciutils lib/header.h), not with the
project's parser."""
import base64
import json
import struct
import subprocess

import pytest

from edgetune.checks import VERIFY_PLAN, inventory_file

NVME_CLASS = "0x0108"
STATE_FILE = "/etc/edgetune/boot.d/pcie-vc.json"
UNIT = "edgetune-boot.service"


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
