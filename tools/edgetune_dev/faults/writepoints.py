"""The write points of an apply, observed: every change it makes to a device twin, at the system call.

`edgetune-dev faults trace -i INVENTORY -l TWIN [--playbook site.yml] [-e VARS]... [-t TAGS] [--out DIR]`
runs the playbook against one container twin with the device's Python under
strace: each module Ansible runs there, and every program it starts (a
`shell` task's redirection, systemctl, tc), is traced from its first system
call to its last. What they changed (files written, renamed, removed, linked,
made, truncated, their mode or owner; sysfs, procfs and cgroup values;
traffic-control objects through netlink; BPF programs; mounts; units through
systemctl's verbs; the reboot) is listed in order and grouped by (module,
kind, path pattern), each group with its first and last instance: the points
the fault campaign cuts at. Nothing is listed by hand: a task added to a role
shows up in the next trace.

Each rename into a managed path is checked as a power cut would test it: the
new file fsynced before the rename (its data on disk before its name), the
directory fsynced after (the name on disk). A symlink switched by rename needs
only the directory's.

What is not seen: the writes systemd (PID 1) makes on a unit's behalf (the
links of `systemctl enable`, a slice's cgroup values, which are in the list as
the systemctl verb that asked for them), and Ansible's own temporary files
(its payloads under ~/.ansible/tmp, Python's byte code). Writes a twin's
simulated sysfs takes are seen at the path the role wrote, which is the
board's.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgetune.errors import UsageError
from edgetune_dev import CHECKOUT
from edgetune_dev.faults import strace_log
from edgetune_dev.twin import manager

TRACE_DIR = "/var/tmp/edgetune-trace"
INTERPRETER = TRACE_DIR + "/python3"
# What changes a device, with execve to know the program; names this architecture lacks are skipped (?).
TRACE_SYSCALLS = ",".join([
    "execve", "openat", "?open", "?creat", "?rename", "renameat", "?renameat2", "?unlink", "unlinkat", "?rmdir",
    "?symlink", "symlinkat", "?link", "linkat", "?mkdir", "mkdirat", "fsync", "fdatasync", "truncate",
    "ftruncate", "sendto", "sendmsg", "bpf", "mount", "umount2", "?chmod", "fchmod", "fchmodat", "?chown",
    "fchown", "fchownat", "reboot"])
# The device's Python, each run traced into a file of its own named by the module (AnsiballZ_<module>.py,
# which Ansible passes when pipelining is off).
WRAPPER = """#!/bin/sh
# edgetune-dev faults trace: the device's Python under strace, one trace file per run.
module=python
for arg in "$@"; do
    case "$arg" in *AnsiballZ_*.py) module=${arg##*AnsiballZ_}; module=${module%%.py} ;; esac
done
exec strace -f -qq -ttt -y -s 4096 -e signal=none --seccomp-bpf -e trace=%(syscalls)s \\
    -o "%(dir)s/$(date +%%s%%N)-$$-$module.strace" /usr/bin/python3 "$@"
"""
TRACE_NAME = re.compile(r"^(?P<ns>\d+)-(?P<pid>\d+)-(?P<module>[\w.]+)\.strace$")
# Not the device's state: Ansible's payloads and temporary directories, Python's byte code, the terminal,
# the trace itself.
IGNORED = re.compile(r"^(?:/dev/(?:null|tty|pts/|shm/)|/proc/self/|/proc/thread-self/|/var/tmp/edgetune-trace"
                     r"|/tmp/ansible|/root/\.ansible/|/home/[^/]+/\.ansible/)|/__pycache__(?:/|$)|\.pyc$")
KINDS_OF_FILES = ("write", "rename", "remove", "symlink", "link", "mkdir", "truncate", "attr")


def path_pattern(path):
    """A path with what differs between runs and between like objects made '*': temporary names (Ansible's
    .ansible_tmp*, Python's tmp*, edgetune's NAME.PID.tmp), long hex ids, numbers (CPUs, IRQs, PIDs)."""
    pattern = re.sub(r"\.ansible_tmp[a-z0-9_]{8}", ".ansible_tmp*", path)  # NamedTemporaryFile's 8 characters
    pattern = re.sub(r"(?<![A-Za-z])tmp[a-z0-9_]{8}(?![A-Za-z0-9_])", "tmp*", pattern)
    pattern = re.sub(r"[0-9a-f]{12,}", "*", pattern)
    pattern = re.sub(r"\d+", "*", pattern)
    return re.sub(r"\*(?:[*]|\.\*)*", "*", pattern)


def ignored(event):
    return event["kind"] in KINDS_OF_FILES + ("fsync",) and bool(IGNORED.search(event["path"]))


def program_of(argv):
    """The program a process ran: its interpreter's script where it ran one (nvpmodel is a script)."""
    if not argv:
        return "python3"
    name = os.path.basename(argv[0])
    if name.startswith("python") and len(argv) > 1 and not argv[1].startswith("-") and "AnsiballZ_" not in argv[1]:
        return os.path.basename(argv[1])
    return name


def staged_and_scratch(events):
    """Within one module's run: the paths renamed into place ({source: target}) and the scratch paths (made,
    then removed by the same run, never renamed: a temporary file, tempfile's probe of /tmp)."""
    staged = dict((e["source"], e["path"]) for e in events if e["kind"] == "rename" and e.get("source"))
    made = set(e["path"] for e in events if e["kind"] in ("write", "mkdir", "symlink")
               and ("O_CREAT" in e.get("flags", "O_CREAT")))
    removed = set(e["path"] for e in events if e["kind"] == "remove")
    return staged, (made & removed) - set(staged)


def _within(path, roots):
    return next((root for root in roots if path == root or path.startswith(root.rstrip("/") + "/")), None)


def read_traces(directory):
    """The events of every trace file in ``directory`` (as the wrapper names them), in time order, each with
    the module whose run made it and the program that made it (via). Scratch paths are left out; a path
    staged for a rename (a temporary file, a directory unpacked beside its place) is named by where the
    rename puts it, with ``staged`` set."""
    found, runs = [], {}
    for path in sorted(Path(directory).glob("*.strace")):  # named by start time: in the order they ran
        named = TRACE_NAME.match(path.name)
        module = named.group("module") if named else "?"
        runs[module] = runs.get(module, 0) + 1
        with path.open(errors="replace") as handle:
            run = list(strace_log.events(handle))
        staged, scratch = staged_and_scratch(run)
        for event in run:
            if _within(event["path"], scratch):
                continue
            root = _within(event["path"], staged) if event["kind"] != "rename" else None
            if root is not None:
                event["staged"] = event["path"]
                event["path"] = staged[root] + event["path"][len(root):]
            event["module"], event["run"] = module, runs[module]
            event["via"] = program_of(event["argv"])
            found.append(event)
    found.sort(key=lambda e: e["time"])
    for seq, event in enumerate(found):
        event["seq"] = seq
    return found


def groups(events):
    """The write points grouped by (module, kind, path pattern), in the order of their first instance: each with
    its count, the programs that made it, its first and last instance (seq, time, path)."""
    found = {}
    for event in events:
        if event["kind"] == "fsync" or ignored(event):
            continue
        key = (event["module"], event["kind"], path_pattern(event["path"]) + (" (staged)" if "staged" in event else ""))
        # Where a cut finds it again: the module's nth run, the process in it, the call and its rank.
        instance = {"seq": event["seq"], "time": event["time"], "path": event["path"], "run": event["run"],
                    "process": event["process"], "call": event["call"], "nth": event["nth"]}
        group = found.get(key)
        if group is None:
            found[key] = group = {"module": key[0], "kind": key[1], "pattern": key[2], "count": 0, "via": [],
                                  "first": instance}
        group["count"] += 1
        group["last"] = instance
        if event["via"] not in group["via"]:
            group["via"].append(event["via"])
    return sorted(found.values(), key=lambda g: g["first"]["seq"])


def renames(events):
    """Every rename into a path that is not ignored, judged: the source fsynced after its last write and before
    the rename (None where the source is a symlink: nothing to fsync), the target's directory fsynced after."""
    judged = []
    for index, event in enumerate(events):
        if event["kind"] != "rename" or ignored(event):
            continue
        pid, source, directory = event["pid"], event.get("source"), os.path.dirname(event["path"])
        before = [e for e in events[:index] if e["pid"] == pid and e.get("staged", e["path"]) == source]
        since_write = before[max([i for i, e in enumerate(before) if e["kind"] == "write"] or [0]):]
        file_synced = (None if any(e["kind"] == "symlink" for e in before)
                       else any(e["kind"] == "fsync" for e in since_write))
        directory_synced = any(e["pid"] == pid and e["kind"] == "fsync" and e.get("staged", e["path"]) == directory
                               for e in events[index + 1:])
        judged.append({"module": event["module"], "via": event["via"], "target": event["path"], "source": source,
                       "pattern": path_pattern(event["path"]), "file_fsync": file_synced,
                       "directory_fsync": directory_synced, "seq": event["seq"]})
    return judged


def unsynced(judged):
    """The renames a power cut could lose or leave empty: (module, target pattern, what is missing), once each."""
    found = []
    for rename in judged:
        missing = [what for what, done in (("file fsync", rename["file_fsync"]),
                                           ("directory fsync", rename["directory_fsync"])) if done is False]
        row = (rename["module"], rename["pattern"], " and ".join(missing))
        if missing and row not in found:
            found.append(row)
    return found


# ------------------------------------------------------------------ on a twin
def docker(*argv, stdin=None, check=True):
    result = subprocess.run(["docker", *argv], input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            check=False)
    if check and result.returncode != 0:
        raise manager.TwinError("docker %s: %s" % (" ".join(argv[:3]), result.stderr.decode(errors="replace")
                                                    .strip()[-300:]))
    return result


def prepare(twin):
    """The wrapper in place on ``twin`` and its trace directory empty."""
    if docker("exec", twin, "sh", "-c", "command -v strace", check=False).returncode != 0:
        raise UsageError("twin %s has no strace (a twin image made before it was added): remove the twin and "
                         "create it again (`edgetune-dev twin rm %s`)" % (twin, twin))
    script = WRAPPER % {"syscalls": TRACE_SYSCALLS, "dir": TRACE_DIR}
    docker("exec", "-i", twin, "sh", "-c", "rm -rf %s && mkdir -p %s && cat > %s && chmod 0755 %s"
           % (TRACE_DIR, TRACE_DIR, INTERPRETER, INTERPRETER), stdin=script.encode())


def collect(twin, destination):
    """The twin's trace files copied into ``destination``, then removed from the twin with the wrapper."""
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    packed = docker("exec", twin, "sh", "-c", "cd %s && tar -c --exclude python3 ." % TRACE_DIR)
    subprocess.run(["tar", "-x", "-C", str(destination)], input=packed.stdout, check=True)
    docker("exec", twin, "rm", "-rf", TRACE_DIR, check=False)
    return destination


def boot_id(twin):
    return docker("exec", twin, "cat", "/proc/sys/kernel/random/boot_id", check=False).stdout.decode().strip()


def trace_apply(twin, inventory, playbook="site.yml", ansible_args=(), out_dir=None, cwd=CHECKOUT, timeout=1800):
    """Run ``playbook`` against ``twin`` (a container twin in ``inventory``) under the tracer, with
    ``ansible_args`` (-e, --tags...) after it, from ``cwd``. Returns the run (rc, output tail), its events,
    groups, judged renames and the directory of the raw traces."""
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="edgetune-trace-"))
    prepare(twin)
    booted = boot_id(twin)
    argv = ["ansible-playbook", "-i", str(inventory), "-l", twin, str(playbook),
            "-e", json.dumps({"ansible_python_interpreter": INTERPRETER}), *ansible_args]
    env = dict(os.environ, ANSIBLE_PIPELINING="False", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    started = time.time()
    try:
        run = subprocess.run(argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, check=False, timeout=timeout)
        rc, output = run.returncode, run.stdout
    except subprocess.TimeoutExpired as exc:
        rc, output = 124, (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
    raw = collect(twin, out_dir / "strace")
    events = read_traces(raw)
    if boot_id(twin) != booted:  # the reboot is Ansible's action over the connection: no module to trace
        events.append({"kind": "unit", "path": "reboot", "module": "reboot", "via": "reboot", "pid": 0,
                       "time": time.time(), "argv": [], "call": "reboot", "seq": len(events), "run": 1,
                       "process": 0, "nth": 1})
    judged = renames(events)
    return {"twin": twin, "playbook": str(playbook), "rc": rc, "seconds": round(time.time() - started, 1),
            "output_tail": output[-4000:], "events": events, "groups": groups(events), "renames": judged,
            "unsynced": unsynced(judged), "raw": str(raw)}


# ------------------------------------------------------------------ the command
def table(result):
    """The groups as a text table: first instance, count, module, kind, pattern."""
    lines = ["%5s %5s  %-24s %-8s %s" % ("first", "count", "module", "kind", "path pattern")]
    for group in result["groups"]:
        lines.append("%5d %5d  %-24s %-8s %s" % (group["first"]["seq"], group["count"], group["module"],
                                                  group["kind"], group["pattern"]))
    for module, pattern, missing in result["unsynced"]:
        lines.append("rename without %s: %s -> %s" % (missing, module, pattern))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="edgetune-dev faults trace", description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", required=True, help="an inventory holding the twin")
    parser.add_argument("-l", "--limit", required=True, metavar="TWIN", help="the twin (its container's name)")
    parser.add_argument("--playbook", default="site.yml", help="the playbook to trace (default: site.yml)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], help="as ansible-playbook's")
    parser.add_argument("-t", "--tags", help="as ansible-playbook's")
    parser.add_argument("--skip-tags", help="as ansible-playbook's")
    parser.add_argument("--out", help="where the raw traces and write-points.json go (default: a new "
                                      "directory under .cache/faults/)")
    args = parser.parse_args(argv)
    out = Path(args.out or CHECKOUT / ".cache" / "faults" / time.strftime("trace-%Y%m%d-%H%M%S"))
    if out.exists() and any(out.iterdir()):
        raise UsageError("--out %s is not empty" % out)
    if shutil.which("ansible-playbook") is None:
        raise UsageError("ansible-playbook is not on PATH (make venv, then use the venv's)")
    ansible_args = [word for value in args.extra_vars for word in ("-e", value)]
    ansible_args += ["--tags", args.tags] if args.tags else []
    ansible_args += ["--skip-tags", args.skip_tags] if args.skip_tags else []
    result = trace_apply(args.limit, args.inventory, args.playbook, ansible_args, out)
    summary = dict(result, events=len(result["events"]))
    (out / "write-points.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(table(result))
    print("edgetune-dev: %d write points in %d groups (%s, rc %d, %.0f s); raw traces and write-points.json in %s"
          % (len(result["events"]), len(result["groups"]), args.playbook, result["rc"], result["seconds"], out),
          file=sys.stderr)
    return 0 if result["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
