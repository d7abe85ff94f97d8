"""The reports of `edgetune audit`: a table for people, JUnit XML for CI and a
node_exporter textfile (Prometheus text format, from prometheus_client).

Each report reads the same devices dict: host -> {"status", "cause",
"results", "seconds"} (see edgetune.audit), status one of STATUSES.
"""
import os
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from edgetune.errors import require_module

STATUSES = ("ok", "drifted", "pending-reboot", "unreachable", "error")
# The exit code is 0 when every device is in one of these.
PASSING = ("ok", "pending-reboot")


def summary(hosts):
    counts = {}
    for entry in hosts.values():
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    return counts


def exit_code(hosts):
    return 0 if all(entry["status"] in PASSING for entry in hosts.values()) else 1


def table(hosts, show_ok=False):
    lines = []
    for host in sorted(hosts):
        entry = hosts[host]
        lines.append("%-28s %s%s" % (host, entry["status"].upper(),
                                      (": " + entry["cause"]) if entry.get("cause") else ""))
        for result in entry["results"]:
            if show_ok or result["state"] != "ok":
                lines.append("    %-15s %-34s %s" % (result["state"], result["setting"], result.get("detail", "")))
    counts = summary(hosts)
    lines.append("fleet: %d device(s): %s" % (len(hosts), ", ".join(
        "%d %s" % (n, state) for state, n in sorted(counts.items()))))
    return "\n".join(lines)


def junit(hosts, seconds):
    """One test case per setting; a device not audited is one case in error."""
    cases, failures, errors = [], 0, 0
    for host in sorted(hosts):
        entry = hosts[host]
        if not entry["results"]:
            errors += 1
            cases.append('  <testcase classname=%s name="audit"><error message=%s/></testcase>' % (
                quoteattr(host), quoteattr("%s: %s" % (entry["status"], entry.get("cause", "")))))
            continue
        for result in entry["results"]:
            body = ""
            message = quoteattr(result["state"] + ": " + result.get("detail", ""))
            if result["state"] == "drifted":
                failures += 1
                body = "<failure message=%s/>" % message
            elif result["state"] == "error":
                errors += 1
                body = "<error message=%s/>" % message
            elif result["state"] == "unsupported":
                body = "<skipped message=%s/>" % quoteattr(result.get("detail", ""))
            elif result["state"] == "pending-reboot":
                body = "<system-out>%s</system-out>" % escape("pending reboot: " + result.get("detail", ""))
            cases.append("  <testcase classname=%s name=%s>%s</testcase>" % (
                quoteattr(host), quoteattr(result["setting"]), body))
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<testsuite name="edgetune-drift" tests="%d" failures="%d" errors="%d" time="%.1f">\n%s\n</testsuite>\n'
            % (len(cases), failures, errors, seconds, "\n".join(cases)))


def prometheus(hosts, finished_at):
    """The textfile: one family per metric, each with all its samples (prometheus_client groups them)."""
    client = require_module("prometheus_client", "--prometheus")
    registry = client.CollectorRegistry()
    audited = client.Gauge("edgetune_device_audited",
                           "1 if the device answered the audit (0: no result), by its status.",
                           ["host", "status"], registry=registry)
    drift = client.Gauge("edgetune_drift", "1 for the state each managed setting of a device is in.",
                         ["host", "setting", "role", "state"], registry=registry)
    duration = client.Gauge("edgetune_audit_duration_seconds",
                            "Seconds from the device's first task to its audit result.", ["host"], registry=registry)
    last_run = client.Gauge("edgetune_audit_last_run_timestamp_seconds",
                            "When the last audit finished (Unix time).", registry=registry)
    for host in sorted(hosts):
        entry = hosts[host]
        audited.labels(host=host, status=entry["status"]).set(1 if entry["results"] else 0)
        if entry.get("seconds") is not None:
            duration.labels(host=host).set(entry["seconds"])
        for result in entry["results"]:
            drift.labels(host=host, setting=result["setting"], role=result.get("role", ""),
                         state=result["state"]).set(1)
    last_run.set(finished_at)
    return client.generate_latest(registry).decode()


def write_atomically(path, text):
    """Readers (node_exporter, CI) never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    os.replace(str(tmp), str(path))
