#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_cgroup_rt: a real-time (SCHED_FIFO/RR) budget for a systemd slice.

Also a command line for the boot-time re-apply unit, usable without Ansible:
``python3 edge_cgroup_rt.py --apply-state FILE [--root /]``.
"""

DOCUMENTATION = r"""
---
module: edge_cgroup_rt
short_description: Give a systemd slice an RT budget (cpu.rt_runtime_us) so SCHED_FIFO works in it, or say why not
description:
  - With RT group scheduling (C(CONFIG_RT_GROUP_SCHED)) the kernel refuses C(SCHED_FIFO)/C(SCHED_RR)
    (C(EPERM)) to a task whose cpu cgroup has C(cpu.rt_runtime_us) = 0, and every new cgroup starts
    at 0. systemd does not manage that file, so a slice with C(CPUQuota=) or C(CPUWeight=) on
    cgroup v1 gets no RT time at all.
  - On cgroup v1 this module writes C(cpu.rt_runtime_us) along the slice's cpu cgroup path below
    systemd's root cgroup (C(ai.slice), then C(ai.slice/ai-infer.slice)), parents first when
    raising, and reads every value back. The kernel only accepts a budget when the children of a
    cgroup together hold no more than the cgroup itself; the module checks that on every level
    first (including the siblings' budgets) and writes nothing when it does not fit.
  - It never writes systemd's root cgroup. When that root has no budget to give (a container
    started without one, as Docker gives its containers C(cpu.rt_runtime_us=0)) the module does not
    fail; it reports RV(ready=false) and the reason, with the fix (Docker's C(--cpu-rt-runtime)).
  - Without RT group scheduling any cgroup may run SCHED_FIFO (throttled only by
    C(kernel.sched_rt_runtime_us)), so RV(ready=true) and nothing is written. On cgroup v2 there is
    no RT budget file, so with RT group scheduling the slice cannot run SCHED_FIFO once systemd enables the
    cpu controller for it (RV(ready=false), reason given).
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  slice:
    description: The slice unit, for example V(ai-infer.slice) (its cgroup is C(/ai.slice/ai-infer.slice)).
    type: str
    required: true
  runtime_us:
    description:
      - RT time per period (microseconds, per CPU) the slice's tasks may use; must stay below the
        period (C(cpu.rt_period_us), 1000000 by default) so RT tasks can never starve the CPU.
    type: int
    required: true
  rt_group_sched:
    description:
      - Whether the kernel has C(CONFIG_RT_GROUP_SCHED) (the edge facts' C(kernel.features.rt_group_sched)).
        Used on cgroup v2 only, where no cgroup file shows it; on v1 the presence of
        C(cpu.rt_runtime_us) decides. Null when unknown.
    type: bool
  state_file:
    description:
      - Save the slice and budget to this JSON file (only when ready, atomically, only when its
        content changes) for the boot-time unit C(edge_cgroup_rt.py --apply-state FILE), since a slice's
        cgroup is created again at every boot with a budget of 0. Not written in check mode.
    type: path
  root:
    description: Prefix for C(/proc) and C(/sys/fs/cgroup) paths (for tests and fake trees).
    type: path
    default: /
attributes:
  check_mode:
    description: Reads and checks everything and reports the writes that would be made; writes nothing.
    support: full
  diff_mode:
    description:
      - "One C(path: value) line per cpu.rt_runtime_us on the slice's path, before and after."
      - The state file's content, when it changes.
    support: full
  platform:
    description: Runs on the board (Linux, Python 3.8 or later).
    support: full
    platforms: linux
notes:
  - The slice must be active (its cgroup created) with a cpu setting (C(CPUQuota=), C(CPUWeight=)).
    A service in the slice that sets its own cpu settings gets its own cpu cgroup (budget 0), so
    RT services in the slice should not set C(CPUQuota=)/C(CPUWeight=)/C(CPUAccounting=) themselves on v1.
"""

EXAMPLES = r"""
- name: Let services in ai-infer.slice run SCHED_FIFO for up to 80% of each second
  edge_cgroup_rt:
    slice: ai-infer.slice
    runtime_us: 800000
    rt_group_sched: "{{ ansible_facts.edge.kernel.features.rt_group_sched }}"
    state_file: /etc/edgetune/rt-budget.json
  register: rt

- name: Say why SCHED_FIFO cannot work here
  ansible.builtin.debug:
    msg: "{{ rt.reason }}"
  when: not rt.ready
"""

RETURN = r"""
ready:
  description: Whether a task in the slice can be given SCHED_FIFO now (in check mode, after the planned writes).
  returned: success
  type: bool
mode:
  description:
    - C(v1-rt-group) (cgroup v1 cpu controller with RT group scheduling), C(no-rt-group) (no RT
      group scheduling), C(v2-rt-group) or C(v2) (cgroup v2, with or without it; C(v2-unknown) when
      O(rt_group_sched) is null).
  returned: success
  type: str
reason:
  description: One sentence saying what the module found and, when not ready, what to change.
  returned: success
  type: str
in_container:
  description: Whether systemd's root cgroup is not the hierarchy's root (systemd runs in a container).
  returned: success
  type: bool
levels:
  description:
    - The cpu cgroups on the slice's path with C(path), C(before) and C(after) budgets
      (v1 with RT group scheduling).
  returned: success
  type: list
  elements: dict
  sample: [{path: /sys/fs/cgroup/cpu,cpuacct/ai.slice, before: 0, after: 800000}]
parent:
  description: systemd's root cpu cgroup, its budget and what its other children already hold.
  returned: when mode is v1-rt-group
  type: dict
pending:
  description:
    - Check mode only; the slice is not active yet, a real run starts it and then sets the budget (C(levels)
      has what it will write). Where the budget would not fit (a container without RT time), the result is
      the real run's instead (not ready, with the reason) and nothing is pending.
  returned: when the slice's cgroup does not exist yet in check mode and its budget fits
  type: bool
errors:
  description: Every error message.
  returned: failure
  type: list
  elements: str
"""

# Ansible modules keep their imports after the documentation strings.
import argparse  # noqa: E402
import errno  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from fractions import Fraction  # noqa: E402

try:
    from ansible.module_utils.basic import AnsibleModule
    from ansible_collections.edgetune.fleet.plugins.module_utils.edge_fileio import atomic_write
except ImportError:
    # The boot-time CLI needs nothing but the standard library.
    if "--apply-state" not in sys.argv:
        raise
    AnsibleModule = atomic_write = None

STATE_FORMAT = 1
RUNTIME = "cpu.rt_runtime_us"
PERIOD = "cpu.rt_period_us"
_SLICE = re.compile(r"^[A-Za-z0-9:_.\\]+(-[A-Za-z0-9:_.\\]+)*\.slice$")


class RtError(Exception):
    def __init__(self, errors, **details):
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))
        self.details = details


class MissingCgroup(RtError):
    """The slice's cpu cgroup is not there (the slice is not active)."""


def under(root, path):
    return os.path.join(root or "/", path.lstrip("/"))


def read_value(path):
    with open(path, "r") as handle:
        return handle.read().strip()


def write_value(path, value):
    """``echo value > path``; never creates a file. Tests replace it to act like the kernel."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, ("%s\n" % value).encode("ascii"))
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# Where things are

def slice_cgroup(name):
    """'ai-infer.slice' -> '/ai.slice/ai-infer.slice' (systemd's dash hierarchy)."""
    if name == "-.slice":
        return "/"
    if not _SLICE.match(name or ""):
        raise RtError(["%r is not a slice unit name (like ai-infer.slice)" % name])
    parts = name[:-len(".slice")].split("-")
    return "/" + "/".join("-".join(parts[:i + 1]) + ".slice" for i in range(len(parts)))


def _unescape(field):
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text):
    """-> list of dicts: point, root (of the mount inside the hierarchy), fstype, options (set)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mounts.append({"point": _unescape(fields[4]), "root": _unescape(fields[3]), "fstype": tail[0],
                       "options": set(tail[2].split(","))})
    return mounts


def systemd_root(text):
    """systemd's root cgroup from /proc/1/cgroup: its own cgroup minus /init.scope."""
    named = unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "name=systemd":
            named = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            unified = parts[2]
    path = named if named is not None else unified
    if path is None:
        raise RtError(["cannot find systemd's cgroup in /proc/1/cgroup"])
    if path.endswith("/init.scope"):
        path = path[:-len("/init.scope")]
    return path or "/"


def fs_path(mount, cgroup):
    """A cgroup path (as /proc/<pid>/cgroup prints it) inside a mounted hierarchy."""
    root = mount["root"].rstrip("/")
    if root and (cgroup == root or cgroup.startswith(root + "/")):
        cgroup = cgroup[len(root):]
    return os.path.join(mount["point"], cgroup.lstrip("/")).rstrip("/") or "/"


def ancestors(cgroup):
    """'/a.slice/a-b.slice' -> ['/a.slice', '/a.slice/a-b.slice']."""
    parts = [p for p in cgroup.split("/") if p]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


# --------------------------------------------------------------------------
# Budgets

def read_budget(directory):
    return int(read_value(os.path.join(directory, RUNTIME))), int(read_value(os.path.join(directory, PERIOD)))


def bandwidth(runtime, period):
    """The kernel's view: runtime -1 means unlimited (the whole period)."""
    return Fraction(1) if runtime < 0 else Fraction(runtime, period)


def children_bandwidth(directory, skip=None):
    total = Fraction(0)
    for entry in sorted(os.listdir(directory)):
        child = os.path.join(directory, entry)
        if child == skip or not os.path.isfile(os.path.join(child, RUNTIME)):
            continue
        total += bandwidth(*read_budget(child))
    return total


def _us(fraction, period):
    return -(-fraction.numerator * period // fraction.denominator)  # ceiling


def plan_v1(mount, sysroot, slice_path, runtime_us, assume_missing=False):
    """Levels [(path, before, after, period)] and the parent's numbers; RtError on impossible input.

    A cgroup of the chain that does not exist yet is MissingCgroup, unless ``assume_missing``
    (check mode): then it is planned as the kernel makes a new one, with no RT time, its
    parent's period and no children, so that check mode decides as the real run will after
    the slice has started."""
    root_dir = fs_path(mount, sysroot)
    chain = [fs_path(mount, sysroot.rstrip("/") + p) for p in ancestors(slice_path)]
    missing = [d for d in chain if not os.path.isfile(os.path.join(d, RUNTIME))]
    if missing and not assume_missing:
        raise MissingCgroup(["the slice's cpu cgroup %s does not exist: the slice must be active and have a cpu "
                             "setting (CPUQuota= or CPUWeight=) so that systemd creates it" % missing[0]])
    budgets = []
    for directory in chain:
        parent_period = budgets[-1][1] if budgets else read_budget(root_dir)[1]
        budgets.append((0, parent_period) if directory in missing else read_budget(directory))
    leaf_period = budgets[-1][1]
    if runtime_us < 0 or runtime_us >= leaf_period:
        raise RtError(["runtime_us %d must be at least 0 and below the period (%d us) so that RT tasks "
                       "cannot starve the CPUs" % (runtime_us, leaf_period)])
    held = children_bandwidth(chain[-1]) if chain[-1] not in missing else Fraction(0)
    if held > Fraction(runtime_us, leaf_period):
        raise RtError(["the cgroups inside %s already hold %d us of RT time; %d us is too little"
                       % (chain[-1], _us(held, leaf_period), runtime_us)])
    need = [None] * len(chain)
    need[-1] = Fraction(runtime_us, leaf_period)
    for i in range(len(chain) - 2, -1, -1):
        others = children_bandwidth(chain[i], skip=chain[i + 1]) if chain[i] not in missing else Fraction(0)
        need[i] = max(bandwidth(*budgets[i]), others + need[i + 1])
    root_runtime, root_period = read_budget(root_dir)
    others = children_bandwidth(root_dir, skip=chain[0])
    parent = {"path": root_dir, "runtime_us": root_runtime, "period_us": root_period,
              "others_us": _us(others, root_period)}
    fits = others + need[0] <= bandwidth(root_runtime, root_period)
    levels = [{"path": d, "before": b[0], "after": _us(n, b[1]) if i < len(chain) - 1 else runtime_us,
               "period": b[1]} for i, (d, b, n) in enumerate(zip(chain, budgets, need))]
    return levels, parent, fits, missing


def not_fitting_reason(parent, sysroot, runtime_us, in_container):
    if in_container and parent["runtime_us"] == 0:
        return ("systemd runs in a container whose cpu cgroup %s has cpu.rt_runtime_us=0, and a container "
                "cannot raise its own budget: SCHED_FIFO in the slice fails with EPERM. Give the container an "
                "RT budget when it is started: dockerd --cpu-rt-runtime=950000 (the daemon's parent cgroup) and "
                "docker run --cpu-rt-runtime=%d (or more) for the container."
                % (parent["path"], runtime_us))
    return ("%s has %d us of RT time per %d us and its other children hold %d us: %d us more for the slice "
            "does not fit; lower the slice's budget, or raise kernel.sched_rt_runtime_us (still below the period)."
            % (parent["path"], parent["runtime_us"], parent["period_us"], parent["others_us"], runtime_us))


def apply_levels(levels):
    """Raise parents first; a lowered leaf goes last. Read every value back."""
    order = [lv for lv in levels if lv["after"] > lv["before"]] + \
            [lv for lv in reversed(levels) if lv["after"] < lv["before"]]
    done = []
    for level in order:
        path = os.path.join(level["path"], RUNTIME)
        try:
            write_value(path, level["after"])
        except OSError as exc:
            hint = " (the kernel refused: the budget does not fit its parent)" if exc.errno in (
                errno.EINVAL, errno.EBUSY) else ""
            raise RtError(["writing %d to %s failed: %s%s" % (level["after"], path, exc.strerror or exc, hint)],
                          levels=done) from None
        done.append(level)
    for level in levels:
        path = os.path.join(level["path"], RUNTIME)
        value = int(read_value(path))
        if value != level["after"]:
            raise RtError(["%s reads %d after writing %d" % (path, value, level["after"])], levels=levels)


def run(root="/", slice_name="", runtime_us=0, rt_group_sched=None, check_mode=False):
    """Returns the result dict (ready, mode, reason, levels, ...). RtError on bad input or a failed write."""
    slice_path = slice_cgroup(slice_name)
    try:
        mounts = parse_mountinfo(read_value(under(root, "proc/self/mountinfo")))
        sysroot = systemd_root(read_value(under(root, "proc/1/cgroup")))
    except OSError as exc:
        raise RtError(["cannot read the cgroup mounts: %s" % exc]) from None
    for mount in mounts:
        mount["point"] = under(root, mount["point"])
    cpu = next((m for m in mounts if m["fstype"] == "cgroup" and "cpu" in m["options"]), None)
    result = {"in_container": sysroot != "/", "levels": [], "slice_cgroup": slice_path}
    if cpu is None:
        if not any(m["fstype"] == "cgroup2" for m in mounts):
            raise RtError(["no cgroup v1 cpu controller and no cgroup v2 mount found in /proc/self/mountinfo"])
        if rt_group_sched:
            result.update(mode="v2-rt-group", ready=False, reason=(
                "cgroup v2 with RT group scheduling (CONFIG_RT_GROUP_SCHED): v2 has no RT budget file, every cgroup "
                "with the cpu controller has 0 RT time, so SCHED_FIFO in %s fails with EPERM while the slice has "
                "CPUQuota=/CPUWeight=. Use a kernel without CONFIG_RT_GROUP_SCHED (6.16+: boot with "
                "rt_group_sched=0), or leave the slice without cpu settings." % slice_name))
        elif rt_group_sched is None:
            result.update(mode="v2-unknown", ready=True, reason=(
                "cgroup v2; whether the kernel has RT group scheduling is unknown (no /proc/config.gz): "
                "SCHED_FIFO works in the slice only without CONFIG_RT_GROUP_SCHED"))
        else:
            result.update(mode="v2", ready=True, reason=(
                "cgroup v2 without RT group scheduling: SCHED_FIFO works in any cgroup, throttled by "
                "kernel.sched_rt_runtime_us"))
        return result
    if not os.path.isfile(os.path.join(cpu["point"], RUNTIME)):
        result.update(mode="no-rt-group", ready=True, reason=(
            "no RT group scheduling (no %s in the cpu controller): SCHED_FIFO works in any cgroup, throttled by "
            "kernel.sched_rt_runtime_us" % RUNTIME))
        return result
    result["mode"] = "v1-rt-group"
    try:
        levels, parent, fits, missing = plan_v1(cpu, sysroot, slice_path, runtime_us, assume_missing=check_mode)
    except OSError as exc:
        raise RtError(["reading the RT budgets failed: %s" % exc]) from None
    result.update(parent=parent)
    if missing and fits:
        # A real run starts the slice first, then sets the budget; check mode cannot start it.
        for level in levels:
            level.pop("period")
        result.update(ready=False, pending=True, levels=levels, reason=(
            "check mode: the slice's cpu cgroup %s does not exist yet; a real run starts the slice and then gives "
            "it %d us of RT time per period" % (missing[0], runtime_us)))
        return result
    if not fits:
        result.update(ready=False, reason=not_fitting_reason(parent, sysroot, runtime_us, result["in_container"]),
                      levels=[dict(lv, after=lv["before"]) for lv in levels])
        for level in result["levels"]:
            level.pop("period")
        return result
    if not check_mode:
        apply_levels(levels)
    for level in levels:
        level.pop("period")
    result.update(levels=levels, ready=runtime_us > 0, reason=(
        "cgroup v1 with RT group scheduling: %s gets %d us of RT time per period (parents first along %s)"
        % (slice_name, runtime_us, slice_path) if runtime_us > 0 else
        "the slice's RT budget is 0: SCHED_FIFO in it fails with EPERM"))
    return result


def state_document(slice_name, runtime_us):
    return json.dumps({"format": STATE_FORMAT, "generated_by": "edge_cgroup_rt", "slice": slice_name,
                       "runtime_us": runtime_us}, indent=2, sort_keys=True) + "\n"


def _read_text(path):
    try:
        with open(path, "r") as handle:
            return handle.read()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise RtError(["cannot read state file %s: %s" % (path, exc.strerror or exc)]) from None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            slice=dict(type="str", required=True),
            runtime_us=dict(type="int", required=True),
            rt_group_sched=dict(type="bool"),
            state_file=dict(type="path"),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = run(p["root"], p["slice"], p["runtime_us"], p["rt_group_sched"], module.check_mode)
        result["changed"] = bool(result.get("pending")) or any(lv["after"] != lv["before"] for lv in result["levels"])
        diff = [{"before_header": "RT budgets", "after_header": "RT budgets",
                 "before": "".join("%s/%s: %d\n" % (lv["path"], RUNTIME, lv["before"]) for lv in result["levels"]),
                 "after": "".join("%s/%s: %d\n" % (lv["path"], RUNTIME, lv["after"]) for lv in result["levels"])}]
        if p["state_file"] and result["mode"] == "v1-rt-group" and result["ready"]:
            before = _read_text(p["state_file"])
            after = state_document(p["slice"], p["runtime_us"])
            result["state_file_changed"] = before != after
            if before != after:
                result["changed"] = True
                diff.append({"before_header": p["state_file"], "after_header": p["state_file"],
                             "before": before or "", "after": after})
                if not module.check_mode:
                    try:
                        directory = os.path.dirname(p["state_file"])
                        if directory:
                            os.makedirs(directory, 0o755, exist_ok=True)
                        atomic_write(p["state_file"], after, backup=False, mode=0o644)
                    except OSError as exc:
                        raise RtError(["writing state file %s failed: %s" % (p["state_file"], exc.strerror or exc)],
                                      **result) from None
        if module._diff:
            result["diff"] = diff
    except RtError as exc:
        module.fail_json(msg=str(exc), errors=exc.errors, **exc.details)
    except Exception as exc:  # never a traceback: report what went wrong in one line
        module.fail_json(msg="edge_cgroup_rt: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


# --------------------------------------------------------------------------
# Boot-time re-apply (no Ansible)

def apply_state_file(path, root="/", out=sys.stdout, err=sys.stderr):
    """Re-apply a state file. Returns 0 when the slice is ready for SCHED_FIFO, else 1 (reason on err)."""
    try:
        text = _read_text(path)
        doc = json.loads(text) if text is not None else None
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT or not isinstance(doc.get("slice"), str) \
                or not isinstance(doc.get("runtime_us"), int) or isinstance(doc.get("runtime_us"), bool):
            raise RtError(["state file %s: missing or not an edge_cgroup_rt state file of format %d"
                           % (path, STATE_FORMAT)])
        result = run(root, doc["slice"], doc["runtime_us"], None, False)
    except (RtError, ValueError) as exc:
        for message in getattr(exc, "errors", [str(exc)]):
            err.write("edge_cgroup_rt: error: %s\n" % message)
        return 1
    except Exception as exc:  # never a traceback in the boot log
        err.write("edge_cgroup_rt: error: %s\n" % exc)
        return 1
    for level in result["levels"]:
        if level["after"] != level["before"]:
            out.write("edge_cgroup_rt: %s/%s: %d -> %d\n" % (level["path"], RUNTIME, level["before"], level["after"]))
    if not result["ready"]:
        err.write("edge_cgroup_rt: error: %s\n" % result["reason"])
        return 1
    return 0


def cli(argv):
    parser = argparse.ArgumentParser(
        prog="edge_cgroup_rt.py", description="Re-apply the slice RT budget saved by the edge_cgroup_rt module.")
    parser.add_argument("--apply-state", metavar="FILE", required=True,
                        help="state file written by the module's state_file option")
    parser.add_argument("--root", default="/", help="prefix for /proc and /sys paths (default /)")
    args = parser.parse_args(argv)
    return apply_state_file(args.apply_state, args.root)


if __name__ == "__main__":
    if "--apply-state" in sys.argv:
        raise SystemExit(cli(sys.argv[1:]))
    main()
