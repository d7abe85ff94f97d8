# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does a planned boot entry still boot?  One check of the whole entry.

edge_cmdline plans an edit key by key; this file judges the result as a whole
before anything is written: the command line the default entry will give the
kernel (the planner's ``persisted`` tokens) and the text of the file that
holds it.  edge_kernel_cmdline calls it on every file it is about to write;
the drift audit (edge_audit.py) can call it on a file as it is (pass the
file's own tokens as ``before``).  Python 3.8+, stdlib only, pure functions.

The rules, with their sources:

root
    The kernel mounts what the last ``root=`` names (init/do_mounts.c:
    root_dev_setup keeps the last one).  An empty one (``root=``,
    ``root=""``) leaves it without a root device.  Where the root comes from
    when ``root=`` is not in the edited text:

    - extlinux (NVIDIA L4TLauncher): nowhere.  L4TLauncher only removes the
      first ``${cbootargs}`` and appends the platform's arguments
      (ExtLinuxBoot, TegraPlatformBootManagerDxe.c); the stock L4T initrd
      mounts what root= names.  The default entry needs a non-empty root=.
      An entry that has none as found (jetson-io has written
      ``APPEND ${cbootargs}`` alone) takes its root some way this check
      cannot see; it is accepted as long as it stays without root=.
    - armbian: boot-rk35xx.cmd passes ``root=${rootdev}`` (rootdev= in
      armbianEnv.txt, /dev/mmcblk0p1 when unset), which the planned tokens
      already hold (edge_cmdline.armbian_boot_tokens, which leaves it out
      when rootdev= is empty: refused too); extraargs need no root=, but an
      empty one there comes later, wins, and is refused.
    - uboot_menu: u-boot-update writes ``append <root> <U_BOOT_PARAMETERS>``
      with root= from U_BOOT_ROOT or the ``/`` entry of /etc/fstab.
    - grub: grub-mkconfig writes ``root=<device> ro`` before
      GRUB_CMDLINE_LINUX.
    For uboot_menu and grub root= may be absent; an empty one is refused.
    ``rootfstype=`` and ``init=`` must not be empty either: an empty
    rootfstype leaves the kernel no file system type to try, an empty init=
    makes it panic ("Requested init  failed").

length
    The kernel keeps COMMAND_LINE_SIZE bytes of command line, the final NUL
    included, and drops the rest without a word, so arguments at the end
    (on L4T the bootloader's own) are lost: 2048 on arm64
    (arch/arm64/include/uapi/asm/setup.h) and x86 (arch/x86/include/asm/
    setup.h), 1024 on 32-bit arm, 512 elsewhere (asm-generic).  The
    architecture is the device's (``os.uname().machine``).  What the
    bootloader adds is counted, high on purpose (BOOTLOADER_ADDS); U-Boot's
    extlinux parser has a smaller buffer of its own (BOOTLOADER_LINE_SIZE).

isolation
    Documentation/admin-guide/kernel-parameters.txt: ``isolcpus=[flag-list,]
    <cpu-list>`` with the flags nohz, domain and managed_irq;
    ``nohz_full=``, ``rcu_nocbs=`` (also bare in newer kernels) and
    ``irqaffinity=`` take a cpu list: ``a``, ``a-b`` and ``a-b:used/group``
    items separated by commas.  On anything else the kernel does not do what
    was asked (kernel/sched/isolation.c: "Housekeeping: nohz_full= or
    isolcpus= incorrect CPU range" drops the isolation, unknown isolcpus
    flags are skipped or refused; 5.10's rcu_nocbs= offloads every CPU on a
    bad list).  ``N`` (the last CPU) and ``all`` are newer than the 5.10
    kernels of L4T r35 and the RK3588 BSPs, so they are refused.  Every
    isolcpus= and nohz_full= must name the same CPUs: 5.10 keeps one
    housekeeping mask and ignores a later parameter that differs
    ("nohz_full= must match isolcpus=").

characters
    Kernel arguments are printable ASCII here: the bootloaders and the kernel
    keep the line in C strings, which a NUL ends; a newline ends an APPEND
    line; L4TLauncher reads the file byte by byte into UCS-2, so other bytes
    arrive mangled [inferred from its line reader].  The file itself may hold
    no control character but tab and line ends: the bootloaders' line
    readers stop at a NUL or misread what follows.

expansions
    ``$(...)``, backticks, ``${...}`` and ``$name`` are refused in arguments:
    U-Boot expands ``$(name)`` and ``${name}`` in extlinux append lines
    (cli_simple_process_macros) and in boot scripts, GRUB expands ``$name``
    in grub.cfg, the shell in /etc/default files; the kernel would not get
    the text written.  The one kept is L4TLauncher's own ``${cbootargs}``
    (a token of its own, extlinux only).
"""
import os
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import (
    CBOOTARGS, render_cmdline, token_key)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

# COMMAND_LINE_SIZE by os.uname().machine (see "length" above).
COMMAND_LINE_SIZE = {
    "aarch64": 2048, "arm64": 2048,
    "x86_64": 2048, "amd64": 2048, "i386": 2048, "i486": 2048, "i586": 2048, "i686": 2048,
}
ARM32_COMMAND_LINE_SIZE = 1024  # machine names starting with "arm" (armv7l, ...)
GENERIC_COMMAND_LINE_SIZE = 512  # include/uapi/asm-generic/setup.h: the smallest, for anything else

# What each bootloader adds to the line the file gives, in characters, and what it is.
BOOTLOADER_ADDS = {
    # L4TLauncher's ExtLinuxBoot allocates the APPEND text plus MAX_CBOOTARG_SIZE
    # (256 bytes of UCS-2) for the arguments the platform appends where ${cbootargs}
    # was (bl_prof_dataptr=..., the UEFI variable KernelCommandLine): 256 characters.
    "extlinux": (256, "the platform arguments L4TLauncher appends (MAX_CBOOTARG_SIZE)"),
    # boot-rk35xx.cmd: ubootpart=<partition UUID> and the settings left empty
    # (usb-storage.quirks=, ...), which the planned tokens leave out.
    "armbian": (96, "ubootpart=<partition UUID> and the empty settings boot-rk35xx.cmd adds"),
    # u-boot-update: the root= it puts first (U_BOOT_ROOT, or the / entry of /etc/fstab).
    "uboot_menu": (128, "the root= u-boot-update puts first"),
    # GRUB: BOOT_IMAGE=<kernel path> first, then grub-mkconfig's root=<device> ro.
    "grub": (256, "GRUB's BOOT_IMAGE=<kernel> and grub-mkconfig's root=<device> ro"),
}
# A bootloader buffer smaller than the kernel's: U-Boot's extlinux parser
# (boot/pxe_utils.c, label_boot) copies the append line into
# char bootargs[CONFIG_SYS_CBSIZE] and does not boot the entry when it does not
# fit ("bootarg overflow"). 1024 is the mainline default for ARM boards; some
# vendor builds have less (256 is seen), which this check cannot know.
BOOTLOADER_LINE_SIZE = {
    "uboot_menu": (1024, "U-Boot's extlinux parser (CONFIG_SYS_CBSIZE, 1024 by default)"),
}

ISOLCPUS_FLAGS = ("nohz", "domain", "managed_irq")
CPU_LIST_PARAMS = ("isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity")
HOUSEKEEPING_PARAMS = ("isolcpus", "nohz_full")  # one housekeeping mask in 5.10
MAX_CPUS = 4096  # NR_CPUS is at most 4096 on arm64: a larger CPU number is out of range
_CPU_ITEM = re.compile(r"^([0-9]+)(?:-([0-9]+)(?::([0-9]+)/([0-9]+))?)?$")
_CONTROL_NAMES = {0: "NUL", 9: "tab", 10: "newline", 13: "carriage return", 27: "escape", 127: "DEL"}


class UnbootableEntry(BadInput):
    """The planned entry fails the check; ``problems`` lists each reason with what to do."""

    def __init__(self, path, problems):
        self.path = path
        self.problems = list(problems)
        super().__init__(
            f"{path}: refusing the planned default entry, which would not boot as intended: "
            + "; ".join(self.problems)
            + ". Nothing was written: the file and its backups are unchanged."
        )


def command_line_size(machine):
    """COMMAND_LINE_SIZE of the architecture ``machine`` (os.uname().machine)."""
    machine = (machine or "").lower()
    if machine in COMMAND_LINE_SIZE:
        return COMMAND_LINE_SIZE[machine]
    if machine.startswith("arm"):
        return ARM32_COMMAND_LINE_SIZE
    return GENERIC_COMMAND_LINE_SIZE


def line_limit(bootloader, machine):
    """(characters the line may have, why): the smaller of the kernel's and the bootloader's buffer, less the NUL."""
    size = command_line_size(machine)
    why = f"COMMAND_LINE_SIZE of {machine or 'an unknown architecture'} is {size} bytes"
    own = BOOTLOADER_LINE_SIZE.get(bootloader)
    if own and own[0] < size:
        size, why = own[0], f"{own[1]} holds {own[0]} bytes"
    return size - 1, why + ", the final NUL included"


def key_value(token):
    """(key, value or None) as the kernel's next_arg reads a token: quotes around it or its value go."""
    bare = token[1:] if token.startswith('"') else token
    if "=" not in bare:
        return token_key(token), None
    key, value = bare.split("=", 1)
    if value.startswith('"'):
        value = value[1:]
    if value.endswith('"'):
        value = value[:-1]
    return key, value


def parse_kernel_cpulist(text):
    """The CPUs of a kernel cpu list (``0-3,6,8-15:2/4``); ValueError saying what is wrong."""
    if not text:
        raise BadInput("the CPU list is empty")
    cpus = set()
    for item in text.split(","):
        match = _CPU_ITEM.match(item)
        if not match:
            raise BadInput(f"{item!r} is not a CPU number, a range a-b or a-b:used/group"
                           + (" ('N' and 'all' are newer than the 5.10 kernels: write the numbers)"
                              if item.lower() in ("n", "all") or item.endswith("-N") else ""))
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise BadInput(f"{item!r} is a range that goes down")
        if last >= MAX_CPUS:
            raise BadInput(f"{item!r} names a CPU above {MAX_CPUS - 1}, which no kernel here has")
        if match.group(3) is not None:
            used, group = int(match.group(3)), int(match.group(4))
            if group == 0 or used == 0 or used > group:
                raise BadInput(f"{item!r}: used/group needs 1 <= used <= group")
            for start in range(first, last + 1, group):
                cpus.update(range(start, min(start + used, last + 1)))
        else:
            cpus.update(range(first, last + 1))
    return sorted(cpus)


def parse_isolcpus(value):
    """(flags, CPUs) of an isolcpus= value; ValueError saying what is wrong."""
    parts = value.split(",")
    flags = []
    # The kernel reads flags while the next character is a letter (isolation.c).
    while parts and parts[0][:1].isalpha():
        flag = parts.pop(0)
        if flag not in ISOLCPUS_FLAGS:
            raise BadInput(
                f"unknown flag {flag!r} (the kernel knows {', '.join(ISOLCPUS_FLAGS)}; it skips or refuses "
                "any other, and then may drop the whole isolation)")
        flags.append(flag)
    if not parts:
        raise BadInput("no CPU list after the flags")
    return flags, parse_kernel_cpulist(",".join(parts))


def _describe(char):
    code = ord(char)
    name = _CONTROL_NAMES.get(code)
    return f"U+{code:04X}" + (f" ({name})" if name else "")


def _bad_character(token):
    for char in token:
        if char == " ":
            continue  # only inside double quotes: split_cmdline made the tokens
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return f"the control character {_describe(char)}"
        if code > 0x7E:
            return f"the non-ASCII character {_describe(char)}"
    return None


def _root_problems(bootloader, tokens, before):
    problems = []
    last = {}
    for token in tokens:
        key, value = key_value(token)
        if key in ("root", "rootfstype", "init") and value is not None:
            last[key] = (token, value)
    if "root" in last:
        token, value = last["root"]
        if not value.strip():
            hint = (" (on Armbian the root device is rootdev= in armbianEnv.txt, which boot-rk35xx.cmd passes as "
                    "root=; extraargs need none)" if bootloader == "armbian" else "")
            problems.append(
                f"{token} leaves the kernel without a root device (the last root= wins){hint}: remove the empty "
                "root=, or name the device (root=PARTUUID=..., root=UUID=..., root=/dev/...)")
    elif bootloader == "extlinux":
        had_root = before is not None and any(key_value(t)[0] == "root" and key_value(t)[1] is not None
                                              for t in before)
        if before is None or had_root:
            problems.append(
                "the default entry would have no root= (L4TLauncher adds none, so the kernel would not find its "
                "root file system): keep the entry's root= (take root out of absent) or set root=<device> in args")
    elif bootloader == "armbian":
        problems.append("the command line would have no root device: rootdev= in armbianEnv.txt is empty, so "
                        "boot-rk35xx.cmd passes an empty root=: set rootdev=<device> (rootdev=UUID=...)")
    for key, what in (
            ("rootfstype", "the kernel would try no file system type and not mount its root (rootfstype=ext4)"),
            ("init", "the kernel panics when the init it is told to run fails (init=/sbin/init)")):
        if key in last and not last[key][1].strip():
            problems.append(f"{last[key][0]} is empty: {what}; remove it or give a value")
    return problems


def _isolation_problems(tokens):
    problems = []
    housekeeping = []  # (token, CPUs) of every isolcpus= and nohz_full=
    for token in tokens:
        key, value = key_value(token)
        if key not in CPU_LIST_PARAMS:
            continue
        if value is None:
            if key == "rcu_nocbs":
                continue  # documented bare form (newer kernels)
            problems.append(f"{token} needs a CPU list ({key}=<cpu-list>)")
            continue
        try:
            if key == "isolcpus":
                _flags, cpus = parse_isolcpus(value)
            else:
                cpus = parse_kernel_cpulist(value)
        except ValueError as exc:
            usage = ("isolcpus=[nohz,][domain,][managed_irq,]<cpu-list>" if key == "isolcpus"
                     else f"{key}=<cpu-list>")
            problems.append(f"{token}: {exc}, so the kernel would not apply it: write {usage}, the CPU list "
                            "being CPU numbers and ranges a-b (or a-b:used/group) separated by commas")
            continue
        if key in HOUSEKEEPING_PARAMS:
            housekeeping.append((token, cpus))
    if len({tuple(cpus) for _token, cpus in housekeeping}) > 1:
        named = ", ".join(f"{token} ({format_cpulist(cpus)})" for token, cpus in housekeeping)
        problems.append(
            f"{named} name different CPUs: Linux 5.10 keeps one housekeeping CPU set and ignores an isolcpus= or "
            "nohz_full= that differs from the first (\"nohz_full= must match isolcpus=\"): give them the same CPU list")
    return problems


def _character_problems(bootloader, tokens):
    problems = []
    for token in tokens:
        bad = _bad_character(token)
        if bad:
            problems.append(f"{token!r} contains {bad}: kernel arguments must be printable ASCII (a NUL or a line end "
                            "cuts the line in the bootloader); remove it, by hand if it is already in the file")
            continue
        if bootloader == "extlinux" and token == CBOOTARGS:
            continue
        if "$(" in token or "`" in token:
            what = "a command substitution"
        elif "${" in token:
            what = "a ${...} variable"
        elif "$" in token:
            what = "a $ expansion"
        else:
            continue
        problems.append(
            f"{token!r} holds {what}: U-Boot, GRUB or the shell would expand it, so the kernel would not get this "
            "text; write the value itself, and remove it by hand if it is already in the file (the only expansion "
            f"kept is L4TLauncher's own {CBOOTARGS}, as a token of its own)")
    return problems


def _length_problems(bootloader, tokens, machine):
    used = len(render_cmdline(tokens).encode("utf-8"))
    adds, what = BOOTLOADER_ADDS.get(bootloader, (0, ""))
    total = used + (adds + 1 if adds else 0)
    limit, why = line_limit(bootloader, machine)
    if total <= limit:
        return []
    longest = max(tokens, key=len) if tokens else ""
    shown = longest if len(longest) <= 40 else longest[:37] + "..."
    return [f"the command line would be {used} characters plus up to {adds} for {what} ({total} in all), over the "
            f"{limit} that fit ({why}); the kernel cuts a longer line and the arguments at its end are lost: drop or "
            f"shorten arguments (the longest is {shown!r}, {len(longest)} characters)"]


def file_problems(text):
    """Control characters in the file's text (tab and line ends are fine)."""
    if text is None:
        return []
    for number, line in enumerate(text.split("\n"), 1):
        body = line[:-1] if line.endswith("\r") else line
        for char in body:
            code = ord(char)
            if (code < 0x20 and char != "\t") or code == 0x7F:
                return [f"line {number} of the file contains the control character {_describe(char)}, which "
                        "bootloaders stop at or misread: remove it by hand (edgetune does not rewrite a file "
                        "that holds one)"]
    return []


def boot_problems(bootloader, tokens, text=None, before=None, machine=None):
    """Every reason the entry would not boot as intended (empty: it passes).

    ``tokens``: the command line the file gives the next boot (the planner's
    ``persisted``; for extlinux the default label's APPEND); ``text``: the
    whole file as it will be written (None: not checked); ``before``: the
    tokens as they are now (None: unknown), which lets an L4T entry without
    root= as found stay so; ``machine``: os.uname().machine of the device
    (None: this machine's).
    """
    if machine is None:
        machine = os.uname().machine
    tokens = list(tokens)
    problems = file_problems(text)
    problems += _character_problems(bootloader, tokens)
    problems += _root_problems(bootloader, tokens, before)
    problems += _isolation_problems(tokens)
    problems += _length_problems(bootloader, tokens, machine)
    return problems


def check_bootable(bootloader, tokens, path, text=None, before=None, machine=None):
    """Raise UnbootableEntry naming ``path`` unless boot_problems finds nothing."""
    problems = boot_problems(bootloader, tokens, text=text, before=before, machine=machine)
    if problems:
        raise UnbootableEntry(path, problems)
