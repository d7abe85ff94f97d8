# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Callback edge_summary: one line per host at the end of a run.

Board, release, the tasks that changed something, reboots, what the runtime's
deploy gate measured on the device, and the wall time of the run: what a person
wants to see after `ansible-playbook site.yml`.
"""

DOCUMENTATION = r"""
name: edge_summary
type: aggregate
short_description: Fleet summary (board, release, changes) at the end of a run
description:
  - Prints, per host, the board profile, the L4T or BSP release, the changed tasks and
    whether the host failed or was unreachable, then the wall time of the run.
  - Where the runtime's deploy gate measured latency on the device (C(edge_runtime_gate)), a second
    line gives it, for an LLM the time to first token and the inter-token P50 and P99 and the tokens/s.
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
    would in check mode, in the order they ran) and C(gate).
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
            "board": "?", "release": "?", "changed": [], "state": "ok", "gate": None})

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
        if result._task.action.split(".")[-1] == "edge_runtime_gate":
            entry["gate"] = gate_line(result._result) or entry["gate"]

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self.host(result)

    def v2_runner_on_unreachable(self, result):
        self.host(result)

    def v2_playbook_on_stats(self, stats):
        for name, entry in self.hosts.items():
            # The play's own count: a failure a block rescued is not a failed host.
            counts = stats.summarize(name)
            entry["state"] = ("UNREACHABLE" if counts["unreachable"] else
                              "FAILED" if counts["failures"] else "ok")
        wall = time.time() - self.started
        if os.environ.get("EDGETUNE_SUMMARY_JSON"):
            self.append_json(os.environ["EDGETUNE_SUMMARY_JSON"], wall)
        if os.environ.get("EDGETUNE_NO_SUMMARY"):  # machine-readable runs (edgetune audit)
            return
        self._display.banner("EDGETUNE FLEET SUMMARY")
        for name in sorted(self.hosts):
            entry = self.hosts[name]
            if entry["board"] == "?" and entry["state"] == "ok":
                continue  # not a device (e.g. localhost in molecule's create step)
            changes = ", ".join(entry["changed"]) if entry["changed"] else "no change"
            self._display.display("%-24s %-6s %-34s %-14s %s" % (
                name, entry["state"], entry["board"], entry["release"], changes))
            if entry["gate"]:
                self._display.display("%-24s gate: %s" % ("", entry["gate"]))
        self._display.display("wall time: %.1f s" % wall)

    def append_json(self, path, wall):
        line = json.dumps({"playbook": self.playbook, "check_mode": bool(context.CLIARGS.get("check")),
                           "wall_s": round(wall, 1), "hosts": self.hosts}, sort_keys=True)
        try:
            with open(path, "a") as handle:
                handle.write(line + "\n")
        except OSError as err:  # the summary never fails a run
            self._display.warning("edge_summary: cannot append to %s: %s" % (path, err))
