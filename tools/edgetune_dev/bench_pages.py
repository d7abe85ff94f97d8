"""`edgetune-dev bench pages RESULTS DEST`: the docs' benchmark pages, generated from raw results.

Every benchmark that backs a default writes its raw result as JSON (`--out`); the files committed
under docs/benchmarks/results/ are the only source of the numbers in the docs. `make docs` runs this
at each build and writes one Markdown page per benchmark kind into the build's source tree, each
table headed by the host, the date and the commit it measured. A result file that does not say all
three is refused: a number nobody can trace is not published.

Kinds (the "bench" key of a result): llm-host (edge_llm_bench: token latency under CPU noise),
audit (bench_audit: the audit's and a no-change converge's controller cost), netqos-echo
(bench_netqos: request/response latency under bulk traffic, with and without the classifier),
netqos-llm (bench_netqos --llm: llama-server's streamed tokens through the same busy uplink).
"""
import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

from edgetune_dev import CHECKOUT
from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_llm_bench
from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_cpulist

from edgetune.errors import UsageError

PAGES = {
    "llm-host": ("llm", "Token latency under CPU noise"),
    "audit": ("audit", "The audit's and the converge's cost"),
    "netqos-echo": ("network", "Network priority under bulk traffic"),
    "netqos-llm": ("network-llm", "Streamed tokens through a busy uplink"),
}
REQUIRED = ("bench", "host", "measured_at", "commit")


def checkout_commit():
    """The checkout's commit, with "-dirty" when tracked files differ from it (then say what changed)."""
    def git(*argv):
        return subprocess.run(["git", "-C", str(CHECKOUT)] + list(argv), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True, check=False)
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def stamp(kind):
    """What every raw result starts with: its kind, the host, when and which commit."""
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    return {"bench": kind, "host": {"hostname": socket.gethostname(), "cpu_model": model,
                                    "cpu_count": os.cpu_count(), "kernel": platform.release(),
                                    "machine": platform.machine()},
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": checkout_commit()}


def load(results_dir):
    """{kind: [result, ...]} from the JSON files under results_dir, oldest first."""
    found = {kind: [] for kind in PAGES}
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError("%s: not a readable JSON result: %s" % (path, exc)) from None
        missing = [key for key in REQUIRED if not (isinstance(result, dict) and result.get(key))]
        if missing:
            raise UsageError("%s: a result must name %s; it lacks %s" % (path, ", ".join(REQUIRED), ", ".join(missing)))
        if result["bench"] not in PAGES:
            raise UsageError("%s: bench %r is not one of %s" % (path, result["bench"], ", ".join(PAGES)))
        result["_file"] = path.name
        found[result["bench"]].append(result)
    for results in found.values():
        results.sort(key=lambda r: r["measured_at"])
    return found


def _ms(value):
    if not isinstance(value, (int, float)):
        return "-"
    return "%.2f" % value if value < 10 else "%.1f" % value


def _host_name(host):
    return host["hostname"] if isinstance(host, dict) else str(host)


def provenance(result):
    """The line above each table: where, when and what was measured, and its raw file."""
    host = result["host"]
    if isinstance(host, dict):
        what = "%s, %s CPUs" % (host.get("cpu_model") or host.get("machine", "?"),
                                host.get("cpu_count") or _cpu_count(host.get("cpus", "")))
        if host.get("kernel"):
            what += ", kernel %s" % host["kernel"]
        if host.get("gpus"):
            what += ", %s" % host["gpus"].splitlines()[0]
    else:
        what = ""
    return "Host **%s**%s; measured %s at commit `%s`; raw results: `results/%s`." % (
        _host_name(host), " (%s)" % what if what else "", result["measured_at"], _short_commit(result["commit"]),
        result["_file"])


def _short_commit(commit):
    commit = str(commit)
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def _cpu_count(cpulist):
    return len(edge_cpulist.parse_cpulist(str(cpulist))) if str(cpulist).strip() else 0


def _cpus(cpulist):
    """'CPU 1' or 'CPUs 0-3'."""
    return "CPU%s %s" % ("" if _cpu_count(cpulist) == 1 else "s", cpulist)


def _table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


# ------------------------------------------------------------------ llm-host
def llm_section(result):
    lines = [provenance(result), "",
             "%s, backend %s; inference on %s, housekeeping on %s; %d alternated rounds, %d generations of "
             "%d tokens per stage; the measuring client %s. Times in ms." % (
                 result["model"], result["backend"], _cpus(result["host"].get("inference_cpus", "")),
                 _cpus(result["host"].get("housekeeping_cpus", "")), result["rounds"], result["generations_per_stage"],
                 result["max_tokens"], "on the housekeeping CPUs at SCHED_FIFO 1" if result.get("client") ==
                 "housekeeping" else "with the server's placement and scheduling")]
    head = ("stage", "TTFT P99", "inter-token P50", "P99", "max", "tokens/s")

    def row(label, summary):
        return (label, _ms(summary["ttft"]["p99_ms"]), _ms(summary["inter_token"]["p50_ms"]),
                _ms(summary["inter_token"]["p99_ms"]), _ms(summary["inter_token"]["max_ms"]),
                _ms(summary["tokens_per_s"]))

    for kind, block in result["noises"].items():
        rows = [row("quiet, %s" % block["default"], result["quiet"]),
                row("noisy, untuned (any CPU, SCHED_OTHER)", block["rows"]["noisy untuned"])]
        stock = block["rows"].get("noisy untuned, llama.cpp's threads")
        if block.get("untuned_stock_failed"):
            rows.append(("noisy, untuned with llama.cpp's own thread count",
                         "did not finish: %s" % block["untuned_stock_failed"], "", "", "", ""))
        elif stock:
            rows.append(row("noisy, untuned with llama.cpp's own thread count", stock))
        for name in block["ranking"]:
            label = "noisy, %s%s%s" % (name, " (default)" if name == block["default"] else "",
                                       " (best)" if name == block["best"] else "")
            rows.append(row("**%s**" % label if name == block["default"] else label, block["rows"][name]))
        lines += ["", "Noise %s: %s." % (kind, block["noise"]), ""] + _table(head, rows)
        lines += ["", "Inter-token P99: noisy default / quiet %sx; noisy untuned / noisy default %sx; "
                      "the default / the best candidate %sx." % (
                          block["noisy_tuned_vs_quiet"], block["noisy_untuned_vs_noisy_tuned"],
                          block["default_vs_best"])]
    settings = ["`%s`: %s" % (c["name"], ", ".join("%s=%s" % kv for kv in sorted(c.items()) if kv[0] != "name"))
                for c in result["candidates"]]
    lines += ["", "Candidates (the first is the runtime's default): " + "; ".join(settings) + "."]
    same = same_on_this_host(result)
    if same:
        count = _cpu_count(result["host"].get("inference_cpus", ""))
        lines += ["", "On this host (%d inference CPU%s) some candidates run the very same server: %s. Their spread "
                      "is the run's own noise, the least difference this table can show." % (
                          count, "" if count == 1 else "s",
                          "; ".join(" = ".join("`%s`" % name for name in group) for group in same))]
    return lines


def same_on_this_host(result):
    """Groups of candidates whose thread rules resolve to the same numbers on the measured host."""
    ncpus = _cpu_count(result["host"].get("inference_cpus", "")) or 1
    groups = {}
    for candidate in result["candidates"]:
        resolved = dict(candidate, name=None)
        resolved["threads"] = edge_llm_bench.resolve_threads(candidate["threads"], ncpus)
        # llama-server's batch threads default to its threads.
        resolved["threads_batch"] = edge_llm_bench.resolve_threads(candidate.get("threads_batch") or
                                                                   candidate["threads"], ncpus)
        groups.setdefault(json.dumps(resolved, sort_keys=True), []).append(candidate["name"])
    return [names for names in groups.values() if len(names) > 1]


# ------------------------------------------------------------------ audit
def audit_section(result):
    lines = [provenance(result)]
    if result.get("fleet_sizes"):  # a run of `--sizes ''` measured only the converge
        lines += ["", "The audit (`playbooks/audit.yml`: facts, the plan, one `edge_audit` call per device) of the "
                      "twins `make demo` converged, and of inventory aliases of them for larger fleets (the "
                      "controller's work per device is the same; the devices' is shared). Module executions are the "
                      "most of any device; controller CPU is `ansible-playbook` and its workers.", ""]
        lines += _table(("devices", "module executions", "controller CPU-s per device", "wall s", "same findings"),
                        [(r["size"], r["executions"], "%.2f" % r["cpu_per_device"], "%.1f" % r["wall"],
                          "yes" if r["same_findings"] else "no") for r in result["fleet_sizes"]])
    if result.get("real"):
        r = result["real"]
        lines += ["", "The audit of %d twins made for the run (60%% Orin NX, 40%% RK3588, never tuned), with "
                      "ansible.cfg's forks: %d module executions per device, %.2f controller CPU-s per device, "
                      "%.1f s wall, %d audited." % (r["size"], r["executions"], r["cpu_per_device"], r["wall"],
                                                     r["audited"])]
    converge = result["converge"]
    fleet = result.get("converge_fleet")
    where = ("%d %s twins made and converged for the run" % (fleet["count"], fleet["board"]) if fleet
             else "the same converged twins")
    if "results" in converge[0]:  # medians, with the audit measured in the same rounds
        full = " beside the full path (`edge_converge_full`)" if any(r["path"] == "full" for r in converge) else ""
        lines += ["", "A `site.yml` that changes nothing on %s: the converge path (a role " % where +
                      "whose last apply is current and holds is not included)%s and the audit, " % full +
                      "median of %d alternated rounds. Task results are "
                      "the most the controller dispatched for one device (a skipped task is one); controller CPU "
                      "is `ansible-playbook` and its workers." % converge[0]["rounds"], ""]
        lines += _table(("path", "devices", "module executions", "task results", "controller CPU-s per device",
                         "wall s", "changed tasks"),
                        [(r["path"], r["devices"], r["executions"], r["results"], "%.2f" % r["cpu_per_device"],
                          "%.1f" % r["wall"], r["changed"]) for r in converge])
        paths = dict((r["path"], r) for r in converge)
        if paths.get("audit", {}).get("cpu_per_device"):
            lines += ["", "The converge path's controller CPU per device is %.1fx the audit's."
                      % (paths["converge"]["cpu_per_device"] / paths["audit"]["cpu_per_device"])]
    else:
        lines += ["", "A `site.yml` that changes nothing on the same converged twins: the converge path (a role "
                      "whose last apply is current and holds is skipped) beside the full path "
                      "(`edge_converge_full`), best of %d alternated rounds." % result["rounds"], ""]
        lines += _table(("site.yml path", "devices", "module executions", "controller CPU-s per device", "wall s",
                         "changed tasks"),
                        [(r["path"], r["devices"], r["executions"], "%.2f" % r["cpu_per_device"], "%.1f" % r["wall"],
                          r["changed"]) for r in converge])
    check = result.get("check")
    if check:
        lines += ["", "With one boot argument removed on every twin, `edgetune audit` and `site.yml --check` "
                      "found %s drifted roles on %d hosts; best of %d rounds: the audit %.1f s, `--check` %.1f s "
                      "(%.1fx)." % ("the same" if check["same_findings"] else "DIFFERENT", check["hosts"],
                                    result["rounds"], check["audit_best_s"], check["check_best_s"],
                                    check["check_best_s"] / check["audit_best_s"])]
    return lines


# ------------------------------------------------------------------ netqos-echo
def netqos_section(result):
    s = result["settings"]
    lines = [provenance(result), "",
             "A veth pair between two network namespaces, the sender's egress shaped by the role's HTB tree at "
             "%s (inference class rate %s); %d bulk TCP flow(s) fill it; GSO %s%s. A probe sends %d B to the "
             "inference port and waits for the echo, %d times per phase; phases without and with the classifier "
             "alternate over %d rounds. Times in ms." % (
                 s["rate"], s["high_rate"], s["flows"], "on" if s["keep_gso"] else "off",
                 "; the link's receive processing on the system's CPUs (RPS)" if result.get("receive_steered") else "",
                 s["size"], s["count"], s["rounds"]), ""]
    summary = result["summary"]
    lines += _table(("", "P50", "P99", "samples"),
                    [("without the classifier", _ms(summary["without"]["p50_ms"]), _ms(summary["without"]["p99_ms"]),
                      summary["without"]["samples"]),
                     ("with the classifier", _ms(summary["with"]["p50_ms"]), _ms(summary["with"]["p99_ms"]),
                      summary["with"]["samples"])])
    lines += ["", "Per phase:", ""]
    lines += _table(("round", "mode", "P50", "P99", "default class Mbit/s", "link Mbit/s"),
                    [(i // 2 + 1, p["mode"], _ms(p["p50_ms"]), _ms(p["p99_ms"]), "%.1f" % p["bulk_mbit"],
                      "%.1f" % p["link_mbit"]) for i, p in enumerate(result["phases"])])
    return lines


# ------------------------------------------------------------------ netqos-llm
def _queue_words(config):
    return "leaf queues %s, GSO %s, inference class rate %s" % (
        "HTB's own" if config["leaf"] == "default" else config["leaf"], "on" if config["gso"] else "off",
        config["high_rate"])


def netqos_llm_section(result):
    s = result["settings"]
    lines = [provenance(result), "",
             "llama-server (%s) in one network namespace on %s streams completions of %d tokens to the gate's "
             "client in another; the link's egress on the server's side is shaped by the role's HTB tree. In the "
             "bulk stages TCP flows (as many as each rate's heading says) leave the server's side on the same "
             "egress; the senders, the sink and the "
             "client run on %s%s. %d alternated rounds of %d generations per stage%s. Times in ms; goodput is "
             "what the bulk sink received (median of the rounds)." % (
                 os.path.basename(s["model"]), _cpus(result["server_cpus"]), s["max_tokens"],
                 _cpus(result["system_cpus"]), ", and so does the link's receive processing (RPS), as the role "
                 "steers IRQs to the housekeeping CPUs" if result.get("receive_steered") else "", s["rounds"],
                 s["generations"],
                 ", every candidate's stages in each round, in a shuffled order" if result.get("decision") else "")]
    for run in result["runs"]:
        for config in run["candidates"]:
            summed = result["summary"][run["rate"]][config["name"]]
            rows = []
            for name, stage in summed["stages"].items():
                goodput = sorted(stage["goodput_mbit"])[len(stage["goodput_mbit"]) // 2]
                rows.append((name, _ms(stage["ttft"]["p50_ms"]), _ms(stage["ttft"]["p99_ms"]),
                             _ms(stage["inter_token"]["p50_ms"]), _ms(stage["inter_token"]["p99_ms"]),
                             _ms(stage["inter_token"]["max_ms"]),
                             "%s-%s" % (_ms(min(stage["round_p99_ms"])), _ms(max(stage["round_p99_ms"]))),
                             "-" if name == "no bulk" else "%.1f" % goodput, stage["inter_token"]["count"]))
            lines += ["", "**%s, %s** (%d bulk flows; %s):" % (run["rate"], config["name"],
                                                              run.get("flows", s["flows"]), _queue_words(config)), ""]
            lines += _table(("stage", "TTFT P50", "TTFT P99", "inter-token P50", "P99", "max", "P99 per round",
                             "bulk goodput Mbit/s", "gaps"), rows)
            lines += ["", "Inter-token P99, median of the rounds: with the classifier %.2fx the no-bulk stage's, "
                          "without it %.2fx; the bulk goodput with the classifier is %.0f%% of the link rate." % (
                              summed["with_vs_no_bulk_p99"], summed["without_vs_no_bulk_p99"],
                              100 * summed["goodput_share"])]
            if not summed.get("load_strong_enough", True):
                lines[-1] += (" Without the classifier the bulk traffic did not double the no-bulk P99: the load "
                              "was too weak for this rate to judge the classifier.")
    for name, why in sorted((result.get("left_out") or {}).items()):
        lines += ["", "Candidate `%s` was not measured: %s." % (name, why)]
    decision = result.get("decision")
    if decision:
        lines += ["", "Decision: %s%s." % (decision["why"], "; **%s** replaces the default" % decision["best"]
                                          if decision["replaces_default"] else "")]
    return lines


SECTIONS = {"llm-host": llm_section, "audit": audit_section, "netqos-echo": netqos_section,
            "netqos-llm": netqos_llm_section}
INTROS = {
    "llm-host": "`edgetune-dev bench llm --host` (root, on the host measured): llama-server quiet, under noise "
                "untuned, and with each candidate runtime setting under the same noise, side by side in "
                "alternated rounds. The runtime's defaults are the candidate that this benchmark ranks best.",
    "audit": "`edgetune-dev bench audit --out FILE` on the twins `make demo` converged, and a converge of twins it "
             "makes for it (`--converge-fleet N`).",
    "netqos-echo": "`edgetune-dev bench netqos --out FILE` (root, after `edgetune-dev netqos-host`), in network "
                   "namespaces the bench makes and removes.",
    "netqos-llm": "`edgetune-dev bench netqos --llm --out FILE` (root, after `edgetune-dev netqos-host` and "
                  "`make artifacts`), in network namespaces the bench makes and removes.",
}


def render(results):
    """{file name: Markdown} for every page, from load()'s results."""
    pages = {}
    for kind, (name, title) in PAGES.items():
        lines = ["# " + title, "", INTROS[kind], ""]
        if not results[kind]:
            lines.append("No result of this benchmark is committed yet.")
        for result in reversed(results[kind]):  # the newest first
            lines += ["## %s %s UTC, %s" % (result["measured_at"][:10], result["measured_at"][11:16],
                                           _host_name(result["host"])), ""]
            lines += SECTIONS[kind](result) + [""]
        pages[name + ".md"] = "\n".join(lines).rstrip() + "\n"
    return pages


def main(argv=None):
    parser = argparse.ArgumentParser(prog="edgetune-dev bench pages", description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the directory of raw result files (docs/benchmarks/results)")
    parser.add_argument("dest", help="where the pages are written (the docs build's benchmarks/)")
    args = parser.parse_args(argv)
    try:
        pages = render(load(args.results))
    except UsageError as exc:
        print("edgetune-dev bench pages: error: %s" % exc, file=sys.stderr)
        return 2
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        (dest / name).write_text(text)
    print("bench pages: %s" % ", ".join(str(dest / name) for name in sorted(pages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
