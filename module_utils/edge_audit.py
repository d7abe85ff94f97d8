"""Drift audit: compare the desired state with what the device persists and runs.

The desired state is rendered on the controller by the same role logic that
applies it; each role hands over a list of *checks*, and this file evaluates
them all on the device in one pass, writing nothing.  Python 3.8+, stdlib.

Check kinds:

``cmdline``  boot arguments: the boot file is planned with the same code the
             edge_kernel_cmdline module writes with (a planned edit means the
             persisted state drifted) and /proc/cmdline is the running state.
             Keys: bootloader, path, args, absent, state_file (arguments a
             previous run set and the intent dropped count as absent).
``value``    a runtime value such as a sysfs attribute: running only.  Keys:
             path, desired, compare (``text`` or ``cpulist``).
``file``     a persisted file (unit, config, state file): its sha1 against the
             sha1 of the content the role renders.  Keys: path, sha1.
``unsupported``  the role found the feature missing; Keys: reason.

States: ok, drifted, pending-reboot (persisted but not running: a boot-only
setting waiting for its reboot, not drift), unsupported, error.
"""
import hashlib
import json
import os

from ansible.module_utils.edge_bootfile import plan_files
from ansible.module_utils.edge_cmdline import pending_changes, split_cmdline, token_key
from ansible.module_utils.edge_cpulist import parse_cpulist

STATES = ("ok", "drifted", "pending-reboot", "unsupported", "error")


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _read(root, path):
    with open(_under(root, path)) as handle:
        return handle.read()


def dropped_args(root, state_file, args):
    """Keys a previous run set (recorded in its state file) that are no longer wanted."""
    if not state_file or not os.path.exists(_under(root, state_file)):
        return []
    try:
        before = json.loads(_read(root, state_file)).get("args", [])
    except ValueError:
        return []
    wanted = set(token_key(a) for a in args)
    return sorted(set(token_key(a) for a in before) - wanted)


def check_cmdline(check, root):
    args, absent = list(check.get("args") or []), list(check.get("absent") or [])
    absent += [key for key in dropped_args(root, check.get("state_file"), args) if key not in absent]
    path = _under(root, check["path"])
    plans = plan_files(check["bootloader"], path, args, absent)
    persisted = plan_files(check["bootloader"], path, [], [])[0].persisted  # the file as it is
    boot_file_ok = all(plan.after == plan.before for plan in plans)
    running = split_cmdline(_read(root, "/proc/cmdline"))
    pending = pending_changes(running, args, absent)
    if not boot_file_ok:
        missing = pending_changes(persisted, args, absent) or ["fallback entry or formatting"]
        return "drifted", "boot file %s lacks: %s" % (check["path"], " ".join(missing)), persisted, running
    if pending:
        return "pending-reboot", "in the boot file, not running yet: %s" % " ".join(pending), persisted, running
    return "ok", "", persisted, running


def check_value(check, root):
    try:
        running = _read(root, check["path"]).strip()
    except OSError as exc:
        return "drifted", "cannot read %s: %s" % (check["path"], exc.strerror), None, None
    desired = str(check["desired"])
    if check.get("compare") == "cpulist":
        same = parse_cpulist(running) == parse_cpulist(desired)
    else:
        same = running == desired
    detail = "" if same else "%s is %r, desired %r" % (check["path"], running, desired)
    return ("ok" if same else "drifted"), detail, None, running


def check_file(check, root):
    path = _under(root, check["path"])
    if not os.path.exists(path):
        return "drifted", "%s is missing" % check["path"], None, None
    with open(path, "rb") as handle:
        digest = hashlib.sha1(handle.read()).hexdigest()
    same = digest == check["sha1"]
    return ("ok" if same else "drifted"), ("" if same else "%s was changed" % check["path"]), digest, None


CHECKERS = {"cmdline": check_cmdline, "value": check_value, "file": check_file}


def evaluate(check, root="/"):
    """One check -> a result dict (setting, role, state, detail, desired, persisted, running)."""
    result = {"setting": check["setting"], "role": check.get("role", ""),
              "desired": check.get("desired", check.get("args", check.get("sha1")))}
    if check["kind"] == "unsupported":
        result.update(state="unsupported", detail=check.get("reason", ""), persisted=None, running=None)
        return result
    checker = CHECKERS.get(check["kind"])
    if checker is None:
        result.update(state="error", detail="unknown check kind %r" % check["kind"], persisted=None, running=None)
        return result
    try:
        state, detail, persisted, running = checker(check, root)
    except (OSError, ValueError, KeyError) as exc:
        state, detail, persisted, running = "error", "%s: %s" % (type(exc).__name__, exc), None, None
    result.update(state=state, detail=detail, persisted=persisted, running=running)
    return result


def audit(checks, root="/"):
    results = [evaluate(check, root) for check in checks]
    summary = dict((state, sum(1 for r in results if r["state"] == state)) for state in STATES)
    return results, summary


def prometheus_text(host, results):
    """node_exporter textfile lines: edgetune_drift{host,setting,state} 1."""
    def label(value):
        return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    lines = ["# HELP edgetune_drift 1 for the state each managed setting is in.",
             "# TYPE edgetune_drift gauge"]
    for result in results:
        lines.append('edgetune_drift{host="%s",setting="%s",role="%s",state="%s"} 1' % (
            label(host), label(result["setting"]), label(result["role"]), result["state"]))
    return "\n".join(lines) + "\n"
