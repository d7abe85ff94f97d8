"""Unit tests for plugins/module_utils/device/edge_bootguard.py: the whole-entry boot check."""
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_bootguard import (
    UnbootableEntry,
    boot_problems,
    check_bootable,
    command_line_size,
    file_problems,
    line_limit,
    parse_isolcpus,
    parse_kernel_cpulist,
)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import (
    plan_armbian,
    plan_extlinux,
    split_cmdline,
)

FIXTURES = Path(__file__).parent / "fixtures" / "bootloader"
STOCK = split_cmdline("root=PARTUUID=4b8a73c4-0b3e-4bd5-9a3c-6c2d1e0f9a87 rw rootwait rootfstype=ext4 "
                      "console=ttyTCU0,115200")


def fixture(name):
    with open(FIXTURES / name, encoding="utf-8", newline="") as handle:
        return handle.read()


def problems(tokens, bootloader="extlinux", **kwargs):
    kwargs.setdefault("machine", "aarch64")
    return boot_problems(bootloader, tokens, **kwargs)


# ---------------------------------------------------------------------------
# CPU lists and isolcpus, as the kernel reads them
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, cpus", [
    ("4", [4]), ("4-7", [4, 5, 6, 7]), ("0,2,4-5", [0, 2, 4, 5]), ("04-05", [4, 5]),
    ("0-9:2/5", [0, 1, 5, 6]),  # kernel-parameters.txt: used/group
    ("100-151:2/25", [100, 101, 125, 126, 150, 151]),
])
def test_kernel_cpulist(text, cpus):
    assert parse_kernel_cpulist(text) == cpus


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("4-", "not a CPU number"), (",4", "not a CPU number"), ("4,,5", "not a CPU number"),
    ("7-4", "goes down"), ("4-7:3/2", "used/group"), ("4-7:0/2", "used/group"), ("0-7:1/0", "used/group"),
    ("N", "newer than the 5.10"), ("all", "newer than the 5.10"), ("4-N", "newer than the 5.10"),
    ("4 5", "not a CPU number"), ("0x4", "not a CPU number"), ("4096", "above 4095"),
])
def test_kernel_cpulist_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_kernel_cpulist(text)


@pytest.mark.parametrize("value, flags, cpus", [
    ("4-7", [], [4, 5, 6, 7]),
    ("managed_irq,domain,4-7", ["managed_irq", "domain"], [4, 5, 6, 7]),
    ("nohz,domain,managed_irq,2,3", ["nohz", "domain", "managed_irq"], [2, 3]),
])
def test_isolcpus(value, flags, cpus):
    assert parse_isolcpus(value) == (flags, cpus)


@pytest.mark.parametrize("value, message", [
    ("domian,4-7", "unknown flag 'domian'"), ("managed_irqs,4-7", "unknown flag"), ("nohz_full,4-7", "unknown flag"),
    ("domain", "no CPU list"), ("domain,", "CPU list is empty"), ("N", "unknown flag 'N'"),
])
def test_isolcpus_refused(value, message):
    with pytest.raises(ValueError, match=message):
        parse_isolcpus(value)


def test_every_isolation_parameter_is_checked():
    bad = ["isolcpus=domian,4-7", "nohz_full=4-x", "rcu_nocbs=", "irqaffinity=0-3,", "isolcpus", "nohz_full"]
    found = problems(STOCK + bad)
    assert len(found) == len(bad)
    for token, problem in zip(bad, found):
        assert problem.startswith(token)
    good = ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7", "rcu_nocbs=4-7", "irqaffinity=0-3", "rcu_nocbs"]
    assert problems(STOCK + good) == []


def test_isolcpus_and_nohz_full_must_name_the_same_cpus():
    found = problems(STOCK + ["isolcpus=domain,4-7", "nohz_full=4-6"])
    assert len(found) == 1 and "name different CPUs" in found[0] and "(4-6)" in found[0]
    assert problems(STOCK + ["isolcpus=domain,4-7", "nohz_full=4,5,6,7"]) == []
    # A kept duplicate counts too (extlinux_several_labels.conf's tuned label).
    assert "different CPUs" in problems(STOCK + ["isolcpus=4-7", "isolcpus=6-7"])[0]


# ---------------------------------------------------------------------------
# The root device, per bootloader
# ---------------------------------------------------------------------------

def test_l4t_needs_a_root():
    without = [t for t in STOCK if not t.startswith("root=")]
    assert "would have no root=" in problems(without, before=STOCK)[0]
    assert "would have no root=" in problems(without)[0]  # nothing known about the entry as found
    # jetson-io's APPEND ${cbootargs} alone: root comes some way this check cannot see; kept as found.
    assert problems(["quiet"], before=[]) == []
    assert "without a root device" in problems(["root="], before=[])[0]


@pytest.mark.parametrize("token", ["root=", 'root=""', '"root="', "root=\" \""])
@pytest.mark.parametrize("bootloader", ["extlinux", "armbian", "uboot_menu", "grub"])
def test_an_empty_root_is_refused_everywhere(bootloader, token):
    found = problems(STOCK + [token], bootloader)
    assert len(found) == 1 and "without a root device" in found[0]
    assert ("rootdev= in armbianEnv.txt" in found[0]) == (bootloader == "armbian")


def test_the_last_root_wins():
    assert problems(["root=", "root=/dev/sda1"]) == []
    assert problems(["root=/dev/sda1", "root="]) != []


@pytest.mark.parametrize("bootloader", ["uboot_menu", "grub"])
def test_root_may_be_absent_where_the_update_command_adds_it(bootloader):
    assert problems(["quiet", "console=ttyS0"], bootloader) == []


def test_armbian_without_rootdev():
    # armbian_boot_tokens leaves root= out when rootdev= is empty.
    assert "rootdev= in armbianEnv.txt is empty" in problems(["rootwait"], "armbian")[0]


@pytest.mark.parametrize("token, message", [("rootfstype=", "no file system type"), ("init=", "panics")])
def test_empty_rootfstype_and_init(token, message):
    found = problems(STOCK + [token])
    assert len(found) == 1 and message in found[0]


# ---------------------------------------------------------------------------
# Length
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("machine, size", [
    ("aarch64", 2048), ("x86_64", 2048), ("i686", 2048), ("armv7l", 1024), ("riscv64", 512), ("", 512),
])
def test_command_line_size(machine, size):
    assert command_line_size(machine) == size


def test_uboot_extlinux_buffer_is_smaller_than_the_kernel():
    assert line_limit("uboot_menu", "aarch64")[0] == 1023
    assert line_limit("extlinux", "aarch64")[0] == 2047


def pad_to(tokens, length):
    """tokens plus one x=... argument, rendered to exactly ``length`` characters."""
    rendered = len(" ".join(tokens))
    return tokens + ["x=" + "a" * (length - rendered - 3)]


@pytest.mark.parametrize("bootloader, fits", [("extlinux", 2047 - 257), ("armbian", 2047 - 97),
                                              ("grub", 2047 - 257), ("uboot_menu", 1023 - 129)])
def test_length_counts_what_the_bootloader_adds(bootloader, fits):
    tokens = pad_to(list(STOCK), fits)
    assert len(" ".join(tokens)) == fits
    assert problems(tokens, bootloader) == []
    longer = pad_to(list(STOCK), fits + 1)
    found = problems(longer, bootloader)
    assert len(found) == 1 and f"would be {fits + 1} characters" in found[0] and "the longest is 'x=aaa" in found[0]


def test_length_of_the_architecture():
    tokens = pad_to(list(STOCK), 1500)
    assert problems(tokens, machine="aarch64") == []
    assert "COMMAND_LINE_SIZE of armv7l is 1024" in problems(tokens, machine="armv7l")[0]


def test_a_5000_character_argument():
    found = problems(STOCK + ["a=" + "b" * 5000])
    assert "over the 2047 that fit" in found[0]


# ---------------------------------------------------------------------------
# Characters and expansions
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("token, message", [
    ("a=b\x00c", "U+0000 (NUL)"), ('a="x\ny"', "U+000A (newline)"), ("a=\x1b[0m", "U+001B (escape)"),
    ("a=\x7f", "U+007F (DEL)"), ("a=\x85", "control character U+0085"), ("caf\u00e9=1", "non-ASCII"),
    ("a=\u200b", "non-ASCII character U+200B"),
])
def test_characters(token, message):
    found = problems(STOCK + [token])
    assert len(found) == 1 and message in found[0]


@pytest.mark.parametrize("token, what", [
    ("a=$(reboot)", "command substitution"), ("a=`id`", "command substitution"), ("a=${HOME}", "${...} variable"),
    ("a=$HOME", "$ expansion"), ("${cbootargs}", "${...} variable"),
])
@pytest.mark.parametrize("bootloader", ["armbian", "uboot_menu", "grub"])
def test_expansions_refused(bootloader, token, what):
    found = problems(STOCK + [token], bootloader)
    assert len(found) == 1 and what in found[0]


def test_cbootargs_is_l4t_own_variable():
    assert problems(STOCK + ["${cbootargs}"]) == []
    assert "${...} variable" in problems(STOCK + ["x=${cbootargs}"])[0]


def test_quoted_spaces_are_fine():
    assert problems(STOCK + ['dyndbg="file drivers/usb/* +p"']) == []


def test_file_text_control_characters():
    text = fixture("extlinux_r36_orin_nx.conf")
    assert file_problems(text) == []
    assert file_problems(text.replace("\n", "\r\n")) == []  # CRLF line ends are line ends
    assert file_problems("TIMEOUT 30\n\tDEFAULT x\n") == []
    assert "line 2 " in file_problems("a\nb\x00\n")[0]
    assert "U+000D (carriage return)" in file_problems("a\rb\n")[0]
    assert "U+000C" in file_problems("a\x0c\n")[0]


# ---------------------------------------------------------------------------
# On the real layouts, as the module and the audit call it
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["extlinux_r35_agx_orin.conf", "extlinux_r36_orin_nx.conf", "extlinux_tabs.conf",
                                  "extlinux_inline_comment.conf", "extlinux_no_trailing_newline.conf",
                                  "extlinux_jetsonio_default.conf"])
def test_stock_l4t_files_pass_as_found(name):
    text = fixture(name)
    tokens = plan_extlinux(text, [], [])[1]
    assert boot_problems("extlinux", tokens, text=text, before=tokens, machine="aarch64") == []
    role_args = ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7", "rcu_nocbs=4-7", "irqaffinity=0-3",
                 "systemd.unified_cgroup_hierarchy=1"]
    after, planned = plan_extlinux(text, role_args, [])
    assert boot_problems("extlinux", planned, text=after, before=tokens, machine="aarch64") == []


@pytest.mark.parametrize("name", ["armbianEnv_rock5b.txt", "armbianEnv_no_extraargs.txt",
                                  "armbianEnv_no_trailing_newline.txt"])
def test_stock_armbian_files_pass(name):
    text = fixture(name)
    after, planned = plan_armbian(text, ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7"], [])
    assert boot_problems("armbian", planned, text=after, machine="aarch64") == []


def test_check_bootable_names_the_file_and_every_problem():
    with pytest.raises(UnbootableEntry) as refused:
        check_bootable("extlinux", ["rw", "a=$(x)"], "/boot/extlinux/extlinux.conf", before=STOCK, machine="aarch64")
    assert str(refused.value).startswith("/boot/extlinux/extlinux.conf: refusing the planned default entry")
    assert "the file and its backups are unchanged" in str(refused.value)
    assert len(refused.value.problems) == 2
    assert isinstance(refused.value, ValueError)  # the module reports it with fail_json
