"""Unit tests for plugins/module_utils/device/edge_cmdline.py (pure functions on fixture text)."""
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import (
    CBOOTARGS,
    FALLBACK_LABEL,
    FALLBACK_MENU_LABEL,
    ExtlinuxConfig,
    apply_args,
    armbian_boot_tokens,
    extlinux_fallback_label,
    grub_dropin_tokens,
    pending_changes,
    plan_armbian,
    plan_extlinux,
    plan_grub,
    plan_kernel_cmdline,
    plan_uboot_default,
    render_cmdline,
    render_grub_dropin,
    split_cmdline,
    token_key,
    validate_args,
)

FIXTURES = Path(__file__).parent / "fixtures" / "bootloader"


def fixture(name):
    with open(FIXTURES / name, encoding="utf-8", newline="") as handle:
        return handle.read()


def append_line(text):
    """The single APPEND line of the default label (for building expectations)."""
    config = ExtlinuxConfig(text)
    return config.lines[config.default_label().append_lines[0]][0]


# ---------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------

class TestSplitCmdline:
    def test_whitespace_of_any_kind_separates(self):
        assert split_cmdline(" quiet\trw\n root=/dev/sda1  ") == ["quiet", "rw", "root=/dev/sda1"]

    def test_double_quotes_keep_spaces_and_stay_in_token(self):
        text = 'a=1 dyndbg="file foo.c +p" "b=c d" e'
        assert split_cmdline(text) == ["a=1", 'dyndbg="file foo.c +p"', '"b=c d"', "e"]

    def test_empty(self):
        assert split_cmdline("") == []
        assert split_cmdline(" \n") == []

    def test_unbalanced_quote_is_refused(self):
        with pytest.raises(ValueError, match="unbalanced double quote at character 11"):
            split_cmdline('quiet key="a b')

    def test_render_round_trip(self):
        text = 'console=ttyTCU0,115200 key="a  b" quiet'
        assert render_cmdline(split_cmdline(text)) == text


@pytest.mark.parametrize(
    "token, key",
    [
        ("isolcpus=1-3", "isolcpus"),
        ("quiet", "quiet"),
        ("console=ttyS2,1500000", "console"),
        ('dyndbg="file a.c +p"', "dyndbg"),
        ('"foo=a b"', "foo"),
        ('"quiet"', "quiet"),
        ("key=", "key"),
        ("a=b=c", "a"),
        (CBOOTARGS, CBOOTARGS),
    ],
)
def test_token_key(token, key):
    assert token_key(token) == key


# ---------------------------------------------------------------------------
# apply_args
# ---------------------------------------------------------------------------

class TestApplyArgs:
    def test_key_value_replaces_all_occurrences_in_first_place(self):
        tokens = ["a", "isolcpus=1", "b", "isolcpus=2", "c"]
        assert apply_args(tokens, ["isolcpus=3"], []) == ["a", "isolcpus=3", "b", "c"]

    def test_same_key_twice_in_args_replaces_the_group(self):
        tokens = ["console=ttyTCU0,115200", "rw", "console=ttyAMA0,115200"]
        args = ["console=tty0", "console=ttyTCU0,115200"]
        assert apply_args(tokens, args, []) == ["console=tty0", "console=ttyTCU0,115200", "rw"]

    def test_bare_flag_appended_only_if_missing(self):
        assert apply_args(["rw"], ["quiet"], []) == ["rw", "quiet"]
        assert apply_args(["quiet", "rw"], ["quiet"], []) == ["quiet", "rw"]

    def test_new_tokens_appended_in_given_order(self):
        assert apply_args(["rw"], ["b=1", "a", "c=2"], []) == ["rw", "b=1", "a", "c=2"]

    def test_absent_bare_key_removes_every_form(self):
        tokens = ["isolcpus=1-3", "rw", "isolcpus", "quiet"]
        assert apply_args(tokens, [], ["isolcpus"]) == ["rw", "quiet"]

    def test_absent_key_value_removes_only_exact_matches(self):
        tokens = ["console=tty0", "console=ttyTCU0,115200"]
        assert apply_args(tokens, [], ["console=tty0"]) == ["console=ttyTCU0,115200"]

    def test_cbootargs_never_touched_and_stays_first(self):
        tokens = [CBOOTARGS, "root=/dev/sda1", "quiet"]
        assert apply_args(tokens, ["a=1"], ["quiet"]) == [CBOOTARGS, "root=/dev/sda1", "a=1"]

    def test_exact_duplicate_arg_is_added_once(self):
        assert apply_args([], ["a=1", "a=1", "q", "q"], []) == ["a=1", "q"]

    def test_quoted_value(self):
        assert apply_args(["x"], ['dyndbg="file a.c +p"'], []) == ["x", 'dyndbg="file a.c +p"']

    @pytest.mark.parametrize(
        "args, absent, message",
        [
            (["a b"], [], "exactly one kernel argument"),
            ([" quiet"], [], "exactly one kernel argument"),
            ([""], [], "empty"),
            (["   "], [], "empty"),
            ([], ["x y"], "exactly one kernel argument"),
            (["isolcpus=1"], ["isolcpus"], "both in args and absent: isolcpus"),
            (["quiet"], ["quiet"], "both in args and absent"),
            (['k="a b'], [], "unbalanced"),
            (["a=#1"], [], "'#'"),
            ([CBOOTARGS], [], "never edited"),
            ([], [CBOOTARGS], "never edited"),
            (["=x"], [], "no usable parameter name"),
            (["splash", "splash=verbose"], [], "bare flag and as key=value"),
        ],
    )
    def test_invalid_items_are_refused(self, args, absent, message):
        with pytest.raises(ValueError, match=message.replace("$", r"\$")):
            apply_args(["rw"], args, absent)

    def test_non_string_is_a_type_error(self):
        with pytest.raises(TypeError):
            validate_args([3], [])
        with pytest.raises(TypeError):
            validate_args("quiet", [])


def test_pending_changes():
    running = ["root=/dev/sda1", "isolcpus=2", "quiet"]
    assert pending_changes(running, ["isolcpus=2", "nohz_full=2"], ["quiet", "splash"]) == [
        "nohz_full=2", "quiet"]


# Hypothesis: generated tokens, including quoted values with spaces.
KEYS = st.text("abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=8).filter(
    lambda key: not key.startswith("-") or len(key) > 1)
PLAIN_VALUES = st.text("abcxyz0123456789,:/.-+@", max_size=8)
QUOTED_VALUES = st.text("abc xyz,=+.", max_size=8).map(lambda value: '"' + value + '"')
TOKENS = st.one_of(
    KEYS,
    st.builds(lambda k, v: k + "=" + v, KEYS, PLAIN_VALUES),
    st.builds(lambda k, v: k + "=" + v, KEYS, QUOTED_VALUES),
)
TOKEN_LISTS = st.lists(TOKENS, max_size=12)


@given(TOKEN_LISTS)
def test_property_split_render_round_trip(tokens):
    assert split_cmdline(render_cmdline(tokens)) == tokens
    text = render_cmdline(tokens)
    assert render_cmdline(split_cmdline(text)) == text


def _valid(args, absent):
    try:
        validate_args(args, absent)
    except ValueError:
        return False
    return True


@given(TOKEN_LISTS, st.lists(TOKENS, max_size=5), st.lists(st.one_of(KEYS, TOKENS), max_size=4))
def test_property_apply_is_idempotent_and_complete(tokens, args, absent):
    assume(_valid(args, absent))
    once = apply_args(tokens, args, absent)
    assert apply_args(once, args, absent) == once
    for arg in args:
        assert arg in once
    for item in absent:
        if "=" in item:
            assert item not in once
        else:
            assert all(token_key(token) != item for token in once)


@given(TOKEN_LISTS, st.lists(TOKENS, max_size=5))
def test_property_cbootargs_stays_first(tokens, args):
    assume(_valid(args, []))
    assert apply_args([CBOOTARGS] + tokens, args, [])[0] == CBOOTARGS


# ---------------------------------------------------------------------------
# extlinux.conf (L4TLauncher)
# ---------------------------------------------------------------------------

def fallback_block(lines, indent="      "):
    return "".join(indent + line + "\n" for line in lines)


class TestExtlinuxStock:
    def test_r35_edit_and_fallback_exact(self):
        text = fixture("extlinux_r35_agx_orin.conf")
        old_append = append_line(text)
        new_text, persisted = plan_extlinux(text, ["isolcpus=4-7", "nohz_full=4-7"], ["nospectre_bhb"])

        new_append = old_append.replace(" nospectre_bhb", "") + " isolcpus=4-7 nohz_full=4-7"
        block = (
            "\nLABEL edgetune-fallback\n"
            + fallback_block([
                "MENU LABEL " + FALLBACK_MENU_LABEL,
                "LINUX /boot/Image",
                "FDT /boot/dtb/kernel_tegra234-p3701-0000-p3737-0000.dtb",
                "INITRD /boot/initrd",
            ])
            + old_append + "\n"
        )
        expected = text.replace(old_append + "\n", new_append + "\n" + block)
        assert new_text == expected
        assert persisted == split_cmdline(new_append)[2:]  # without "APPEND ${cbootargs}"
        assert persisted[0].startswith("root=PARTUUID=")

    def test_r35_commented_backup_block_is_not_a_label(self):
        text = fixture("extlinux_r35_agx_orin.conf")
        assert [label.name for label in ExtlinuxConfig(text).labels] == ["primary"]
        new_text, _plans = plan_extlinux(text, ["quiet"], [])
        assert [label.name for label in ExtlinuxConfig(new_text).labels] == [
            "primary", FALLBACK_LABEL]
        # NVIDIA's comment block is still there, byte for byte, after the new label.
        comment_start = text.index("# When testing")
        assert new_text.endswith(text[comment_start:])

    def test_r36_idempotent(self):
        text = fixture("extlinux_r36_orin_nx.conf")
        once, persisted = plan_extlinux(text, ["isolcpus=2-3"], [])
        twice, persisted_again = plan_extlinux(once, ["isolcpus=2-3"], [])
        assert twice == once
        assert persisted_again == persisted
        assert persisted[-3:] == ["video=efifb:off", "console=tty0", "isolcpus=2-3"]

    def test_no_change_leaves_text_and_adds_no_fallback(self):
        text = fixture("extlinux_r36_orin_nx.conf")
        new_text, persisted = plan_extlinux(text, ["rw", "net.ifnames=0"], ["nosuchflag"])
        assert new_text == text
        assert CBOOTARGS not in persisted
        assert extlinux_fallback_label(new_text) is None

    def test_without_fallback_only_append_line_changes(self):
        text = fixture("extlinux_r35_agx_orin.conf")
        new_text, _plans = plan_extlinux(text, ["quiet"], [], fallback=False)
        old_lines, new_lines = text.split("\n"), new_text.split("\n")
        assert len(old_lines) == len(new_lines)
        changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]
        assert len(changed) == 1
        assert new_lines[changed[0]] == old_lines[changed[0]] + " quiet"


class TestExtlinuxLayouts:
    def test_jetsonio_default_label_is_edited(self):
        text = fixture("extlinux_jetsonio_default.conf")
        primary_append = text.split("\n")[9]
        new_text, persisted = plan_extlinux(text, ["isolcpus=2-3"], [])
        assert persisted == ["isolcpus=2-3"]
        assert primary_append in new_text  # primary untouched
        expected = text.replace(
            "\tAPPEND ${cbootargs}\n\tOVERLAYS /boot/tegra234-p3767-camera-p3768-imx219-dual.dtbo\n",
            "\tAPPEND ${cbootargs} isolcpus=2-3\n"
            "\tOVERLAYS /boot/tegra234-p3767-camera-p3768-imx219-dual.dtbo\n"
            "\n"
            "LABEL edgetune-fallback\n"
            "\tMENU LABEL edgetune fallback (previous kernel arguments)\n"
            "\tLINUX /boot/Image\n"
            "\tFDT /boot/kernel_tegra234-p3768-0000+p3767-0000-nv-user-custom.dtb\n"
            "\tINITRD /boot/initrd\n"
            "\tAPPEND ${cbootargs}\n"
            "\tOVERLAYS /boot/tegra234-p3767-camera-p3768-imx219-dual.dtbo\n",
        )
        assert new_text == expected
        assert "DEFAULT JetsonIO\n" in new_text

    def test_no_trailing_newline_kept_with_fallback(self):
        text = fixture("extlinux_no_trailing_newline.conf")
        assert not text.endswith("\n")
        new_text, _plans = plan_extlinux(text, ["quiet"], [])
        old_append = text.split("\n")[-1]
        expected = (
            text + " quiet\n\nLABEL edgetune-fallback\n"
            + fallback_block(["MENU LABEL " + FALLBACK_MENU_LABEL, "LINUX /boot/Image",
                              "INITRD /boot/initrd"])
            + old_append
        )
        assert new_text == expected
        assert not new_text.endswith("\n")
        assert plan_extlinux(new_text, ["quiet"], [])[0] == new_text

    def test_no_trailing_newline_kept_without_fallback(self):
        text = fixture("extlinux_no_trailing_newline.conf")
        new_text, _plans = plan_extlinux(text, ["quiet"], [], fallback=False)
        assert new_text == text + " quiet"

    def test_tabs_kept_and_menu_label_added(self):
        text = fixture("extlinux_tabs.conf")
        new_text, persisted = plan_extlinux(text, ["quiet"], [])
        assert new_text == (
            "TIMEOUT 30\nDEFAULT primary\n\nMENU TITLE L4T boot options\n\n"
            "LABEL primary\n\tLINUX /boot/Image\n\tINITRD /boot/initrd\n"
            # the tab after APPEND stays; tokens are re-joined with single spaces
            "\tAPPEND\t${cbootargs} root=/dev/mmcblk0p1 rw rootwait console=ttyTCU0,115200 quiet\n"
            "\nLABEL edgetune-fallback\n"
            "\tMENU LABEL edgetune fallback (previous kernel arguments)\n"
            "\tLINUX /boot/Image\n\tINITRD /boot/initrd\n"
            "\tAPPEND\t${cbootargs} root=/dev/mmcblk0p1 rw rootwait\tconsole=ttyTCU0,115200\n"
        )
        assert persisted[-1] == "quiet"

    def test_inline_comment_kept_byte_for_byte(self):
        text = fixture("extlinux_inline_comment.conf")
        new_text, persisted = plan_extlinux(text, ["isolcpus=2-3"], ["quiet"], fallback=False)
        assert new_text == text.replace(
            "rw rootwait quiet  # isolcpus=2 was tried here",
            "rw rootwait isolcpus=2-3  # isolcpus=2 was tried here",
        )
        assert persisted == ["root=/dev/nvme0n1p1", "rw", "rootwait", "isolcpus=2-3"]

    def test_inline_comment_on_menu_label_kept_in_fallback(self):
        text = fixture("extlinux_inline_comment.conf")
        new_text, _plans = plan_extlinux(text, ["isolcpus=2-3"], [])
        assert "      MENU LABEL " + FALLBACK_MENU_LABEL + "  # stock kernel\n" in new_text
        assert new_text.count("# isolcpus=2 was tried here") == 2

    def test_several_labels_only_default_edited(self):
        text = fixture("extlinux_several_labels.conf")
        new_text, persisted = plan_extlinux(text, ["isolcpus=2-3"], [])
        tuned_old = "      APPEND ${cbootargs} root=/dev/nvme0n1p1 rw rootwait isolcpus=4-7 isolcpus=6-7\n"
        tuned_new = "      APPEND ${cbootargs} root=/dev/nvme0n1p1 rw rootwait isolcpus=2-3\n"
        expected = text.replace(
            tuned_old,
            tuned_new + "\nLABEL edgetune-fallback\n"
            + fallback_block(["MENU LABEL " + FALLBACK_MENU_LABEL, "LINUX /boot/Image",
                              "INITRD /boot/initrd"])
            + tuned_old,
        )
        assert new_text == expected
        assert persisted == ["root=/dev/nvme0n1p1", "rw", "rootwait", "isolcpus=2-3"]
        names = [label.name for label in ExtlinuxConfig(new_text).labels]
        assert names == ["primary", "tuned", FALLBACK_LABEL, "rt"]

    def test_existing_fallback_is_refreshed_not_duplicated(self):
        text = fixture("extlinux_r35_agx_orin.conf")
        first, _plans = plan_extlinux(text, ["isolcpus=4-7"], [])
        second, _plans = plan_extlinux(first, ["isolcpus=8-11"], [])
        config = ExtlinuxConfig(second)
        assert [label.name for label in config.labels] == ["primary", FALLBACK_LABEL]
        fallback_append = config.parsed[config.find_label(FALLBACK_LABEL).end].value
        assert fallback_append.endswith(" nospectre_bhb isolcpus=4-7")
        assert config.parsed[config.default_label().append_lines[0]].value.endswith("isolcpus=8-11")
        # Everything but the two APPEND lines is as after the first edit.
        first_lines, second_lines = first.split("\n"), second.split("\n")
        assert len(first_lines) == len(second_lines)
        assert sum(a != b for a, b in zip(first_lines, second_lines)) == 2

    def test_fallback_is_kept_when_the_edited_entry_never_booted(self):
        """The default entry was edited by hand (isolcpus changed) and not booted: the
        fallback keeps the arguments the device is known to boot with."""
        text = fixture("extlinux_r35_agx_orin.conf")
        first, _plans = plan_extlinux(text, ["isolcpus=4-7"], [])
        running = split_cmdline("root=/dev/mmcblk0p1 console=ttyTCU0 isolcpus=4-7")
        hand_edited = first.replace(" nospectre_bhb isolcpus=4-7\n", " nospectre_bhb isolcpus=5-7\n", 1)
        assert hand_edited != first
        fixed, _plans = plan_extlinux(hand_edited, ["isolcpus=4-7"], [], running=running)
        assert fixed == first  # the default entry repaired, the fallback as it was

        # After a boot with the hand-edited entry, that entry is the known-good one.
        booted = split_cmdline("root=/dev/mmcblk0p1 console=ttyTCU0 isolcpus=5-7")
        refreshed, _plans = plan_extlinux(hand_edited, ["isolcpus=4-7"], [], running=booted)
        config = ExtlinuxConfig(refreshed)
        assert config.parsed[config.find_label(FALLBACK_LABEL).end].value.endswith(" isolcpus=5-7")

    def test_fallback_disabled_leaves_existing_fallback(self):
        first, _plans = plan_extlinux(fixture("extlinux_r35_agx_orin.conf"), ["isolcpus=4-7"], [])
        second, _plans = plan_extlinux(first, ["isolcpus=8-11"], [], fallback=False)
        # Only the default APPEND changed; the fallback still holds the stock arguments.
        changed = [(a, b) for a, b in zip(first.split("\n"), second.split("\n")) if a != b]
        assert changed == [(append_line(first), append_line(second))]
        assert extlinux_fallback_label(second) == FALLBACK_LABEL

    def test_ten_labels_no_room_for_fallback(self):
        text = fixture("extlinux_10_labels.conf")
        with pytest.raises(ValueError, match=r"would make 11 labels.*fallback=false"):
            plan_extlinux(text, ["quiet"], [])
        new_text, _plans = plan_extlinux(text, ["quiet"], [], fallback=False)
        assert len(ExtlinuxConfig(new_text).labels) == 10

    def test_persisted_drops_only_the_first_cbootargs(self):
        text = "DEFAULT a\nLABEL a\n  APPEND ${cbootargs} x ${cbootargs}\n"
        assert plan_extlinux(text, [], [])[1] == ["x", CBOOTARGS]

    def test_default_is_fallback_label_is_refused(self):
        text = "DEFAULT edgetune-fallback\nLABEL edgetune-fallback\n  APPEND x\n"
        with pytest.raises(ValueError, match="edgetune's own fallback"):
            plan_extlinux(text, ["quiet"], [])

    def test_two_append_lines_in_default_label_refused(self):
        text = "DEFAULT a\nLABEL a\n  APPEND x\n  APPEND y\n"
        with pytest.raises(ValueError, match="2 APPEND lines"):
            plan_extlinux(text, ["quiet"], [])

    def test_unbalanced_quote_in_append_refused(self):
        text = 'DEFAULT a\nLABEL a\n  APPEND x="y\n'
        with pytest.raises(ValueError, match="unbalanced double quote"):
            plan_extlinux(text, ["quiet"], [])

    def test_crlf_line_endings_kept(self):
        text = "DEFAULT a\r\nLABEL a\r\n  LINUX /boot/Image\r\n  APPEND ${cbootargs} rw\r\n"
        new_text, _plans = plan_extlinux(text, ["quiet"], [])
        assert new_text == (
            "DEFAULT a\r\nLABEL a\r\n  LINUX /boot/Image\r\n  APPEND ${cbootargs} rw quiet\r\n"
            "\r\nLABEL edgetune-fallback\r\n  MENU LABEL " + FALLBACK_MENU_LABEL + "\r\n"
            "  LINUX /boot/Image\r\n  APPEND ${cbootargs} rw\r\n"
        )


@pytest.mark.parametrize(
    "name, message",
    [
        ("extlinux_11_labels.conf", "11 labels, but L4TLauncher reads at most 10"),
        ("extlinux_default_names_no_label.conf", "DEFAULT 'primary-old' names no label"),
        ("extlinux_no_default.conf", "no DEFAULT line"),
        ("extlinux_duplicate_labels.conf", "duplicate LABEL names: primary"),
        ("extlinux_default_without_append.conf", "default label 'primary' has no APPEND line"),
        ("extlinux_uboot_lowercase.conf", "not an L4TLauncher extlinux.conf"),
    ],
)
def test_extlinux_refusals(name, message):
    with pytest.raises(ValueError, match=message):
        plan_extlinux(fixture(name), ["quiet"], [])


# ---------------------------------------------------------------------------
# Armbian
# ---------------------------------------------------------------------------

class TestArmbian:
    def test_rock5b_extraargs_edited_in_place(self):
        text = fixture("armbianEnv_rock5b.txt")
        new_text, persisted = plan_armbian(text, ["isolcpus=4-7"], [])
        assert new_text == text.replace("extraargs=cma=256M\n", "extraargs=cma=256M isolcpus=4-7\n")
        assert persisted == [
            "root=UUID=7d2b6a31-5c4e-4f8a-9b1d-2e3f4a5b6c7d", "rootwait", "rootfstype=ext4",
            "splash=verbose", "console=ttyS2,1500000", "console=tty1", "consoleblank=0",
            "loglevel=1", "usb-storage.quirks=0x2537:0x1066:u,0x2537:0x1068:u",
            "cma=256M", "isolcpus=4-7",
        ]  # docker_optimizations=off: no cgroup_enable tokens
        assert plan_armbian(new_text, ["isolcpus=4-7"], [])[0] == new_text

    def test_absent_removes_from_extraargs(self):
        text = fixture("armbianEnv_rock5b.txt")
        new_text, persisted = plan_armbian(text, [], ["cma"])
        assert new_text == text.replace("extraargs=cma=256M\n", "extraargs=\n")
        assert "cma=256M" not in persisted

    def test_extraargs_added_at_end(self):
        text = fixture("armbianEnv_no_extraargs.txt")
        new_text, persisted = plan_armbian(text, ["isolcpus=4-7"], [])
        assert new_text == text + "extraargs=isolcpus=4-7\n"
        assert persisted == [
            "root=UUID=7d2b6a31-5c4e-4f8a-9b1d-2e3f4a5b6c7d", "rootwait", "rootfstype=ext4",
            "splash=verbose", "console=ttyS2,1500000", "consoleblank=0", "loglevel=1",
            "isolcpus=4-7", "cgroup_enable=cpuset", "cgroup_memory=1", "cgroup_enable=memory",
        ]

    def test_missing_trailing_newline_respected(self):
        text = fixture("armbianEnv_no_trailing_newline.txt")
        new_text, _plans = plan_armbian(text, ["quiet"], [])
        assert new_text == text + "\nextraargs=quiet"

    def test_last_extraargs_line_wins_and_is_edited(self):
        text = "extraargs=a=1\nverbosity=7\nextraargs=b=2\n"
        new_text, persisted = plan_armbian(text, ["c=3"], [])
        assert new_text == "extraargs=a=1\nverbosity=7\nextraargs=b=2 c=3\n"
        assert "a=1" not in persisted and "loglevel=7" in persisted

    def test_nothing_to_do_adds_no_line(self):
        text = fixture("armbianEnv_no_extraargs.txt")
        assert plan_armbian(text, [], ["isolcpus"])[0] == text

    def test_not_key_value_refused(self):
        with pytest.raises(ValueError, match="line 4 is not key=value"):
            plan_armbian(fixture("armbianEnv_broken.txt"), ["quiet"], [])

    def test_absent_set_by_boot_script_refused(self):
        with pytest.raises(ValueError, match="docker_optimizations"):
            plan_armbian(fixture("armbianEnv_no_extraargs.txt"), [], ["cgroup_enable"])

    def test_boot_tokens_console_variants(self):
        assert "console=tty1" in armbian_boot_tokens({"console": "display"})
        assert "console=ttyS2,1500000" not in armbian_boot_tokens({"console": "display"})
        tokens = armbian_boot_tokens({"bootlogo": "true", "earlycon": "on"})
        assert tokens[3:8] == ["splash", "plymouth.ignore-serial-consoles", "earlycon",
                               "console=ttyS2,1500000", "console=tty1"]
        assert armbian_boot_tokens({"rootdev": ""})[0] == "rootwait"


# ---------------------------------------------------------------------------
# u-boot-menu
# ---------------------------------------------------------------------------

class TestUbootMenu:
    def test_kernel_cmdline_without_newline(self):
        text = fixture("kernel_cmdline")
        new_text, persisted = plan_kernel_cmdline(text, ["isolcpus=4-7"], ["cgroup_memory"])
        assert new_text == (
            "rootwait rw console=ttyS2,1500000 console=tty1 cgroup_enable=cpuset "
            "cgroup_enable=memory isolcpus=4-7"
        )
        assert persisted == split_cmdline(new_text)
        assert plan_kernel_cmdline(new_text, ["isolcpus=4-7"], ["cgroup_memory"])[0] == new_text

    def test_kernel_cmdline_with_newline_kept(self):
        assert plan_kernel_cmdline("rw quiet\n", ["a=1"], [])[0] == "rw quiet a=1\n"
        assert plan_kernel_cmdline("", ["a=1"], [])[0] == "a=1"

    def test_kernel_cmdline_several_lines_refused(self):
        with pytest.raises(ValueError, match="single line"):
            plan_kernel_cmdline("rw\nquiet\n", ["a=1"], [])

    def test_default_u_boot(self):
        text = fixture("default_u-boot")
        new_text, persisted = plan_uboot_default(text, ['dyndbg="file a.c +p"'], ["ro"])
        assert new_text == text.replace(
            'U_BOOT_PARAMETERS="console=tty1 consoleblank=0 ro rootwait"',
            'U_BOOT_PARAMETERS="console=tty1 consoleblank=0 rootwait dyndbg=\\"file a.c +p\\""',
        )
        assert persisted == ["console=tty1", "consoleblank=0", "rootwait", 'dyndbg="file a.c +p"']
        assert plan_uboot_default(new_text, ['dyndbg="file a.c +p"'], ["ro"]) == (new_text, persisted)

    def test_single_quoted_value(self):
        new_text, _plans = plan_uboot_default("U_BOOT_PARAMETERS='rw quiet' # keep\n", ["a=1"], [])
        assert new_text == 'U_BOOT_PARAMETERS="rw quiet a=1" # keep\n'

    def test_command_substitution_refused(self):
        with pytest.raises(ValueError, match="command substitution"):
            plan_uboot_default(fixture("default_u-boot_cmdsubst"), ["a=1"], [])

    def test_variable_refused(self):
        with pytest.raises(ValueError, match="shell variable"):
            plan_uboot_default('U_BOOT_PARAMETERS="$EXTRA rw"\n', ["a=1"], [])

    def test_missing_parameters_refused(self):
        with pytest.raises(ValueError, match="no U_BOOT_PARAMETERS line"):
            plan_uboot_default('U_BOOT_TIMEOUT="10"\n', ["a=1"], [])


# ---------------------------------------------------------------------------
# GRUB drop-in
# ---------------------------------------------------------------------------

class TestGrub:
    def test_new_dropin(self):
        new_text, persisted = plan_grub(None, ["isolcpus=1-3"], [], fixture("grub_default"), {})
        assert new_text == (
            "# Managed by edgetune (edge_kernel_cmdline)\n"
            'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX isolcpus=1-3"\n'
        )
        # 10_linux: GRUB_CMDLINE_LINUX, then GRUB_CMDLINE_LINUX_DEFAULT
        assert persisted == ["isolcpus=1-3", "quiet"]

    def test_other_dropins_in_sorted_order(self):
        dropins = {"50-cloudimg-settings.cfg": fixture("grub_d_50-cloudimg-settings.cfg"),
                   "10-first.cfg": 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX mitigations=off"\n'}
        _text, persisted = plan_grub(None, ["isolcpus=1-3"], [], fixture("grub_default"), dropins)
        assert persisted == ["mitigations=off", "isolcpus=1-3", "console=tty1", "console=ttyS0"]

    def test_existing_dropin_edited_and_idempotent(self):
        current = render_grub_dropin(["isolcpus=1-3", "quiet"])
        assert grub_dropin_tokens(current) == ["isolcpus=1-3", "quiet"]
        new_text, _plans = plan_grub(current, ["nohz_full=1-3"], ["isolcpus"], fixture("grub_default"), {})
        assert grub_dropin_tokens(new_text) == ["quiet", "nohz_full=1-3"]
        again, _plans = plan_grub(new_text, ["nohz_full=1-3"], ["isolcpus"], fixture("grub_default"), {})
        assert again == new_text

    def test_no_dropin_and_nothing_to_add(self):
        assert plan_grub(None, [], ["isolcpus"], fixture("grub_default"), {}) == (None, ["quiet"])

    def test_quoted_value_round_trip(self):
        text = render_grub_dropin(['dyndbg="file a.c +p"', "x=$y"])
        assert text.splitlines()[1] == (
            'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX dyndbg=\\"file a.c +p\\" x=\\$y"')
        assert grub_dropin_tokens(text) == ['dyndbg="file a.c +p"', "x=$y"]

    def test_absent_set_in_foreign_file_names_it(self):
        with pytest.raises(ValueError, match="quiet in /etc/default/grub"):
            plan_grub(None, [], ["quiet"], fixture("grub_default"), {})
        dropins = {"50-cloudimg-settings.cfg": fixture("grub_d_50-cloudimg-settings.cfg")}
        with pytest.raises(ValueError, match="console in 50-cloudimg-settings.cfg"):
            plan_grub(None, [], ["console"], fixture("grub_default"), dropins)

    def test_foreign_file_under_our_name_refused(self):
        with pytest.raises(ValueError, match="not written by edgetune"):
            plan_grub('GRUB_CMDLINE_LINUX="quiet"\n', ["a=1"], [], fixture("grub_default"), {})

    def test_command_substitution_in_cmdline_refused(self):
        grub = 'GRUB_CMDLINE_LINUX="$(cat /etc/cmdline)"\n'
        with pytest.raises(ValueError, match="command substitution"):
            plan_grub(None, ["a=1"], [], grub, {})

    def test_unrelated_command_substitution_tolerated_unless_used(self):
        grub = "GRUB_X=`hostname`\nGRUB_CMDLINE_LINUX=\"rw $GRUB_X\"\n"
        with pytest.raises(ValueError, match="GRUB_X"):
            plan_grub(None, ["a=1"], [], grub, {})

    def test_later_dropin_resetting_cmdline_refused(self):
        dropins = {"99-zz.cfg": 'GRUB_CMDLINE_LINUX=""\n'}
        with pytest.raises(ValueError, match="99-zz.cfg"):
            plan_grub(None, ["a=1"], [], fixture("grub_default"), dropins)

    def test_shell_code_refused(self):
        grub = 'if [ -e /x ]; then\nGRUB_CMDLINE_LINUX="rw"\nfi\n'
        with pytest.raises(ValueError, match="only NAME=value lines"):
            plan_grub(None, ["a=1"], [], grub, {})
