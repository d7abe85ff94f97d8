"""PCIe QoS: the inventory's TC -> VC mapping on both ends of the NVMe link, and again after a reboot.
The intent is read from the scenario's inventory (``edge_pcie_qos_mappings``,
set for the twins in molecule.yml's provisioner.inventory.group_vars); without
it the role must leave the link alone. The registers are read back from the
twin's config space files with a small decoder written here from the PCIe
register layout (Linux include/uapi/linux/pci_regs.h, pciutils lib/header.h), not with the project's parser.
"""
import re
import subprocess
import time


from edgetune.checks.pcie_qos import (  # noqa: F401  (the device checks, collected here)
    UNIT, assert_mapped, test_boot_unit_and_state_file, test_nvme_link_is_mapped_on_both_ends,
    test_without_a_mapping_the_link_is_left_alone)


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
