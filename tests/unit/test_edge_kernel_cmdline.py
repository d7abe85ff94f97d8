"""Unit tests for plugins/modules/edge_kernel_cmdline.py on fixture trees under tmp_path."""
import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import edge_kernel_cmdline as module
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import FALLBACK_LABEL, plan_extlinux
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import atomic_write, backup_files
from ansible.module_utils.testing import patch_module_args

FIXTURES = Path(__file__).parent / "fixtures" / "bootloader"
EXTLINUX = "boot/extlinux/extlinux.conf"


def install(root, fixture_name, relative_path):
    target = root / relative_path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / fixture_name, target)
    return target


def snapshot(path):
    info = os.stat(path)
    return path.read_bytes(), info.st_mtime_ns, stat.S_IMODE(info.st_mode)


def cmdline_file(root, text="root=/dev/nvme0n1p1 rw rootwait bl_prof_dataptr=2031616@0x471E10000\n"):
    path = root / "proc_cmdline"
    path.write_text(text)
    return path


def params(**overrides):
    """Module parameters as AnsibleModule fills them in."""
    values = {
        "args": [], "absent": [], "bootloader": None, "path": None, "extra_paths": [],
        "fallback": True, "backup": True, "cmdline_path": "/proc/cmdline", "update_command": None,
        "record": None, "keep": [],
    }
    values.update(overrides)
    return values


def run_command(argv):
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def no_command(_name):
    return None


def fake_update(root, rc=0, extra_shell=""):
    """An update command that records each call (and may misbehave)."""
    log = root / "update-calls.log"
    script = root / "fake-update"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n{extra_shell}\nexit {rc}\n')
    script.chmod(0o755)
    return [str(script), "--flag"], log


def calls(log):
    return log.read_text().splitlines() if log.exists() else []


def run(root, check_mode=False, want_diff=False, find_command=no_command, machine="aarch64", **overrides):
    if "cmdline_path" not in overrides:
        overrides["cmdline_path"] = str(cmdline_file(root))
    return module.run_module(params(**overrides), check_mode=check_mode, want_diff=want_diff,
                             run_command=run_command, find_command=find_command, root=str(root),
                             machine=machine)


# ---------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "files, commands, expected",
    [
        (["etc/nv_tegra_release", EXTLINUX], [], "extlinux"),
        (["boot/armbianEnv.txt", EXTLINUX], [], "armbian"),
        (["etc/kernel/cmdline"], ["u-boot-update"], "uboot_menu"),
        (["etc/default/u-boot"], ["u-boot-update"], "uboot_menu"),
        (["etc/default/grub"], ["update-grub"], "grub"),
        (["etc/default/grub"], ["grub-mkconfig"], "grub"),
        (["etc/kernel/cmdline", EXTLINUX], [], "extlinux"),  # u-boot-update missing
        ([EXTLINUX], [], "extlinux"),
    ],
)
def test_detect_bootloader(tmp_path, files, commands, expected):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = module.detect_bootloader(lambda name: name if name in commands else None, str(tmp_path))
    assert found == expected


def test_detect_bootloader_failure_lists_what_was_looked_for(tmp_path):
    with pytest.raises(ValueError, match=r"/etc/nv_tegra_release.*armbianEnv.txt.*u-boot-update"):
        module.detect_bootloader(no_command, str(tmp_path))


def test_default_path_uboot_menu_prefers_kernel_cmdline(tmp_path):
    assert module.default_path("uboot_menu", str(tmp_path)).endswith("/etc/default/u-boot")
    install(tmp_path, "kernel_cmdline", "etc/kernel/cmdline")
    assert module.default_path("uboot_menu", str(tmp_path)).endswith("/etc/kernel/cmdline")


# ---------------------------------------------------------------------------
# extlinux end to end through run_module
# ---------------------------------------------------------------------------

class TestExtlinuxRun:
    def test_write_backup_read_back_and_idempotence(self, tmp_path):
        conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc/nv_tegra_release").write_text("# R35 (release), REVISION: 4.1\n")
        original = conf.read_bytes()
        conf.chmod(0o600)

        result = run(tmp_path, args=["isolcpus=4-7"], absent=["nospectre_bhb"])
        assert result["changed"] is True
        assert result["bootloader"] == "extlinux"
        assert result["path"] == str(conf)
        expected, persisted = plan_extlinux(original.decode(), ["isolcpus=4-7"], ["nospectre_bhb"])
        assert conf.read_text() == expected
        assert result["persisted"] == persisted
        assert result["fallback_label"] == FALLBACK_LABEL
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600  # mode kept
        backup = Path(result["backup_file"])
        assert backup.read_bytes() == original
        assert backup.name.startswith("extlinux.conf.edgetune-") and backup.name.endswith(".bak")
        assert result["reboot_required"] is True
        assert result["pending"] == ["isolcpus=4-7"]

        again = run(tmp_path, args=["isolcpus=4-7"], absent=["nospectre_bhb"])
        assert again["changed"] is False
        assert again["backup_file"] is None
        assert len(backup_files(str(conf))) == 1
        assert conf.read_text() == expected

    def test_check_mode_writes_nothing(self, tmp_path):
        conf = install(tmp_path, "extlinux_r36_orin_nx.conf", EXTLINUX)
        before = snapshot(conf)
        result = run(tmp_path, check_mode=True, want_diff=True, bootloader="extlinux",
                     args=["isolcpus=2-3"])
        assert result["changed"] is True
        assert snapshot(conf) == before
        assert backup_files(str(conf)) == []
        assert sorted(os.listdir(conf.parent)) == ["extlinux.conf"]
        diff = result["diff"][0]
        assert diff["before"] == before[0].decode()
        assert diff["after"] == plan_extlinux(before[0].decode(), ["isolcpus=2-3"], [])[0]
        assert result["persisted"][-1] == "isolcpus=2-3"

    @pytest.mark.parametrize(
        "name",
        ["extlinux_11_labels.conf", "extlinux_default_names_no_label.conf",
         "extlinux_no_default.conf", "extlinux_duplicate_labels.conf",
         "extlinux_default_without_append.conf", "extlinux_uboot_lowercase.conf"],
    )
    def test_refused_file_is_left_byte_identical(self, tmp_path, name):
        conf = install(tmp_path, name, EXTLINUX)
        before = snapshot(conf)
        with pytest.raises(ValueError, match=str(conf)):
            run(tmp_path, bootloader="extlinux", args=["quiet"])
        assert snapshot(conf) == before
        assert sorted(os.listdir(conf.parent)) == ["extlinux.conf"]

    def test_ten_labels_refused_unless_fallback_disabled(self, tmp_path):
        conf = install(tmp_path, "extlinux_10_labels.conf", EXTLINUX)
        before = snapshot(conf)
        with pytest.raises(ValueError, match="fallback=false"):
            run(tmp_path, bootloader="extlinux", args=["quiet"])
        assert snapshot(conf) == before
        result = run(tmp_path, bootloader="extlinux", args=["quiet"], fallback=False)
        assert result["changed"] and result["fallback_label"] is None

    def test_extra_paths_all_or_nothing(self, tmp_path):
        slot_a = install(tmp_path, "extlinux_r36_orin_nx.conf", EXTLINUX)
        slot_b = install(tmp_path, "extlinux_no_default.conf", "mnt/slot_b/" + EXTLINUX)
        before_a, before_b = snapshot(slot_a), snapshot(slot_b)
        with pytest.raises(ValueError, match="slot_b.*no DEFAULT line"):
            run(tmp_path, bootloader="extlinux", args=["quiet"], extra_paths=[str(slot_b)])
        assert (snapshot(slot_a), snapshot(slot_b)) == (before_a, before_b)

        install(tmp_path, "extlinux_r35_agx_orin.conf", "mnt/slot_b/" + EXTLINUX)
        result = run(tmp_path, bootloader="extlinux", args=["quiet"], extra_paths=[str(slot_b)])
        assert sorted(result["backup_files"]) == sorted([str(slot_a), str(slot_b)])
        assert "rootwait rootfstype=ext4" in slot_b.read_text()
        for path in (slot_a, slot_b):
            config_text = path.read_text()
            assert plan_extlinux(config_text, ["quiet"], [])[0] == config_text

    def test_at_most_three_backups(self, tmp_path):
        conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        for cpus in ("1", "2", "3", "4", "5"):
            run(tmp_path, bootloader="extlinux", args=["isolcpus=" + cpus])
        kept = backup_files(str(conf))
        assert len(kept) == 3
        assert "isolcpus=4" in Path(kept[-1]).read_text()  # the newest backup is the last state

    def test_no_backup_when_disabled(self, tmp_path):
        conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        result = run(tmp_path, bootloader="extlinux", args=["quiet"], backup=False)
        assert result["changed"] and result["backup_file"] is None
        assert backup_files(str(conf)) == []


# ---------------------------------------------------------------------------
# reboot_required from the running command line
# ---------------------------------------------------------------------------

class TestRebootRequired:
    def test_pending_even_without_change(self, tmp_path):
        install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        run(tmp_path, bootloader="extlinux", args=["isolcpus=4-7"])
        result = run(tmp_path, bootloader="extlinux", args=["isolcpus=4-7"])
        assert result["changed"] is False
        assert result["reboot_required"] is True
        assert result["pending"] == ["isolcpus=4-7"]
        assert result["reboot_reason"] == "boot arguments waiting for a reboot: " + result["waiting"]
        assert "isolcpus=4-7" in result["waiting"]

    def test_running_matches(self, tmp_path):
        install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        running = cmdline_file(tmp_path, "root=PARTUUID=x rw isolcpus=4-7 bl_prof_dataptr=1@0x2\n")
        result = run(tmp_path, bootloader="extlinux", args=["isolcpus=4-7"],
                     absent=["nohz_full"], cmdline_path=str(running))
        assert result["changed"] is True
        assert result["reboot_required"] is False
        assert result["pending"] == [] and result["reboot_reason"] == ""
        assert result["running"] == ["root=PARTUUID=x", "rw", "isolcpus=4-7", "bl_prof_dataptr=1@0x2"]

    def test_absent_still_running(self, tmp_path):
        install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        running = cmdline_file(tmp_path, "root=PARTUUID=x nospectre_bhb\n")
        result = run(tmp_path, bootloader="extlinux", absent=["nospectre_bhb"],
                     cmdline_path=str(running))
        assert result["reboot_required"] is True
        assert result["pending"] == ["nospectre_bhb"]

    def test_unreadable_cmdline(self, tmp_path):
        install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        with pytest.raises(ValueError, match="cannot read"):
            run(tmp_path, bootloader="extlinux", cmdline_path=str(tmp_path / "missing"))


# ---------------------------------------------------------------------------
# Armbian, u-boot-menu, grub through run_module
# ---------------------------------------------------------------------------

def test_armbian_run(tmp_path):
    env = install(tmp_path, "armbianEnv_no_trailing_newline.txt", "boot/armbianEnv.txt")
    original = env.read_text()
    result = run(tmp_path, args=["isolcpus=4-7"])
    assert result["bootloader"] == "armbian"
    assert env.read_text() == original + "\nextraargs=isolcpus=4-7"
    assert "isolcpus=4-7" in result["persisted"]
    assert result["fallback_label"] is None


def test_armbian_refused_file_untouched(tmp_path):
    env = install(tmp_path, "armbianEnv_broken.txt", "boot/armbianEnv.txt")
    before = snapshot(env)
    with pytest.raises(ValueError, match="line 4 is not key=value"):
        run(tmp_path, args=["quiet"])
    assert snapshot(env) == before


class TestUbootMenuRun:
    def test_kernel_cmdline_updates_and_runs_command_once(self, tmp_path):
        cmdline = install(tmp_path, "kernel_cmdline", "etc/kernel/cmdline")
        update, log = fake_update(tmp_path)
        result = run(tmp_path, bootloader="uboot_menu", args=["isolcpus=4-7"], update_command=update)
        assert result["changed"] is True
        assert result["path"] == str(cmdline)
        assert cmdline.read_text().endswith("cgroup_enable=memory isolcpus=4-7")  # no newline added
        assert calls(log) == ["--flag"]
        again = run(tmp_path, bootloader="uboot_menu", args=["isolcpus=4-7"], update_command=update)
        assert again["changed"] is False
        assert calls(log) == ["--flag"]

    def test_check_mode_runs_nothing(self, tmp_path):
        cmdline = install(tmp_path, "kernel_cmdline", "etc/kernel/cmdline")
        before = snapshot(cmdline)
        update, log = fake_update(tmp_path)
        result = run(tmp_path, check_mode=True, bootloader="uboot_menu", args=["quiet"],
                     update_command=update)
        assert result["changed"] is True
        assert snapshot(cmdline) == before
        assert calls(log) == []

    def test_default_u_boot_when_no_kernel_cmdline(self, tmp_path):
        default = install(tmp_path, "default_u-boot", "etc/default/u-boot")
        update, log = fake_update(tmp_path)
        result = run(tmp_path, bootloader="uboot_menu", args=["quiet"], update_command=update)
        assert result["path"] == str(default)
        assert 'U_BOOT_PARAMETERS="console=tty1 consoleblank=0 ro rootwait quiet"\n' in default.read_text()
        assert len(calls(log)) == 1

    def test_failed_update_restores_file(self, tmp_path):
        cmdline = install(tmp_path, "kernel_cmdline", "etc/kernel/cmdline")
        original = cmdline.read_bytes()
        update, log = fake_update(tmp_path, rc=3, extra_shell="echo boom >&2")
        with pytest.raises(EdgeError, match=r"rc=3.*restored") as failure:
            run(tmp_path, bootloader="uboot_menu", args=["quiet"], update_command=update)
        assert failure.value.details["stderr"].strip() == "boom"
        assert cmdline.read_bytes() == original
        assert len(calls(log)) == 1

    def test_missing_update_command_writes_nothing(self, tmp_path):
        cmdline = install(tmp_path, "kernel_cmdline", "etc/kernel/cmdline")
        before = snapshot(cmdline)
        with pytest.raises(ValueError, match="u-boot-update not found"):
            run(tmp_path, bootloader="uboot_menu", args=["quiet"])
        assert snapshot(cmdline) == before

    def test_read_back_mismatch_is_an_error(self, tmp_path):
        cmdline = install(tmp_path, "kernel_cmdline", "etc/kernel/cmdline")
        # A misbehaving hook rewrites our file after we wrote it.
        update, _log = fake_update(tmp_path, extra_shell=f'printf "rootwait rw" > "{cmdline}"')
        with pytest.raises(EdgeError, match=r"read-back of .*cmdline.*backup: .*\.bak"):
            run(tmp_path, bootloader="uboot_menu", args=["quiet"], update_command=update)


class TestGrubRun:
    def test_dropin_created_and_update_run(self, tmp_path):
        install(tmp_path, "grub_default", "etc/default/grub")
        install(tmp_path, "grub_d_50-cloudimg-settings.cfg", "etc/default/grub.d/50-cloudimg-settings.cfg")
        grub_before = snapshot(tmp_path / "etc/default/grub")
        update, log = fake_update(tmp_path)
        result = run(tmp_path, bootloader="grub", args=["isolcpus=1-3"], update_command=update)
        dropin = tmp_path / "etc/default/grub.d/99-edgetune.cfg"
        assert result["path"] == str(dropin)
        assert dropin.read_text() == (
            "# Managed by edgetune (edge_kernel_cmdline)\n"
            'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX isolcpus=1-3"\n'
        )
        assert stat.S_IMODE(dropin.stat().st_mode) == 0o644
        assert result["persisted"] == ["isolcpus=1-3", "console=tty1", "console=ttyS0"]
        assert result["backup_file"] is None  # nothing to back up: the file is new
        assert snapshot(tmp_path / "etc/default/grub") == grub_before
        assert calls(log) == ["--flag"]
        assert run(tmp_path, bootloader="grub", args=["isolcpus=1-3"],
                   update_command=update)["changed"] is False

    def test_dropin_dir_created_and_grub_mkconfig_fallback(self, tmp_path):
        install(tmp_path, "grub_default", "etc/default/grub")
        mkconfig, log = fake_update(tmp_path)
        result = run(tmp_path, args=["quiet2"],
                     find_command=lambda name: mkconfig[0] if name == "grub-mkconfig" else None)
        assert result["bootloader"] == "grub"
        assert (tmp_path / "etc/default/grub.d/99-edgetune.cfg").exists()
        assert calls(log) == ["-o /boot/grub/grub.cfg"]

    def test_absent_in_foreign_file(self, tmp_path):
        install(tmp_path, "grub_default", "etc/default/grub")
        with pytest.raises(ValueError, match=r"quiet in .*etc/default/grub"):
            run(tmp_path, bootloader="grub", absent=["quiet"], update_command=["true"])
        assert not (tmp_path / "etc/default/grub.d").exists()


def test_extra_paths_only_for_extlinux(tmp_path):
    install(tmp_path, "armbianEnv_rock5b.txt", "boot/armbianEnv.txt")
    with pytest.raises(ValueError, match="extra_paths"):
        run(tmp_path, args=["quiet"], extra_paths=["/x"])


def test_atomic_write_new_file_and_owner(tmp_path):
    target = tmp_path / "new.cfg"
    assert atomic_write(str(target), "x\n") is None
    assert target.read_text() == "x\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    target.chmod(0o640)
    backup = atomic_write(str(target), b"y\n")
    assert Path(backup).read_text() == "x\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_atomic_write_follows_symlink(tmp_path):
    real = tmp_path / "real.conf"
    real.write_text("old\n")
    link = tmp_path / "link.conf"
    link.symlink_to(real)
    backup = atomic_write(str(link), "new\n")
    assert link.is_symlink()
    assert real.read_text() == "new\n"
    assert Path(backup).read_text() == "old\n"
    assert Path(backup).name.startswith("real.conf.edgetune-")


# ---------------------------------------------------------------------------
# The record of managed arguments: a key that leaves the intent
# ---------------------------------------------------------------------------

def default_append(conf):
    """The APPEND tokens of the label DEFAULT names, as the bootloader reads them."""
    text = conf.read_text()
    default = next(line.split()[1] for line in text.splitlines() if line.startswith("DEFAULT"))
    in_label = False
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words[:1] == ["LABEL"]:
            in_label = words[1] == default
        elif in_label and words[:1] == ["APPEND"]:
            return words[1:]
    raise AssertionError("no APPEND in the default label")


class TestRecord:
    def setup_device(self, tmp_path):
        conf = install(tmp_path, "extlinux_r36_orin_nx.conf", EXTLINUX)
        return conf, tmp_path / "etc/edgetune/bootargs.json"

    def test_a_key_that_leaves_the_intent_gets_the_vendor_tokens_back(self, tmp_path):
        conf, record = self.setup_device(tmp_path)
        stock = default_append(conf)
        consoles = [t for t in stock if t.startswith("console=")]
        assert len(consoles) == 2

        first = run(tmp_path, bootloader="extlinux", record=str(record),
                    args=["isolcpus=4-7", "console=ttyS0,115200", "root=/dev/sda1"])
        assert first["changed"] is True
        tuned = default_append(conf)
        assert [t for t in tuned if t.startswith("console=")] == ["console=ttyS0,115200"]
        saved = json.loads(record.read_text())
        assert saved["args"] == ["isolcpus=4-7", "console=ttyS0,115200", "root=/dev/sda1"]
        assert saved["replaced"] == {"isolcpus": [], "console": consoles,
                                     "root": [t for t in stock if t.startswith("root=")]}

        dropped = run(tmp_path, bootloader="extlinux", record=str(record), args=["isolcpus=4-7"])
        assert dropped["changed"] is True
        assert sorted(dropped["restored"]) == sorted(consoles + [t for t in stock if t.startswith("root=")])
        assert dropped["dropped"] == []
        # The same tokens, console= in the vendor's order (they come back together, where the
        # first one was: the kernel's console is the last console=).
        restored = default_append(conf)
        assert sorted(restored) == sorted(stock + ["isolcpus=4-7"])
        assert [t for t in restored if t.startswith("console=")] == consoles
        assert json.loads(record.read_text())["args"] == ["isolcpus=4-7"]
        assert run(tmp_path, bootloader="extlinux", record=str(record), args=["isolcpus=4-7"])["changed"] is False

    def test_a_key_that_replaced_nothing_is_removed_unless_kept(self, tmp_path):
        conf, record = self.setup_device(tmp_path)
        stock = default_append(conf)
        run(tmp_path, bootloader="extlinux", record=str(record), args=["nohz_full=4-7", "init=/sbin/tini"],
            keep=["init"])
        result = run(tmp_path, bootloader="extlinux", record=str(record), args=[], keep=["init"])
        assert result["dropped"] == ["nohz_full"] and result["restored"] == []
        assert default_append(conf) == stock + ["init=/sbin/tini"]
        assert json.loads(record.read_text())["args"] == []

    def test_a_record_without_replaced_tokens_removes_what_it_lists(self, tmp_path):
        """Records of earlier releases listed the args only."""
        conf, record = self.setup_device(tmp_path)
        stock = default_append(conf)
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"managed_by": "edgetune edge_bootargs", "args": ["quiet", "root=/x"]}))
        result = run(tmp_path, bootloader="extlinux", record=str(record), args=["isolcpus=4-7"], keep=["root"])
        assert result["dropped"] == ["quiet"]
        assert default_append(conf) == stock + ["isolcpus=4-7"]

    def test_check_mode_writes_neither_boot_file_nor_record_and_diffs_both(self, tmp_path):
        conf, record = self.setup_device(tmp_path)
        run(tmp_path, bootloader="extlinux", record=str(record), args=["console=ttyS0,115200"])
        before = snapshot(conf), snapshot(record)
        result = run(tmp_path, bootloader="extlinux", record=str(record), args=[], check_mode=True, want_diff=True)
        assert result["changed"] is True
        assert (snapshot(conf), snapshot(record)) == before
        assert [d["after_header"] for d in result["diff"]] == [str(conf), str(record)]
        assert "console=ttyTCU0,115200" in result["diff"][0]["after"]

    def test_only_the_record_out_of_date_is_a_change(self, tmp_path):
        conf, record = self.setup_device(tmp_path)
        run(tmp_path, bootloader="extlinux", record=str(record), args=["isolcpus=4-7"])
        record.write_text(record.read_text().replace("isolcpus=4-7", "isolcpus=2-7"))
        before = snapshot(conf)
        result = run(tmp_path, bootloader="extlinux", record=str(record), args=["isolcpus=4-7"])
        assert result["changed"] is True and snapshot(conf) == before
        assert json.loads(record.read_text())["args"] == ["isolcpus=4-7"]

    @pytest.mark.parametrize("content", ["not json", "[]", '{"args": "quiet"}', '{"args": [], "replaced": []}'])
    def test_a_record_it_cannot_read_is_refused_and_nothing_written(self, tmp_path, content):
        conf, record = self.setup_device(tmp_path)
        record.parent.mkdir(parents=True)
        record.write_text(content)
        before = snapshot(conf), snapshot(record)
        with pytest.raises(ValueError, match="not a record of managed boot arguments"):
            run(tmp_path, bootloader="extlinux", record=str(record), args=["isolcpus=4-7"])
        assert (snapshot(conf), snapshot(record)) == before

    def boot(self, tmp_path, conf, boot_id):
        """A (re)boot of the fixture device: /proc/cmdline from the default entry, a new boot id."""
        boot_id_file = tmp_path / "sys/kernel/random/boot_id"
        boot_id_file.parent.mkdir(parents=True, exist_ok=True)
        boot_id_file.write_text(boot_id + "\n")
        return str(cmdline_file(tmp_path, " ".join(default_append(conf)) + "\n"))

    def test_a_dropped_key_stays_pending_until_the_reboot_without_a_reboot_policy(self, tmp_path):
        """nohz_full and isolcpus leave the intent: their removal stays pending on every run of the same
        boot (no policy rebooted), and is not pending, nor the record changed, after the reboot."""
        conf, record = self.setup_device(tmp_path)
        cmdline = self.boot(tmp_path, conf, "boot-1")
        run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline,
            args=["nohz_full=4-7", "isolcpus=4-7", "quiet"])
        cmdline = self.boot(tmp_path, conf, "boot-2")
        tuned = run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline,
                    args=["nohz_full=4-7", "isolcpus=4-7", "quiet"])
        assert tuned["changed"] is False and tuned["reboot_required"] is False

        first = run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline, args=["quiet"])
        assert first["changed"] is True and first["dropped"] == ["nohz_full", "isolcpus"]
        assert "nohz_full=4-7" not in default_append(conf) and first["reboot_required"] is True
        for later in ("second run", "third run"):   # of the same boot: nothing to write, still waiting
            again = run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline, args=["quiet"])
            assert again["changed"] is False and again["reboot_required"] is True, later
            assert again["pending"] == ["nohz_full", "isolcpus"], later
        kept = record.read_text()
        assert json.loads(kept)["unbooted"] == {"boot_id": "boot-2", "args": [], "absent": ["nohz_full", "isolcpus"]}

        cmdline = self.boot(tmp_path, conf, "boot-3")
        after = run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline, args=["quiet"])
        assert after["changed"] is False and after["reboot_required"] is False and after["pending"] == []
        assert record.read_text() == kept

    def test_restored_vendor_tokens_stay_pending_until_the_reboot(self, tmp_path):
        conf, record = self.setup_device(tmp_path)
        consoles = [t for t in default_append(conf) if t.startswith("console=")]
        run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=self.boot(tmp_path, conf, "boot-1"),
            args=["console=ttyS0,115200"])
        cmdline = self.boot(tmp_path, conf, "boot-2")
        dropped = run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline, args=[])
        assert dropped["restored"] == consoles and dropped["reboot_required"] is True
        again = run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline, args=[])
        assert again["changed"] is False and again["pending"] == consoles
        # Asked for again in the same boot: it is the intent's again, nothing left over.
        back = run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline,
                   args=["console=ttyS0,115200"])
        assert back["changed"] is True and back["reboot_required"] is False

    def test_without_a_boot_id_nothing_is_carried(self, tmp_path):
        conf, record = self.setup_device(tmp_path)
        cmdline = str(cmdline_file(tmp_path, " ".join(default_append(conf)) + " nohz_full=4-7\n"))
        run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline, args=["nohz_full=4-7"])
        run(tmp_path, bootloader="extlinux", record=str(record), cmdline_path=cmdline, args=[])
        assert "unbooted" not in json.loads(record.read_text())

    @pytest.mark.parametrize("unbooted", ['"x"', '{"boot_id": 1, "args": [], "absent": []}',
                                          '{"boot_id": "b", "args": "quiet", "absent": []}'])
    def test_a_malformed_unbooted_part_is_refused_and_nothing_written(self, tmp_path, unbooted):
        conf, record = self.setup_device(tmp_path)
        record.parent.mkdir(parents=True)
        record.write_text('{"args": [], "replaced": {}, "unbooted": %s}' % unbooted)
        before = snapshot(conf), snapshot(record)
        with pytest.raises(ValueError, match="'unbooted' is not an object"):
            run(tmp_path, bootloader="extlinux", record=str(record), args=["isolcpus=4-7"])
        assert (snapshot(conf), snapshot(record)) == before

    def test_armbian_extra_that_replaced_root_gives_rootdev_back(self, tmp_path):
        env = install(tmp_path, "armbianEnv_rock5b.txt", "boot/armbianEnv.txt")
        record = tmp_path / "bootargs.json"
        run(tmp_path, bootloader="armbian", record=str(record), args=["root=/dev/nvme0n1p2"])
        result = run(tmp_path, bootloader="armbian", record=str(record), args=[])
        rootdev = [t for t in result["persisted"] if t.startswith("root=")]
        assert rootdev and all(t == "root=UUID=7d2b6a31-5c4e-4f8a-9b1d-2e3f4a5b6c7d" for t in rootdev)
        assert "root=/dev/nvme0n1p2" not in env.read_text()


# ---------------------------------------------------------------------------
# main(): what Ansible sees
# ---------------------------------------------------------------------------

def run_main(capsys, module_args):
    with patch_module_args(module_args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


def test_main_check_mode_with_diff(tmp_path, capsys):
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    before = snapshot(conf)
    result = run_main(capsys, {
        "bootloader": "extlinux", "path": str(conf), "args": ["isolcpus=4-7"],
        "cmdline_path": str(cmdline_file(tmp_path)),
        "_ansible_check_mode": True, "_ansible_diff": True,
    })
    assert result["changed"] is True
    assert result["diff"][0]["after_header"] == str(conf)
    assert snapshot(conf) == before


def test_main_refusal_is_fail_json_not_traceback(tmp_path, capsys):
    conf = install(tmp_path, "extlinux_no_default.conf", EXTLINUX)
    result = run_main(capsys, {"bootloader": "extlinux", "path": str(conf), "args": ["quiet"],
                               "cmdline_path": str(cmdline_file(tmp_path))})
    assert result["failed"] is True
    assert "no DEFAULT line" in result["msg"]
    assert "exception" not in result


def test_main_invalid_args(tmp_path, capsys):
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    result = run_main(capsys, {"bootloader": "extlinux", "path": str(conf),
                               "args": ["isolcpus=1"], "absent": ["isolcpus"]})
    assert result["failed"] is True
    assert "both in args and absent" in result["msg"]


# ---------------------------------------------------------------------------
# The boot check: every refusal leaves the file and its backups byte-identical
# ---------------------------------------------------------------------------

ARMBIAN = "boot/armbianEnv.txt"
KERNEL_CMDLINE = "etc/kernel/cmdline"
L4T_R35_ROOT = "root=PARTUUID=3c8a7b6e-1f2d-4a5b-9c0d-e1f2a3b4c5d6"
L4T_R36_ROOT = "root=PARTUUID=4b8a73c4-0b3e-4bd5-9a3c-6c2d1e0f9a87"


def seed_backups(target, count=3):
    """The backups earlier runs left next to ``target`` (as many as are kept)."""
    for day in range(1, count + 1):
        old = target.parent / f"{target.name}.edgetune-202401{day:02d}T000000.000000Z.bak"
        old.write_bytes(target.read_bytes().replace(b"\n", b" \n", day))
    assert len(backup_files(str(target))) == count


def dir_state(directory):
    """Every file in the directory: name, bytes, mtime and mode (temp files and backups included)."""
    return {entry.name: snapshot(entry) for entry in sorted(directory.iterdir()) if entry.is_file()}


REFUSALS = [
    # id, fixture, where it goes, bootloader, parameters, the reason in the message
    ("l4t-absent-root", "extlinux_r35_agx_orin.conf", EXTLINUX, "extlinux", {"absent": ["root"]},
     "would have no root="),
    ("l4t-absent-exact-root", "extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux", {"absent": [L4T_R36_ROOT]},
     "would have no root="),
    ("l4t-empty-root", "extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux", {"args": ["root="]},
     "without a root device"),
    ("armbian-empty-root", "armbianEnv_rock5b.txt", ARMBIAN, "armbian", {"args": ["root="]},
     "rootdev= in armbianEnv.txt"),
    ("armbian-quoted-empty-root", "armbianEnv_no_extraargs.txt", ARMBIAN, "armbian", {"args": ['root=""']},
     "without a root device"),
    ("uboot-empty-root", "kernel_cmdline", KERNEL_CMDLINE, "uboot_menu", {"args": ["root="]},
     "without a root device"),
    ("l4t-empty-init", "extlinux_r35_agx_orin.conf", EXTLINUX, "extlinux", {"args": ["init="]}, "init= is empty"),
    ("l4t-5000-characters", "extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux", {"args": ["x=" + "a" * 5000]},
     "over the 2047 that fit"),
    ("armbian-5000-characters", "armbianEnv_rock5b.txt", ARMBIAN, "armbian", {"args": ["x=" + "a" * 5000]},
     "over the 2047 that fit"),
    ("l4t-over-by-the-platform-arguments", "extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux",
     {"args": ["x=" + "a" * 1600]}, "plus up to 256 for the platform arguments"),
    ("uboot-over-the-u-boot-buffer", "kernel_cmdline", KERNEL_CMDLINE, "uboot_menu", {"args": ["x=" + "a" * 900]},
     "U-Boot's extlinux parser"),
    ("isolcpus-unknown-flag", "extlinux_r35_agx_orin.conf", EXTLINUX, "extlinux",
     {"args": ["isolcpus=nohz,domian,4-7"]}, "unknown flag 'domian'"),
    ("isolcpus-no-cpu-list", "armbianEnv_rock5b.txt", ARMBIAN, "armbian", {"args": ["isolcpus=managed_irq,domain"]},
     "no CPU list"),
    ("nohz_full-bad-list", "extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux", {"args": ["nohz_full=4-7,"]},
     "not a CPU number"),
    ("rcu_nocbs-N", "extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux", {"args": ["rcu_nocbs=4-N"]},
     "newer than the 5.10"),
    ("irqaffinity-empty", "armbianEnv_rock5b.txt", ARMBIAN, "armbian", {"args": ["irqaffinity="]},
     "CPU list is empty"),
    ("isolcpus-nohz_full-differ", "extlinux_r35_agx_orin.conf", EXTLINUX, "extlinux",
     {"args": ["isolcpus=domain,4-7", "nohz_full=5-7"]}, "name different CPUs"),
    ("nul-in-an-argument", "extlinux_r35_agx_orin.conf", EXTLINUX, "extlinux", {"args": ["quiet\x00"]},
     "U+0000 (NUL)"),
    ("newline-in-an-argument", "armbianEnv_rock5b.txt", ARMBIAN, "armbian", {"args": ['dyndbg="a\nb"']},
     "U+000A (newline)"),
    ("nul-already-in-the-file", "extlinux_r35_nul.conf", EXTLINUX, "extlinux", {"args": ["quiet"]},
     "line 11 of the file contains the control character U+0000 (NUL)"),
    ("cmdsubst-already-in-the-file", "extlinux_r36_cmdsubst.conf", EXTLINUX, "extlinux", {"args": ["quiet"]},
     "'systemd.hostname=$(cat' holds a command substitution"),
    ("cmdsubst-argument", "armbianEnv_rock5b.txt", ARMBIAN, "armbian", {"args": ["x=$(reboot)"]},
     "command substitution"),
    ("variable-argument", "extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux", {"args": ["x=${HOME}"]},
     "${...} variable"),
    ("backtick-argument", "kernel_cmdline", KERNEL_CMDLINE, "uboot_menu", {"args": ["x=`id`"]},
     "command substitution"),
]


@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
@pytest.mark.parametrize("fixture_name, relative, bootloader, overrides, reason",
                         [case[1:] for case in REFUSALS], ids=[case[0] for case in REFUSALS])
def test_refusal_leaves_the_file_and_its_backups_byte_identical(
        tmp_path, fixture_name, relative, bootloader, overrides, reason, check_mode):
    target = install(tmp_path, fixture_name, relative)
    seed_backups(target)
    before = dir_state(target.parent)
    update, log = fake_update(tmp_path)
    with pytest.raises(ValueError) as refused:
        run(tmp_path, check_mode=check_mode, bootloader=bootloader, update_command=update, **overrides)
    message = str(refused.value)
    assert message.startswith(f"{target}: refusing the planned default entry"), message
    assert reason in message, message
    assert "the file and its backups are unchanged" in message
    assert dir_state(target.parent) == before
    assert calls(log) == []


def test_refused_grub_dropin_is_not_created(tmp_path):
    install(tmp_path, "grub_default", "etc/default/grub")
    before = dir_state(tmp_path / "etc/default")
    with pytest.raises(ValueError, match=r"99-edgetune.cfg: refusing .*root= leaves the kernel without a root"):
        run(tmp_path, bootloader="grub", args=["root="], update_command=["true"])
    assert dir_state(tmp_path / "etc/default") == before
    assert not (tmp_path / "etc/default/grub.d").exists()


def test_the_bootloaders_own_variable_is_kept(tmp_path):
    conf = install(tmp_path, "extlinux_r36_orin_nx.conf", EXTLINUX)
    result = run(tmp_path, bootloader="extlinux", args=["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7"])
    assert result["changed"] is True
    assert default_append(conf)[0] == "${cbootargs}"


def test_jetsonio_entry_without_root_stays_as_found(tmp_path):
    """jetson-io's APPEND ${cbootargs} alone: edgetune neither judges nor changes where its root comes from."""
    conf = install(tmp_path, "extlinux_jetsonio_default.conf", EXTLINUX)
    result = run(tmp_path, bootloader="extlinux", args=["isolcpus=managed_irq,domain,4-7"])
    assert result["persisted"] == ["isolcpus=managed_irq,domain,4-7"]
    before = dir_state(conf.parent)
    with pytest.raises(ValueError, match="without a root device"):
        run(tmp_path, bootloader="extlinux", args=["isolcpus=managed_irq,domain,4-7", "root="])
    assert dir_state(conf.parent) == before


@pytest.mark.parametrize("fixture_name, relative, bootloader, overrides, written", [
    ("extlinux_r35_agx_orin.conf", EXTLINUX, "extlinux", {"absent": ["root"]},
     lambda text, persisted: not any(t.startswith("root=") for t in persisted) and L4T_R35_ROOT in text),
    ("armbianEnv_rock5b.txt", ARMBIAN, "armbian", {"args": ["root="]},
     lambda text, persisted: "extraargs=cma=256M root=\n" in text and persisted[-1] == "root="),
    ("extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux", {"args": ["x=" + "a" * 5000]},
     lambda text, persisted: persisted[-1] == "x=" + "a" * 5000),
    ("extlinux_r36_cmdsubst.conf", EXTLINUX, "extlinux", {"args": ["quiet"]},
     lambda text, persisted: persisted[-3:] == ["systemd.hostname=$(cat", "/etc/hostname)", "quiet"]),
], ids=["l4t-root-removed", "armbian-empty-root", "too-long", "cmdsubst-kept"])
def test_without_the_guard_the_unbootable_entry_would_be_written(
        tmp_path, monkeypatch, fixture_name, relative, bootloader, overrides, written):
    """Not vacuous: with the check replaced by a no-op the same run writes the entry it refused
    (for L4T the old root= survives only in the fallback label)."""
    target = install(tmp_path, fixture_name, relative)
    with pytest.raises(ValueError, match="refusing the planned default entry"):
        run(tmp_path, bootloader=bootloader, **overrides)
    monkeypatch.setattr(module, "guard_plans", lambda *_args, **_kwargs: None)
    result = run(tmp_path, bootloader=bootloader, **overrides)
    assert result["changed"] is True
    persisted = module.plan_files(bootloader, str(target), [], [])[0].persisted
    assert written(target.read_text(), persisted), persisted


def test_property_fails_without_the_guard(monkeypatch):
    """The property below finds an unbootable entry once the check is gone."""
    monkeypatch.setattr(module, "guard_plans", lambda *_args, **_kwargs: None)
    with pytest.raises(AssertionError):
        test_property_no_intent_writes_an_entry_without_a_usable_root()


# ---------------------------------------------------------------------------
# A write the file system refuses (an immutable boot file): no backup added or rotated
# ---------------------------------------------------------------------------

def refuse_rename_onto(monkeypatch, target):
    """os.rename fails with EPERM onto ``target``, as it does onto a chattr +i file."""
    real_rename = os.rename
    target = os.path.realpath(str(target))

    def rename(src, dst, *args, **kwargs):
        if os.path.realpath(str(dst)) == target:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        return real_rename(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, "rename", rename)


def test_refused_write_adds_no_backup_and_removes_none(tmp_path, monkeypatch):
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    seed_backups(conf)
    before = dir_state(conf.parent)
    refuse_rename_onto(monkeypatch, conf)
    with pytest.raises(EdgeError, match=r"Operation not permitted.*nothing was changed.*no backup added"):
        run(tmp_path, bootloader="extlinux", args=["isolcpus=4-7"])
    assert dir_state(conf.parent) == before


def test_immutable_boot_file(tmp_path):
    """The same with a real immutable file, where the file system supports it (root, ext4)."""
    chattr = shutil.which("chattr")
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    seed_backups(conf)
    if not chattr or subprocess.run([chattr, "+i", str(conf)], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not possible here (needs root and a file system with the flag)")
    try:
        before = dir_state(conf.parent)
        with pytest.raises(EdgeError, match="Operation not permitted"):
            run(tmp_path, bootloader="extlinux", args=["isolcpus=4-7"])
        assert dir_state(conf.parent) == before
    finally:
        subprocess.run([chattr, "-i", str(conf)], check=True)


def test_second_file_refused_restores_the_first_and_its_backups(tmp_path, monkeypatch):
    slot_a = install(tmp_path, "extlinux_r36_orin_nx.conf", EXTLINUX)
    slot_b = install(tmp_path, "extlinux_r35_agx_orin.conf", "mnt/slot_b/" + EXTLINUX)
    seed_backups(slot_a)
    seed_backups(slot_b)
    before_a, before_b = dir_state(slot_a.parent), dir_state(slot_b.parent)
    refuse_rename_onto(monkeypatch, slot_b)
    with pytest.raises(EdgeError, match="restored, no backup added or removed"):
        run(tmp_path, bootloader="extlinux", args=["quiet"], extra_paths=[str(slot_b)])
    assert dir_state(slot_b.parent) == before_b
    # slot a was written and put back (a new mtime), its backups are as they were.
    after_a = dir_state(slot_a.parent)
    assert sorted(after_a) == sorted(before_a)
    assert {name: state[0] for name, state in after_a.items()} == {name: state[0] for name, state in before_a.items()}


def test_refused_new_dropin_leaves_no_directory(tmp_path, monkeypatch):
    install(tmp_path, "grub_default", "etc/default/grub")
    before = dir_state(tmp_path / "etc/default")
    refuse_rename_onto(monkeypatch, tmp_path / "etc/default/grub.d/99-edgetune.cfg")
    with pytest.raises(EdgeError, match="nothing was changed"):
        run(tmp_path, bootloader="grub", args=["quiet"], update_command=["true"])
    assert dir_state(tmp_path / "etc/default") == before
    assert not (tmp_path / "etc/default/grub.d").exists()


def test_failed_update_command_leaves_the_backups(tmp_path):
    cmdline = install(tmp_path, "kernel_cmdline", KERNEL_CMDLINE)
    seed_backups(cmdline)
    before = {name: state[0] for name, state in dir_state(cmdline.parent).items()}
    update, _log = fake_update(tmp_path, rc=2)
    with pytest.raises(EdgeError, match="no backup added or removed"):
        run(tmp_path, bootloader="uboot_menu", args=["quiet"], update_command=update)
    assert {name: state[0] for name, state in dir_state(cmdline.parent).items()} == before


def test_successful_run_keeps_the_three_newest_backups(tmp_path):
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    seed_backups(conf)
    oldest = backup_files(str(conf))[0]
    result = run(tmp_path, bootloader="extlinux", args=["quiet"])
    kept = backup_files(str(conf))
    assert len(kept) == 3 and oldest not in kept and result["backup_file"] == kept[-1]


# ---------------------------------------------------------------------------
# Clear messages: undecodable files, strings for lists, the wrong bootloader
# ---------------------------------------------------------------------------

def test_non_utf8_file_is_named(tmp_path):
    """The Rock 5B file as a Windows editor saves it: UTF-16 with a byte order mark (ff fe)."""
    env = install(tmp_path, "armbianEnv_rock5b.txt", ARMBIAN)
    env.write_bytes(b"\xff\xfe" + env.read_text().encode("utf-16-le"))
    seed_backups(env)
    before = dir_state(env.parent)
    with pytest.raises(ValueError) as refused:
        run(tmp_path, bootloader="armbian", args=["quiet"])
    assert str(refused.value).startswith(f"{env} is not UTF-8 text: byte 0xff on line 1 (offset 0)")
    assert "armbianEnv.txt.edgetune-*.bak" in str(refused.value)
    assert dir_state(env.parent) == before


def test_non_utf8_byte_further_in_names_its_line(tmp_path):
    env = install(tmp_path, "armbianEnv_rock5b.txt", ARMBIAN)
    env.write_bytes(env.read_bytes().replace(b"console=both", b"console=b\xf6th"))
    with pytest.raises(ValueError, match=r"byte 0xf6 on line 3 \(offset 36\)"):
        run(tmp_path, args=["quiet"])


@pytest.mark.parametrize("name", ["args", "absent", "keep", "extra_paths", "update_command"])
def test_run_module_refuses_a_string_for_a_list(tmp_path, name):
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    before = dir_state(conf.parent)
    with pytest.raises(TypeError, match=f"{name} must be a list of strings, not the string 'isolcpus=1,2'"):
        run(tmp_path, bootloader="extlinux", **{name: "isolcpus=1,2"})
    assert dir_state(conf.parent) == before


@pytest.mark.parametrize("name, value", [("args", "isolcpus=1,2"), ("absent", "root"), ("args", "quiet")])
def test_main_refuses_a_string_before_ansible_splits_it(tmp_path, capsys, name, value):
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    before = dir_state(conf.parent)
    result = run_main(capsys, {"bootloader": "extlinux", "path": str(conf), name: value,
                               "cmdline_path": str(cmdline_file(tmp_path))})
    assert result["failed"] is True
    assert result["msg"].startswith(f"{name} must be a list of strings, not the string {value!r}")
    assert "not split at commas" in result["msg"]
    assert dir_state(conf.parent) == before


def test_main_accepts_a_list(tmp_path, capsys):
    conf = install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
    result = run_main(capsys, {"bootloader": "extlinux", "path": str(conf), "args": ["isolcpus=1,2"],
                               "cmdline_path": str(cmdline_file(tmp_path)), "_ansible_check_mode": True})
    assert result["changed"] is True and result["persisted"][-1] == "isolcpus=1,2"


def jetson(root):
    install(root, "extlinux_r36_orin_nx.conf", EXTLINUX)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 4.3\n")


@pytest.mark.parametrize("bootloader, missing", [
    ("grub", "etc/default/grub"), ("armbian", "boot/armbianEnv.txt"), ("uboot_menu", "etc/default/u-boot")])
def test_requested_bootloader_missing_names_the_one_the_board_uses(tmp_path, bootloader, missing):
    jetson(tmp_path)
    with pytest.raises(ValueError) as refused:
        run(tmp_path, bootloader=bootloader, args=["quiet"])
    assert str(refused.value) == (
        f"bootloader={bootloader} was asked for, but {tmp_path / missing} does not exist on this board, which "
        f"boots with extlinux ({tmp_path / EXTLINUX}): set bootloader: extlinux, or leave bootloader unset "
        "to detect it")


def test_requested_bootloader_missing_on_a_board_without_any(tmp_path):
    with pytest.raises(ValueError, match=r"extlinux.conf does not exist, and this board has none .*looked for"):
        run(tmp_path, bootloader="extlinux", args=["quiet"])


def test_given_path_missing_names_the_boards_file(tmp_path):
    jetson(tmp_path)
    wrong = tmp_path / "boot/extlinux/extlinux.cfg"
    with pytest.raises(ValueError) as refused:
        run(tmp_path, bootloader="extlinux", path=str(wrong), args=["quiet"])
    assert str(refused.value) == (f"{wrong} does not exist; this board's extlinux file is {tmp_path / EXTLINUX}: "
                                  "correct the path, or leave it unset")


# ---------------------------------------------------------------------------
# Property: no args/absent lists give an L4T or Armbian default entry without a usable root
# ---------------------------------------------------------------------------

def usable_root(tokens):
    roots = [t for t in tokens if t.split("=", 1)[0].strip('"') == "root" and "=" in t]
    return bool(roots) and roots[-1].split("=", 1)[1].strip('"').strip() != ""


_WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=8)
_ARGS = st.one_of(
    st.sampled_from(["root=", 'root=""', '"root="', 'root=" "', "root", "root=/dev/nvme0n1p1", "root=PARTUUID=x",
                     "rootwait", "rootfstype=", "rootfstype=ext4", "init=", "rw", "ro", "quiet", "rootdev=",
                     "isolcpus=4-7", "cma=256M"]),
    _WORDS, st.builds(lambda k, v: f"{k}={v}", _WORDS, _WORDS))
_ABSENT = st.one_of(
    st.sampled_from(["root", "rootwait", "rootfstype", "rootdev", "rw", "cma", "cma=256M", L4T_R35_ROOT,
                     L4T_R36_ROOT, "root=UUID=7d2b6a31-5c4e-4f8a-9b1d-2e3f4a5b6c7d", "console"]),
    _WORDS)
ROOTED_LAYOUTS = [("extlinux_r35_agx_orin.conf", EXTLINUX, "extlinux"),
                  ("extlinux_r36_orin_nx.conf", EXTLINUX, "extlinux"),
                  ("armbianEnv_rock5b.txt", ARMBIAN, "armbian"),
                  ("armbianEnv_no_extraargs.txt", ARMBIAN, "armbian")]


@settings(max_examples=200, deadline=None)
@given(layout=st.sampled_from(ROOTED_LAYOUTS), args=st.lists(_ARGS, max_size=5), absent=st.lists(_ABSENT, max_size=3),
       fallback=st.booleans())
def test_property_no_intent_writes_an_entry_without_a_usable_root(layout, args, absent, fallback):
    fixture_name, relative, bootloader = layout
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        target = install(root, fixture_name, relative)
        try:
            result = run(root, bootloader=bootloader, args=args, absent=absent, fallback=fallback)
        except (ValueError, TypeError):
            result = None
        # Whatever happened, the file as it is now gives the next boot a usable root.
        now = module.plan_files(bootloader, str(target), [], [])[0].persisted
        assert usable_root(now), (args, absent, now)
        if result is not None:
            assert usable_root(result["persisted"])
