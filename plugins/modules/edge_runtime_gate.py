#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_runtime_gate: health, scheduling and latency gates for a deployed runtime, on the device."""

DOCUMENTATION = r"""
---
module: edge_runtime_gate
short_description: Gate a runtime deploy on readiness, real thread scheduling and P99 latency measured on the device
description:
  - C(health) polls C(GET /healthz) on 127.0.0.1 until it answers 200, for at most O(health_timeout)
    seconds, while watching the unit with C(systemctl show); a unit that fails or restarts meanwhile
    ends the wait at once with its exit status, what that status means, and the unit's last log lines.
  - C(threads) reads every thread of the unit's main process from C(/proc/<pid>/task/*/stat) and
    C(status) (policy, RT priority, C(Cpus_allowed_list)) and fails when any thread differs from
    O(expect.policy), O(expect.priority) or O(expect.cpus). A unit that claims SCHED_FIFO but runs
    SCHED_OTHER therefore fails here. When O(expect.policy=other) and O(expect.fallback_reason) is set,
    the module warns C(running SCHED_OTHER - <reason>).
  - C(latency) sends O(requests) C(POST) requests (after O(warmup) unmeasured ones) over
    O(concurrency) keep-alive connections to 127.0.0.1, computes P50/P90/P99/max and QPS
    (nearest-rank percentiles) and fails when P99 exceeds O(p99_ms) or any request failed. The
    measured numbers are in the result and in the failure message.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  gates:
    description: The gates to run, in this order.
    type: list
    elements: str
    choices: [health, threads, latency]
    default: [health, threads, latency]
  service:
    description: The runtime's systemd unit.
    type: str
    default: edgetune-runtime.service
  port:
    description: The runtime's port on 127.0.0.1.
    type: int
    default: 8470
  health_path:
    description: The readiness endpoint.
    type: str
    default: /healthz
  health_timeout:
    description: Seconds to wait for readiness.
    type: float
    default: 60
  expect:
    description: The scheduling every thread must have.
    type: dict
    default: {}
    suboptions:
      policy:
        description: C(fifo), C(rr) or C(other); empty to skip.
        type: str
        default: ''
        choices: ['', fifo, rr, other]
      priority:
        description: The RT priority (for fifo and rr).
        type: int
      cpus:
        description: The allowed CPU list, for example C(4-7); empty to skip.
        type: str
        default: ''
      fallback_reason:
        description: Why the service runs SCHED_OTHER although FIFO was wanted; turned into a warning.
        type: str
        default: ''
      cpus_fallback_reason:
        description: Why the service runs unpinned although CPUs were wanted; turned into a warning.
        type: str
        default: ''
  requests:
    description: Measured requests for the latency gate.
    type: int
    default: 200
  warmup:
    description: Requests sent first and not measured.
    type: int
    default: 20
  concurrency:
    description: Parallel keep-alive connections.
    type: int
    default: 1
  body:
    description: The JSON body of each C(POST /infer).
    type: raw
    default: {sample: 0}
  p99_ms:
    description: The P99 limit in milliseconds.
    type: float
    default: 0
  request_timeout:
    description: Seconds before one request counts as failed.
    type: float
    default: 10
attributes:
  check_mode:
    description:
      - The gates only read C(/proc), query systemd and send requests to the runtime, so they run
        the same in check mode.
    support: full
  diff_mode:
    description: Changes nothing, so there is no difference to show.
    support: none
  platform:
    description: Runs on the board (Linux with systemd, Python 3.8 or later).
    support: full
    platforms: linux
"""

EXAMPLES = r"""
- name: Gate the deploy
  edge_runtime_gate:
    port: 8470
    health_timeout: 60
    expect: {policy: fifo, priority: 40, cpus: "4-7"}
    requests: 200
    p99_ms: 50
  register: gate
"""

RETURN = r"""
health:
  description: C(ready_s) (seconds this gate waited for C(/healthz) to answer 200), C(startup_s) (seconds from
    the process start to its READY notification, from systemd's timestamps) and the C(body) C(/healthz) returned.
  returned: when the health gate ran
  type: dict
service:
  description: The unit's C(ActiveState), C(SubState), C(MainPID), C(ExecMainStatus) and C(NRestarts).
  returned: always
  type: dict
threads:
  description: Every thread of the main process (tid, name, policy, rt_priority, cpus).
  returned: when the threads gate ran
  type: list
  elements: dict
latency:
  description: C(count), C(errors), C(p50_ms), C(p90_ms), C(p99_ms), C(max_ms), C(mean_ms), C(qps), C(p99_limit_ms).
  returned: when the latency gate ran
  type: dict
"""

import http.client  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_cpulist import parse_cpulist  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_latency import run_load  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_sched import fmt, thread_mismatches, threads_of  # noqa: E402

# What the unit's exit status means: the runtime's own codes (runtime/README.md)
# and systemd's (systemd.exec(5), "Process exit codes").
EXIT_MEANING = {
    1: "unexpected error in the runtime",
    2: "bad arguments or environment",
    3: "engine rejected at load (format, shapes or file)",
    4: "warm-up failed (the engine's golden results did not match)",
    5: "cannot listen on the port (in use or not permitted)",
    200: "CHDIR", 203: "EXEC (the interpreter or launcher is missing)", 214: "SETSCHEDULER (SCHED_FIFO refused)",
    215: "CPUAFFINITY (the CPUs are not available)", 216: "GROUP", 217: "USER (the service user is missing)",
    226: "NAMESPACE (sandboxing could not be set up)",
}


class GateError(Exception):
    pass


def unit_state(module, service):
    systemctl = module.get_bin_path("systemctl", required=True)
    props = ["ActiveState", "SubState", "MainPID", "ExecMainStatus", "NRestarts", "Result",
             "InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic"]
    rc, out, err = module.run_command([systemctl, "show"] + ["--property=" + p for p in props] + [service])
    if rc != 0:
        raise GateError("systemctl show %s failed: %s" % (service, err.strip()))
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for key in ("MainPID", "ExecMainStatus", "NRestarts", "InactiveExitTimestampMonotonic",
                "ActiveEnterTimestampMonotonic"):
        try:
            state[key] = int(state.get(key) or 0)
        except ValueError:
            state[key] = 0
    return state


def journal_tail(module, service, lines=6):
    journalctl = module.get_bin_path("journalctl")
    if not journalctl:
        return ""
    rc, out, _err = module.run_command([journalctl, "-u", service, "-n", str(lines), "--no-pager", "-o", "cat"])
    return " | ".join(line.strip() for line in out.splitlines() if line.strip()) if rc == 0 else ""


def describe_failure(module, service, state):
    status = state["ExecMainStatus"]
    return "%s is %s/%s (result %s, exit status %d: %s); last log: %s" % (
        service, state.get("ActiveState"), state.get("SubState"), state.get("Result"), status,
        EXIT_MEANING.get(status, "see the log"), journal_tail(module, service) or "(none)")


def get_json(port, path, timeout=2.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        data = response.read()
        try:
            body = json.loads(data.decode("utf-8"))
        except ValueError:
            body = {"raw": data[:200].decode("utf-8", "replace")}
        return response.status, body
    finally:
        conn.close()


def gate_health(module, params, result):
    began = time.monotonic()
    deadline = began + params["health_timeout"]
    last = "no answer yet"
    while True:
        state = unit_state(module, params["service"])
        result["service"] = state
        if state.get("ActiveState") == "failed" or state["NRestarts"] > 0 or (
                state.get("ActiveState") == "inactive" and time.monotonic() - began > 2.0):
            raise GateError("health gate: %s" % describe_failure(module, params["service"], state))
        try:
            status, body = get_json(params["port"], params["health_path"])
            if status == 200:
                result["health"] = {"ready_s": round(time.monotonic() - began, 3), "body": body}
                state = unit_state(module, params["service"])
                result["service"] = state
                # Type=notify: systemd marks the unit active at READY=1, so this is start-to-ready.
                start, ready = state["InactiveExitTimestampMonotonic"], state["ActiveEnterTimestampMonotonic"]
                if start and ready >= start:
                    result["health"]["startup_s"] = round((ready - start) / 1e6, 3)
                return
            last = "HTTP %d %s" % (status, body.get("status", ""))
        except (OSError, http.client.HTTPException) as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise GateError("health gate: %s not ready within %.0f s (last answer from 127.0.0.1:%d%s: %s); "
                            "last log: %s" % (params["service"], params["health_timeout"], params["port"],
                                              params["health_path"], last,
                                              journal_tail(module, params["service"]) or "(none)"))
        time.sleep(0.2)


def gate_threads(module, params, result):
    state = unit_state(module, params["service"])
    result["service"] = state
    pid = state["MainPID"]
    threads = threads_of(pid) if pid else []
    result["threads"] = [dict(t, cpus=fmt(t["cpus"])) for t in threads]
    if not threads:
        raise GateError("threads gate: %s has no running main process (%s)"
                        % (params["service"], describe_failure(module, params["service"], state)))
    expect = params["expect"] or {}
    cpus = parse_cpulist(expect["cpus"]) if expect.get("cpus") else None
    problems = thread_mismatches(threads, expect.get("policy") or None, expect.get("priority"), cpus)
    if problems:
        raise GateError("threads gate: %d of %d threads of %s (pid %d) do not run as intended: %s" % (
            len(problems), len(threads), params["service"], pid, "; ".join(problems)))
    if expect.get("policy") == "other" and expect.get("fallback_reason"):
        module.warn("running SCHED_OTHER: %s" % expect["fallback_reason"])
    if not expect.get("cpus") and expect.get("cpus_fallback_reason"):
        module.warn("running unpinned: %s" % expect["cpus_fallback_reason"])


def gate_latency(module, params, result):
    body = params["body"]
    if not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    stats = run_load("127.0.0.1", params["port"], "/infer", body, params["requests"], params["concurrency"],
                     params["warmup"], params["request_timeout"])
    stats["p99_limit_ms"] = params["p99_ms"]
    result["latency"] = stats
    summary = "P50 %s ms, P90 %s ms, P99 %s ms, max %s ms, %s QPS over %d requests (%d errors)" % (
        stats["p50_ms"], stats["p90_ms"], stats["p99_ms"], stats["max_ms"], stats["qps"], stats["count"],
        stats["errors"])
    if stats["errors"]:
        raise GateError("latency gate: %d of %d requests failed (first: %s); %s" % (
            stats["errors"], stats["errors"] + stats["count"], stats["first_error"], summary))
    if params["p99_ms"] > 0 and stats["p99_ms"] > params["p99_ms"]:
        raise GateError("latency gate: P99 %s ms is over the limit of %s ms (edge_runtime_p99_ms); %s" % (
            stats["p99_ms"], params["p99_ms"], summary))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gates=dict(type="list", elements="str", default=["health", "threads", "latency"],
                       choices=["health", "threads", "latency"]),
            service=dict(type="str", default="edgetune-runtime.service"),
            port=dict(type="int", default=8470),
            health_path=dict(type="str", default="/healthz"),
            health_timeout=dict(type="float", default=60),
            expect=dict(type="dict", default={}, options=dict(
                policy=dict(type="str", default="", choices=["", "fifo", "rr", "other"]),
                priority=dict(type="int"),
                cpus=dict(type="str", default=""),
                fallback_reason=dict(type="str", default=""),
                cpus_fallback_reason=dict(type="str", default=""))),
            requests=dict(type="int", default=200),
            warmup=dict(type="int", default=20),
            concurrency=dict(type="int", default=1),
            body=dict(type="raw", default={"sample": 0}),
            p99_ms=dict(type="float", default=0),
            request_timeout=dict(type="float", default=10),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["requests"] < 1 or params["concurrency"] < 1 or params["warmup"] < 0:
        module.fail_json(msg="requests and concurrency must be at least 1, warmup 0 or more")
    if (params["expect"] or {}).get("cpus"):
        try:
            parse_cpulist(params["expect"]["cpus"])
        except ValueError as exc:
            module.fail_json(msg="expect.cpus: %s" % exc)
    result = {"changed": False}
    gates = {"health": gate_health, "threads": gate_threads, "latency": gate_latency}
    try:
        for name in params["gates"]:
            gates[name](module, params, result)
    except GateError as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
