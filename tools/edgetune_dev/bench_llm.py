"""Token latency of the deployed llama-server under noise: the numbers and the report of tools/bench-runtime.

The measuring runs on the device, with its system Python and no edgetune
installed: ``device_program()`` is plugins/module_utils/common/edge_error.py,
edge_latency.py and edge_llm.py (the deploy gate's own streaming client)
followed by a small command line, piped to ``python3 -``:

    python3 - ready PORT TIMEOUT            wait until /health answers 200
    python3 - measure '{"port": ..., ...}'  streamed generations -> JSON runs

Each phase of the benchmark (quiet, noisy untuned, noisy tuned) collects the
runs of every round; ``summarize()`` turns them into time to first token and
inter-token P50/P99 and tokens/s with edge_llm.token_latency (the gate's
method), ``ratios()`` into the two ratios the field report's table is read by.
"""
import json
import re
from pathlib import Path

from edgetune_dev import bench, bench_pages
from edgetune.errors import UsageError

from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_llm_bench

MODULE_UTILS = Path(__file__).resolve().parents[2] / "plugins" / "module_utils"
# The imports between the piped files; on the device they are one script.
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
    parts = [_COLLECTION_IMPORT.sub("", (MODULE_UTILS / name).read_text())
             for name in ("common/edge_error.py", "device/edge_latency.py", "device/edge_llm.py")]
    return "\n\n".join(parts) + _DRIVER


# The host bench's summary: a board's numbers and a host's are computed alike.
summarize = edge_llm_bench.summarize
_ratio = edge_llm_bench._ratio


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


# ------------------------------------------------------------------ edgetune bench llm
def draw_host_pngs(result, path):
    """One histogram of inter-token gaps per noise kind: quiet, untuned, the default and the best
    candidate (matplotlib, on the controller: the host may lack it)."""
    written = []
    for kind, block in result["noises"].items():
        series = {"quiet": result["quiet"]["gaps_ms"], "noisy untuned": block["rows"]["noisy untuned"]["gaps_ms"]}
        for name in dict.fromkeys([block["default"], block["best"]]):
            series["noisy " + name] = block["rows"][name]["gaps_ms"]
        target = str(path).replace(".png", "-%s.png" % kind.replace("+", "-"))
        written.append(bench.write_histogram_png(
            target, series, "llama-server (%s) inter-token gaps, %s noise, on %s" % (
                result["backend"], kind, result["host"]["hostname"]), xlabel="gap between tokens", ylabel="gaps"))
    return "histograms: " + ", ".join(written)


def _draw_or_say(result, path):
    try:
        return draw_host_pngs(result, path)
    except UsageError as exc:
        return "no histogram here (%s); draw it elsewhere with `edgetune-dev bench llm --plot %s`" % (
            exc, str(path).replace(".png", ".json"))


def cmd_llm(args):
    if args.plot:
        try:
            result = json.loads(Path(args.plot).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError("cannot read %s: %s" % (args.plot, exc)) from None
        print(draw_host_pngs(result, str(Path(args.plot).with_suffix(".png"))))
        return 0
    if not args.host:
        raise UsageError("bench llm measures this host (--host) or draws a result (--plot FILE); "
                         "a device over Ansible is measured by tools/bench-runtime")
    for name in ("server", "model"):
        if not getattr(args, name):
            raise UsageError("--host needs --%s" % name)
    if not args.commit:
        args.commit = bench_pages.checkout_commit()
    return edge_llm_bench.run(args, draw=_draw_or_say)


def add_parser(subparsers):
    parent = subparsers.choices.get("bench")
    if parent is None:
        parent = subparsers.add_parser("bench", help="benchmarks (latency of a runtime, ...)")
        parent.edgetune_sub = parent.add_subparsers(dest="bench_command", required=True)
    p = parent.edgetune_sub.add_parser(
        "llm", help="token latency of llama-server on this host: quiet, noisy untuned and each candidate "
                    "setting under the same noise, side by side (root; no Ansible, systemd or Docker)")
    p.add_argument("--host", action="store_true", help="measure on this host")
    p.add_argument("--plot", metavar="JSON", help="draw the histograms of a bench-llm-host.json and exit")
    edge_llm_bench.add_arguments(p)
    for action in p._actions:
        if action.dest in ("server", "model"):
            action.required = False
    p.set_defaults(func=cmd_llm)
