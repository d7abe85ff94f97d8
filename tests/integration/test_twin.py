"""Device twins behave like the boards across a reboot.

Creates real twin containers with the project's own tool, changes the boot
file as a user (or a role) would, reboots, and checks what a user would check
on the device: /proc/cmdline, the boot id, the sysfs state after power-on.
"""
import subprocess
import time

import pytest

from edgetune_dev.twin import manager

pytestmark = pytest.mark.controller


def sh(name, command):
    result = subprocess.run(["docker", "exec", name, "sh", "-c", command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def reboot(name):
    before = sh(name, "cat /proc/sys/kernel/random/boot_id")
    subprocess.run(["docker", "exec", name, "systemctl", "reboot"], check=False)
    deadline = time.time() + 90
    while time.time() < deadline:
        time.sleep(1)
        probe = subprocess.run(["docker", "exec", name, "cat", "/proc/sys/kernel/random/boot_id"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() not in ("", before):
            manager.wait_booted(name)
            return probe.stdout.strip()
    pytest.fail("twin %s did not come back from reboot" % name)


@pytest.fixture(scope="module")
def twins():
    manager.ensure_images(["bookworm"])
    names = {"orin": "it-twin-orin-nx", "rock": "it-twin-rock5b"}
    for name in names.values():
        manager.remove(name)
    manager.create(names["orin"], "orin-nx-16gb-r36")
    manager.create(names["rock"], "rock5b-rk3588")
    yield names
    for name in names.values():
        manager.remove(name)


def test_l4t_cmdline_is_the_default_labels_append_without_cbootargs(twins):
    name = twins["orin"]
    append = sh(name, "sed -n 's/^ *APPEND //p' /boot/extlinux/extlinux.conf | head -1")
    cmdline = sh(name, "cat /proc/cmdline")
    assert append.startswith("${cbootargs} ")
    # L4TLauncher drops the first ${cbootargs} and appends its own args at the end.
    assert cmdline.startswith(append[len("${cbootargs} "):] + " bl_prof_dataptr=")
    assert "${cbootargs}" not in cmdline


def test_reboot_rederives_cmdline_resets_sysfs_and_changes_boot_id(twins):
    name = twins["orin"]
    first_boot = sh(name, "cat /proc/sys/kernel/random/boot_id")
    sh(name, "sed -i 's/^\\( *APPEND .*\\)$/\\1 isolcpus=managed_irq,domain,4-7/' /boot/extlinux/extlinux.conf")
    sh(name, "echo performance > /sys/devices/system/cpu/cpufreq/policy4/scaling_governor")
    second_boot = reboot(name)
    assert second_boot != first_boot
    cmdline = sh(name, "cat /proc/cmdline").split()
    assert "isolcpus=managed_irq,domain,4-7" in cmdline
    assert cmdline.index("isolcpus=managed_irq,domain,4-7") < cmdline.index("bl_prof_dataptr=2031616@0x471E10000")
    assert sh(name, "cat /sys/devices/system/cpu/isolated") == "4-7"
    assert sh(name, "cat /sys/devices/system/cpu/cpufreq/policy4/scaling_governor") == "schedutil"


def test_jetson_io_default_label_is_followed(twins):
    name = twins["orin"]
    sh(name, "cp /boot/extlinux/extlinux.conf /root/extlinux.orig")
    sh(name, "printf 'LABEL JetsonIO\\n\\tMENU LABEL Custom Header Config\\n\\tLINUX /boot/Image\\n"
             "\\tAPPEND ${cbootargs} root=/dev/nvme0n1p1 jetsonio=1\\n' >> /boot/extlinux/extlinux.conf")
    sh(name, "sed -i 's/^DEFAULT primary/DEFAULT JetsonIO/' /boot/extlinux/extlinux.conf")
    reboot(name)
    assert sh(name, "cat /proc/cmdline").startswith("root=/dev/nvme0n1p1 jetsonio=1 bl_prof_dataptr=")
    sh(name, "cp /root/extlinux.orig /boot/extlinux/extlinux.conf")


def test_armbian_cmdline_is_built_from_armbianenv(twins):
    name = twins["rock"]
    sh(name, "sed -i 's/^extraargs=.*/extraargs=cma=256M nohz_full=4-7/' /boot/armbianEnv.txt")
    reboot(name)
    cmdline = sh(name, "cat /proc/cmdline")
    assert cmdline.startswith("root=UUID=6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f rootwait rootfstype=ext4 "
                              "console=ttyS2,1500000 console=tty1 consoleblank=0 loglevel=1 ")
    assert "usb-storage.quirks=0x2537:0x1066:u,0x2537:0x1068:u cma=256M nohz_full=4-7" in cmdline
    # docker_optimizations=off in this board's file: no cgroup_enable args.
    assert "cgroup_enable" not in cmdline


def test_twin_sysfs_is_not_the_hosts(twins):
    name = twins["rock"]
    assert sh(name, "ls /sys/devices/system/cpu/cpufreq") == "policy0\npolicy4\npolicy6"
    host_has_devfreq = subprocess.run(["test", "-e", "/sys/class/devfreq/dmc"], check=False).returncode == 0
    assert not host_has_devfreq
    assert sh(name, "cat /sys/class/devfreq/dmc/governor") == "dmc_ondemand"


def test_unmovable_irq_refuses_affinity_write(twins):
    name = twins["orin"]
    refused = subprocess.run(["docker", "exec", name, "sh", "-c", "echo 0 > /proc/irq/11/smp_affinity_list"],
                             stderr=subprocess.PIPE, check=False)
    assert refused.returncode != 0
    sh(name, "echo 0-3 > /proc/irq/70/smp_affinity_list")
    assert sh(name, "cat /proc/irq/70/smp_affinity_list") == "0-3"


def test_twins_made_one_by_one_stay_out_of_the_fleet(twins, tmp_path):
    """Molecule's and developers' twins are not in `twin up`'s inventory, and `twin down` leaves them."""
    inventory = manager.write_inventory(tmp_path).read_text()
    fleet = [twin["name"] for twin in manager.twins(fleet_only=True)]
    for name in twins.values():
        assert name not in inventory and name not in fleet
        assert name in [twin["name"] for twin in manager.twins()]
