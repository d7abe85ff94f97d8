"""The reports of `edgetune audit`: a table for people, JUnit XML for CI and a
node_exporter textfile (Prometheus text format, rendered by the collection's
plugins/module_utils/device/edge_metrics.py, as the on-device audit timer's is).

Each report reads the same devices dict: host -> {"status", "cause",
"results", "seconds"} (see edgetune.audit), status one of STATUSES.
"""
import re
import xml.etree.ElementTree as ET

from edgetune import outputs
from edgetune.ansible_setup import module_utils
from edgetune.errors import CLEAN, FINDINGS, UNREACHABLE


STATUSES = ("ok", "drifted", "pending-reboot", "unreachable", "error")
# The exit code is 0 when every device is in one of these.
PASSING = ("ok", "pending-reboot")


def summary(hosts):
    counts = {}
    for entry in hosts.values():
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    return counts


def exit_code(hosts):
    """3 when a device could not be reached (the fleet was not all seen), else 1 for any finding."""
    if any(entry["status"] == "unreachable" for entry in hosts.values()):
        return UNREACHABLE
    return CLEAN if all(entry["status"] in PASSING for entry in hosts.values()) else FINDINGS


def table(hosts, show_ok=False):
    """One line per device, one per setting not ok (every setting with show_ok). A long detail (such as
    the paragraph on what a hybrid cgroup mode does not enforce, the same on every device of a kind) is
    said once, as a numbered note after the devices; each setting's line has its first words and the note."""
    long_detail = 100  # longer than this: said once, as a note, however many devices have it
    lines, notes = [], {}
    for host in sorted(hosts):
        entry = hosts[host]
        lines.append("%-28s %s%s" % (host, entry["status"].upper(),
                                      (": " + entry["cause"]) if entry.get("cause") else ""))
        for result in entry["results"]:
            if show_ok or result["state"] != "ok":
                detail = str(result.get("detail", ""))
                if len(detail) > long_detail:
                    number = notes.setdefault(detail, len(notes) + 1)
                    head = detail.split(": ", 1)[0]
                    detail = "%s (note %d)" % (head if len(head) <= 60 else head[:57] + "...", number)
                lines.append("    %-15s %-34s %s" % (result["state"], result["setting"], detail))
    lines.extend("note %d: %s" % (number, text) for text, number in notes.items())
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
    """The textfile: the names, labels and HELP of plugins/module_utils/device/edge_metrics.py (METRICS), the
    same the on-device audit timer writes, plus the controller's own (audited, unreachable, duration)."""
    edge_metrics = module_utils("device.edge_metrics")
    samples = {"edgetune_device_audited": [], "edgetune_device_unreachable": [],
               "edgetune_audit_duration_seconds": []}
    for host in sorted(hosts):
        entry = hosts[host]
        samples["edgetune_device_audited"].append(({"host": host, "status": entry["status"]},
                                                   1 if entry["results"] else 0))
        samples["edgetune_device_unreachable"].append(({"host": host}, 1 if entry["status"] == "unreachable" else 0))
        if entry.get("seconds") is not None:
            samples["edgetune_audit_duration_seconds"].append(({"host": host}, entry["seconds"]))
        if entry["results"]:
            edge_metrics.device_samples(host, entry["results"], samples)
        elif entry["status"] == "error":  # the device answered but its audit failed: nothing was checked
            samples.setdefault("edgetune_audit_errors", []).append(({"host": host}, 1))
    samples["edgetune_audit_last_run_timestamp_seconds"] = [({}, finished_at)]
    return edge_metrics.render(samples, edge_metrics.CONTROLLER)


def write_atomically(path, text, option=None):
    """Readers (node_exporter, CI) never see a half-written file; a failed write is one
    UsageError line (edgetune.outputs)."""
    outputs.write_text(path, text, option)
