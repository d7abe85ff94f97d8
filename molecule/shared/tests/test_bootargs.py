"""Boot arguments: in the boot file, running after the one reboot, safe to change.

The device check is edgetune.checks.bootargs's (`edgetune verify` runs it on devices), collected here.
"""
import pytest
from conftest import recap, run_site

from edgetune.checks.bootargs import boot_tokens, test_args_are_in_the_boot_file_and_running  # noqa: F401

# Runs about the boot arguments alone (no reboot is due in them).
BOOTARGS_TAGS = "edge_facts,edge_bootargs"


def test_vendor_arguments_and_cbootargs_kept(host, expected):
    persisted = boot_tokens(host, expected)
    if expected["bootloader"].endswith("extlinux.conf"):
        assert persisted[0] == "${cbootargs}"
        assert persisted[1].startswith("root=PARTUUID=") and "console=ttyTCU0,115200" in persisted
    else:
        assert persisted[0] == "cma=256M"


def test_extlinux_keeps_a_bootable_fallback_entry(host, expected):
    """The fallback is a whole copy of the default entry with arguments this board has
    booted (the stock ones after the first change; which ones after later changes is
    proven by the unit tests of plan_extlinux)."""
    if not expected["bootloader"].endswith("extlinux.conf"):
        pytest.skip("no boot menu entries in %s" % expected["bootloader"])
    text = host.file(expected["bootloader"]).content_string
    assert text.startswith("TIMEOUT 30\nDEFAULT primary\n")
    default = text.split("LABEL primary\n", 1)[1].split("\n\n", 1)[0].splitlines()
    fallback = text.split("LABEL edgetune-fallback\n", 1)[1].split("\n\n", 1)[0].splitlines()
    keywords = ("LINUX", "INITRD", "FDT")
    assert [line for line in fallback if line.split()[0] in keywords] == \
        [line for line in default if line.split()[0] in keywords]
    append = next(line for line in fallback if line.strip().startswith("APPEND")).split()
    assert append[1] == "${cbootargs}" and append[2].startswith("root=PARTUUID=")
    assert "console=ttyTCU0,115200" in append
    assert "# LABEL backup" in text  # NVIDIA's commented block is left as it was


@pytest.mark.one_per_family
def test_pending_reboot_with_policy_never_then_dropped_args_removed(host, expected):
    """A new argument is persisted but reported pending under policy never;
    dropping it from the intent removes it again (and only it)."""
    result = run_site(host, "--tags", BOOTARGS_TAGS, "-e", "edge_reboot_policy=never",
                      "-e", '{"edge_bootargs_extra": ["nosoftlockup"]}')
    assert recap(result.stdout, host.backend.host)["failed"] == 0, result.stdout[-3000:]
    assert "Reboot pending (edge_reboot_policy is never)" in result.stdout
    assert "nosoftlockup" in boot_tokens(host, expected)
    assert "nosoftlockup" not in host.file("/proc/cmdline").content_string.split()

    result = run_site(host, "--tags", BOOTARGS_TAGS)  # back to the inventory's intent
    assert recap(result.stdout, host.backend.host)["failed"] == 0, result.stdout[-3000:]
    persisted = boot_tokens(host, expected)
    assert "nosoftlockup" not in persisted
    for arg in expected["bootargs"]:
        assert arg in persisted and arg in host.file("/proc/cmdline").content_string.split()


def test_bad_cpu_set_fails_clearly_and_leaves_the_boot_file(host, expected):
    before = host.file(expected["bootloader"]).content_string
    result = run_site(host, "--tags", BOOTARGS_TAGS, "-e", "edge_bootargs_isolate=6-19")
    assert recap(result.stdout, host.backend.host)["failed"] == 1
    assert "do not exist on this board" in result.stdout
    assert host.file(expected["bootloader"]).content_string == before
