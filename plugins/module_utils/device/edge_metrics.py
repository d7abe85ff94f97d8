# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Prometheus metrics of the drift audit: one definition, one renderer.

Both node_exporter textfiles come from here: the on-device audit timer's
(plugins/modules/edge_audit.py --prometheus, role edge_audit_timer) and the
controller's (`edgetune audit --prometheus`, tools/edgetune/audit_report.py).
METRICS holds every name, type, label set and HELP text; the alert rules and
the Grafana dashboard in extras/prometheus/ name only these (tests check it).
render() writes the Prometheus text exposition format itself (each family once,
HELP and TYPE first, label values escaped), so the device needs no client
library.  Python 3.8+, stdlib only.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import math
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

# Who writes a family: the device's own audit timer, the controller's `edgetune audit`, or both.
DEVICE = "device"
CONTROLLER = "controller"
BOTH = (DEVICE, CONTROLLER)

Metric = collections.namedtuple("Metric", "name type labels help writers")

METRICS = (
    Metric("edgetune_drift", "gauge", ("host", "setting", "role", "state"),
           "1 for the state each managed setting of a device is in.", BOTH),
    Metric("edgetune_device_drifted", "gauge", ("host",),
           "1 if a managed setting of the device drifted from the desired state, else 0.", BOTH),
    Metric("edgetune_drift_findings", "gauge", ("host", "role"),
           "Managed settings of the role found drifted on the device.", BOTH),
    Metric("edgetune_reboot_pending", "gauge", ("host",),
           "1 if a boot-only setting is persisted but waits for a reboot to run, else 0.", BOTH),
    Metric("edgetune_audit_errors", "gauge", ("host",),
           "Settings of the device the audit could not check (a failed device audit counts 1).", BOTH),
    Metric("edgetune_audit_last_run_timestamp_seconds", "gauge", (),
           "When the last audit finished (Unix time).", BOTH),
    Metric("edgetune_device_audited", "gauge", ("host", "status"),
           "1 if the device answered the audit (0: no result), by its status.", (CONTROLLER,)),
    Metric("edgetune_device_unreachable", "gauge", ("host",),
           "1 if the controller could not reach the device to audit it, else 0.", (CONTROLLER,)),
    Metric("edgetune_audit_duration_seconds", "gauge", ("host",),
           "Seconds from the device's first task to its audit result.", (CONTROLLER,)),
)
BY_NAME = dict((metric.name, metric) for metric in METRICS)


def names(writer=None):
    """The metric names (of one writer, or all)."""
    return [metric.name for metric in METRICS if writer is None or writer in metric.writers]


def escape_label(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def render(samples, writer):
    """The textfile of ``writer``: every family it writes, in METRICS order, with its samples.

    ``samples``: {name: [({label: value}, number), ...]}. A name not in METRICS,
    one the writer does not write, or labels other than the definition's is a
    ValueError (the one definition cannot be bypassed)."""
    for name, rows in samples.items():
        metric = BY_NAME.get(name)
        if metric is None or writer not in metric.writers:
            raise BadInput("%s is not a metric the %s writes (edge_metrics.METRICS)" % (name, writer))
        for labels, _value in rows:
            if sorted(labels) != sorted(metric.labels):
                raise BadInput("%s takes the labels %s, not %s" % (name, list(metric.labels), sorted(labels)))
    lines = []
    for metric in METRICS:
        if writer not in metric.writers:
            continue
        lines.append("# HELP %s %s" % (metric.name, escape_help(metric.help)))
        lines.append("# TYPE %s %s" % (metric.name, metric.type))
        for labels, value in samples.get(metric.name, ()):
            text = ",".join('%s="%s"' % (label, escape_label(labels[label])) for label in metric.labels)
            lines.append("%s%s %s" % (metric.name, "{%s}" % text if text else "", format_value(value)))
    return "\n".join(lines) + "\n"


def device_samples(host, results, samples=None):
    """Add one device's audit ``results`` (dicts with setting, role, state) to ``samples``.

    edgetune_drift: one sample per setting; edgetune_device_drifted and
    edgetune_reboot_pending: 0/1; edgetune_drift_findings: the drifted settings
    of each role seen (0 included); edgetune_audit_errors: settings in error."""
    samples = {} if samples is None else samples

    def add(name, labels, value):
        samples.setdefault(name, []).append((dict(labels, host=host), value))

    per_role = collections.OrderedDict()
    for result in results:
        role = result.get("role") or ""
        add("edgetune_drift", {"setting": result["setting"], "role": role, "state": result["state"]}, 1)
        per_role[role] = per_role.get(role, 0) + (1 if result["state"] == "drifted" else 0)
    states = [result["state"] for result in results]
    add("edgetune_device_drifted", {}, 1 if "drifted" in states else 0)
    for role in sorted(per_role):
        add("edgetune_drift_findings", {"role": role}, per_role[role])
    add("edgetune_reboot_pending", {}, 1 if "pending-reboot" in states else 0)
    add("edgetune_audit_errors", {}, states.count("error"))
    return samples


def with_new_timestamp(text, finished_at):
    """A textfile ``text`` (the last audit's, or None) with its last-run timestamp set to ``finished_at``:
    what the timer writes when it skips an audit because an apply holds the device, so that the
    skipped run counts as a run (not a dead timer) and the last results stand."""
    name = "edgetune_audit_last_run_timestamp_seconds"
    sample = "%s %s" % (name, format_value(finished_at))
    lines = (text or "").splitlines()
    if any(line.split(" ", 1)[0] == name for line in lines):
        return "\n".join(sample if line.split(" ", 1)[0] == name else line for line in lines) + "\n"
    return (text or "") + render({name: [({}, finished_at)]}, DEVICE)


def device_textfile(host, results, finished_at):
    """The on-device audit timer's textfile (node_exporter's textfile collector)."""
    samples = device_samples(host, results)
    samples["edgetune_audit_last_run_timestamp_seconds"] = [({}, finished_at)]
    return render(samples, DEVICE)
