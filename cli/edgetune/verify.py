"""`edgetune verify`: run the device checks molecule runs on the twins
(edgetune.checks, the functions marked ``device``, which molecule/shared/tests
collects too) against devices, through the Ansible inventory (testinfra's
ansible backend), with a JUnit report.

Expected values are not the twins' hand-written ones: for each device they
come from its plan, the object the roles apply. Step 1 runs verify_plan.yml
(next to this file: the collection's preflight playbook, where edge_facts
reads the board and the action edge_plan validates the intent and plans the
device; nothing on the device changes) and takes each check's expectations
from the plan, and the few role settings outside it (file paths, the probe,
ports) from the intent (the collection's role defaults, then the inventory).
Step 2 runs pytest with the checks, which only read a device. Both run as the
operator's ansible-playbook would from the current directory: its ansible.cfg
(edgetune.ansible_setup), its inventory, the collection where Ansible finds
it; no checkout is needed. So verify proves that a device runs what the roles
intend for it; whether that intent is right for a board is what molecule's
hand-written expectations prove on the twins.

The Ansible options are ansible-playbook's: the plan playbook takes them as
given; the checks connect through testinfra's Ansible backend, which takes
the user, key, become and connection from them (Ansible's environment
variables) but cannot answer a password prompt.

Exit codes: 0 every check passed, 1 a check failed or a device could not be
planned, 2 usage or environment error, 3 a device unreachable (its checks are
not run), 130 interrupted.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from edgetune import ansible_options, ansible_setup, checks, outputs
from edgetune.errors import CLEAN, FINDINGS, UNREACHABLE, USAGE, Interrupted, UsageError

PLAN_TASK = "Desired state for edgetune verify"
PLAYBOOK = Path(__file__).resolve().parent / "verify_plan.yml"


def ansible_env(config):
    """The environment of verify's ansible-playbook and pytest: the caller's, with the ansible.cfg
    Ansible found from the current directory made explicit, and this environment's scripts first."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PATH=path)
    if config.path:
        env["ANSIBLE_CONFIG"] = str(config.path)
    return env


def require_pytest():
    """pytest and testinfra run the checks: without them, one line (exit 2) before anything runs."""
    missing = [name for name, module in (("pytest", "pytest"), ("pytest-testinfra", "testinfra"))
               if importlib.util.find_spec(module) is None]
    if missing:
        raise UsageError("`edgetune verify` runs the device checks with %s, which %s not installed for %s: "
                         "install them (pip install pytest-testinfra) beside edgetune"
                         % (" and ".join(missing), "is" if len(missing) == 1 else "are", sys.executable))


def run_plan(config, options):
    """{host: plan dict or {"error": message}} (the error "unreachable" for a device not reached)."""
    target, env_add = ansible_setup.collection_playbook(config, "preflight")
    argv = options.playbook_argv(ansible_setup.ansible_playbook(), str(PLAYBOOK),
                                 "-e", "edgetune_preflight=%s" % target)
    env = dict(ansible_env(config), **dict(ansible_setup.JSON_REPORT_ENV, **env_add))
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    plans = {}
    for host, outcome in ansible_setup.outcomes(ansible_setup.json_report(done, "the plan playbook"),
                                                PLAN_TASK).items():
        if "result" in outcome:
            plans[host] = outcome["result"].get("msg")
        elif outcome["error"] == "unreachable":
            plans[host] = {"error": "unreachable", "message": outcome["message"][:500]}
        else:
            plans[host] = {"error": "%s: %s" % (outcome["task"], outcome["message"][:500]) if outcome["task"]
                           else "failed"}
    return plans


# ---------------------------------------------------------------- expectations
def role_defaults(collection):
    """The roles' defaults, merged, of the collection edgetune.fleet at this path."""
    merged = {}
    for path in sorted((Path(collection) / "roles").glob("*/defaults/main.yml")):
        merged.update(yaml.safe_load(path.read_text()) or {})
    return merged


def truthy(value):
    return str(value).strip().lower() in ("true", "yes", "1", "on")


def policies_of(settings, clusters):
    """The cpufreq policy numbers a plan's cpufreq settings address (by policy, or by a CPU of it)."""
    found = set()
    for item in settings:
        if "policy" in item:
            found.add(int(item["policy"]))
        else:
            cpus = set(item.get("cpus") if isinstance(item.get("cpus"), list) else [item.get("cpus")])
            found.update(c["policy"] for c in clusters if cpus & set(c["cpus"]))
    return sorted(found)


def memory_limit(given, size):
    """The slice's memory limit as the checks take it: a share of MemTotal for NN% (systemd resolves it
    when it loads the unit), else the plan's bytes; None for no limit."""
    share = ansible_setup.module_utils("device.edge_audit").ram_share(given)
    if share is not None:
        return {"fraction": share}
    return {"bytes": size} if size is not None else None


def expectations(report, defaults):
    """The shared checks' expectations for one device (the shape of molecule's EXPECTED, SETS, POWER).

    The values are the device's plan (action edge_plan, the same object the
    roles apply); the role settings that are not part of it (file paths, the
    probe, persistence, ports) come from the intent, role defaults first.
    """
    intent = dict(defaults)
    intent.update(report.get("intent") or {})
    facts, profile, plan = report["facts"], report["profile"] or {}, report["plan"]
    cpu, boot, power, piece, runtime = (plan[k] for k in ("cpu", "bootargs", "power", "slice", "runtime"))
    quota = piece.get("cpu_quota") or ""
    interfaces = [i["name"] if isinstance(i, dict) else i for i in intent.get("edge_netqos_interfaces") or []]
    clusters = facts["cpu"]["clusters"]
    return {
        "bootloader": boot.get("path") or facts["bootloader"]["path"],
        "bootloader_name": boot.get("bootloader") or facts["bootloader"]["name"],
        "bootargs": boot["args"] if boot["enabled"] else None,
        "isolated": boot["kernel_isolated"] if boot["enabled"] else None,
        "clusters": ["%d-%d" % (c["cpus"][0], c["cpus"][-1]) for c in clusters],
        "model": facts.get("model"), "profile": profile.get("title"),
        "sets": {"inference": cpu["inference"], "housekeeping": cpu["housekeeping"]},
        # kernel.numa_balancing is checked apart, where the kernel has it (checks/cpu_cgroups.py).
        "sysctls": {item["name"].replace(".", "/"): str(item["value"]) for item in cpu["sysctl"]
                    if item["name"] != "kernel.numa_balancing"}
        if truthy(intent.get("edge_cpu_enabled", True)) else None,
        "sysctl_file": intent.get("edge_cpu_sysctl_file"),
        "slice": None if not piece["enabled"] else {
            "name": piece["name"], "quota_cpus": float(quota[:-1]) / 100 if quota.endswith("%") else None,
            "weight": piece["cpu_weight"],
            "memory_max": memory_limit(piece["memory_max"], piece["memory_max_bytes"]),
            "confine_system": truthy(intent.get("edge_cgroups_confine_system", True)),
            "probe": truthy(intent.get("edge_cgroups_probe", True)),
            "probe_priority": int(intent.get("edge_cgroups_probe_priority", 10))},
        "power": None if not power["enabled"] else {
            "mode": power["nvpmodel_mode"] if power["nvpmodel_managed"] else None,
            "jetson": power["jetson"], "pinned": bool(power["jetson_clocks_managed"] and power["jetson_clocks"]),
            "inference": policies_of([i for i in power["cpufreq"] if i.get("governor") == "performance"], clusters),
            "housekeeping": [], "housekeeping_governor": None,
            "devfreq": sorted(i["node"] for i in power["devfreq"] if i.get("governor") == "performance"),
            "cpu_top": None, "persist": truthy(intent.get("edge_power_persist", True))},
        "netqos_interfaces": interfaces,
        "runtime": None if not truthy(intent.get("edge_runtime_enabled", True)) else {
            "port": int(intent.get("edge_runtime_port", 8470)),
            "policy": runtime["sched_policy"], "priority": runtime["sched_priority"],
            "require_fifo": runtime["require_fifo"],
            "http_threads": int(intent.get("edge_runtime_http_threads", 4)),
            "infer_threads": int(intent.get("edge_runtime_infer_threads", 1)),
            "cpus": runtime["cpulist"]},
    }


# ---------------------------------------------------------------- the command
def checks_environment(options):
    """(pytest options, environment) that give testinfra's Ansible backend the operator's Ansible
    options: it reads the user, become and connection settings from Ansible's environment variables,
    the key from its own option; a connection other than the inventory's goes through Ansible itself."""
    env, argv = {}, []
    if options.user:
        env["ANSIBLE_REMOTE_USER"] = options.user
    if options.become:
        env["ANSIBLE_BECOME"] = "True"
    if options.become_user:
        env["ANSIBLE_BECOME_USER"] = options.become_user
    if options.private_key:
        argv.append("--ssh-identity-file=%s" % str(Path(options.private_key).expanduser().resolve()))
        env["ANSIBLE_PRIVATE_KEY_FILE"] = str(Path(options.private_key).expanduser().resolve())
    if options.connection:
        env["ANSIBLE_CONNECTION"] = options.connection
        argv.append("--force-ansible")
    if options.vault_password_file:
        env["ANSIBLE_VAULT_PASSWORD_FILE"] = str(Path(options.vault_password_file[0]).expanduser().resolve())
    if options.vault_id:
        env["ANSIBLE_VAULT_IDENTITY_LIST"] = ",".join(options.vault_id)
    return argv, env


def cmd_verify(args):
    require_pytest()
    options = ansible_options.Options.from_args(args)
    if options.prompts():
        raise UsageError("verify's checks connect through testinfra, which cannot answer a password prompt "
                         "(-k, -K, --ask-vault-pass, --vault-id ...@prompt): use an SSH key (--private-key) "
                         "and a vault password file")
    # Before anything touches a device: the reports can be written, the inventory is there.
    outputs.check(files=[("--junit", args.junit), ("--keep-plan", args.keep_plan)])
    config = ansible_setup.config_in_effect()
    options.check(config.inventories)
    collection = ansible_setup.locate_collection()[0]
    if collection is None:
        raise ansible_setup.not_installed(config)
    inventories = options.inventory or config.inventories
    if len(inventories) != 1:
        raise UsageError("give one inventory (-i) to verify; testinfra reads one (%s names %s)"
                         % (config.describe(), ", ".join(inventories) or "none"))
    inventory = str(Path(inventories[0]).expanduser().resolve())
    options.inventory = [inventory]
    started = time.time()
    say("planning %s: each device's plan from the inventory and the boards' facts (read-only)" % args.limit)
    plans = run_plan(config, options)
    if not plans:
        raise UsageError("no hosts matched %s in %s" % (args.limit, inventory))
    defaults = role_defaults(collection)
    derived = {}
    for host, plan in sorted(plans.items()):
        if plan is None or "error" in plan:
            derived[host] = {"error": (plan or {}).get("error", "no plan")}
            say("%s: %s" % (host, "UNREACHABLE: %s" % plan.get("message", "") if derived[host]["error"] ==
                            "unreachable" else "cannot be verified: %s" % derived[host]["error"]))
        else:
            derived[host] = {"expected": expectations(plan, defaults)}
    planned = time.time() - started
    if args.keep_plan:
        outputs.write_text(args.keep_plan, json.dumps(derived, indent=1), "--keep-plan")
    checked = sorted(host for host, entry in derived.items() if "expected" in entry)
    code = CLEAN
    if checked:
        code = run_checks(args, options, config, inventory, derived, checked)
    if args.junit:
        junit_unplanned(args.junit, derived)
    unreachable = any(entry.get("error") == "unreachable" for entry in derived.values())
    say("verify of %s took %.0f s (plan %.0f s)" % (args.limit, time.time() - started, planned))
    if code == USAGE:
        return code
    if unreachable:
        return UNREACHABLE
    return FINDINGS if code != CLEAN or len(checked) < len(derived) else CLEAN


def run_checks(args, options, config, inventory, derived, hosts):
    """pytest with the device checks on the planned hosts; edgetune's exit code for its result."""
    with tempfile.TemporaryDirectory(prefix="edgetune-verify-") as tmp:
        plan_file = Path(tmp) / "plan.json"
        plan_file.write_text(json.dumps(derived, indent=1))
        # The checks as shipped, with their own fixtures (edgetune.checks.plugin) and no configuration
        # or conftest.py of the working directory's (-c: none; the rootdir is the checks' own).
        here = str(Path(checks.__file__).resolve().parent)
        connect, connect_env = checks_environment(options)
        argv = [sys.executable, "-m", "pytest", *[str(path) for path in checks.paths()], "-c", os.devnull,
                "--rootdir", here, "--confcutdir", here, "-p", "edgetune.checks.plugin", "-m", "device",
                "-p", "no:cacheprovider", "--hosts=%s" % ",".join("ansible://%s" % host for host in hosts),
                "--ansible-inventory=%s" % inventory, "-rfEs", "--tb=short", "-o", "junit_family=xunit2"]
        argv += connect
        if args.junit:
            argv += ["--junitxml", str(Path(args.junit).resolve())]
        if args.keyword:
            argv += ["-k", args.keyword]
        argv += ["-q"] if not options.verbose else ["-v"]
        # Not molecule's: verify may run inside a molecule run (the VM scenario's test of it).
        env = {k: v for k, v in ansible_env(config).items() if not k.startswith("MOLECULE_")}
        env.update(connect_env, EDGETUNE_VERIFY_PLAN=str(plan_file), EDGETUNE_VERIFY_INVENTORY=inventory)
        try:
            done = subprocess.run(argv, env=env, check=False)
        except KeyboardInterrupt:
            raise Interrupted("verify interrupted: the checks stopped, no report written") from None
    if done.returncode == 5:
        raise UsageError("no device checks ran for %s" % args.limit)
    if done.returncode == 2:
        raise Interrupted("verify interrupted: the checks stopped")
    return {0: CLEAN, 1: FINDINGS}.get(done.returncode, USAGE)


def junit_unplanned(path, derived):
    """The devices whose checks did not run (not planned, unreachable), each an error in the JUnit report
    beside pytest's suite (or alone, where no check ran), so that CI sees them."""
    from xml.etree import ElementTree
    unplanned = sorted(host for host, entry in derived.items() if "error" in entry)
    if not unplanned:
        return
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        root = ElementTree.Element("testsuites")
    if root.tag != "testsuites":
        wrapper = ElementTree.Element("testsuites")
        wrapper.append(root)
        root = wrapper
    suite = ElementTree.SubElement(root, "testsuite", name="edgetune verify: devices", tests=str(len(unplanned)),
                                   errors=str(len(unplanned)), failures="0", skipped="0")
    for host in unplanned:
        case = ElementTree.SubElement(suite, "testcase", classname="edgetune.verify", name=host)
        ElementTree.SubElement(case, "error", message="%s: not verified: %s" % (host, derived[host]["error"]))
    outputs.write_text(path, ElementTree.tostring(root, encoding="unicode"), "--junit")


def say(message):
    print("edgetune: " + message, file=sys.stderr, flush=True)


def add_parser(subparsers):
    p = subparsers.add_parser("verify", help="run the device checks of the twins' tests against devices "
                                             "(expected values from the inventory's intent and the boards' facts)")
    ansible_options.add_to(p, limit_required=True)
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    p.add_argument("--checks", dest="keyword", metavar="EXPR", help="only the checks matching this pytest -k "
                   "expression, e.g. \"bootargs or runtime\"")
    p.add_argument("--keep-plan", metavar="FILE", help="also write the derived expectations (JSON) here")
    p.set_defaults(func=cmd_verify)
