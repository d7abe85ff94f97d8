"""Unit tests for plugins/modules/edge_kernel_cmdline.py on fixture trees under tmp_path."""
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import edge_kernel_cmdline as module
import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.edge_cmdline import FALLBACK_LABEL, plan_extlinux
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_fileio import atomic_write, backup_files
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


def run(root, check_mode=False, want_diff=False, find_command=no_command, **overrides):
    if "cmdline_path" not in overrides:
        overrides["cmdline_path"] = str(cmdline_file(root))
    return module.run_module(params(**overrides), check_mode=check_mode, want_diff=want_diff,
                             run_command=run_command, find_command=find_command, root=str(root))


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

    def test_running_matches(self, tmp_path):
        install(tmp_path, "extlinux_r35_agx_orin.conf", EXTLINUX)
        running = cmdline_file(tmp_path, "root=PARTUUID=x rw isolcpus=4-7 bl_prof_dataptr=1@0x2\n")
        result = run(tmp_path, bootloader="extlinux", args=["isolcpus=4-7"],
                     absent=["nohz_full"], cmdline_path=str(running))
        assert result["changed"] is True
        assert result["reboot_required"] is False
        assert result["pending"] == []
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
        with pytest.raises(module.ModuleFailure, match=r"rc=3.*restored") as failure:
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
        with pytest.raises(module.ModuleFailure, match=r"read-back of .*cmdline.*backup: .*\.bak"):
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
