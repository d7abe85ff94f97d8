"""The Prometheus side of the audit: one metric definition, two textfiles, the alert rules and the dashboard.

plugins/module_utils/device/edge_metrics.py (METRICS) names every metric; the device's
textfile (edge_audit.prometheus_text) and the controller's (`edgetune audit
--prometheus`, audit_report.prometheus) both render from it. extras/prometheus/
ships the alert rules with their promtool unit tests, whose input series are
the samples of the textfiles in extras/prometheus/fixtures/ (written by the real
renderers: EDGETUNE_REGENERATE=1 rewrites them), and a Grafana dashboard.

promtool is Debian's package prometheus (`make unit` installs it as root on Debian).
"""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_metrics
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import prometheus_text

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ROOT / "extras" / "prometheus"
FIXTURES = EXTRAS / "fixtures"
RULES = EXTRAS / "edgetune-alerts.yml"
RULE_TESTS = EXTRAS / "edgetune-alerts.test.yml"
DASHBOARD = EXTRAS / "edgetune-fleet.dashboard.json"
FIXTURE_NAMES = ("controller.prom", "device-clean.prom", "device-drifted.prom")
# The fixtures' audits finish at the start of promtool's clock (Unix time 0).
FINISHED_AT = 0
# The controller's report and promtool: not part of the Python 3.8 run (the device side's
# rendering is tested there by test_edge_audit.py).
pytestmark = pytest.mark.controller


def result(setting, role, state, detail=""):
    return {"setting": setting, "role": role, "state": state, "detail": detail}


CLEAN = [result("kernel boot arguments", "edge_bootargs", "ok"), result("IRQ affinity", "edge_cpu", "ok"),
         result("nvpmodel mode", "edge_power", "ok")]
DRIFTED = [result("kernel boot arguments", "edge_bootargs", "pending-reboot", "to add: isolcpus=4-7"),
           result("IRQ affinity", "edge_cpu", "drifted", "IRQ 90 on 4-7"),
           result("sysctl kernel.sched_rt_runtime_us", "edge_cpu", "error", "OSError: [Errno 5]"),
           result("cpufreq policy4 governor", "edge_power", "drifted", "ondemand, not performance")]
FLEET = {
    "orin-nx-01": {"status": "ok", "cause": "", "seconds": 4.2, "results": CLEAN},
    "rock5b-02": {"status": "error", "cause": "could not check sysctl kernel.sched_rt_runtime_us",
                  "seconds": 5.1, "results": DRIFTED},
    "agx-orin-03": {"status": "unreachable", "cause": "Connection refused", "seconds": None, "results": []},
}


def rendered_fixtures():
    from edgetune import audit_report
    return {
        "device-clean.prom": prometheus_text("orin-nx-01", CLEAN, FINISHED_AT),
        "device-drifted.prom": prometheus_text("rock5b-02", DRIFTED, FINISHED_AT),
        "controller.prom": audit_report.prometheus(FLEET, FINISHED_AT),
    }


def test_fixtures_are_what_the_renderers_write_today():
    rendered = rendered_fixtures()
    assert sorted(rendered) == sorted(FIXTURE_NAMES)
    if os.environ.get("EDGETUNE_REGENERATE"):
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (FIXTURES / name).write_text(text)
    for name, text in rendered.items():
        assert (FIXTURES / name).read_text() == text, (
            "extras/prometheus/fixtures/%s is out of date: EDGETUNE_REGENERATE=1 pytest %s" % (name, __file__))


# --------------------------------------------------------------------------
# The text format, parsed here (names, HELP, TYPE, samples) to compare the two files.

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_labels(text):
    return tuple(sorted((name, bytes(value, "utf-8").decode("unicode_escape")) for name, value
                        in LABEL.findall(text or "")))


def parse_text(text):
    """{"help": {name: text}, "type": {name: type}, "samples": {(name, labels): value}}."""
    parsed = {"help": {}, "type": {}, "samples": {}}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _sep, help_text = line[len("# HELP "):].partition(" ")
            parsed["help"][name] = help_text
        elif line.startswith("# TYPE "):
            name, _sep, kind = line[len("# TYPE "):].partition(" ")
            parsed["type"][name] = kind
        elif line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, line
            parsed["samples"][(match.group(1), parse_labels(match.group(2)))] = float(match.group(3))
    return parsed


def test_both_textfiles_share_names_help_and_type_from_the_one_definition():
    device = parse_text(rendered_fixtures()["device-drifted.prom"])
    controller = parse_text(rendered_fixtures()["controller.prom"])
    definition = {m.name: (m.help, m.type) for m in edge_metrics.METRICS}
    for parsed, writer in ((device, edge_metrics.DEVICE), (controller, edge_metrics.CONTROLLER)):
        assert sorted(parsed["help"]) == sorted(edge_metrics.names(writer))
        for name in parsed["help"]:
            assert (parsed["help"][name], parsed["type"][name]) == definition[name]
    shared = set(device["help"]) & set(controller["help"])
    assert shared == set(edge_metrics.names(edge_metrics.DEVICE))
    assert {"edgetune_drift", "edgetune_device_drifted", "edgetune_drift_findings", "edgetune_reboot_pending",
            "edgetune_audit_errors", "edgetune_audit_last_run_timestamp_seconds"} <= shared
    assert {"edgetune_device_unreachable", "edgetune_device_audited",
            "edgetune_audit_duration_seconds"} == set(controller["help"]) - shared
    # One device's samples are the same in its own file and in the controller's.
    rock = {key: value for key, value in controller["samples"].items() if ("host", "rock5b-02") in key[1]
            and key[0] in shared}
    assert rock == {key: value for key, value in device["samples"].items()
                    if key[0] != "edgetune_audit_last_run_timestamp_seconds"}


def test_device_textfile_gauges():
    samples = parse_text(rendered_fixtures()["device-drifted.prom"])["samples"]
    host = (("host", "rock5b-02"),)
    assert samples[("edgetune_device_drifted", host)] == 1
    assert samples[("edgetune_reboot_pending", host)] == 1
    assert samples[("edgetune_audit_errors", host)] == 1
    assert samples[("edgetune_drift_findings", (("host", "rock5b-02"), ("role", "edge_cpu")))] == 1
    assert samples[("edgetune_drift_findings", (("host", "rock5b-02"), ("role", "edge_bootargs")))] == 0
    assert samples[("edgetune_audit_last_run_timestamp_seconds", ())] == FINISHED_AT
    clean = parse_text(rendered_fixtures()["device-clean.prom"])["samples"]
    assert [key for key, value in clean.items() if value and key[0] != "edgetune_drift"] == []


def test_label_values_are_escaped_and_round_trip():
    from prometheus_client.parser import text_string_to_metric_families
    text = prometheus_text('kiosk"1\\', [result('a\nb "c"', "edge_x", "drifted")], 1.5)
    drift = next(f for f in text_string_to_metric_families(text) if f.name == "edgetune_drift")
    assert drift.samples[0].labels == {"host": 'kiosk"1\\', "setting": 'a\nb "c"', "role": "edge_x",
                                       "state": "drifted"}


def test_render_refuses_what_the_definition_does_not_say():
    with pytest.raises(ValueError, match="not a metric the device writes"):
        edge_metrics.render({"edgetune_device_unreachable": [({"host": "a"}, 1)]}, edge_metrics.DEVICE)
    with pytest.raises(ValueError, match="takes the labels"):
        edge_metrics.render({"edgetune_device_drifted": [({"host": "a", "x": "y"}, 1)]}, edge_metrics.DEVICE)


def test_the_device_side_is_python_38_stdlib():
    """edge_metrics.py runs on the device (the audit timer): no third-party import (the collection's own
    error hierarchy is shipped with it, in the audit program's import closure), none of 3.9's syntax."""
    source = (ROOT / "plugins" / "module_utils" / "device" / "edge_metrics.py").read_text()
    imports = re.findall(r"^(?:from|import) (\S+)", source, re.M)
    assert set(imports) <= {"__future__", "collections", "math",
                            "ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error"}
    import ast
    ast.parse(source, feature_version=(3, 8))


# --------------------------------------------------------------------------
# promtool: the rules, their unit tests, both textfiles.

def promtool():
    found = shutil.which("promtool")
    if found:
        return found
    from edgetune_dev import host_packages
    if host_packages.is_debian_root():
        pytest.fail("promtool is missing: `make unit` installs it (Debian's package prometheus)")
    pytest.skip("promtool is not installed and this is not Debian as root (Debian: apt-get install prometheus)")


def run_promtool(*args, stdin=None):
    done = subprocess.run([promtool(), *args], input=stdin, cwd=str(EXTRAS), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_promtool_checks_the_rules():
    assert "SUCCESS" in run_promtool("check", "rules", RULES.name)


def test_promtool_unit_tests_of_the_rules_pass():
    assert "SUCCESS" in run_promtool("test", "rules", RULE_TESTS.name)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_promtool_accepts_both_textfiles(name):
    run_promtool("check", "metrics", stdin=rendered_fixtures()[name])


def rule_tests():
    return yaml.safe_load(RULE_TESTS.read_text())


def test_every_alert_has_a_firing_and_a_silent_case():
    alerts = [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
              if "alert" in rule]
    cases = {}
    for test in rule_tests()["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add("firing" if case.get("exp_alerts") else "silent")
    assert {alert: cases.get(alert) for alert in alerts} == {alert: {"firing", "silent"} for alert in alerts}


def test_rule_tests_feed_the_samples_of_the_fixture_textfiles():
    """Every input series is a sample of a fixture textfile (plus the labels a scrape adds), starting at its
    value there: the rules are tested against what the renderers really write."""
    fixtures = {}
    for name in FIXTURE_NAMES:
        fixtures.update(parse_text((FIXTURES / name).read_text())["samples"])
    scrape_labels = {"instance", "job"}
    for test in rule_tests()["tests"]:
        for series in test["input_series"]:
            match = SAMPLE.match(series["series"] + " 0")
            name, labels = match.group(1), parse_labels(match.group(2))
            if not name.startswith("edgetune_"):
                continue  # another exporter's series (the case of no edgetune metric at all)
            key = (name, tuple(label for label in labels if label[0] not in scrape_labels))
            assert key in fixtures, "%s is in no fixture textfile" % series["series"]
            first = re.match(r"[-+]?[\d.e+]+", series["values"]).group()
            assert float(first) == fixtures[key], series


# --------------------------------------------------------------------------
# Metric names in PromQL (the dashboard's queries and the rules' expressions).

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                "unless", "inf", "nan", "atan2"}


def metric_names(expr):
    """The metric names an expression reads: identifiers that are no function, keyword, label or duration."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)      # strings
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)                              # Grafana variables
    expr = re.sub(r"\{[^}]*\}", "", expr)                                      # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                                     # ranges, subqueries
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\boffset\s+\S+", " ", expr)
    found = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        if not match.group(2) and match.group(1).lower() not in PROMQL_WORDS:
            found.add(match.group(1))
    return found


def test_metric_names_parser():
    assert metric_names('sum by (role) (max by (host, role) (edgetune_drift_findings{host=~"$host"}))') == {
        "edgetune_drift_findings"}
    assert metric_names("time() - edgetune_audit_last_run_timestamp_seconds > 26 * 3600") == {
        "edgetune_audit_last_run_timestamp_seconds"}
    assert metric_names("last_over_time(a[7d]) unless on (instance) b or vector(0)") == {"a", "b"}


def dashboard_queries(dashboard):
    queries = []

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            queries.append(("panel %r" % panel.get("title"), target.get("expr", "")))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            label_values = re.match(r"^label_values\((.*),\s*\w+\)$", query)
            queries.append(("variable %r" % variable["name"], label_values.group(1) if label_values else query))
    return queries


def test_the_dashboard_queries_only_metrics_edgetune_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    assert queries, "the dashboard has no query"
    exported = set(edgetune_metrics_all())
    for where, expr in queries:
        assert expr.strip(), "%s has an empty query" % where
        names = metric_names(expr)
        assert names, "%s queries no metric: %s" % (where, expr)
        assert names <= exported, "%s queries %s, which edgetune does not export (edge_metrics.METRICS)" % (
            where, sorted(names - exported))
    # Every metric edgetune exports is on the dashboard.
    assert set().union(*(metric_names(expr) for _where, expr in queries)) == exported


def test_the_alert_rules_read_only_metrics_edgetune_exports():
    exprs = [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    names = set().union(*(metric_names(expr) for expr in exprs))
    assert names and names <= set(edgetune_metrics_all()), sorted(names - set(edgetune_metrics_all()))


def edgetune_metrics_all():
    return edge_metrics.names()


def test_the_collection_build_ships_extras_prometheus():
    """galaxy.yml's build_ignore leaves extras/ in the collection tarball."""
    ignored = yaml.safe_load((ROOT / "galaxy.yml").read_text())["build_ignore"]
    import fnmatch
    for path in (RULES, RULE_TESTS, DASHBOARD):
        relative = path.relative_to(ROOT).as_posix()
        parts = relative.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        assert not [pattern for pattern in ignored for prefix in prefixes + parts
                    if fnmatch.fnmatch(prefix, pattern)], relative
