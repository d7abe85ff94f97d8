"""The reports of `edgetune audit`: a table for people, JUnit XML for CI and a
node_exporter textfile (Prometheus text format, from prometheus_client).

Each report reads the same devices dict: host -> {"status", "cause",
"results", "seconds"} (see edgetune.audit), status one of STATUSES.
"""
import re
import xml.etree.ElementTree as ET

from edgetune import outputs
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


# What XML 1.0 cannot carry, even as a character reference: C0 controls but tab, newline and
# carriage return; lone surrogates; U+FFFE and U+FFFF.
_NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text):
    """``text`` as XML 1.0 can carry it: each character it cannot, replaced visibly by its Python
    escape (ESC is the four characters \\x1b), so a finding's text is never lost or made invalid."""
    return _NOT_XML.sub(lambda match: match.group().encode("unicode_escape", "backslashreplace")
                        .decode("ascii"), str(text))


def junit(hosts, seconds):
    """One test case per setting; a device not audited is one case in error.

    Built with xml.etree, which escapes &, < and > (so ]]> too) and quotes; xml_text()
    replaces the characters XML cannot carry at all."""
    suite = ET.Element("testsuite", name="edgetune-drift")
    failures = errors = 0

    def case(host, name):
        return ET.SubElement(suite, "testcase", classname=xml_text(host), name=xml_text(name))

    def child(parent, tag, message):
        return ET.SubElement(parent, tag, message=xml_text(message))

    for host in sorted(hosts):
        entry = hosts[host]
        if not entry["results"]:
            errors += 1
            child(case(host, "audit"), "error", "%s: %s" % (entry["status"], entry.get("cause", "")))
            continue
        for result in entry["results"]:
            testcase = case(host, result["setting"])
            message = result["state"] + ": " + result.get("detail", "")
            if result["state"] == "drifted":
                failures += 1
                child(testcase, "failure", message)
            elif result["state"] == "error":
                errors += 1
                child(testcase, "error", message)
            elif result["state"] == "unsupported":
                child(testcase, "skipped", result.get("detail", ""))
            elif result["state"] == "pending-reboot":
                ET.SubElement(testcase, "system-out").text = xml_text("pending reboot: " + result.get("detail", ""))
    cases = list(suite)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("time", "%.1f" % seconds)
    # One test case a line, as a person reading the file would want it.
    suite.text = "\n  " if cases else "\n"
    for index, testcase in enumerate(cases):
        testcase.tail = "\n  " if index < len(cases) - 1 else "\n"
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


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


def write_atomically(path, text, option=None):
    """Readers (node_exporter, CI) never see a half-written file; a failed write is one
    UsageError line (edgetune.outputs)."""
    outputs.write_text(path, text, option)
