"""The JUnit XML of `edgetune audit` (tools/edgetune/audit_report.py) is valid XML whatever a finding says."""
import xml.etree.ElementTree as ET

import pytest

from edgetune import audit_report

# What a device may put in a finding: a terminal's colours, a NUL read from sysfs, markup,
# the end of a CDATA section, quotes, non-ASCII (and astral) text, and code points XML 1.0 cannot carry.
NASTY = "\x1b[31mred\x1b[0m nul\x00 bell\x07 & <b>bold</b> ]]> \"quoted\" 'single' héllo ✓ 😀 \ud800 \ufffe end"
# The same text as the report carries it: the impossible characters spelled out, the rest as they were.
NASTY_IN_XML = ("\\x1b[31mred\\x1b[0m nul\\x00 bell\\x07 & <b>bold</b> ]]> \"quoted\" 'single' héllo ✓ 😀 "
                "\\ud800 \\ufffe end")


@pytest.fixture
def nasty_hosts():
    return {
        "dev<1>&\x1b": {"status": "drifted", "cause": "drifted", "seconds": 1.0, "results": [
            {"setting": "sysctl \x00kernel.x & <y>", "role": "edge_cpu", "state": "drifted", "detail": NASTY},
            {"setting": "governor", "role": "edge_power", "state": "error", "detail": NASTY},
            {"setting": "devfreq", "role": "edge_power", "state": "unsupported", "detail": NASTY},
            {"setting": "bootargs", "role": "edge_boot", "state": "pending-reboot", "detail": NASTY},
            {"setting": "irq", "role": "edge_cpu", "state": "ok", "detail": "fine"},
        ]},
        "gone-1": {"status": "unreachable", "cause": NASTY, "seconds": None, "results": []},
    }


def test_xml_text_spells_out_what_xml_cannot_carry():
    assert audit_report.xml_text("a\x1bb\x00c\x7f\td\ne\rf") == "a\\x1bb\\x00c\x7f\td\ne\rf"
    assert audit_report.xml_text("\ud800\udfff\ufffe\uffff") == "\\ud800\\udfff\\ufffe\\uffff"
    assert audit_report.xml_text("é ✓ 😀 & < ]]>") == "é ✓ 😀 & < ]]>"  # the XML writer escapes these
    assert audit_report.xml_text(42) == "42"


def test_junit_is_valid_xml_for_any_finding_text(nasty_hosts, tmp_path):
    text = audit_report.junit(nasty_hosts, 12.34)
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    suite = ET.fromstring(text.encode("utf-8"))
    assert suite.tag == "testsuite"
    assert {k: suite.get(k) for k in ("name", "tests", "failures", "errors", "time")} == {
        "name": "edgetune-drift", "tests": "6", "failures": "1", "errors": "2", "time": "12.3"}
    cases = {(case.get("classname"), case.get("name")): case for case in suite.iter("testcase")}
    host = "dev<1>&\\x1b"
    assert set(cases) == {(host, "sysctl \\x00kernel.x & <y>"), (host, "governor"), (host, "devfreq"),
                          (host, "bootargs"), (host, "irq"), ("gone-1", "audit")}
    assert cases[host, "sysctl \\x00kernel.x & <y>"].find("failure").get("message") == "drifted: " + NASTY_IN_XML
    assert cases[host, "governor"].find("error").get("message") == "error: " + NASTY_IN_XML
    assert cases[host, "devfreq"].find("skipped").get("message") == NASTY_IN_XML
    assert cases[host, "bootargs"].find("system-out").text == "pending reboot: " + NASTY_IN_XML
    assert list(cases[host, "irq"]) == []
    assert cases["gone-1", "audit"].find("error").get("message") == "unreachable: " + NASTY_IN_XML

    # Written as a file (UTF-8, as the declaration says) it parses the same.
    path = tmp_path / "reports" / "drift.xml"
    audit_report.write_atomically(str(path), text, "--junit")
    parsed = ET.parse(str(path)).getroot()
    assert parsed.find("testcase/skipped").get("message") == NASTY_IN_XML
    assert sorted(p.name for p in path.parent.iterdir()) == ["drift.xml"]  # no temporary file left


def test_junit_keeps_one_case_a_line_and_an_empty_fleet_valid():
    text = audit_report.junit({"a": {"status": "ok", "cause": "", "seconds": 1.0, "results": [
        {"setting": "s1", "state": "ok"}, {"setting": "s2", "state": "ok"}]}}, 1.0)
    starts = [line.strip()[:10] for line in text.splitlines()[1:]]
    assert starts == ["<testsuite", "<testcase ", "<testcase ", "</testsuit"]
    empty = ET.fromstring(audit_report.junit({}, 0.0).encode("utf-8"))
    assert (empty.get("tests"), list(empty)) == ("0", [])
