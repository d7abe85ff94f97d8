"""`edgetune audit`: which device drifted, and how.

Runs playbooks/audit.yml (roles render their desired state on the controller,
one edge_audit call per device compares it with the device), reads the
results through Ansible's JSON callback and writes the reports: a table for
people, JSON, JUnit XML for CI and a Prometheus textfile for node_exporter.
Exit codes: 0 clean, 1 drift or unreachable devices, 2 usage or environment.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from edgetune.errors import UsageError

AUDIT_TASK = "Audit the managed settings"
FINDINGS = ("drifted", "error")


def find_project(start=None):
    """The edgetune checkout: the directory holding ansible.cfg and playbooks/audit.yml."""
    here = Path(start or os.getcwd()).resolve()
    for candidate in [here] + list(here.parents) + [Path(__file__).resolve().parents[2]]:
        if (candidate / "playbooks" / "audit.yml").exists() and (candidate / "ansible.cfg").exists():
            return candidate
    raise UsageError("cannot find the edgetune project (playbooks/audit.yml); run from the checkout")


def run_playbook(project, inventories=(), limit=None, extra_vars=()):
    argv = ["ansible-playbook", str(project / "playbooks" / "audit.yml")]
    for inventory in inventories:
        argv += ["-i", inventory]
    if limit:
        argv += ["-l", limit]
    for extra in extra_vars:
        argv += ["-e", extra]
    env = dict(os.environ, ANSIBLE_CONFIG=str(project / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", EDGETUNE_NO_SUMMARY="1",
               ANSIBLE_NOCOLOR="1")
    try:
        result = subprocess.run(argv, cwd=str(project), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, check=False)
    except FileNotFoundError:
        raise UsageError("ansible-playbook not found; run `make venv` and use .venv/bin/edgetune") from None
    try:
        return json.loads(result.stdout)
    except ValueError:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise UsageError("the audit playbook did not run: %s" % " | ".join(tail)) from None


def collect(report):
    """Ansible JSON callback output -> {host: {"status": ..., "results": [...], "message": ...}}."""
    hosts = {}
    for host, stats in report.get("stats", {}).items():
        hosts[host] = {"status": "unreachable" if stats.get("unreachable") else "failed"
                       if stats.get("failures") else "unknown", "results": [], "message": ""}
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            for host, result in task.get("hosts", {}).items():
                entry = hosts.setdefault(host, {"status": "unknown", "results": [], "message": ""})
                if result.get("unreachable"):
                    entry["status"], entry["message"] = "unreachable", result.get("msg", "")
                elif result.get("failed") and not entry["message"]:
                    entry["message"] = "%s: %s" % (task["task"]["name"], result.get("msg", ""))
                elif task["task"]["name"] == AUDIT_TASK and "results" in result:
                    entry["results"] = result["results"]
                    entry["status"] = "audited"
    for entry in hosts.values():
        if entry["status"] == "audited":
            states = {r["state"] for r in entry["results"]}
            entry["status"] = ("drifted" if states & set(FINDINGS)
                               else "pending-reboot" if "pending-reboot" in states else "clean")
        elif entry["status"] == "unknown":
            entry["status"] = "failed"
    return hosts


def summary(hosts):
    counts = {}
    for entry in hosts.values():
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    return counts


def exit_code(hosts):
    return 0 if all(e["status"] in ("clean", "pending-reboot") for e in hosts.values()) else 1


def table(hosts, verbose=False):
    lines = []
    for host in sorted(hosts):
        entry = hosts[host]
        lines.append("%-28s %s%s" % (host, entry["status"].upper(),
                                      (": " + entry["message"]) if entry["message"] else ""))
        for result in entry["results"]:
            if verbose or result["state"] != "ok":
                lines.append("    %-15s %-34s %s" % (result["state"], result["setting"], result.get("detail", "")))
    counts = summary(hosts)
    lines.append("fleet: %d device(s): %s" % (len(hosts), ", ".join(
        "%d %s" % (n, state) for state, n in sorted(counts.items()))))
    return "\n".join(lines)


def junit(hosts, seconds):
    cases, failures, errors = [], 0, 0
    for host in sorted(hosts):
        entry = hosts[host]
        if entry["status"] in ("unreachable", "failed"):
            errors += 1
            cases.append('  <testcase classname=%s name="reachable"><error message=%s/></testcase>' % (
                quoteattr(host), quoteattr(entry["status"] + ": " + entry["message"])))
            continue
        for result in entry["results"]:
            body = ""
            if result["state"] in FINDINGS:
                failures += 1
                body = "<failure message=%s/>" % quoteattr(result["state"] + ": " + result.get("detail", ""))
            elif result["state"] == "unsupported":
                body = "<skipped message=%s/>" % quoteattr(result.get("detail", ""))
            elif result["state"] == "pending-reboot":
                body = "<system-out>%s</system-out>" % escape("pending reboot: " + result.get("detail", ""))
            cases.append("  <testcase classname=%s name=%s>%s</testcase>" % (
                quoteattr(host), quoteattr(result["setting"]), body))
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<testsuite name="edgetune-drift" tests="%d" failures="%d" errors="%d" time="%.1f">\n%s\n</testsuite>\n'
            % (len(cases), failures, errors, seconds, "\n".join(cases)))


def prometheus(hosts):
    def label(value):
        return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    lines = ["# HELP edgetune_drift 1 for the state each managed setting of a device is in.",
             "# TYPE edgetune_drift gauge",
             "# HELP edgetune_device_audited 1 if the device answered the audit.",
             "# TYPE edgetune_device_audited gauge"]
    for host in sorted(hosts):
        entry = hosts[host]
        lines.append('edgetune_device_audited{host="%s",status="%s"} %d' % (
            label(host), entry["status"], 0 if entry["status"] in ("unreachable", "failed") else 1))
        for result in entry["results"]:
            lines.append('edgetune_drift{host="%s",setting="%s",role="%s",state="%s"} 1' % (
                label(host), label(result["setting"]), label(result.get("role", "")), result["state"]))
    return "\n".join(lines) + "\n"


def write_atomically(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    os.replace(str(tmp), str(path))


def cmd_audit(args):
    project = find_project()
    started = time.time()
    hosts = collect(run_playbook(project, args.inventory or (), args.limit, args.extra_vars or ()))
    seconds = time.time() - started
    if not hosts:
        raise UsageError("no hosts matched; check the inventory and --limit")
    if args.junit:
        write_atomically(args.junit, junit(hosts, seconds))
    if args.prometheus:
        write_atomically(args.prometheus, prometheus(hosts))
    if args.json:
        print(json.dumps({"hosts": hosts, "summary": summary(hosts), "seconds": round(seconds, 1)}, indent=2))
    else:
        print(table(hosts, args.verbose))
        print("audit took %.1f s" % seconds, file=sys.stderr)
    return exit_code(hosts)


def add_parser(subparsers):
    p = subparsers.add_parser("audit", help="drift audit of the fleet (desired vs persisted vs running)")
    p.add_argument("-i", "--inventory", action="append", help="inventory, repeatable (default: ansible.cfg's)")
    p.add_argument("-l", "--limit", help="limit to hosts or groups, e.g. orin-fleet")
    p.add_argument("-e", "--extra-vars", action="append", help="extra variables, as for ansible-playbook")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML for CI")
    p.add_argument("--prometheus", metavar="FILE", help="also write a node_exporter textfile")
    p.add_argument("-v", "--verbose", action="store_true", help="list settings that are ok too")
    p.set_defaults(func=cmd_audit)
