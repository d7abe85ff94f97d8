"""Token latency of the deployed llama-server under noise: the numbers and the report of tools/bench-runtime.

The measuring runs on the device, with its system Python and no edgetune
installed: ``device_program()`` is plugins/module_utils/edge_latency.py and
edge_llm.py (the deploy gate's own streaming client) followed by a small
command line, piped to ``python3 -``:

    python3 - ready PORT TIMEOUT            wait until /health answers 200
    python3 - measure '{"port": ..., ...}'  streamed generations -> JSON runs

Each phase of the benchmark (quiet, noisy untuned, noisy tuned) collects the
runs of every round; ``summarize()`` turns them into time to first token and
inter-token P50/P99 and tokens/s with edge_llm.token_latency (the gate's
method), ``ratios()`` into the two ratios the field report's table is read by.
"""
import re
from pathlib import Path

from ansible_collections.edgetune.fleet.plugins.module_utils import edge_llm

MODULE_UTILS = Path(__file__).resolve().parents[2] / "plugins" / "module_utils"
# The one import between the two piped files; on the device both are one script.
_COLLECTION_IMPORT = re.compile(r"^from ansible_collections\.\S+ import .*$", re.M)

QUIET, UNTUNED, TUNED = "quiet", "noisy untuned", "noisy tuned"
PHASES = (QUIET, UNTUNED, TUNED)
STAGES = {QUIET: "quiet: tuned service, no noise",
          UNTUNED: "noisy: untuned copy (system.slice, SCHED_OTHER, any CPU)",
          TUNED: "noisy: tuned service"}

_DRIVER = r'''

def _bench_main(argv):
    import sys as _sys
    if argv[0] == "ready":
        wait_ready(int(argv[1]), "/health", float(argv[2]))
        return 0
    options = json.loads(argv[1])
    try:
        _summary, runs = measure(options["port"], options["prompt"], options["max_tokens"], options["runs"],
                                 options["warmup"], timeout=options["timeout"])
    except LLMError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"runs": [{"ttft_ms": run["ttft_ms"], "gaps_ms": run["gaps_ms"], "tokens": run["tokens"]}
                               for run in runs]}))
    return 0


if __name__ == "__main__":
    import sys as _sys
    _sys.exit(_bench_main(_sys.argv[1:]))
'''


def device_program():
    """The Python source the device runs (stdlib only, Python 3.8)."""
    latency = (MODULE_UTILS / "edge_latency.py").read_text()
    llm = _COLLECTION_IMPORT.sub("", (MODULE_UTILS / "edge_llm.py").read_text())
    return latency + "\n\n" + llm + _DRIVER


def summarize(runs):
    """edge_llm.token_latency of a phase's runs, plus the samples for the histogram."""
    summary = edge_llm.token_latency(runs)
    summary["gaps_ms"] = [gap for run in runs for gap in run["gaps_ms"]]
    summary["ttft_ms"] = [run["ttft_ms"] for run in runs]
    return summary


def _ratio(over, under):
    return round(over / under, 2) if over is not None and under else None


def ratios(summaries):
    """noisy tuned / quiet (what is left of the noise with the tuning) and noisy untuned / noisy
    tuned (what the tuning wins under noise), for the TTFT and inter-token P99."""
    out = {}
    for metric in ("ttft", "inter_token"):
        quiet, untuned, tuned = (summaries[phase][metric]["p99_ms"] for phase in PHASES)
        out[metric] = {"noisy_tuned_vs_quiet": _ratio(tuned, quiet),
                       "noisy_untuned_vs_noisy_tuned": _ratio(untuned, tuned)}
    return out


def _ms(value):
    return "%.1f ms" % value if value is not None else "-"


def table(summaries):
    """The field report's shape: stage, P50, P99, throughput; TTFT and inter-token each."""
    lines = ["%-58s %11s %11s %13s %13s %10s" % ("stage", "TTFT P50", "TTFT P99", "token P50", "token P99",
                                                "tokens/s")]
    for phase in PHASES:
        s = summaries[phase]
        lines.append("%-58s %11s %11s %13s %13s %10s" % (
            STAGES[phase], _ms(s["ttft"]["p50_ms"]), _ms(s["ttft"]["p99_ms"]), _ms(s["inter_token"]["p50_ms"]),
            _ms(s["inter_token"]["p99_ms"]), "%.1f" % s["tokens_per_s"] if s["tokens_per_s"] else "-"))
    found = ratios(summaries)
    for metric, name in (("inter_token", "inter-token P99"), ("ttft", "TTFT P99")):
        lines.append("%s: noisy tuned / quiet %sx, noisy untuned / noisy tuned %sx" % (
            name, found[metric]["noisy_tuned_vs_quiet"], found[metric]["noisy_untuned_vs_noisy_tuned"]))
    return "\n".join(lines)


def what_was_measured(is_twin, kernel_cpus, service):
    """One line saying whether the numbers describe a board or a twin sharing the host's CPUs."""
    if is_twin:
        return ("measured on a device twin: a container sharing this machine's %d CPUs with everything else "
                "running here (the kernel refused the service %s), so there is nothing to isolate; the numbers "
                "that matter come from a board with CPUs to spare" % (
                    len(kernel_cpus), "FIFO and its CPUs" if service["policy"] == "other" else "nothing"))
    return "measured on a real device: %d kernel CPUs, the service %s prio %s on CPUs %s" % (
        len(kernel_cpus), service["policy"].upper(), service["priority"], service["cpus"])
