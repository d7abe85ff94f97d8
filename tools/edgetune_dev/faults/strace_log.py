"""What a traced device did to its state, read from strace's output.

The tracer runs as ``strace -f -ttt -y -s 4096 -e trace=SYSCALLS`` (see
writepoints.TRACE_SYSCALLS): one line per system call, ``PID EPOCH call(args)
= result``, a call another thread interrupted split in an ``<unfinished ...>``
line and a ``<... call resumed>`` line. With -y, every file descriptor (the
result of openat, the argument of fsync, a directory fd, AT_FDCWD itself) is
followed by the path it stood for, in angle brackets: relative paths resolve
through it, and an fsync names what it made durable.

events() turns the lines into the device's state changes, in order: a file
opened for writing (sysfs, procfs and cgroup values among them), renamed,
removed, linked, made, truncated, its mode or owner changed, fsynced (what
makes the others durable), a traffic-control or BPF object changed through
netlink or bpf(2), a mount, a program run (systemctl's verbs are how units are
enabled, started and the device rebooted). Calls that failed change nothing
and are left out. Format: strace's own output (strace(1), "-y" and "-f"),
version 5.3 or later (--seccomp-bpf).
"""
import os
import re

LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<time>\d+\.\d+)\s+(?P<rest>.*)$")
CALL = re.compile(r"^(?P<name>\w+)\((?P<args>.*)\)\s+=\s+(?P<result>-?\d+|\?)(?P<after>.*)$")
UNFINISHED = " <unfinished ...>"
RESUMED = re.compile(r"^<\.\.\. (?P<name>\w+) resumed>(?P<rest>.*)$")
# "3</etc/x>", "AT_FDCWD</root>": the path after the descriptor.
FD_PATH = re.compile(r"^(?:-?\d+|AT_FDCWD)<(?P<path>.*)>$")
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")
# Traffic control and links: what the netqos loader and `tc` change through rtnetlink.
NETLINK_CHANGES = re.compile(r"nlmsg_type=(RTM_(?:NEW|DEL)(?:QDISC|TCLASS|TFILTER|CHAIN))")
NETLINK_IFINDEX = re.compile(r"tcm_ifindex=(?:if_nametoindex\(\"(?P<name>[^\"]+)\"\)|(?P<index>\d+))")
BPF_PROG_NAME = re.compile(r"prog_name=\"(?P<name>[^\"]*)\"")
# systemctl's verbs that change the device (the others only read it).
SYSTEMCTL_CHANGES = ("start", "stop", "restart", "reload", "try-restart", "reload-or-restart", "enable",
                     "disable", "reenable", "mask", "unmask", "daemon-reload", "set-property", "reboot",
                     "poweroff", "kill", "reset-failed")


def split_args(text):
    """strace's argument list split at its top-level commas (strings, arrays and structures kept whole)."""
    parts, depth, start, quoted, escaped = [], 0, 0, False, False
    for index, char in enumerate(text):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    tail = text[start:].strip()
    if tail or parts:
        parts.append(tail)
    return parts


def unquote(text):
    """A C string as strace prints it ("..." with C escapes; a trailing ... when it was cut)."""
    text = text.strip()
    if text.endswith("..."):
        text = text[:-3]
    if not (text.startswith('"') and text.endswith('"')):
        return None
    body = text[1:-1]
    return re.sub(r"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)", _unescape, body)


def _unescape(match):
    code = match.group(1)
    if code[0] == "x":
        return chr(int(code[1:], 16))
    if code.isdigit():
        return chr(int(code, 8))
    return {"n": "\n", "t": "\t", "r": "\r", "v": "\v", "f": "\f"}.get(code, code)


def fd_path(text):
    """The path strace printed after a descriptor (-y), or None."""
    match = FD_PATH.match(text.strip())
    return match.group("path") if match else None


def resolve(directory_fd, name):
    """A path argument made absolute through its directory descriptor's path (or None)."""
    if name is None:
        return None
    if name.startswith("/"):
        return os.path.normpath(name)
    base = fd_path(directory_fd) if directory_fd is not None else None
    return os.path.normpath(os.path.join(base, name)) if base else name


def joined_lines(lines):
    """(pid, time, text) of each complete call: an <unfinished ...> line joined to its resumption."""
    pending = {}
    for raw in lines:
        match = LINE.match(raw.rstrip("\n"))
        if not match:
            continue
        pid, stamp, rest = int(match.group("pid")), float(match.group("time")), match.group("rest")
        if rest.endswith(UNFINISHED):
            pending[pid] = (stamp, rest[:-len(UNFINISHED)])
            continue
        resumed = RESUMED.match(rest)
        if resumed:
            began = pending.pop(pid, None)
            if began is None:
                continue
            yield pid, began[0], began[1] + resumed.group("rest")
            continue
        yield pid, stamp, rest


def _event(kind, path, **extra):
    event = {"kind": kind, "path": path}
    event.update(extra)
    return event


def call_event(name, args, after):
    """The state change one successful call made, or None."""
    if name in ("openat", "open", "creat"):
        flags = args[2] if name == "openat" else (args[1] if name == "open" else "O_CREAT|O_WRONLY|O_TRUNC")
        if "O_PATH" in flags or not any(flag in flags.split("|") for flag in WRITE_FLAGS):
            return None
        opened = re.match(r"^<(?P<path>.*)>", after)
        if opened:
            path = opened.group("path")
        else:
            path = resolve(args[0], unquote(args[1])) if name == "openat" else unquote(args[0])
        return _event("write", path, flags=flags)
    if name in ("rename", "renameat", "renameat2"):
        if name == "rename":
            source, target = unquote(args[0]), unquote(args[1])
        else:
            source, target = resolve(args[0], unquote(args[1])), resolve(args[2], unquote(args[3]))
        return _event("rename", target, source=source)
    if name in ("unlink", "rmdir"):
        return _event("remove", unquote(args[0]))
    if name == "unlinkat":
        return _event("remove", resolve(args[0], unquote(args[1])))
    if name == "symlink":
        return _event("symlink", unquote(args[1]), target=unquote(args[0]))
    if name == "symlinkat":
        return _event("symlink", resolve(args[1], unquote(args[2])), target=unquote(args[0]))
    if name in ("link", "linkat"):
        target = unquote(args[1]) if name == "link" else resolve(args[2], unquote(args[3]))
        return _event("link", target)
    if name == "mkdir":
        return _event("mkdir", unquote(args[0]))
    if name == "mkdirat":
        return _event("mkdir", resolve(args[0], unquote(args[1])))
    if name in ("fsync", "fdatasync"):
        return _event("fsync", fd_path(args[0]))
    if name == "truncate":
        return _event("truncate", unquote(args[0]))
    if name == "ftruncate":
        return _event("truncate", fd_path(args[0]))
    if name in ("chmod", "chown", "lchown"):
        return _event("attr", unquote(args[0]))
    if name in ("fchmod", "fchown"):
        return _event("attr", fd_path(args[0]))
    if name in ("fchmodat", "fchownat"):
        return _event("attr", resolve(args[0], unquote(args[1])))
    if name in ("sendto", "sendmsg"):
        text = ", ".join(args)
        change = NETLINK_CHANGES.search(text)
        if not change:
            return None
        device = NETLINK_IFINDEX.search(text)
        where = (device.group("name") or "ifindex %s" % device.group("index")) if device else "?"
        return _event("netlink", "rtnetlink %s %s" % (change.group(1), where))
    if name == "bpf" and args and args[0] == "BPF_PROG_LOAD":
        program = BPF_PROG_NAME.search(", ".join(args))
        return _event("bpf", "bpf program %s" % (program.group("name") if program else "?"))
    if name == "mount":
        return _event("mount", unquote(args[1]))
    if name == "umount2":
        return _event("mount", unquote(args[0]))
    if name == "reboot":
        return _event("reboot", "reboot")
    return None


def exec_argv(args):
    """The argument vector of an execve call's arguments (strings only, as strace printed them)."""
    if len(args) < 2 or not args[1].startswith("["):
        return []
    return [word for word in (unquote(part) for part in split_args(args[1][1:-1])) if word is not None]


def exec_event(argv):
    """A program run that changes the device (systemctl's changing verbs, reboot, shutdown), or None."""
    if not argv:
        return None
    program = os.path.basename(argv[0])
    if program in ("reboot", "shutdown", "poweroff"):
        return _event("unit", "%s" % program)
    if program == "systemctl":
        words = [word for word in argv[1:] if not word.startswith("-")]
        if words and words[0] in SYSTEMCTL_CHANGES:
            return _event("unit", ("systemctl %s %s" % (words[0], " ".join(words[1:]))).strip())
    return None


def events(lines):
    """The state changes in strace lines, in order: dicts kind, path (what changed), pid, time, argv (the
    program the process ran last, as far as the trace saw its execve), the call's extras (a rename's
    source, the flags of an open for writing, a symlink's target), and where a cut can find the call
    again in a run alike: ``process`` (the pid's rank among the trace's processes, by first call) and
    ``nth`` (the call's rank among that process's calls of the same name, failed ones included: what
    strace's inject=...:when= counts)."""
    programs, ranks, counts = {}, {}, {}
    for pid, stamp, text in joined_lines(lines):
        call = CALL.match(text)
        if not call:
            continue
        name = call.group("name")
        ranks.setdefault(pid, len(ranks))
        counts[pid, name] = counts.get((pid, name), 0) + 1
        if call.group("result") == "?" or call.group("result").startswith("-"):
            continue
        args = split_args(call.group("args"))
        try:
            if name == "execve":
                programs[pid] = exec_argv(args)
                event = exec_event(programs[pid])
            else:
                event = call_event(name, args, call.group("after").strip())
        except IndexError:  # a call printed with fewer arguments than its kind has: not ours to guess
            continue
        if event is None or event["path"] is None:
            continue
        event.update(pid=pid, time=stamp, call=name, process=ranks[pid], nth=counts[pid, name])
        event["argv"] = programs.get(pid, [])
        yield event
