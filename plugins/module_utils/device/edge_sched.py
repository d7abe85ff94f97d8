# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the scheduler really does with a process: per-thread policy, RT
priority and allowed CPUs read from /proc, the RT budget of its cgroup, and
who holds a TCP port. Python 3.8+, stdlib only.

Policy and priority come from /proc/<pid>/task/<tid>/stat (fields 41 and 40,
present on every kernel), not from the ``sched`` file, which needs
CONFIG_SCHED_DEBUG.
"""

import os
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist, parse_cpulist
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

POLICIES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline"}


BACKENDS = ("cpu", "cuda", "rknn")


def compute_threads(pinned_cpus, online_cpus, backend="cpu"):
    """Compute threads for an inference runtime such as llama.cpp: one per CPU it is pinned to
    (CPUs the plan gives it alone) on the CPU backend; half of them (at least one) where the GPU
    or NPU computes, as measured best by `edgetune bench llm --host` (README, "Measured"); unpinned,
    half the online CPUs, at least one. ggml's threads meet at a barrier after every operation, so on
    CPUs shared with other work one descheduled thread stalls the rest: on a 2-CPU twin beside two
    busy processes, 2 threads stalled up to 3 s between tokens, 1 thread at most 23 ms."""
    if not pinned_cpus:
        return max(1, online_cpus // 2)
    return pinned_cpus if backend == "cpu" else max(1, pinned_cpus // 2)


def resolve_threads(rule, ncpus, what="threads"):
    """The runtime's thread count from its rule: 'n' -> ncpus, 'n-1' -> ncpus - 1, 'n/2' -> ncpus // 2
    (each at least 1), '3' -> 3."""
    text = str(rule).replace(" ", "")
    try:
        if text.startswith("n"):
            operator = text[1:2]
            value = {"": ncpus, "-": ncpus - int(text[2:] or 0), "/": ncpus // int(text[2:] or 1)}.get(operator)
        else:
            value = int(text)
    except ValueError:
        value = None
    if value is None:
        raise BadInput("%s %r is not n, n-K or a number" % (what, rule))
    return max(1, value)


def _read(path):
    with open(path) as handle:
        return handle.read()


def parse_stat(text):
    """/proc/<pid>/task/<tid>/stat -> (comm, policy name, rt_priority)."""
    close = text.rindex(")")
    comm = text[text.index("(") + 1:close]
    fields = text[close + 2:].split()
    # fields[0] is field 3 (state): rt_priority is field 40, policy field 41.
    policy = int(fields[38])
    return comm, POLICIES.get(policy, str(policy)), int(fields[37])


def parse_status_cpus(text):
    match = re.search(r"^Cpus_allowed_list:\s*(\S*)", text, re.M)
    return parse_cpulist(match.group(1)) if match else []


def threads_of(pid, proc="/proc"):
    """[{tid, name, policy, rt_priority, cpus}] for every thread of ``pid``; [] when it is gone."""
    base = "%s/%d/task" % (proc, pid)
    try:
        tids = sorted(int(t) for t in os.listdir(base) if t.isdigit())
    except OSError:
        return []
    threads = []
    for tid in tids:
        try:
            comm, policy, prio = parse_stat(_read("%s/%d/stat" % (base, tid)))
            cpus = parse_status_cpus(_read("%s/%d/status" % (base, tid)))
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between listdir and read
        threads.append({"tid": tid, "name": comm, "policy": policy, "rt_priority": prio, "cpus": cpus})
    return threads


def thread_mismatches(threads, policy=None, priority=None, cpus=None):
    """Lines naming each thread whose policy, priority or CPU set differs from the expectation."""
    problems = []
    for t in threads:
        wrong = []
        if policy and t["policy"] != policy:
            wrong.append("policy %s (expected %s)" % (t["policy"], policy))
        if priority is not None and policy in ("fifo", "rr") and t["policy"] == policy and t["rt_priority"] != priority:
            wrong.append("priority %d (expected %d)" % (t["rt_priority"], priority))
        if cpus is not None and sorted(t["cpus"]) != sorted(cpus):
            wrong.append("CPUs %s (expected %s)" % (fmt(t["cpus"]), fmt(cpus)))
        if wrong:
            problems.append("%s[%d]: %s" % (t["name"], t["tid"], ", ".join(wrong)))
    return problems


def fmt(cpus):
    return format_cpulist(cpus) or "none"


# ------------------------------------------------------------------ RT budget
def cpu_cgroup_path(pid, proc="/proc"):
    """The process's cgroup in the v1 cpu controller (or the v2 path), e.g. '/docker/abc'."""
    text = _read("%s/%d/cgroup" % (proc, pid))
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "cpu" in parts[1].split(","):
            return "v1", parts[2]
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    return ("v2", v2) if v2 is not None else (None, None)


def rt_budget_chain(kind, path, cgroup_root="/sys/fs/cgroup"):
    """[(directory, cpu.rt_runtime_us)] from the root down to ``path`` (v1 cpu controller only)."""
    if kind != "v1" or path is None:
        return []
    mount = None
    for name in ("cpu,cpuacct", "cpu"):
        if os.path.isfile(os.path.join(cgroup_root, name, "cpu.rt_runtime_us")):
            mount = os.path.join(cgroup_root, name)
            break
    if mount is None:
        return []
    chain, current = [], mount
    for part in [""] + [p for p in path.split("/") if p]:
        current = os.path.join(current, part) if part else current
        try:
            chain.append((current, int(_read(os.path.join(current, "cpu.rt_runtime_us")).strip())))
        except (OSError, ValueError):
            break
    return chain


def explain_rt_refusal(pid=None, proc="/proc", cgroup_root="/sys/fs/cgroup"):
    """A sentence saying why SCHED_FIFO is refused, from the kernel's RT settings and the cgroup budget."""
    reasons = []
    try:
        runtime = int(_read("%s/sys/kernel/sched_rt_runtime_us" % proc).strip())
        if runtime == 0:
            reasons.append("kernel.sched_rt_runtime_us is 0 (no RT time at all)")
    except (OSError, ValueError):
        pass
    if pid is not None:
        try:
            kind, path = cpu_cgroup_path(pid, proc)
        except OSError:
            kind, path = None, None
        for directory, budget in rt_budget_chain(kind, path, cgroup_root):
            if budget == 0:
                reasons.append("cpu.rt_runtime_us is 0 in %s (RT group scheduling gives this cgroup no RT "
                               "time; a container needs Docker's --cpu-rt-runtime, a slice needs an RT budget)"
                               % directory)
                break
        if kind == "v2":
            reasons.append("cgroup v2 at %s" % path)
    return "; ".join(reasons) or "sched_setscheduler(SCHED_FIFO) was refused (EPERM)"


# ------------------------------------------------------------------ ports
def _socket_inodes(port, proc="/proc"):
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = _read("%s/net/%s" % (proc, name)).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, state = fields[1], fields[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                inodes.add(fields[9])
    return inodes


def port_holders(port, proc="/proc"):
    """Processes listening on TCP ``port``: [{pid, comm, unit}] (unit from the systemd cgroup)."""
    inodes = _socket_inodes(port, proc)
    if not inodes:
        return []
    holders = []
    for pid in (int(p) for p in os.listdir(proc) if p.isdigit()):
        fd_dir = "%s/%d/fd" % (proc, pid)
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        links = []
        for fd in fds:
            try:
                links.append(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue  # closed meanwhile (listdir's own descriptor, for one)
        if any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
            try:
                comm = _read("%s/%d/comm" % (proc, pid)).strip()
                cgroup = _read("%s/%d/cgroup" % (proc, pid))
            except OSError:
                continue
            match = re.search(r"/([^/\n]+\.service)(?:/|$)", cgroup, re.M)
            holders.append({"pid": pid, "comm": comm, "unit": match.group(1) if match else None})
    if not holders:  # listening, but the socket belongs to a process we cannot see
        holders.append({"pid": None, "comm": None, "unit": None})
    return holders
