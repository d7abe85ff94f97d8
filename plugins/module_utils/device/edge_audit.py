# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drift audit: compare the desired state with what the device persists and runs.

The desired state is rendered on the controller by the same role logic that
applies it; each role hands over a list of *checks*, and this file evaluates
them all on the device in one pass, writing nothing.  Python 3.8+, stdlib.

Check kinds:

``cmdline``  boot arguments: the boot file is planned with the same code the
             edge_kernel_cmdline module writes with (a planned edit means the
             persisted state drifted) and /proc/cmdline is the running state.
             Keys: bootloader, path, args, absent, record and keep (the
             record of managed arguments, read as edge_kernel_cmdline reads
             it: a key the intent dropped must have its old tokens back, or be
             gone; an out-of-date record is drift too).
``value``    a runtime value such as a sysfs attribute: running only.  Keys:
             path, desired, compare (``text``, ``cpulist``, ``bytes``: a
             memory limit the kernel rounded down to whole pages, or
             ``ram-share``: a limit given as NN% of the RAM, which systemd
             resolves against MemTotal when it loads the unit; MemTotal moves
             by some KiB from boot to boot and on VMs within a boot, so the
             check takes today's MemTotal and allows 0.1% of it).
``file``     a persisted file (unit, config, state file): its sha1 against the
             sha1 of the content the role renders.  Keys: path, sha1.
``irq_affinity``  interrupt steering (role edge_cpu), running only, classified by
             the same code the edge_irq_affinity module moves interrupts with
             (plugins/module_utils/device/edge_irq.py).  Keys: cpus (the housekeeping CPUs),
             target (``irqs``, ``default_affinity`` or ``workqueue``), and for
             irqs keep_subsets, unmovable_names, state_file (the module's record
             of the interrupts the kernel refused to move), inference (CPU list,
             named in the detail).  A movable interrupt that reaches CPUs outside
             the housekeeping set is drift; a per-CPU or managed one the kernel
             places itself (hinted by /proc/interrupts, or refused earlier) is not.
``nvpmodel`` the Jetson power mode (role edge_power), by name: the id the name
             has in the device's /etc/nvpmodel.conf (parsed by the code the
             edge_nvpmodel module switches modes with), the running mode from
             ``nvpmodel -q --verbose`` and the persisted one from nvpmodel's
             status file (what ``nvpmodel -f`` applies at boot).  Keys: mode,
             conf, status_file.  The desired mode recorded but not running, or
             running with boot-only settings (CPU_ONLINE, power gating) still
             waiting, is pending-reboot.
``pcie_vc``  a PCIe Traffic Class to Virtual Channel mapping (role
             edge_pcie_qos), running: both ends of the link (the device and
             its upstream port) read from config space and planned by the
             code the edge_pcie_vc module maps with
             (plugins/module_utils/device/edge_pcie.py); a register that would be
             rewritten is drift.  A link without an extended VC is
             unsupported, with the reason.  Keys: device or device_class,
             tcs, vc_id.
``jetson_clocks`` whether the Jetson's clocks are pinned (role edge_power),
             running: ``jetson_clocks --show`` parsed by the code the
             edge_jetson_clocks module pins with
             (plugins/module_utils/device/edge_clocks.py).  Keys: desired
             (``pinned`` or ``restored``), program (default: found on PATH).
``netqos``   the inference traffic priority (role edge_netqos), running: the
             role's loader (``edgetune-netqos check``, the code that
             attaches it) compares each interface's qdiscs, HTB classes and
             eBPF classifier with the desired settings the check carries (not
             the device's config file, which a ``file`` check covers).  Keys:
             config (the settings, as the edge_netqos module built them),
             interfaces, loader, python, source (the classifier's C file).
``runtime``  the serving release (role edge_runtime), persisted and running:
             ROOT/current points to the release the deploy installed, whose
             release.json names the same artifacts (sha256) and whose files
             are all there (those up to 64 MiB by their sha256: the programs;
             a model by its presence: plugins/module_utils/device/edge_serving.py,
             which edge_release repairs a release with); the unit is enabled and active, its main
             process runs that release's program, and every thread has the
             policy, priority and CPUs the deploy's gates accepted.  Keys:
             root, release, artifacts ({kind: sha256}), service, expect
             (policy, priority, cpus).
``unsupported``  the role found the feature missing; Keys: reason.

The keys of each kind, with their types, are declared once in CHECK_SCHEMA (below): edge_record
refuses to write a check outside it, and evaluate() reports a check that lacks a key or has one
of the wrong type as an error.

The checks come from the records the last apply left on the device (one
JSON file per role in the record directory, written by the playbooks: the
role's checks, rendered by the role as it applied them, and its ``inputs``,
what that desired state was made of; see plugins/module_utils/plan/edge_plan.py's
``audit_part``).  ``audit_records`` evaluates them all; given the inputs the
controller planned today, a role whose recorded inputs differ (the inventory
or the board changed since the last apply) or that left no record is drift,
named, besides its checks.

States: ok, drifted, pending-reboot (persisted but not running: a boot-only
setting waiting for its reboot, not drift), unsupported, error.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import time

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_bootfile import (
    BOOT_ID, plan_files, plan_managed, read_boot_id)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_clocks import (
    find_program, not_pinned, parse_show)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import (
    describe_changes, pending_changes, split_cmdline, token_key)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import (
    format_cpulist, parse_cpulist, parse_cpumask)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import read_json
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_metrics import device_textfile
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_sched import fmt, thread_mismatches, threads_of
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_serving import (
    installed_problems, program_of, runs_release, unit_state)

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_pcie import prepare as pcie_prepare
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_nvpmodel import (
    DEFAULT_CONF, DEFAULT_STATUS_FILE, parse_conf, parse_query_output, parse_status, pending_settings)

try:
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_irq import (
        DEFAULT_AFFINITY, WORKQUEUE_MASK, classify, compile_patterns, known_refusals, mask_target,
        read_interrupts, read_irqs, read_state, validate_cpus)
except ImportError:  # an on-device install without edge_irq.py: only the irq_affinity checks fail
    classify = None

# The largest page size a memory limit is rounded down to (arm64 64 KiB pages).
PAGE_ROUNDING = 65536
# How far MemTotal may have moved since systemd resolved a NN% memory limit.
RAM_SHARE_SLACK = 0.001
STATES = ("ok", "drifted", "pending-reboot", "unsupported", "error")


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _read(root, path):
    with open(_under(root, path)) as handle:
        return handle.read()


def check_cmdline(check, root):
    args, absent = list(check.get("args") or []), list(check.get("absent") or [])
    path = _under(root, check["path"])
    record = _under(root, check["record"]) if check.get("record") else None
    managed = plan_managed(check["bootloader"], path, args, absent, record, check.get("keep") or (),
                           boot_id=read_boot_id(_under(root, BOOT_ID)))
    args, absent, plans = managed.args, managed.absent, managed.plans
    persisted = plan_files(check["bootloader"], path, [], [])[0].persisted  # the file as it is
    boot_file_ok = all(plan.after == plan.before for plan in plans)
    running = split_cmdline(_read(root, "/proc/cmdline"))
    if not boot_file_ok:
        edits = (describe_changes(persisted, args, absent) or _reordered(persisted, plans[0].persisted)
                 or "to restore: the fallback entry or formatting")
        return "drifted", "boot file %s, %s" % (check["path"], edits), persisted, running
    if managed.record is not None and managed.record.after != managed.record.before:
        return "drifted", "record %s does not list the managed arguments" % check["record"], persisted, running
    if pending_changes(running, args, absent):
        waiting = describe_changes(running, args, absent)
        return "pending-reboot", "in the boot file, waiting for a reboot: %s" % waiting, persisted, running
    return "ok", "", persisted, running


def _reordered(persisted, planned):
    """'to set: key= as ...' for the keys whose tokens are right but in another order or number."""
    def of(tokens, key):
        return [t for t in tokens if token_key(t) == key]
    keys = [key for key in sorted(set(map(token_key, persisted + planned))) if of(persisted, key) != of(planned, key)]
    return ("to set: " + " ".join("%s= as %s" % (key, " ".join(of(planned, key))) for key in keys)) if keys else ""


def check_value(check, root):
    try:
        running = _read(root, check["path"]).strip()
    except OSError as exc:
        return "drifted", "cannot read %s: %s" % (check["path"], exc.strerror), None, None
    desired = str(check["desired"])
    if check.get("compare") == "cpulist":
        same = parse_cpulist(running) == parse_cpulist(desired)
    elif check.get("compare") == "bytes" and running.isdigit() and desired.isdigit():
        # The kernel rounds a memory limit down to whole pages (4-64 KiB).
        same = 0 <= int(desired) - int(running) < PAGE_ROUNDING
    elif check.get("compare") == "ram-share" and running.isdigit():
        ram = mem_total_bytes(root)
        share = ram_share(desired)
        if ram is None or share is None:
            return "error", "cannot resolve %r against MemTotal in /proc/meminfo" % desired, None, running
        wanted = int(ram * share)
        same = -ram * RAM_SHARE_SLACK < wanted - int(running) < PAGE_ROUNDING + ram * RAM_SHARE_SLACK
        desired = "%s (%d bytes of MemTotal %d)" % (desired, wanted, ram)
    else:
        same = running == desired
    detail = "" if same else "%s is %r, desired %r" % (check["path"], running, desired)
    return ("ok" if same else "drifted"), detail, None, running


def ram_share(text):
    """'75%' or '12.5%' -> 0.75 or 0.125; None when not a percentage."""
    match = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)%\s*$", str(text))
    return float(match.group(1)) / 100 if match else None


def mem_total_bytes(root):
    """MemTotal of /proc/meminfo in bytes, None when unreadable."""
    try:
        match = re.search(r"^MemTotal:\s+([0-9]+) kB", _read(root, "/proc/meminfo"), re.M)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def check_file(check, root):
    path = _under(root, check["path"])
    if not os.path.exists(path):
        return "drifted", "%s is missing" % check["path"], None, None
    with open(path, "rb") as handle:
        digest = hashlib.sha1(handle.read()).hexdigest()
    same = digest == check["sha1"]
    return ("ok" if same else "drifted"), ("" if same else "%s was changed" % check["path"]), digest, None


def _irqs_state(check, root, wanted):
    state_file = check.get("state_file")
    doc = read_state(_under(root, state_file))[1] if state_file else None
    classified = classify(read_irqs(root), read_interrupts(root), wanted, check.get("keep_subsets", True),
                          compile_patterns(check.get("unmovable_names")), known_refusals(doc))
    movable = [c for c in classified if not (c["status"] == "move" and (c["hint"] or c["known_refused"]))]
    stray = [c for c in movable if c["status"] == "move"]
    running = ["%d %s: %s" % (c["irq"], c["name"] or "?", format_cpulist(c["affinity"])) for c in movable]
    if not stray:
        return "ok", "", None, running
    inference = set(parse_cpulist(str(check.get("inference") or "")))
    parts = []
    for c in stray:
        outside = sorted(set(c["affinity"]) - set(wanted))
        reached = sorted(set(outside) & inference)
        parts.append("IRQ %d (%s) on %s, reaches %s CPUs %s" % (
            c["irq"], c["name"] or "?", format_cpulist(c["affinity"]), "inference" if reached else "non-housekeeping",
            format_cpulist(reached or outside)))
    return "drifted", "%s; desired %s" % ("; ".join(parts), format_cpulist(wanted)), None, running


def check_irq_affinity(check, root):
    if classify is None:
        return "error", "module_utils/device/edge_irq.py is not installed beside the audit", None, None
    target = check.get("target", "irqs")
    try:
        wanted = validate_cpus(root, str(check["cpus"]))
        if target == "irqs":
            return _irqs_state(check, root, wanted)
        relpath = {"default_affinity": DEFAULT_AFFINITY, "workqueue": WORKQUEUE_MASK}[target]
        path = _under(root, relpath)
        if not os.path.exists(path):
            if target == "workqueue":
                return "unsupported", "this kernel has no unbound workqueue cpumask (/%s)" % relpath, None, None
            return "drifted", "/%s is missing" % relpath, None, None
        before = parse_cpumask(_read(root, relpath).strip())
    except EdgeError as exc:
        return "error", str(exc), None, None
    running = format_cpulist(before)
    if mask_target(before, wanted, check.get("keep_subsets", True)) == before:
        return "ok", "", None, running
    return "drifted", "/%s is %s, desired %s" % (relpath, running, format_cpulist(wanted)), None, running


def nvpmodel_query(root, conf, status_file):
    """``nvpmodel -q --verbose`` parsed (parse_query_output), on the device itself only."""
    if os.path.abspath(root) != "/":
        raise BadInput("the running power mode is read with nvpmodel, which runs on the device root only")
    program = shutil.which("nvpmodel") or next((p for p in ("/usr/sbin/nvpmodel", "/usr/bin/nvpmodel")
                                                if os.path.exists(p)), None)
    if program is None:
        raise BadInput("nvpmodel is not installed (no nvpmodel on PATH, /usr/sbin or /usr/bin)")
    argv = [program, "-q", "--verbose"]
    if conf != DEFAULT_CONF:
        argv += ["-f", conf]
    if status_file != DEFAULT_STATUS_FILE:
        argv += ["-u", status_file]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          check=False)
    if done.returncode != 0:
        raise BadInput("%s failed (rc %d): %s" % (" ".join(argv), done.returncode,
                                                  (done.stderr or done.stdout).strip()[-200:]))
    return parse_query_output(done.stdout + "\n" + done.stderr)


def check_nvpmodel(check, root):
    conf_path = check.get("conf") or DEFAULT_CONF
    status_path = check.get("status_file") or DEFAULT_STATUS_FILE
    try:
        conf = parse_conf(_read(root, conf_path))
    except OSError as exc:
        return "error", "cannot read %s: %s" % (conf_path, exc.strerror), None, None
    except ValueError as exc:
        return "error", "%s: %s" % (conf_path, exc), None, None
    target = conf.by_name(check["mode"])
    if target is None:
        return "drifted", "%s has no power mode %r (modes: %s)" % (
            conf_path, check["mode"], ", ".join(conf.names())), None, None
    try:
        persisted_id = parse_status(_read(root, status_path))["pmode"]
    except OSError:
        persisted_id = None
    persisted = None
    if persisted_id is not None:
        mode = conf.by_id(persisted_id)
        persisted = "%s (id %d)" % (mode.name if mode else "?", persisted_id)
    query = nvpmodel_query(root, conf_path, status_path)
    running = "%s (id %d)" % (query["name"], query["id"])
    if query["id"] == target.id:
        waiting = pending_settings(query)
        if waiting:
            return "pending-reboot", "mode %s is set; its %s start at the next boot" % (
                target.name, ", ".join(sorted(set(p["param"] for p in waiting)))), persisted, running
        return "ok", "", persisted, running
    if persisted_id == target.id:
        return "pending-reboot", "mode %s (id %d) is recorded in %s and starts at the next boot (running %s)" % (
            target.name, target.id, status_path, running), persisted, running
    return "drifted", "nvpmodel mode is %s, desired %s (id %d)" % (running, target.name, target.id), persisted, running


def check_pcie_vc(check, root):
    vc_id = check.get("vc_id", 1)
    try:
        ends, tcs, reasons, _result = pcie_prepare(
            root, check.get("device"), check.get("device_class"), check.get("tcs") or [], vc_id)
    except EdgeError as exc:
        return "error", str(exc), None, None
    if reasons:
        return "unsupported", "; ".join(reasons), None, None
    running = dict((end.label(), end.before) for end in ends)
    stale = [end for end in ends if end.writes]
    if not stale:
        return "ok", "", None, running
    return "drifted", "TC %s not on VC ID %d: %s" % (",".join(map(str, tcs)), vc_id, "; ".join(
        "%s %s to rewrite" % (end.label(), ", ".join(w["register"] for w in end.writes)) for end in stale)), \
        None, running


def check_jetson_clocks(check, root):
    if os.path.abspath(root) != "/":
        raise BadInput("the clocks are read with jetson_clocks, which runs on the device root only")
    program = check.get("program") or find_program()
    if program is None:
        raise BadInput("jetson_clocks is not installed (no jetson_clocks on PATH, /usr/bin or /usr/sbin)")
    done = subprocess.run([program, "--show"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()[-200:]
        raise BadInput("%s --show failed (rc %d): %s" % (program, done.returncode, output))
    unpinned = not_pinned(parse_show(done.stdout))
    running = "restored" if unpinned else "pinned"
    if running == check["desired"]:
        return "ok", "", None, running
    if unpinned:
        return "drifted", "clocks not pinned: %s" % "; ".join(unpinned), None, running
    return "drifted", "clocks pinned by jetson_clocks, desired as the power mode sets them", None, running


def check_netqos(check, root):
    if os.path.abspath(root) != "/":
        raise BadInput("the qdiscs and the classifier are read with the loader, on the device root only")
    argv = [check["python"], check["loader"], "check", "--config", "-", "--source", check["source"], "--json"]
    for name in check["interfaces"]:
        argv += ["--interface", name]
    try:
        done = subprocess.run(argv, input=json.dumps(check["config"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, check=False)
    except OSError as exc:
        raise BadInput("cannot run the loader %s with %s: %s" % (check["loader"], check["python"],
                                                                 exc.strerror or exc)) from None
    try:
        report = json.loads(done.stdout) if done.returncode in (0, 1) else None
    except ValueError:
        report = None
    if not isinstance(report, dict) or not isinstance(report.get("interfaces"), dict):
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise BadInput("%s check failed (rc %d): %s" % (check["loader"], done.returncode, lines[-1][-300:]))
    differs = dict((name, (report["interfaces"].get(name) or {"differences": ["not checked"]})["differences"])
                   for name in check["interfaces"])
    running = "; ".join("%s %s" % (name, "differs" if found else "in sync") for name, found in differs.items())
    stale = ["%s: %s" % (name, ", ".join(found)) for name, found in differs.items() if found]
    if stale:
        return "drifted", "; ".join(stale), None, running
    return "ok", "", None, running


def runtime_release_check(root, release, artifacts, service, expect):
    """Role edge_runtime's release check for the drift audit: the release ``release`` serves from
    ``root`` (its ``current`` link), its files match ``artifacts`` (a list of {kind, sha256}, as the
    deploy resolved them), ``service`` is enabled and active, and its threads run as ``expect``
    (what the gates accepted: policy, priority, CPUs). Checked against CHECK_SCHEMA."""
    check = {"setting": "runtime release", "role": "edge_runtime", "kind": "runtime", "root": root,
             "release": release or "", "service": service,
             "artifacts": {item["kind"]: item["sha256"] for item in artifacts or []}, "expect": dict(expect or {})}
    return validate_checks([check], "edge_runtime")[0]


def check_runtime(check, root):
    release_dir = os.path.join(check["root"], "releases", check["release"])
    try:
        target = os.readlink(_under(root, os.path.join(check["root"], "current")))
    except OSError:
        target = None
    current = target.rstrip("/").split("/")[-1] if target else None
    problems = []
    if current != check["release"]:
        problems.append("%s/current is %s, not release %s" % (check["root"], current or "missing", check["release"]))
    else:
        problems += installed_problems(_under(root, release_dir), check.get("artifacts") or {}, shown=release_dir)
    state = unit_state(check["service"])
    active, enabled, pid = state.get("ActiveState"), state.get("UnitFileState"), state["MainPID"]
    if enabled != "enabled":
        problems.append("%s is %s at boot, not enabled" % (check["service"], enabled or "unknown"))
    running = "%s %s" % (check["service"], active)
    if active != "active" or not pid:
        problems.append("%s is %s, not active" % (check["service"], active or "unknown"))
    else:
        proc = _under(root, "/proc")
        program = program_of(pid, proc)
        if not runs_release(program, _under(root, release_dir)):
            problems.append("%s runs %s, not release %s (a restart switches it)"
                            % (check["service"], program or "an unknown program", check["release"]))
        expect = check.get("expect") or {}
        threads = threads_of(pid, proc)
        cpus = parse_cpulist(expect["cpus"]) if expect.get("cpus") else None
        wrong = thread_mismatches(threads, expect.get("policy") or None, expect.get("priority"), cpus)
        if wrong:
            problems.append("%d of %d threads do not run as deployed: %s"
                            % (len(wrong), len(threads), "; ".join(wrong[:3])))
        if threads:
            first = threads[0]
            running = "%s active, %d threads %s on CPUs %s" % (
                check["service"], len(threads), first["policy"], fmt(first["cpus"]))
    if problems:
        return "drifted", "; ".join(problems), current, running
    return "ok", "", current, running


# The declared schema of a check, read by ``check_problems``: the keys every check has, and per kind
# ({kind: (required, optional)}) the keys it must and may have, each with what its value may be (a
# tuple of types, or a tuple of the allowed strings). What the roles record is checked against it
# before it is written (edge_record), and ``evaluate`` reports a check it refuses as an error.
TEXT = (str,)
OPTIONAL_TEXT = (str, type(None))
NUMBER = (int, float)
COMMON_KEYS = ({"setting": TEXT, "kind": TEXT}, {"role": TEXT})
CHECK_SCHEMA = {
    "cmdline": ({"bootloader": TEXT, "path": TEXT},
                {"args": (list,), "absent": (list,), "record": OPTIONAL_TEXT, "keep": (list,)}),
    "value": ({"path": TEXT, "desired": TEXT + NUMBER},
              {"compare": ("text", "cpulist", "bytes", "ram-share")}),
    "file": ({"path": TEXT, "sha1": TEXT}, {}),
    "irq_affinity": ({"cpus": TEXT},
                     {"target": ("irqs", "default_affinity", "workqueue"), "inference": TEXT, "keep_subsets": (bool,),
                      "unmovable_names": (list,), "state_file": OPTIONAL_TEXT}),
    "nvpmodel": ({"mode": TEXT + (int,)}, {"conf": TEXT, "status_file": TEXT}),
    "pcie_vc": ({"tcs": (list,)}, {"device": OPTIONAL_TEXT, "device_class": OPTIONAL_TEXT, "vc_id": (int,)}),
    "jetson_clocks": ({"desired": ("pinned", "restored")}, {"program": OPTIONAL_TEXT}),
    "netqos": ({"config": (dict,), "interfaces": (list,), "loader": TEXT, "python": TEXT, "source": TEXT}, {}),
    "runtime": ({"root": TEXT, "release": TEXT, "service": TEXT}, {"artifacts": (dict,), "expect": (dict,)}),
    "unsupported": ({"reason": OPTIONAL_TEXT}, {}),
}


def _allowed(value, allowed):
    if all(isinstance(a, str) for a in allowed):  # a choice of strings
        return isinstance(value, str) and value in allowed
    return isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)


def _shown_allowed(allowed):
    if all(isinstance(a, str) for a in allowed):
        return "one of " + ", ".join(allowed)
    return " or ".join("null" if a is type(None) else a.__name__ for a in allowed)


def check_problems(check, strict=True):
    """What is wrong with one check against CHECK_SCHEMA, in words; [] for a well-formed check.
    ``strict`` False (reading a record an older edgetune may have written): keys the schema does
    not know are left alone."""
    if not isinstance(check, dict):
        return ["a check is a mapping, not %s" % type(check).__name__]
    kind = check.get("kind")
    if kind not in CHECK_SCHEMA:
        return ["unknown check kind %r (kinds: %s)" % (kind, ", ".join(sorted(CHECK_SCHEMA)))]
    required, optional = CHECK_SCHEMA[kind]
    required, optional = dict(COMMON_KEYS[0], **required), dict(COMMON_KEYS[1], **optional)
    problems = ["no %s" % key for key in required if key not in check]
    for key, value in sorted(check.items()):
        allowed = required.get(key, optional.get(key))
        if allowed is None:
            if strict:
                problems.append("unknown key %s for kind %s" % (key, kind))
        elif not _allowed(value, allowed):
            problems.append("%s is %r, not %s" % (key, value, _shown_allowed(allowed)))
    return problems


def validate_checks(checks, origin):
    """Raise EdgeError naming ``origin`` and the first malformed check; the checks otherwise."""
    if not isinstance(checks, list):
        raise EdgeError("%s: the checks are %s, not a list" % (origin, type(checks).__name__))
    for check in checks:
        problems = check_problems(check)
        if problems:
            name = check.get("setting") if isinstance(check, dict) else None
            raise EdgeError("%s: check %s: %s" % (origin, repr(name) if name else "#%d" % checks.index(check),
                                                  "; ".join(problems)))
    return checks


def file_checks(role, files):
    """``kind: file`` checks of the files a role writes: ``files`` is a list of {setting, path, content}
    (the text the role renders; None where the role does not write that file in this configuration)."""
    return [{"setting": item["setting"], "role": role, "kind": "file", "path": item["path"],
             "sha1": hashlib.sha1(item["content"].encode("utf-8") if isinstance(item["content"], str)
                                  else item["content"]).hexdigest()}
            for item in files if item.get("content") is not None]


CHECKERS = {"cmdline": check_cmdline, "value": check_value, "file": check_file, "irq_affinity": check_irq_affinity,
            "nvpmodel": check_nvpmodel, "pcie_vc": check_pcie_vc, "jetson_clocks": check_jetson_clocks,
            "netqos": check_netqos, "runtime": check_runtime}


def evaluate(check, root="/"):
    """One check -> a result dict (setting, role, state, detail, desired, persisted, running)."""
    problems = check_problems(check, strict=False)
    if problems:
        known = check if isinstance(check, dict) else {}
        return {"setting": str(known.get("setting") or "malformed check"), "role": str(known.get("role") or ""),
                "desired": None, "state": "error", "detail": "malformed check: " + "; ".join(problems),
                "persisted": None, "running": None}
    desired = next((check[key] for key in ("desired", "args", "sha1", "cpus", "mode", "tcs", "release")
                    if key in check), None)
    if check["kind"] == "netqos":
        desired = "classifier and HTB classes on %s" % ", ".join(check["interfaces"])
    result = {"setting": check["setting"], "role": check.get("role", ""), "desired": desired}
    if check["kind"] == "unsupported":
        result.update(state="unsupported", detail=check.get("reason") or "", persisted=None, running=None)
        return result
    checker = CHECKERS[check["kind"]]
    try:
        state, detail, persisted, running = checker(check, root)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        state, detail, persisted, running = "error", "%s: %s" % (type(exc).__name__, exc), None, None
    result.update(state=state, detail=detail, persisted=persisted, running=running)
    return result


def audit(checks, root="/"):
    results = [evaluate(check, root) for check in checks]
    summary = dict((state, sum(1 for r in results if r["state"] == state)) for state in STATES)
    return results, summary


RECORD_VERSION = 1
# Where role edge_record keeps the apply records (the plan's audit.record_dir).
RECORD_DIR = "/etc/edgetune/applied"


def record_path(record_dir, role):
    return os.path.join(record_dir, role + ".json")


def read_record(root, record_dir, role):
    """The role's record, None when there is none; ValueError when it cannot be read."""
    doc = read_json(_under(root, record_path(record_dir, role)), record_path(record_dir, role))
    if doc is None:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        raise BadInput("%s is not an edgetune apply record (no list of checks)" % record_path(record_dir, role))
    return doc


def _shown(value):
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _identity_shown(identity):
    """A shipped file's identity in words: name, version and the sha256's first 12 digits."""
    if "unresolved" in identity:
        return "unreadable (%s)" % identity["unresolved"]
    words = [str(identity[key]) for key in ("name", "version") if identity.get(key)]
    return " ".join(words + ["sha256 %s" % str(identity.get("sha256"))[:12]])


def _file_changes(what, old, new):
    """How one file the controller ships (the plan's inputs ``files``: {name, version, sha256}, or
    {"unresolved": why} where the controller could not read it) differs from the recorded one."""
    if old == new:
        return []
    if new is None:
        return ["%s no longer shipped" % what]
    if old is None:
        return ["%s %s (new)" % (what, _identity_shown(new))]
    if "unresolved" in old or "unresolved" in new:
        return ["%s %s -> %s" % (what, _identity_shown(old), _identity_shown(new))]
    return ["%s %s %s -> %s" % (what, key, str(old.get(key))[:12] if key == "sha256" else old.get(key),
                                str(new.get(key))[:12] if key == "sha256" else new.get(key))
            for key in sorted(set(old) | set(new), key=lambda k: (_IDENTITY_ORDER.get(k, 3), k))
            if old.get(key) != new.get(key)]


_IDENTITY_ORDER = {"name": 0, "version": 1, "sha256": 2}


def inputs_changes(recorded, planned):
    """What differs between the inputs of the last apply and today's plan, in words."""
    recorded, planned = recorded or {}, planned or {}
    changes = []
    old_vars, new_vars = recorded.get("variables") or {}, planned.get("variables") or {}
    for name in sorted(set(old_vars) | set(new_vars)):
        if name not in new_vars:
            changes.append("%s no longer planned" % name)
        elif name not in old_vars:
            changes.append("%s %s (new)" % (name, _shown(new_vars[name])))
        elif old_vars[name] != new_vars[name]:
            changes.append("%s %s -> %s" % (name, _shown(old_vars[name]), _shown(new_vars[name])))
    old_parts, new_parts = recorded.get("plan") or {}, planned.get("plan") or {}
    changes += ["plan part %s" % part for part in sorted(set(old_parts) | set(new_parts))
                if old_parts.get(part) != new_parts.get(part)]
    old_files, new_files = recorded.get("files") or {}, planned.get("files") or {}
    for what in sorted(set(old_files) | set(new_files)):
        changes += _file_changes(what, old_files.get(what), new_files.get(what))
    if recorded.get("code") != planned.get("code"):
        changes.append("edgetune's code for this role (its role files or the modules)")
    return changes


def _inputs_result(role, recorded, planned):
    """The role's applied state from its recorded and planned inputs. A file the controller ships but
    cannot read here (an audit from a controller without the runtime's artifacts) leaves the role
    unjudged, an error naming the file, unless something else already shows it drifted."""
    files = planned.get("files") or {}
    unjudged = sorted(what for what, identity in files.items()
                      if isinstance(identity, dict) and "unresolved" in identity)
    if unjudged:
        recorded = dict(recorded or {}, files=dict((what, identity) for what, identity in
                                                   ((recorded or {}).get("files") or {}).items()
                                                   if what not in unjudged))
        planned = dict(planned, files=dict((what, identity) for what, identity in files.items()
                                           if what not in unjudged))
    changes = inputs_changes(recorded, planned)
    if changes:
        return _applied_result(role, "drifted", "the desired state changed since the last apply (run site.yml): "
                               + "; ".join(changes))
    if unjudged:
        return _applied_result(role, "error", "cannot judge it from this controller: %s (audit from a controller "
                               "that has the files the apply shipped)" % "; ".join(
                                   "%s %s" % (what, _identity_shown(files[what])) for what in unjudged))
    return _applied_result(role, "ok", "")


def _applied_result(role, state, detail):
    return {"setting": "%s applied state" % role, "role": role, "state": state, "detail": detail,
            "desired": None, "persisted": None, "running": None}


def evaluate_records(root="/", record_dir=RECORD_DIR, roles=None):
    """The device's half of the audit: every record of ``roles`` (None: every record found) read and its
    checks evaluated, {role: {"inputs": the recorded inputs, "results": one per check, and for the runtime
    "artifacts": {kind: sha256} of the release it serves}, or {"error": why it cannot be read}}; a role
    without a record is left out. None when the record directory cannot be listed (``roles`` None)."""
    if roles is None:
        try:
            roles = sorted(n[:-5] for n in os.listdir(_under(root, record_dir)) if n.endswith(".json"))
        except OSError:
            return None
    evaluated = {}
    for role in sorted(roles):
        try:
            record = read_record(root, record_dir, role)
        except ValueError as exc:
            evaluated[role] = {"error": str(exc)}
            continue
        if record is None:
            continue
        evaluated[role] = {"inputs": record.get("inputs"), "results": audit(record["checks"], root)[0]}
        served = [check.get("artifacts") for check in record["checks"] if check.get("kind") == "runtime"]
        if served:
            evaluated[role]["artifacts"] = served[0]
    return evaluated


def judge_records(evaluated, record_dir=RECORD_DIR, expected=None):
    """The audit's results and summary from ``evaluated`` (evaluate_records: on the device, in the same
    execution as the facts, or just before): ``expected`` {role: {"enabled", "inputs"}} from today's plan
    (the controller's audit), or None (the on-device timer: every record found, judged as recorded). A
    role without a record, or whose recorded inputs differ from today's, is reported drifted, naming what
    changed."""
    results, checked = [], []
    if expected is None:
        if evaluated is None:
            results.append(_applied_result("edgetune", "drifted", "no apply records in %s: run site.yml"
                                           % record_dir))
        expected = dict((name, {"enabled": True}) for name in sorted(evaluated or {}))
    for role, want in sorted(expected.items()):
        if not want.get("enabled", True):
            continue
        found = (evaluated or {}).get(role)
        if found is None:
            results.append(_applied_result(role, "drifted", "never applied here: no %s (run site.yml)"
                                           % record_path(record_dir, role)))
            continue
        if "error" in found:
            results.append(_applied_result(role, "error", found["error"]))
            continue
        if "inputs" in want:
            results.append(_inputs_result(role, found.get("inputs"), want["inputs"]))
        checked += found["results"]
    results += checked
    summary = dict((state, sum(1 for r in results if r["state"] == state)) for state in STATES)
    return results, summary


def audit_records(root="/", record_dir=RECORD_DIR, expected=None):
    """Evaluate the checks of every role's record and judge them (evaluate_records, then judge_records)."""
    roles = None if expected is None else [role for role, want in expected.items() if want.get("enabled", True)]
    return judge_records(evaluate_records(root, record_dir, roles), record_dir, expected)


HOLDING = ("ok", "unsupported")


def task_results(params):
    """The results and summary of the edge_audit task: its ``records`` (the plan's audit part), judged from
    ``evaluated`` where the run's first device execution evaluated them (the controller, no device read) or
    read and evaluated now, then its explicit ``checks``."""
    results = []
    records = params.get("records")
    if records is not None:
        record_dir = records.get("record_dir") or RECORD_DIR
        expected = records.get("roles") or {}
        if params.get("evaluated") is not None:
            results += judge_records(params["evaluated"], record_dir, expected)[0]
        else:
            results += audit_records(params.get("root") or "/", record_dir, expected)[0]
    if params.get("checks"):
        results += audit(params["checks"], params.get("root") or "/")[0]
    summary = dict((state, sum(1 for r in results if r["state"] == state)) for state in STATES)
    return results, summary


def findings_line(results):
    """What the audit found, on one line: the settings by state (ok and unsupported counted)."""
    found = ["%s: %s" % (state, ", ".join(r["setting"] for r in results if r["state"] == state))
             for state in STATES if state not in ("ok", "unsupported") and any(r["state"] == state for r in results)]
    counted = "%d ok, %d unsupported" % (sum(1 for r in results if r["state"] == "ok"),
                                         sum(1 for r in results if r["state"] == "unsupported"))
    return "; ".join(found + [counted])


def applied_state(root="/", record_dir=RECORD_DIR):
    """What an apply's or an audit's first device execution tells the controller of the last apply: the
    evaluated records (evaluate_records, every record found) and, per role that could be read, whether
    every recorded check holds now (``holds``) and the first settings that do not, with their state
    (``not_holding``); a record that cannot be read has only its ``error`` (its role runs)."""
    state = evaluate_records(root, record_dir) or {}
    for entry in state.values():
        if "results" in entry:
            failing = ["%s: %s" % (r["setting"], r["state"]) for r in entry["results"] if r["state"] not in HOLDING]
            entry.update(holds=not failing, not_holding=failing[:3])
    return state


def prometheus_text(host, results, finished_at=None):
    """The node_exporter textfile of one device (names and HELP from edge_metrics.METRICS)."""
    return device_textfile(host, results, time.time() if finished_at is None else finished_at)
