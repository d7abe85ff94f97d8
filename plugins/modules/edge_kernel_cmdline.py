#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_kernel_cmdline: persist kernel arguments in the boot files."""

DOCUMENTATION = r"""
---
module: edge_kernel_cmdline
short_description: Set or remove kernel command line arguments in the bootloader's own files
description:
  - Edits the file the board's bootloader builds the kernel command line from, so that the
    next boot gets the wanted arguments, and reports whether the running kernel already has them.
  - C(extlinux) follows NVIDIA L4TLauncher's parser (Jetson Orin, L4T r35/r36). Only the APPEND
    line of the label named by DEFAULT is edited; every other byte of the file is kept.
    C(${cbootargs}) is never touched. When the APPEND changes, a label C(edgetune-fallback)
    holding the previous arguments is written after the default label, so the previous
    command line can be picked from the boot menu. DEFAULT is never changed.
  - C(armbian) edits the last C(extraargs=) line of C(/boot/armbianEnv.txt) (RK3588 Armbian,
    C(boot-rk35xx.cmd)).
  - C(uboot_menu) edits C(/etc/kernel/cmdline), or C(U_BOOT_PARAMETERS) in C(/etc/default/u-boot)
    when that file does not exist, then runs C(u-boot-update).
  - C(grub) never edits C(/etc/default/grub); it manages the drop-in
    C(/etc/default/grub.d/99-edgetune.cfg) and runs C(update-grub) (or C(grub-mkconfig)).
  - Files that cannot be edited safely (unknown syntax, ambiguous labels, shell code) are refused
    with a message and left byte-identical. After a write the file is read back and planned
    again; a mismatch is an error naming the file and its backup.
  - Before anything is written (in check mode too) the planned default entry is checked as a
    whole, with the arguments it keeps and the ones it adds. It must keep a root device (a
    non-empty C(root=) in an L4T APPEND line, unless the entry had none as found; Armbian's
    C(rootdev=); for C(uboot_menu) and C(grub) the C(root=) the update command adds, so only an
    empty C(root=) is refused), no empty C(rootfstype=) or C(init=), a command line that fits the
    kernel's C(COMMAND_LINE_SIZE) of the device's architecture (2048 bytes on arm64 and x86) with
    room for what the bootloader adds (256 characters for L4TLauncher's platform arguments; U-Boot's
    extlinux parser holds 1024 bytes), well-formed C(isolcpus=) (flags C(nohz), C(domain),
    C(managed_irq)), C(nohz_full=), C(rcu_nocbs=) and C(irqaffinity=) CPU lists (every
    C(isolcpus=) and C(nohz_full=) naming the same CPUs), printable ASCII only, and no shell or
    bootloader expansion (command substitution, backticks, C(${...}) or C($name) other than L4T's own
    C(${cbootargs})).
    The file may hold no control character. A refusal names the file, the reason and what to do,
    and leaves the files and their backups as they were.
  - A key=value in O(args) replaces every occurrence of that key (first one kept in place, later
    duplicates removed). Several O(args) with the same key (for example two C(console=)) replace
    that key's occurrences together. A bare flag is appended when that exact token is missing.
    New arguments are appended in the order given.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  args:
    description:
      - Kernel arguments that must be set, each one token (C(key=value) or a bare flag).
        Double quotes may enclose whitespace, as the kernel allows (C(key="a b")).
      - A list; a string is refused, not split at commas (C(isolcpus=1,2) is one argument).
    type: list
    elements: str
    default: []
  absent:
    description:
      - Kernel arguments to remove. A bare key removes every token with that key
        (C(isolcpus) removes C(isolcpus=1-3)); C(key=value) removes only exact matches.
      - A key may not be both in O(args) and O(absent).
      - A list; a string is refused, not split at commas.
    type: list
    elements: str
    default: []
  bootloader:
    description:
      - Which boot configuration to edit. Detected when omitted, in this order
        C(/etc/nv_tegra_release) and C(/boot/extlinux/extlinux.conf) give C(extlinux);
        C(/boot/armbianEnv.txt) gives C(armbian); C(/etc/kernel/cmdline) or
        C(/etc/default/u-boot) with C(u-boot-update) on PATH give C(uboot_menu);
        C(/etc/default/grub) with C(update-grub) or C(grub-mkconfig) gives C(grub);
        C(/boot/extlinux/extlinux.conf) alone gives C(extlinux).
      - When the file of the bootloader given here does not exist (C(grub) on a Jetson), the
        module fails naming the bootloader the board uses.
    type: str
    choices: [extlinux, armbian, uboot_menu, grub]
  path:
    description:
      - The file to edit. Defaults to C(/boot/extlinux/extlinux.conf), C(/boot/armbianEnv.txt),
        C(/etc/kernel/cmdline) (or C(/etc/default/u-boot) when it does not exist) and
        C(/etc/default/grub.d/99-edgetune.cfg).
      - For C(uboot_menu), a file named C(u-boot) is read as the shell config with
        C(U_BOOT_PARAMETERS=); any other name as a one-line command line.
      - For C(grub), the main config is read from C(grub) next to the drop-in's directory, and
        the other C(*.cfg) drop-ins from the same directory.
    type: path
  extra_paths:
    description:
      - More extlinux.conf files to edit the same way, for example the inactive A/B slot's
        rootfs mounted somewhere. Every file must parse, or nothing is written.
      - Only for C(extlinux).
    type: list
    elements: path
    default: []
  fallback:
    description:
      - Write the C(edgetune-fallback) label when the APPEND line changes, holding the default label
        as it was. An existing fallback is refreshed only when the running kernel booted with the
        entry as it was (an entry edited by hand or by an update and never booted does not replace
        a fallback known to boot).
        L4TLauncher reads at most 10 labels; when the fallback label would be the 11th the
        module fails, and you can free a label or set this to V(false).
      - Only for C(extlinux).
    type: bool
    default: true
  backup:
    description:
      - Copy each file to C(<path>.edgetune-<UTC timestamp>.bak) before changing it. The three
        newest backups per file are kept. The backup is made once the new content is ready
        beside the file and removed again when the write fails (for example an immutable file)
        or the run is rolled back; older backups are removed only after a successful run.
    type: bool
    default: true
  cmdline_path:
    description:
      - Where to read the running kernel's command line.
    type: path
    default: /proc/cmdline
  update_command:
    description:
      - Command (argument list, no shell) run after a change for C(uboot_menu) and C(grub),
        instead of C(u-boot-update), C(update-grub) or C(grub-mkconfig -o /boot/grub/grub.cfg).
    type: list
    elements: str
  record:
    description:
      - A JSON file recording the O(args) this module set with it and, for each of their keys,
        the tokens the boot file gave that key before it was first set. On the next run, a key
        recorded there and no longer in O(args) gets those tokens back (an argument that
        replaced the vendor's C(console=) or C(root=) gives the vendor's value back); a key that
        had none is removed, unless it is in O(keep). Written after the boot files, only when
        its content changes; check mode and diff include it.
      - Without it, the module only sets O(args) and removes O(absent).
    type: path
  keep:
    description:
      - Keys never removed because they left O(args) with nothing recorded to restore (for
        example C(root), whose removal would leave an entry that cannot boot).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    description: Plans and reports exactly what would change; writes nothing and runs nothing.
    support: full
  diff_mode:
    description: Returns the before and after text of every file that changes.
    support: full
notes:
  - A change takes effect at the next boot. RV(reboot_required) compares the wanted arguments
    with the running command line, whether or not this run changed a file.
  - For C(armbian) and C(grub) other settings also contribute to the command line. An O(absent)
    item that stays on the command line because of a file or setting this module does not edit
    is an error naming it. The C(ubootpart=) argument that C(boot-rk35xx.cmd) adds is not in
    RV(persisted) (the partition UUID is only known to U-Boot).
  - For C(uboot_menu), RV(persisted) is the content of the edited file; C(u-boot-update) adds the
    root device itself.
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Isolate the inference cores on the next boot
  edge_kernel_cmdline:
    args:
      - isolcpus=nohz,domain,managed_irq,4-7
      - nohz_full=4-7
      - rcu_nocbs=4-7
    absent:
      - nospectre_bhb
  register: edge_cmdline

- name: Edit both A/B slots of a Jetson (the inactive rootfs is mounted on /mnt/slot_b)
  edge_kernel_cmdline:
    bootloader: extlinux
    args: [systemd.unified_cgroup_hierarchy=1]
    extra_paths: [/mnt/slot_b/boot/extlinux/extlinux.conf]

- name: Add an argument on an Armbian RK3588 board without a backup file
  edge_kernel_cmdline:
    bootloader: armbian
    args: [cma=256M]
    backup: false

- name: Remember that a reboot is needed
  ansible.builtin.set_fact:
    edge_reboot_required: "{{ edge_cmdline.reboot_required }}"
"""

RETURN = r"""
bootloader:
  description: The boot configuration that was used (given or detected).
  returned: success
  type: str
  sample: extlinux
path:
  description: The main file edited.
  returned: success
  type: str
  sample: /boot/extlinux/extlinux.conf
backup_file:
  description: Backup of O(path) made by this run, or null.
  returned: success
  type: str
  sample: /boot/extlinux/extlinux.conf.edgetune-20250101T120000.000000Z.bak
backup_files:
  description: Backup of each file written by this run (O(path) and O(extra_paths)).
  returned: success
  type: dict
  sample: {"/boot/extlinux/extlinux.conf": "/boot/extlinux/extlinux.conf.edgetune-20250101T120000.000000Z.bak"}
persisted:
  description:
    - The kernel arguments the next boot will get from the (planned) file, in order. For
      extlinux, the default label's APPEND without C(${cbootargs}); the bootloader adds its
      own arguments after these.
  returned: success
  type: list
  elements: str
  sample: ["root=PARTUUID=0f9a", "rw", "rootwait", "isolcpus=4-7"]
running:
  description: Tokens of the running command line (O(cmdline_path)).
  returned: success
  type: list
  elements: str
  sample: ["root=PARTUUID=0f9a", "rw", "rootwait", "bl_prof_dataptr=2031616@0x471E10000"]
reboot_required:
  description:
    - True when an O(args) item is not in RV(running) or an O(absent) item still is, whether or
      not this run changed a file.
    - With O(record), a key that left O(args) and that a run of this boot took out of the boot
      file (or gave its old tokens back) stays pending until the next boot, on every run, not only
      on the run that edited the file.
  returned: success
  type: bool
  sample: true
reboot_reason:
  description: Why the device needs a reboot (RV(waiting), said so), or empty when RV(reboot_required) is false.
  returned: success
  type: str
  sample: "boot arguments waiting for a reboot: to add: isolcpus=4-7; to remove: quiet"
pending:
  description: The O(args) items missing from RV(running), then the O(absent) items still in it.
  returned: success
  type: list
  elements: str
  sample: ["isolcpus=4-7"]
waiting:
  description: RV(pending) in words, what the next boot adds and removes; empty when nothing waits.
  returned: success
  type: str
  sample: "to add: isolcpus=4-7; to remove: quiet"
restored:
  description: Tokens put back because their key left O(args) (see O(record)).
  returned: success
  type: list
  elements: str
  sample: ["console=ttyTCU0,115200"]
dropped:
  description: Keys removed because they left O(args) with nothing to restore (see O(record)).
  returned: success
  type: list
  elements: str
  sample: ["nohz_full"]
fallback_label:
  description: Name of the fallback label in the (planned) extlinux.conf, or null.
  returned: success
  type: str
  sample: edgetune-fallback
diff:
  description: Before and after text of every file that changes, when run with C(--diff).
  returned: changed and diff mode
  type: list
  elements: dict
"""

# Ansible modules keep DOCUMENTATION first, hence the E402 waivers.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, _load_params  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_bootfile import (  # noqa: E402
    BOOTLOADERS,
    _read,
    default_path,
    detect_bootloader,
    guard_plans,
    plan_files,
    plan_managed,
    read_boot_id,
    require_boot_file,
)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import (  # noqa: E402
    args_satisfied,
    describe_changes,
    extlinux_fallback_label,
    pending_changes,
    split_cmdline,
    validate_args,
)
from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_command  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, BadType, EdgeError  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import (  # noqa: E402
    atomic_write,
    prune_backups,
    remove_quietly,
)

# The options that are lists. AnsibleModule would turn a string into a list
# by splitting it at commas ("isolcpus=1,2" -> two arguments): refused instead.
LIST_OPTIONS = ("args", "absent", "extra_paths", "update_command", "keep")


def boot_id_path(cmdline_path):
    """The boot id in the proc tree the command line is read from (/proc, or a fixture's)."""
    return os.path.join(os.path.dirname(cmdline_path), "sys", "kernel", "random", "boot_id")


def default_update_command(bootloader, find_command):
    """The command that regenerates the boot menu, as an argument list (or None)."""
    if bootloader == "uboot_menu":
        program = find_command("u-boot-update")
        if not program:
            raise BadInput("u-boot-update not found: install u-boot-menu or set update_command")
        return [program]
    if bootloader == "grub":
        program = find_command("update-grub")
        if program:
            return [program]
        program = find_command("grub-mkconfig")
        if program:
            return [program, "-o", "/boot/grub/grub.cfg"]
        raise BadInput("neither update-grub nor grub-mkconfig found: set update_command")
    return None


def _restore(written):
    """Put back what we wrote (newest first); return the paths that failed."""
    failed = []
    for path, before in reversed(written):
        try:
            if before is None:
                os.unlink(path)
            else:
                atomic_write(path, before, backup=False)
        except OSError:
            failed.append(path)
    return failed


def list_option(params, name):
    """The list option ``name``; TypeError for a string (never split) or another non-list."""
    value = params.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        raise BadType(
            f"{name} must be a list of strings, not the string {value!r}: write it as a YAML list "
            f"({name}: [{value}]); a string is not split at commas, since isolcpus=1,2 is one argument")
    if not isinstance(value, (list, tuple)):
        raise BadType(f"{name} must be a list of strings, not {type(value).__name__} {value!r}")
    return list(value)


def drop_backups(backups):
    """Remove the backups this run made (the files are as they were): nothing rotated, nothing added."""
    for backup_path in backups.values():
        if backup_path:
            remove_quietly(backup_path)


def write_plans(changed, backup):
    """Write every changed file; on an error put back the ones already written.

    Old backups are not pruned here (see finish_backups): a failure leaves the
    backups as they were, the ones this run made are removed again."""
    backups = {}
    written = []
    created = []
    try:
        for plan in changed:
            directory = os.path.dirname(plan.path)
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, 0o755)  # e.g. /etc/default/grub.d
                created.append(directory)
            backups[plan.path] = atomic_write(plan.path, plan.after, backup=backup, prune=False)
            written.append((plan.path, plan.before))
    except OSError as exc:
        not_restored = _restore(written)
        for directory in reversed(created):
            try:
                os.rmdir(directory)  # only if still empty
            except OSError:
                pass
        if not_restored:
            msg = (f"writing {plan.path} failed: {exc}; putting back {', '.join(not_restored)} failed too, "
                   f"their backups are {', '.join(str(backups.get(p)) for p in not_restored)}")
        else:
            drop_backups(backups)
            msg = (f"writing {plan.path} failed: {exc}; nothing was changed (files written before it were "
                   "restored, no backup added or removed)")
        raise EdgeError(msg, not_restored=not_restored) from exc
    return backups, written


def finish_backups(backups):
    """After a successful run: keep the newest backups of each file written."""
    for path, backup_path in backups.items():
        if backup_path:
            prune_backups(os.path.realpath(path))


def verify_read_back(plans, backups, bootloader, args, absent, extra_paths, fallback, running):
    """Read the files again: they must hold what we planned and need no further change."""
    again = plan_files(bootloader, plans[0].path, args, absent, extra_paths, fallback, running)
    for planned, reread in zip(plans, again):
        if (reread.before != planned.after or reread.after != reread.before
                or reread.persisted != planned.persisted
                or not args_satisfied(reread.persisted, args, absent)):
            raise EdgeError(
                f"read-back of {planned.path} does not hold the planned kernel arguments "
                f"(backup: {backups.get(planned.path)})",
                backup_file=backups.get(planned.path),
            )


def run_module(params, check_mode=False, want_diff=False, run_command=None,
               find_command=None, root="/", machine=None):
    """Read, plan, check, write (unless check mode), update, read back; return the result dict.

    ``run_command(argv) -> (rc, stdout, stderr)`` and ``find_command(name) -> path or None``
    come from AnsibleModule; ``root`` lets tests detect the bootloader in a fixture tree;
    ``machine`` is the architecture the command line length is checked for (None: this
    device's, os.uname().machine).
    """
    args = list_option(params, "args")
    absent = list_option(params, "absent")
    validate_args(args, absent)
    extra_paths = list_option(params, "extra_paths")
    keep = list_option(params, "keep")
    update_command = list_option(params, "update_command")
    fallback = params.get("fallback", True)
    bootloader = params.get("bootloader") or detect_bootloader(find_command, root)
    if extra_paths and bootloader != "extlinux":
        raise BadInput("extra_paths is only for bootloader=extlinux")
    path = params.get("path") or default_path(bootloader, root)
    require_boot_file(bootloader, path, find_command, root)

    cmdline_path = params.get("cmdline_path") or "/proc/cmdline"
    running = split_cmdline(_read(cmdline_path))
    managed = plan_managed(bootloader, path, args, absent, params.get("record"), keep,
                           extra_paths, fallback, running, read_boot_id(boot_id_path(cmdline_path)))
    args, absent, plans = managed.args, managed.absent, managed.plans
    changed = [plan for plan in plans if plan.after != plan.before]
    # The whole entry, before anything is written (check mode too): a refusal
    # leaves every file and backup as it is.
    guard_plans(bootloader, changed, machine)
    record = managed.record
    record_changed = record is not None and record.after != record.before

    update_argv = None
    if changed and bootloader in ("uboot_menu", "grub"):
        # Found before writing, so a missing tool leaves the files untouched.
        update_argv = update_command or default_update_command(
            bootloader, find_command)

    backups = {}
    if changed and not check_mode:
        backups, written = write_plans(changed, params.get("backup", True))
        if update_argv:
            rc, stdout, stderr = run_command(update_argv)
            if rc != 0:
                not_restored = _restore(written)
                if not not_restored:
                    drop_backups(backups)
                raise EdgeError(
                    f"{' '.join(update_argv)} failed (rc={rc}); the edited files were "
                    "restored to their previous content" + ("" if not_restored else " (no backup added or removed)"),
                    rc=rc, stdout=stdout, stderr=stderr, not_restored=not_restored,
                )
        verify_read_back(plans, backups, bootloader, args, absent, extra_paths, fallback, running)
        finish_backups(backups)
    if record_changed and not check_mode:
        # After the boot files: a record never names args the files do not hold.
        write_plans([record], backup=False)

    pending = pending_changes(running, args, absent)
    waiting = describe_changes(running, args, absent)
    result = {
        "changed": bool(changed) or record_changed,
        "bootloader": bootloader,
        "path": path,
        "backup_file": backups.get(path),
        "backup_files": {p: b for p, b in backups.items() if b},
        "persisted": plans[0].persisted,
        "running": running,
        "reboot_required": bool(pending),
        "pending": pending,
        "waiting": waiting,
        "reboot_reason": "boot arguments waiting for a reboot: " + waiting if pending else "",
        "fallback_label": (extlinux_fallback_label(plans[0].after)
                           if bootloader == "extlinux" else None),
        "restored": managed.restored,
        "dropped": managed.dropped,
    }
    if want_diff:
        result["diff"] = [
            {"before_header": plan.path, "after_header": plan.path,
             "before": plan.before or "", "after": plan.after or ""}
            for plan in changed + ([record] if record_changed else [])
        ]
    return result


def main():
    # Read before AnsibleModule, whose list type splits a string at commas
    # (ansible-core documents _load_params for modules that look at their raw
    # parameters; validate-modules' stand-in returns None).
    raw = _load_params() or {}
    strings = [name for name in LIST_OPTIONS if isinstance(raw.get(name), str)]
    module = AnsibleModule(
        argument_spec={
            "args": {"type": "list", "elements": "str", "default": []},
            "absent": {"type": "list", "elements": "str", "default": []},
            "bootloader": {"type": "str", "choices": list(BOOTLOADERS)},
            "path": {"type": "path"},
            "extra_paths": {"type": "list", "elements": "path", "default": []},
            "fallback": {"type": "bool", "default": True},
            "backup": {"type": "bool", "default": True},
            "cmdline_path": {"type": "path", "default": "/proc/cmdline"},
            "update_command": {"type": "list", "elements": "str"},
            "record": {"type": "path"},
            "keep": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        for name in strings:
            list_option(raw, name)  # raises the TypeError that names the option
        result = run_module(
            module.params,
            check_mode=module.check_mode,
            want_diff=module._diff,
            run_command=edge_command.run,  # the bootloader's update command killed if it hangs
            find_command=module.get_bin_path,
        )
    except EdgeError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (ValueError, TypeError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
