# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Callback edge_summary: one short line per host at the end of a run.

State, board, release, the play's counts (ok, changed, failed, skipped) and the
runtime's deploy gate result, then the wall time of the run: what a person wants
to see after `ansible-playbook site.yml`. With -v, the names of the tasks that
changed something and what the gate measured follow each host's line; the JSON
lines file (EDGETUNE_SUMMARY_JSON) always has both.
"""

DOCUMENTATION = r"""
name: edge_summary
type: aggregate
short_description: Fleet summary (board, release, changes) at the end of a run
description:
  - Prints one short line per host - whether it failed or was unreachable, the board profile, the L4T or
    BSP release, the play's counts of ok, changed, failed and skipped tasks, and whether the runtime's deploy
    gate (C(edge_runtime_gate)) passed - then the wall time of the run.
  - With C(-v) (verbosity 1 or more), each host's line is followed by the names of the tasks that changed
    something (or would, in check mode), one a line, and by what the deploy gate measured on the device -
    request latency, or for an LLM the time to first token, the inter-token P50 and P99 and the tokens/s.
author:
  - edgetune contributors (!UNKNOWN)
version_added: "0.1.0"
requirements:
  - Enabled in C(ansible.cfg) (C(callbacks_enabled = edgetune.fleet.edge_summary)) or with
    E(ANSIBLE_CALLBACKS_ENABLED).
notes:
  - Set E(EDGETUNE_NO_SUMMARY) to leave the summary out (machine-readable runs such as C(edgetune audit)).
  - Set E(EDGETUNE_SUMMARY_JSON) to a file path to have each run append one JSON line to it, for dashboards
    and CI, printed or not - C(playbook), C(check_mode), C(wall_s), and per host its C(state) (C(ok),
    C(FAILED), C(UNREACHABLE)), C(board), C(release), C(changed) (the names of the tasks that changed, or
    would in check mode, in the order they ran, whatever the verbosity), C(gate) (what the gate measured),
    C(gate_result) (C(passed), C(failed) or null where no gate ran) and C(counts) (the play's C(ok),
    C(changed), C(failures), C(skipped), C(unreachable), C(rescued) and C(ignored), as in the recap).
  - Hosts without a board profile that ran without failing (such as C(localhost)) are left out.
"""

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from ansible import context  # noqa: E402
from ansible.plugins.callback import CallbackBase  # noqa: E402


def gate_line(gate):
    """What edge_runtime_gate measured, in one line; None when it measured no latency (or its
    result is not shaped as the module documents: the summary never fails a run)."""
    try:
        return _gate_line(gate)
    except (KeyError, TypeError, AttributeError):
        return None


def _gate_line(gate):
    tokens = gate.get("token_latency")
    if tokens:
        return ("time to first token P50 %s ms, P99 %s ms; inter-token P50 %s ms, P99 %s ms; %s tokens/s "
                "(%s generations on the device)" % (
                    tokens["ttft"]["p50_ms"], tokens["ttft"]["p99_ms"], tokens["inter_token"]["p50_ms"],
                    tokens["inter_token"]["p99_ms"], tokens["tokens_per_s"], tokens["runs"]))
    latency = gate.get("latency")
    if latency:
        return "request latency P50 %s ms, P99 %s ms, %s QPS (%s requests on the device)" % (
            latency["p50_ms"], latency["p99_ms"], latency["qps"], latency["count"])
    return None


def is_gate(result):
    return result._task.action.split(".")[-1] == "edge_runtime_gate"


# The audit's states that are findings (ok and unsupported are not).
FINDINGS = ("drifted", "pending-reboot", "error")


def is_audit(result):
    return result._task.action.split(".")[-1] == "edge_audit" and isinstance(result._result.get("summary"), dict)


def host_line(name, entry):
    """One short line: host, state, board, release, the recap's counts and the gate's result; the
    changed tasks' names and the gate's numbers are for -v and the JSON lines file."""
    counts = entry.get("counts") or {}
    gate = {"passed": "  gate passed", "failed": "  gate FAILED"}.get(entry.get("gate_result"), "")
    return "%-24s %-11s %-27s %-12s ok=%d changed=%d failed=%d skipped=%d%s" % (
        name, entry["state"], entry["board"], entry["release"], counts.get("ok", 0), counts.get("changed", 0),
        counts.get("failures", 0), counts.get("skipped", 0), gate)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "edge_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.started = time.time()
        self.hosts = {}
        self.playbook = None

    def v2_playbook_on_start(self, playbook):
        self.playbook = getattr(playbook, "_file_name", None)

    def host(self, result):
        return self.hosts.setdefault(result._host.get_name(), {
            "board": "?", "release": "?", "changed": [], "state": "ok", "gate": None, "gate_result": None,
            "counts": {}})

    def v2_runner_on_ok(self, result):
        entry = self.host(result)
        facts = result._result.get("ansible_facts") or {}
        edge = facts.get("edge")
        if edge:
            l4t, bsp = edge.get("l4t"), edge.get("bsp") or {}
            entry["release"] = ("L4T %s" % l4t["version"]) if l4t else "%s %s" % (bsp.get("name"), bsp.get("version"))
        if facts.get("edge_facts_profile"):
            entry["board"] = facts["edge_facts_profile"]["title"]
        if result._result.get("changed") and result._task.get_name() not in entry["changed"]:
            entry["changed"].append(result._task.get_name())
        if is_gate(result):
            entry["gate"] = gate_line(result._result) or entry["gate"]
            entry["gate_result"] = "passed"
        if is_audit(result) and any(result._result["summary"].get(state) for state in FINDINGS):
            entry["findings"] = result._result.get("msg")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        entry = self.host(result)
        if is_gate(result):
            entry["gate_result"] = "failed"

    def v2_runner_on_unreachable(self, result):
        self.host(result)

    def v2_playbook_on_stats(self, stats):
        for name, entry in self.hosts.items():
            # The play's own count: a failure a block rescued is not a failed host.
            counts = entry["counts"] = stats.summarize(name)
            entry["state"] = ("UNREACHABLE" if counts["unreachable"] else
                              "FAILED" if counts["failures"] else "ok")
        wall = time.time() - self.started
        if os.environ.get("EDGETUNE_SUMMARY_JSON"):
            self.append_json(os.environ["EDGETUNE_SUMMARY_JSON"], wall)
        if os.environ.get("EDGETUNE_NO_SUMMARY"):  # machine-readable runs (edgetune audit)
            return
        self._display.banner("EDGETUNE FLEET SUMMARY")
        verbose = self._display.verbosity >= 1
        hidden = False
        for name in sorted(self.hosts):
            entry = self.hosts[name]
            if entry["board"] == "?" and entry["state"] == "ok":
                continue  # not a device (e.g. localhost in molecule's create step)
            self._display.display(host_line(name, entry))
            if entry.get("findings"):  # an audit's: the reason to run it, so always shown
                self._display.display("    audit: %s" % entry["findings"])
            if verbose:
                for task in entry["changed"]:
                    self._display.display("    changed: %s" % task)
                if entry["gate"]:
                    self._display.display("    gate: %s" % entry["gate"])
            hidden = hidden or bool(entry["changed"] or entry["gate"])
        if hidden and not verbose:  # said once per run, not per host
            self._display.display("(with -v: each host's changed tasks and gate measurements%s)" % (
                "; also in %s" % os.environ["EDGETUNE_SUMMARY_JSON"] if os.environ.get("EDGETUNE_SUMMARY_JSON")
                else ""))
        self._display.display("wall time: %.1f s" % wall)

    def append_json(self, path, wall):
        line = json.dumps({"playbook": self.playbook, "check_mode": bool(context.CLIARGS.get("check")),
                           "wall_s": round(wall, 1), "hosts": self.hosts}, sort_keys=True)
        try:
            with open(path, "a") as handle:
                handle.write(line + "\n")
        except OSError as err:  # the summary never fails a run
            self._display.warning("edge_summary: cannot append to %s: %s" % (path, err))
