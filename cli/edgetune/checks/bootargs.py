"""Boot arguments: in the boot file and running; the boot file where the board boots from."""
import re

import pytest


def boot_tokens(host, expected):
    """The arguments the board's boot file gives the next boot."""
    name = expected.get("bootloader_name")
    if name == "uboot_menu":
        return host.file(expected["bootloader"]).content_string.split()
    if name == "grub":
        text = host.file(expected["bootloader"]).content_string
        return [t for q in re.findall(r'"([^"]*)"', text) for t in q.split() if not t.startswith("$")]
    if expected["bootloader"].endswith("extlinux.conf"):
        text = host.file(expected["bootloader"]).content_string
        default = next(line.split()[1] for line in text.splitlines() if line.startswith("DEFAULT"))
        block = text.split("LABEL %s\n" % default, 1)[1]
        return next(line.split(None, 1)[1] for line in block.splitlines() if line.strip().startswith("APPEND")).split()
    env = dict(line.split("=", 1) for line in host.file(expected["bootloader"]).content_string.splitlines()
               if "=" in line)
    return env["extraargs"].split()


@pytest.mark.device
def test_args_are_in_the_boot_file_and_running(host, expected):
    if expected["bootargs"] is None:
        pytest.skip("edge_bootargs is not enabled for this device")
    persisted = boot_tokens(host, expected)
    running = host.file("/proc/cmdline").content_string.split()
    for arg in expected["bootargs"]:
        assert arg in persisted
        assert arg in running
    assert host.file("/sys/devices/system/cpu/isolated").content_string.strip() == expected["isolated"]


@pytest.mark.device
def test_bootloader_file_present(host, expected):
    assert host.file(expected["bootloader"]).is_file
