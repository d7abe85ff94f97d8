# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Autotune of the runtime on the device itself: the candidate settings measured side by side with
the bench's own code (edge_llm_bench: the same server placement and streaming client as
`edgetune bench llm --host` and the deploy gate, the client on the housekeeping CPUs), the best
inter-token P99 chosen (TTFT P99 as tie-break), and the measurements and the choice recorded on the
device, where edge_facts reads them and the plan (edge_plan.runtime_part) applies them. Python 3.8+, stdlib only.

A candidate is ``NAME:key=value,...`` over the settings the role applies: ``policy`` (other,
fifo, rr), ``priority`` (1-99 for fifo and rr) and ``threads`` (a rule: n, n-K, n/K, or a
number, resolved against the CPUs the runtime runs on). The first candidate is the default, the
settings the plan gives without autotune.
"""
import json
import os
import time

from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_llm_bench

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_llm
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist, parse_cpulist
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import (
    atomic_write, fsync_directory, read_json)

RECORD = "/etc/edgetune/autotune.json"
# A measurement waits here until the deploy of its choice has passed the gates: the record names
# only a choice that served (a choice whose deploy was rolled back is no desired state).
PENDING = "/etc/edgetune/autotune.pending.json"
RECORD_VERSION = 1
# What the role can apply of a candidate (the bench compares more: polling, batch threads, ...).
KEYS = ("policy", "priority", "threads")
NOISE = ("none",) + tuple(edge_llm_bench.NOISE_KINDS)
DEFAULT_CANDIDATES = ("pinned-fifo:policy=fifo,priority=40", "threads-n-1:threads=n-1",
                      "threads-n-2:threads=n/2")


class AutotuneError(EdgeError):
    """Autotune cannot run as asked; the message says why. Nothing was changed."""


def parse_candidates(texts, default):
    """[candidate settings], the default first (``default``: {policy, priority, threads} of the plan
    without autotune, named "default"); a candidate naming a key the role cannot apply is refused."""
    out = [dict(edge_llm_bench.parse_candidate("default:policy=%s,priority=%d,threads=%s" % (
        default["policy"], int(default["priority"] or 0) if default["policy"] != "other" else 0,
        default["threads"])))]
    for text in texts:
        try:
            candidate = edge_llm_bench.parse_candidate(text)
        except edge_llm_bench.BenchError as exc:
            raise AutotuneError(str(exc)) from None
        body = text.partition(":")[2]
        extra = sorted({item.partition("=")[0].strip().replace("-", "_") for item in body.split(",") if item.strip()}
                       - set(KEYS))
        if extra:
            raise AutotuneError("candidate %s: %s cannot be applied by the role; keys: %s"
                                % (candidate["name"], ", ".join(extra), ", ".join(KEYS)))
        if candidate["name"] in [c["name"] for c in out]:
            raise AutotuneError("candidate name %s is used twice (default is the plan's own settings)"
                                % candidate["name"])
        out.append(candidate)
    return out


def choice_of(candidate):
    return {"name": candidate["name"], "policy": candidate["policy"], "priority": candidate["priority"],
            "threads": str(candidate["threads"])}


def rank(rows):
    """Names of the measured candidates, best first: inter-token P99, then TTFT P99."""
    def key(name):
        row = rows[name]
        return (row["inter_token"]["p99_ms"] if row["inter_token"]["p99_ms"] is not None else float("inf"),
                row["ttft"]["p99_ms"] if row["ttft"]["p99_ms"] is not None else float("inf"))
    return sorted(rows, key=key)


class Options(object):
    """What edge_llm_bench.Bench reads of a command line, for a run on the device."""

    def __init__(self, **values):
        self.__dict__.update(values)


def measure(server, model, cpus, candidates, backend="cpu", noise="none", rounds=2, generations=10,
            max_tokens=32, timeout_s=600, ready_timeout=60.0, planned=None, say=None):
    """Measure ``candidates`` (parse_candidates' answer) on ``cpus`` (the CPUs the runtime runs on;
    the rest take the synthetic noise when ``noise`` is not none) and choose. ``planned``: the plan's
    inference CPUs (a list; default ``cpus``), which the record names: where the kernel refused them
    the runtime runs unpinned and is measured on every online CPU. Returns the record. Raises
    AutotuneError before anything starts when it cannot run as asked."""
    planned = cpus if planned is None else planned
    problems = []
    if not planned or not cpus:
        problems.append("there are no inference CPUs to tune: the plan gives the runtime none "
                        "(edge_runtime_cpus, or the CPU isolation of role edge_cpu)")
    if noise not in NOISE:
        problems.append("noise %r is not one of %s" % (noise, ", ".join(NOISE)))
    for what, path in (("server", server), ("model", model)):
        if not os.path.isfile(path):
            problems.append("the %s %s is not a file" % (what, path))
    if rounds < 1 or generations < 1 or max_tokens < 2 or timeout_s < 1:
        problems.append("rounds, generations and the time bound are 1 or more, max_tokens 2 or more")
    online = edge_llm_bench.online_cpus()
    if cpus and not set(cpus) <= set(online):
        problems.append("the runtime's CPUs %s are not all online (online: %s)"
                        % (format_cpulist(cpus), format_cpulist(online)))
    if noise != "none" and cpus and not set(online) - set(cpus):
        problems.append("noise on the housekeeping CPUs asked for, but the runtime runs on every CPU")
    if problems:
        raise AutotuneError("autotune: " + "; ".join(problems))
    began = time.monotonic()
    options = Options(server=server, model=model, backend=backend, infer_cpus=format_cpulist(cpus),
                      noise=[] if noise == "none" else [noise],
                      candidate=["%s:%s" % (c["name"], ",".join("%s=%s" % (k, c[k]) for k in KEYS))
                                 for c in candidates],
                      rounds=rounds, generations=generations, max_tokens=max_tokens, warmup=1,
                      prompt="Once upon a time", settle=1.0, ready_timeout=ready_timeout, request_timeout=120.0,
                      affinity_only=True, client="housekeeping")
    bench = edge_llm_bench.Bench(options, say=say or (lambda text: None))
    try:
        stages, refusals, measured = bench.candidate_stages(None if noise == "none" else noise,
                                                            began + timeout_s)
    except edge_llm_bench.BenchError as exc:
        raise AutotuneError("autotune: %s; the settings stay as they are" % exc) from None
    rows = {}
    for candidate in candidates:
        runs = [run for stage in stages if stage["candidate"] == candidate["name"] for run in stage["runs"]]
        if runs:
            summary = edge_llm.token_latency(runs)
            placement = next(s for s in stages if s["candidate"] == candidate["name"])
            rows[candidate["name"]] = dict(summary, placement=placement["placement"],
                                           threads_seen=placement["threads_seen"])
    if not rows:
        raise AutotuneError("autotune: no candidate could be measured (%s); the settings stay as they are"
                            % "; ".join("%s: %s" % item for item in sorted(refusals.items())))
    ranking = rank(rows)
    by_name = dict((c["name"], c) for c in candidates)
    return {
        "version": RECORD_VERSION,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - began, 1),
        "cpus": format_cpulist(planned), "measured_on": format_cpulist(cpus), "backend": backend, "noise": noise,
        "noise_described": edge_llm_bench.NOISE_KINDS.get(noise, "none: the device's own load"),
        "rounds": measured, "generations": generations, "max_tokens": max_tokens,
        "candidates": [dict((k, c[k]) for k in ("name",) + KEYS) for c in candidates],
        "results": [dict(name=name, settings=choice_of(by_name[name]), ttft_p99_ms=rows[name]["ttft"]["p99_ms"],
                         inter_token_p50_ms=rows[name]["inter_token"]["p50_ms"],
                         inter_token_p99_ms=rows[name]["inter_token"]["p99_ms"],
                         inter_token_max_ms=rows[name]["inter_token"]["max_ms"],
                         tokens_per_s=rows[name]["tokens_per_s"], generations=rows[name]["runs"],
                         placement=rows[name]["placement"], threads_seen=rows[name]["threads_seen"])
                    for name in ranking],
        "refused": dict(refusals),
        "choice": choice_of(by_name[ranking[0]]),
    }


def read_record(root="/"):
    """The device's autotune record, None when there is none; {"error": why} when it cannot be read."""
    try:
        doc = read_json(os.path.join(root, RECORD.lstrip("/")), RECORD)
    except ValueError as exc:
        return {"error": str(exc)}
    if doc is None:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("choice"), dict):
        return {"error": "%s is not an edgetune autotune record" % RECORD}
    return doc


def write_record(record, root="/", path=RECORD):
    path = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1, sort_keys=True) + "\n", backup=False, mode=0o644)


def accept_pending(root="/"):
    """The measurement a deploy has gated becomes the device's record (PENDING renamed over RECORD);
    False when there is none pending."""
    pending = os.path.join(root, PENDING.lstrip("/"))
    if not os.path.exists(pending):
        return False
    record = os.path.join(root, RECORD.lstrip("/"))
    os.rename(pending, record)
    fsync_directory(os.path.dirname(record))
    return True


def remove_record(root="/"):
    """Remove the record and any pending measurement; whether there was a record."""
    found = False
    for name in (RECORD, PENDING):
        path = os.path.join(root, name.lstrip("/"))
        if os.path.exists(path):
            os.unlink(path)
            found = found or name == RECORD
    return found


def in_force(record, cpulist, backend):
    """Why the recorded choice does not apply to today's plan, None when it does."""
    if not record:
        return "no choice is recorded on the device"
    if record.get("error"):
        return record["error"]
    if record.get("cpus") != cpulist:
        return "it was measured on CPUs %s, the plan's are %s" % (record.get("cpus") or "none", cpulist or "none")
    if record.get("backend") != backend:
        return "it was measured on the %s backend, the plan's is %s" % (record.get("backend"), backend)
    return None


def cpus_of(text):
    return sorted(parse_cpulist(text)) if text else []
