# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot file of each bootloader: where it is, and what an edit would do.

Shared by the edge_kernel_cmdline module (which writes the plan) and the
edge_audit module (which compares it with the device, writing nothing).
Python 3.8+, stdlib only.
"""
import glob
import os
from collections import namedtuple

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_board import (
    detect_bootloader as board_bootloader)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_bootguard import check_bootable
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import (
    parse_record,
    plan_armbian,
    plan_extlinux,
    plan_grub,
    plan_kernel_cmdline,
    plan_uboot_default,
    reconcile_record,
    render_record,
)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import read_text
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

BOOTLOADERS = ("extlinux", "armbian", "uboot_menu", "grub")
EXTLINUX_PATH = "/boot/extlinux/extlinux.conf"
ARMBIAN_PATH = "/boot/armbianEnv.txt"
KERNEL_CMDLINE_PATH = "/etc/kernel/cmdline"
UBOOT_DEFAULT_PATH = "/etc/default/u-boot"
GRUB_DROPIN_PATH = "/etc/default/grub.d/99-edgetune.cfg"

# One file's plan: its text now (None: missing), the planned text, and the
# command line the next boot gets from it.
FilePlan = namedtuple("FilePlan", "path before after persisted")
# The edit with a record of managed args: the boot files' plans, the record's
# own plan (None without a record), the args and absent items in effect, and
# the old tokens restored and keys dropped because they left the intent.
ManagedPlan = namedtuple("ManagedPlan", "plans record args absent restored dropped")


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def detect_bootloader(find_command, root="/"):
    """Name the boot configuration in use; ValueError listing what was looked for."""
    name, found = board_bootloader(root, find_command)
    if name is None:
        raise BadInput("cannot detect the bootloader; looked for %s; set the bootloader option"
                       % ", ".join(found))
    return name


def default_path(bootloader, root="/"):
    if bootloader == "extlinux":
        return _under(root, EXTLINUX_PATH)
    if bootloader == "armbian":
        return _under(root, ARMBIAN_PATH)
    if bootloader == "uboot_menu":
        cmdline = _under(root, KERNEL_CMDLINE_PATH)
        return cmdline if os.path.exists(cmdline) else _under(root, UBOOT_DEFAULT_PATH)
    return _under(root, GRUB_DROPIN_PATH)


def _read(path, missing_ok=False):
    try:
        return read_text(path)
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise BadInput(
            f"{path} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} on line {line} (offset {exc.start}) "
            "cannot be decoded; boot files are plain text: fix that line by hand, or put back an earlier copy "
            f"(edgetune's backups are {os.path.basename(path)}.edgetune-*.bak next to it)"
        ) from exc
    except OSError as exc:
        if missing_ok and not os.path.exists(path):
            return None
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from exc


def boot_file(bootloader, path):
    """The file the bootloader must have for an edit of ``path``: the file itself, or for
    grub the main config (the drop-in ``path`` may not exist yet)."""
    if bootloader == "grub":
        return os.path.join(os.path.dirname(os.path.dirname(path)), "grub")
    return path


def require_boot_file(bootloader, path, find_command=None, root="/"):
    """ValueError when the bootloader's file is missing, naming the bootloader this board uses."""
    needed = boot_file(bootloader, path)
    if os.path.exists(needed):
        return
    name, found = board_bootloader(root, find_command or (lambda _name: None))
    if name is None:
        raise BadInput(f"{needed} does not exist, and this board has none of the boot files edgetune edits "
                       f"(looked for {', '.join(found)})")
    if name != bootloader:
        raise BadInput(
            f"bootloader={bootloader} was asked for, but {needed} does not exist on this board, which boots "
            f"with {name} ({_under(root, found)}): set bootloader: {name}, or leave bootloader unset to detect it")
    raise BadInput(f"{needed} does not exist; this board's {name} file is {_under(root, found)}: "
                   "correct the path, or leave it unset")


def guard_plans(bootloader, plans, machine=None):
    """The boot check (edge_bootguard) on each planned file: UnbootableEntry (a ValueError)
    naming the file unless the default entry it plans still boots."""
    for plan in plans:
        before = None
        if bootloader == "extlinux" and plan.before is not None:
            before = plan_extlinux(plan.before, [], [])[1]
        check_bootable(bootloader, plan.persisted, plan.path, text=plan.after, before=before, machine=machine)


def _plan_one(path, planner, *planner_args, **planner_kwargs):
    """Run a planner, prefixing its refusal with the file name."""
    try:
        return planner(*planner_args, **planner_kwargs)
    except (ValueError, TypeError) as exc:
        raise BadInput(f"{path}: {exc}") from exc


def plan_files(bootloader, path, args, absent, extra_paths=(), fallback=True, running=None):
    """Plan every file; any refusal raises ValueError before anything is written.

    ``running``: the running kernel's arguments, which decide whether extlinux's
    fallback entry is refreshed (see plan_extlinux)."""
    plans = []
    if bootloader == "extlinux":
        for one_path in [path] + list(extra_paths):
            text = _read(one_path)
            after, persisted = _plan_one(
                one_path, plan_extlinux, text, args, absent, fallback=fallback, running=running)
            plans.append(FilePlan(one_path, text, after, persisted))
    elif bootloader == "armbian":
        text = _read(path)
        after, persisted = _plan_one(path, plan_armbian, text, args, absent)
        plans.append(FilePlan(path, text, after, persisted))
    elif bootloader == "uboot_menu":
        text = _read(path)
        if os.path.basename(path) == "u-boot":
            after, persisted = _plan_one(path, plan_uboot_default, text, args, absent, path)
        else:
            after, persisted = _plan_one(path, plan_kernel_cmdline, text, args, absent)
        plans.append(FilePlan(path, text, after, persisted))
    elif bootloader == "grub":
        dropin_dir = os.path.dirname(path)
        grub_path = os.path.join(os.path.dirname(dropin_dir), "grub")
        grub_text = _read(grub_path)
        dropins = {}
        for other in glob.glob(os.path.join(glob.escape(dropin_dir), "*.cfg")):
            if os.path.abspath(other) != os.path.abspath(path):
                dropins[os.path.join(dropin_dir, os.path.basename(other))] = _read(other)
        text = _read(path, missing_ok=True)
        after, persisted = _plan_one(
            path, plan_grub, text, args, absent, grub_text, dropins,
            grub_name=grub_path, dropin_name=path)
        plans.append(FilePlan(path, text, after, persisted))
    else:
        raise BadInput(f"unknown bootloader {bootloader!r}; use one of {', '.join(BOOTLOADERS)}")
    return plans


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read_boot_id(path=BOOT_ID):
    """The running boot's id, None where the kernel does not say (a fixture tree)."""
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def plan_managed(bootloader, path, args, absent, record_path=None, keep=(), extra_paths=(), fallback=True,
                 running=None, boot_id=None):
    """plan_files for args kept in a record (see reconcile_record): keys set by an
    earlier run and no longer wanted get their old tokens back or are removed,
    and stay planned until the boot ``boot_id`` is over."""
    if not record_path:
        plans = plan_files(bootloader, path, args, absent, extra_paths, fallback, running)
        return ManagedPlan(plans, None, list(args), list(absent), [], [])
    record_text = _read(record_path, missing_ok=True)
    record = parse_record(record_text, record_path)
    persisted_now = plan_files(bootloader, path, [], [], extra_paths, fallback, running)[0].persisted
    args, absent, new_record, restored, dropped = reconcile_record(record, args, absent, persisted_now, keep,
                                                                   boot_id)
    plans = plan_files(bootloader, path, args, absent, extra_paths, fallback, running)
    record_plan = FilePlan(record_path, record_text, render_record(new_record), None)
    return ManagedPlan(plans, record_plan, args, absent, restored, dropped)
