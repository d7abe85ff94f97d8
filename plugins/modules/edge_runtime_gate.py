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
  - C(stream) (an LLM server such as llama.cpp's C(llama-server)) runs O(warmup_generations) then
    O(generations) streamed completions of O(prompt) (C(POST) O(stream_path) with C(stream) true,
    temperature 0, O(max_tokens) each), takes the time from sending each request to its first token
    (TTFT) and the gaps between its tokens as they arrive, and fails when the P99 of either is over
    O(ttft_p99_ms) or O(token_p99_ms) (0 is no limit).
  - C(golden) streams the prompt of O(golden) at temperature 0 and compares the first tokens with
    its C(tokens), the record the packager made of the same engine; a difference means a corrupt
    or different model or runtime, and the gate refuses it, naming the first differing token.
  - C(latency) sends O(requests) C(POST) requests (after O(warmup) unmeasured ones) over
    O(concurrency) keep-alive connections to 127.0.0.1, computes P50/P90/P99/max and QPS
    (nearest-rank percentiles) and fails when P99 exceeds O(p99_ms) or any request failed. The
    measured numbers are in the result and in the failure message.
version_added: "0.1.0"
requirements:
  - systemd on the board
author:
  - edgetune contributors (!UNKNOWN)
options:
  gates:
    description: The gates to run, in this order.
    type: list
    elements: str
    choices: [health, threads, latency, stream, golden]
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
    description: Seconds before one request (a whole generation for C(stream) and C(golden)) counts as failed.
    type: float
    default: 10
  stream_path:
    description: The OpenAI-compatible streaming completions endpoint.
    type: str
    default: /v1/completions
  prompt:
    description: The prompt of the C(stream) gate's generations.
    type: str
    default: Once upon a time
  max_tokens:
    description: Tokens per generation of the C(stream) gate (at least 2, so that there are gaps to measure).
    type: int
    default: 32
  generations:
    description: Measured generations of the C(stream) gate.
    type: int
    default: 5
  warmup_generations:
    description: Generations run first and not measured.
    type: int
    default: 1
  ttft_p99_ms:
    description: The limit of the time to first token's P99, in milliseconds; 0 is no limit.
    type: float
    default: 0
  token_p99_ms:
    description: The limit of the inter-token gap's P99, in milliseconds; 0 is no limit.
    type: float
    default: 0
  golden:
    description:
      - The engine manifest's record of a known prompt's first tokens at temperature 0 (its C(golden) key,
        passed whole). The gate reads C(prompt) (a string), C(tokens) (the first tokens, one string each, as
        the packager streamed them) and C(max_tokens) (tokens to generate, default the number recorded);
        the record's other keys (C(text), C(recorded_with), ...) are ignored.
    type: dict
    default: {}
  golden_tokens:
    description:
      - Generate and compare only the first N recorded tokens; 0 compares them all. Fewer tokens still catch
        a wrong model, less surely, on hosts where each token costs seconds (an emulated machine).
    type: int
    default: 0
attributes:
  check_mode:
    description:
      - The gates only read C(/proc), query systemd and send requests to the runtime, so they run
        the same in check mode.
    support: full
extends_documentation_fragment:
  - edgetune.fleet.edge
  - edgetune.fleet.edge.reads_only
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

- name: Gate an LLM server (llama-server) on token latency and its first tokens
  edge_runtime_gate:
    gates: [health, threads, golden, stream]
    service: edgetune-llm.service
    port: 8471
    health_path: /health
    expect: {policy: fifo, priority: 40, cpus: "4-7"}
    golden: "{{ engine_manifest.golden }}"
    generations: 5
    max_tokens: 32
    ttft_p99_ms: 500
    token_p99_ms: 60
    request_timeout: 60
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
token_latency:
  description: C(runs), C(tokens), C(ttft) and C(inter_token) (each C(count), C(p50_ms), C(p99_ms), C(max_ms)),
    C(tokens_per_s), C(ttft_p99_limit_ms), C(token_p99_limit_ms).
  returned: when the stream gate ran
  type: dict
latency_summary:
  description: The latency the gates measured (or that no latency gate ran), on one line, as the deploy reports it.
  returned: success
  type: str
  sample: P50 3.1 ms, P99 4.8 ms (limit 50 ms), max 6.2 ms, 310.5 QPS over 200 requests measured on the device
golden:
  description: C(prompt), C(expected) and C(observed) first tokens.
  returned: when the golden gate ran
  type: dict
"""

import json  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import parse_cpulist  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_command  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_latency import run_load  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_llm import (  # noqa: E402
    LLMError,
    golden_problems,
    latency_problems,
    measure,
    stream_completion,
    wait_ready,
)
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_sched import fmt, thread_mismatches, threads_of  # noqa: E402

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


def unit_state(module, service):
    systemctl = module.get_bin_path("systemctl", required=True)
    props = ["ActiveState", "SubState", "MainPID", "ExecMainStatus", "NRestarts", "Result",
             "InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic"]
    rc, out, err = edge_command.run([systemctl, "show"] + ["--property=" + p for p in props] + [service])
    if rc != 0:
        raise EdgeError("systemctl show %s failed: %s" % (service, err.strip()))
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
    rc, out, _err = edge_command.run([journalctl, "-u", service, "-n", str(lines), "--no-pager", "-o", "cat"])
    return " | ".join(line.strip() for line in out.splitlines() if line.strip()) if rc == 0 else ""


def describe_failure(module, service, state):
    status = state["ExecMainStatus"]
    return "%s is %s/%s (result %s, exit status %d: %s); last log: %s" % (
        service, state.get("ActiveState"), state.get("SubState"), state.get("Result"), status,
        EXIT_MEANING.get(status, "see the log"), journal_tail(module, service) or "(none)")


def gate_health(module, params, result):
    began = time.monotonic()
    # systemd keeps counting restarts across a manual restart (a rollback right after a release
    # that crashed): only a restart during the wait counts.
    restarts = unit_state(module, params["service"])["NRestarts"]

    def unit_alive():
        state = unit_state(module, params["service"])
        result["service"] = state
        if state.get("ActiveState") == "failed" or state["NRestarts"] > restarts or (
                state.get("ActiveState") == "inactive" and time.monotonic() - began > 2.0):
            raise EdgeError("health gate: %s" % describe_failure(module, params["service"], state))

    try:
        result["health"] = wait_ready(params["port"], params["health_path"], params["health_timeout"],
                                      check=unit_alive)
    except LLMError as exc:
        raise EdgeError("health gate: %s %s; last log: %s" % (
            params["service"], exc, journal_tail(module, params["service"]) or "(none)")) from None
    state = unit_state(module, params["service"])
    result["service"] = state
    # Type=notify: systemd marks the unit active at READY=1, so this is start-to-ready.
    start, ready = state["InactiveExitTimestampMonotonic"], state["ActiveEnterTimestampMonotonic"]
    if start and ready >= start:
        result["health"]["startup_s"] = round((ready - start) / 1e6, 3)


def gate_threads(module, params, result):
    state = unit_state(module, params["service"])
    result["service"] = state
    pid = state["MainPID"]
    threads = threads_of(pid) if pid else []
    result["threads"] = [dict(t, cpus=fmt(t["cpus"])) for t in threads]
    if not threads:
        raise EdgeError("threads gate: %s has no running main process (%s)"
                        % (params["service"], describe_failure(module, params["service"], state)))
    expect = params["expect"] or {}
    cpus = parse_cpulist(expect["cpus"]) if expect.get("cpus") else None
    problems = thread_mismatches(threads, expect.get("policy") or None, expect.get("priority"), cpus)
    if problems:
        raise EdgeError("threads gate: %d of %d threads of %s (pid %d) do not run as intended: %s" % (
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
        raise EdgeError("latency gate: %d of %d requests failed (first: %s); %s" % (
            stats["errors"], stats["errors"] + stats["count"], stats["first_error"], summary))
    if params["p99_ms"] > 0 and stats["p99_ms"] > params["p99_ms"]:
        raise EdgeError("latency gate: P99 %s ms is over the limit of %s ms (edge_runtime_p99_ms); %s" % (
            stats["p99_ms"], params["p99_ms"], summary))


def gate_stream(module, params, result):
    try:
        summary, _runs = measure(params["port"], params["prompt"], params["max_tokens"], params["generations"],
                                 params["warmup_generations"], timeout=params["request_timeout"],
                                 path=params["stream_path"])
    except LLMError as exc:
        raise EdgeError("stream gate: %s" % exc) from None
    summary.update(ttft_p99_limit_ms=params["ttft_p99_ms"], token_p99_limit_ms=params["token_p99_ms"])
    result["token_latency"] = summary
    text = "TTFT P50 %s ms, P99 %s ms; inter-token P50 %s ms, P99 %s ms; %s tokens/s over %d generations" % (
        summary["ttft"]["p50_ms"], summary["ttft"]["p99_ms"], summary["inter_token"]["p50_ms"],
        summary["inter_token"]["p99_ms"], summary["tokens_per_s"], summary["runs"])
    problems = latency_problems(summary, params["ttft_p99_ms"], params["token_p99_ms"])
    if problems:
        raise EdgeError("stream gate: %s; %s" % ("; ".join(problems), text))


def gate_golden(module, params, result):
    golden = params["golden"] or {}
    if not golden.get("prompt") or not golden.get("tokens"):
        raise EdgeError("golden gate: no record to compare with: pass the engine manifest's golden "
                        "(prompt and tokens)")
    tokens, count = golden["tokens"], golden.get("max_tokens") or len(golden["tokens"])
    if not isinstance(golden["prompt"], str) or not isinstance(tokens, list) or \
            not all(isinstance(t, str) for t in tokens) or not isinstance(count, int) or count < 1:
        raise EdgeError("golden gate: golden must have a string prompt, a list of string tokens and a positive "
                        "max_tokens (the engine manifest's golden record), not %s" % json.dumps(golden)[:200])
    if params["golden_tokens"]:
        # Only the first N recorded tokens: at temperature 0 they are the same prefix.
        golden = dict(golden, tokens=tokens[:params["golden_tokens"]])
        count = min(count, params["golden_tokens"])
    try:
        run = stream_completion(params["port"], golden["prompt"], count, timeout=params["request_timeout"],
                                path=params["stream_path"], require_tokens=False)
    except LLMError as exc:
        raise EdgeError("golden gate: %s" % exc) from None
    result["golden"] = {"prompt": golden["prompt"], "expected": list(golden["tokens"]), "observed": run["tokens"]}
    problems = golden_problems(run["tokens"], golden)
    if problems:
        raise EdgeError("golden gate: refusing the engine: %s" % "; ".join(problems))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gates=dict(type="list", elements="str", default=["health", "threads", "latency"],
                       choices=["health", "threads", "latency", "stream", "golden"]),
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
            stream_path=dict(type="str", default="/v1/completions"),
            prompt=dict(type="str", default="Once upon a time"),
            max_tokens=dict(type="int", default=32, no_log=False),
            generations=dict(type="int", default=5),
            warmup_generations=dict(type="int", default=1),
            ttft_p99_ms=dict(type="float", default=0),
            token_p99_ms=dict(type="float", default=0, no_log=False),
            golden=dict(type="dict", default={}),
            golden_tokens=dict(type="int", default=0, no_log=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["requests"] < 1 or params["concurrency"] < 1 or params["warmup"] < 0:
        module.fail_json(msg="requests and concurrency must be at least 1, warmup 0 or more")
    if params["generations"] < 1 or params["warmup_generations"] < 0 or params["max_tokens"] < 2 \
            or params["golden_tokens"] < 0:
        module.fail_json(msg="generations must be at least 1, warmup_generations and golden_tokens 0 or more and "
                             "max_tokens at least 2 (one gap between two tokens)")
    if (params["expect"] or {}).get("cpus"):
        try:
            parse_cpulist(params["expect"]["cpus"])
        except ValueError as exc:
            module.fail_json(msg="expect.cpus: %s" % exc)
    result = {"changed": False}
    gates = {"health": gate_health, "threads": gate_threads, "latency": gate_latency, "stream": gate_stream,
             "golden": gate_golden}
    try:
        for name in params["gates"]:
            gates[name](module, params, result)
    except EdgeError as exc:
        module.fail_json(msg=str(exc), **dict(result, **exc.details))
    result["latency_summary"] = latency_summary(result)
    module.exit_json(**result)


def latency_summary(result):
    """The latency the gates measured, as the deploy reports it (one line)."""
    if "latency" in result:
        stats = result["latency"]
        return "P50 %s ms, P99 %s ms (limit %s ms), max %s ms, %s QPS over %s requests measured on the device" % (
            stats["p50_ms"], stats["p99_ms"], stats["p99_limit_ms"], stats["max_ms"], stats["qps"], stats["count"])
    if "token_latency" in result:
        tokens = result["token_latency"]
        return ("time to first token P50 %s ms, P99 %s ms (limit %s ms); inter-token P50 %s ms, P99 %s ms (limit %s "
                "ms); %s tokens/s over %s generations measured on the device; first tokens as recorded at packaging"
                % (tokens["ttft"]["p50_ms"], tokens["ttft"]["p99_ms"], tokens["ttft_p99_limit_ms"],
                   tokens["inter_token"]["p50_ms"], tokens["inter_token"]["p99_ms"], tokens["token_p99_limit_ms"],
                   tokens["tokens_per_s"], tokens["runs"]))
    return "unchanged, so no latency gate"


if __name__ == "__main__":
    main()
