#!/usr/bin/python3
"""Benchmark (not a test): inference traffic through an uplink busy with bulk traffic, with and
without the edgetune classifier, side by side in one run.

Two network namespaces joined by a veth pair; the egress of side A (the device) is shaped by the
same HTB tree `edgetune-netqos apply` makes (link rate --rate, inference class 1:10, default class
1:20), and N bulk TCP flows leave A on that egress (a board uploading video, logs, models). Each
mode alternates over --rounds rounds so that drift hits every stage alike; "without the classifier"
is the same HTB tree with the classifier's filter removed, so every packet takes the default class.

Two probes:
- echo (the default): a client on B sends --size bytes to A's inference port and waits for the
  echo, --count times per phase; phases without and with the classifier, bulk running throughout.
- llm (--llm): llama-server in A streams completions to the gate's client (edge_llm) in B; stages
  per round: no bulk, bulk without the classifier, bulk with it. TTFT and inter-token gaps as the
  client receives them, the bulk goodput per stage, and the issue's acceptance ratios. The server
  runs on --server-cpus (default the last CPU); the bulk senders, the sink and the client run on
  the other CPUs (the system's), so the bench measures the network, not CPU contention.

Run as root after `edgetune-dev netqos-host` (bcc, pyroute2, kernel headers):
    edgetune-dev bench netqos [--rate 20mbit] [--rounds 3] [--json] [--out FILE]
    edgetune-dev bench netqos --llm [--rate 20mbit] [--flows 2] [--rounds 5] [--generations 16]
which runs this module with the system Python (bcc is Debian's, not the venv's). The loader is
the collection's edge_netqos_loader, run as the role's edgetune-netqos command runs it. Traffic
stays inside the namespaces this script makes and removes.
"""
import argparse
import glob
import json
import os
import random
import secrets
import subprocess
import sys
import time

from edgetune_dev import bench_pages  # (edgetune_dev also puts the checkout's collection on the import path)
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader as netqos
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import (format_cpulist, format_cpumask,
                                                                                 parse_cpulist)

A_ADDR, B_ADDR = "10.78.0.1", "10.78.0.2"
INFER_PORT, BULK_PORT = 8000, 5001
PYTHON = "/usr/bin/python3"

SINK = r"""
import socket, sys, threading, time
received = [0]
lock = threading.Lock()
def drain(conn):
    while True:
        data = conn.recv(1 << 16)
        if not data:
            return
        with lock:
            received[0] += len(data)
def report():
    while True:
        with open(sys.argv[1] + ".tmp", "w") as handle:
            handle.write("%%d %%f" %% (received[0], time.monotonic()))
        __import__("os").replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(0.1)
threading.Thread(target=report, daemon=True).start()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", %d)); srv.listen(64)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=drain, args=(conn,), daemon=True).start()
""" % BULK_PORT

ECHO = r"""
import socket
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", %d)); srv.listen(8)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = conn.recv(1 << 16)
        if not data:
            break
        conn.sendall(data)
""" % INFER_PORT

BULK = r"""
import socket, sys, time
deadline = time.time() + 10
while True:
    try:
        sock = socket.create_connection((sys.argv[1], int(sys.argv[2]))); break
    except OSError:
        if time.time() > deadline: raise
        time.sleep(0.05)
chunk = b"b" * (1 << 16)
while True:
    sock.sendall(chunk)
"""

PROBE = r"""
import json, socket, sys, time
addr, port, count, size, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
deadline = time.time() + 10
while True:
    try:
        sock = socket.create_connection((addr, port), timeout=30); break
    except OSError:
        if time.time() > deadline: raise
        time.sleep(0.05)
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
payload = b"q" * size
rtts = []
for _ in range(count):
    start = time.perf_counter()
    sock.sendall(payload)
    got = 0
    while got < size:
        data = sock.recv(size - got)
        if not data:
            raise SystemExit("echo server closed")
        got += len(data)
    rtts.append((time.perf_counter() - start) * 1e3)
    time.sleep(gap)
print(json.dumps(rtts))
"""


def sh(*argv, check=True):
    result = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, check=False)
    if result.returncode != 0:
        if check:
            raise SystemExit("bench_netqos: %s failed: %s" % (" ".join(map(str, argv)), result.stderr.strip()))
        return None
    return result.stdout


def percentile(values, pct):
    ordered = sorted(values)
    rank = max(1, int(-(-pct * len(ordered) // 100)))  # nearest rank
    return ordered[rank - 1]


def summary(values):
    ordered = sorted(values)
    return {"count": len(ordered), "p50_ms": percentile(ordered, 50) if ordered else None,
            "p99_ms": percentile(ordered, 99) if ordered else None, "max_ms": ordered[-1] if ordered else None}


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


class Bench(object):
    """The namespaces, the link, the role's HTB tree and classifier, the sink; helpers on CPUs of their own."""

    def __init__(self, args):
        tag = secrets.token_hex(3)
        self.args = args
        self.ns_a, self.ns_b = "etqb-%s-a" % tag, "etqb-%s-b" % tag
        self.a, self.b = "nqb%sa" % tag, "nqb%sb" % tag
        self.procs, self.bulk = [], []
        self.sink_file = "/tmp/edgetune-bench-sink-%s" % tag
        # The link's settings: the command line's, or the sweep's candidate being measured.
        self.config = {"name": "as given", "leaf": args.leaf, "gso": args.keep_gso, "high_rate": args.high_rate,
                       "rate": args.rate}
        cpus = sorted(os.sched_getaffinity(0))
        self.server_cpus = parse_cpulist(args.server_cpus) if args.server_cpus else cpus[-1:]
        self.system_cpus = [cpu for cpu in cpus if cpu not in self.server_cpus] or cpus

    def nsenter(self, ns, cpus=None):
        return ["nsenter", "--net=/run/netns/%s" % ns] + (["taskset", "-c", format_cpulist(cpus)] if cpus else [])

    def setup(self):
        sh("ip", "netns", "add", self.ns_a)
        sh("ip", "netns", "add", self.ns_b)
        sh("ip", "link", "add", self.a, "netns", self.ns_a, "type", "veth", "peer", "name", self.b, "netns", self.ns_b)
        for ns, dev, addr in ((self.ns_a, self.a, A_ADDR), (self.ns_b, self.b, B_ADDR)):
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", dev, "up")
            self.steer_receive(ns, dev)
        self.start(self.ns_b, SINK, self.sink_file)
        self.configure(self.config)

    def steer_receive(self, ns, dev):
        """The link's receive processing on the system's CPUs (RPS), as the role steers IRQs there.

        A veth receives in the sender's softirq: without this, the bulk sink's TCP receive work
        would run on the server's CPU whenever the server's send dequeues bulk packets, work that
        a board's uplink hands to the peer machine. Written in the namespace's own sysfs, on the
        bench's own device."""
        mask = format_cpumask(self.system_cpus, max(self.system_cpus + self.server_cpus) + 1)
        sh("ip", "netns", "exec", ns, "sh", "-c", 'echo %s > "/sys/class/net/%s/queues/rx-0/rps_cpus"' % (mask, dev))

    def configure(self, config):
        """The link as ``config`` says: GSO, the HTB tree and classifier at its rates, its leaves."""
        self.config = config
        for ns, dev in ((self.ns_a, self.a), (self.ns_b, self.b)):
            # Off: one segment per skb, as on a link shaped without TSO (a 64 KiB GSO packet
            # holds a 20 Mbit/s wire for 26 ms whatever its class). On: the veth's own 65535.
            sh("ip", "-n", ns, "link", "set", dev, "gso_max_segs", "65535" if config["gso"] else "1")
        self.apply()

    def start(self, ns, script, *argv):
        proc = subprocess.Popen(self.nsenter(ns, self.system_cpus) + [PYTHON, "-c", script] + [str(a) for a in argv],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def start_bulk(self):
        self.bulk = [self.start(self.ns_a, BULK, B_ADDR, BULK_PORT) for _ in range(self.args.flows)]

    def stop_bulk(self):
        for proc in self.bulk:
            proc.kill()
            proc.wait()
            self.procs.remove(proc)
        self.bulk = []

    def received(self):
        """(bytes the sink received so far, when)."""
        for _attempt in range(50):
            try:
                with open(self.sink_file) as handle:
                    count, when = handle.read().split()
                return int(count), float(when)
            except (OSError, ValueError):
                time.sleep(0.05)
        raise SystemExit("bench_netqos: the bulk sink reports nothing")

    def loader(self, *argv):
        return sh(*(self.nsenter(self.ns_a) + netqos.command(PYTHON, netqos.collections_root()) + list(argv)))

    def apply(self):
        self.loader("apply", "-i", self.a, "--rate", self.config["rate"], "--high-rate", self.config["high_rate"],
                    "--ports", str(INFER_PORT))
        if self.config["leaf"] != "default":
            # A candidate queue behind each class (the role's tree leaves HTB's own default there).
            for parent, handle in (("1:10", "10:"), ("1:20", "20:")):
                sh(*(self.nsenter(self.ns_a) + ["tc", "qdisc", "replace", "dev", self.a, "parent", parent,
                                                "handle", handle] + self.config["leaf"].split()))

    def without_classifier(self):
        sh(*(self.nsenter(self.ns_a) + ["tc", "filter", "del", "dev", self.a, "egress", "pref", netqos.FILTER_PREF]))

    def class_bytes(self):
        out = json.loads(self.loader("status", "-i", self.a, "--json"))["interfaces"][0]
        return dict((c["class"], c["bytes"]) for c in out["classes"])

    def check_helpers(self):
        for proc in self.procs:
            if proc.poll() is not None:
                raise SystemExit("bench_netqos: a helper exited early: %s" % proc.stderr.read().decode().strip())

    def cleanup(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for ns in (self.ns_a, self.ns_b):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, check=False)
        for path in (self.sink_file, self.sink_file + ".tmp"):
            if os.path.exists(path):
                os.remove(path)


class EchoBench(Bench):
    """Small requests answered by an echo server in A, bulk running throughout."""

    def probe(self):
        out = sh(*(self.nsenter(self.ns_b, self.system_cpus) + [PYTHON, "-c", PROBE, A_ADDR, INFER_PORT,
                                                                 self.args.count, self.args.size, self.args.gap]))
        return json.loads(out)

    def run(self):
        self.setup()
        self.start(self.ns_a, ECHO)
        self.start_bulk()
        time.sleep(self.args.warmup)
        results = {"without": [], "with": []}
        phases = []
        for _ in range(self.args.rounds):
            for mode in ("without", "with"):
                if mode == "without":
                    self.without_classifier()
                else:
                    self.apply()
                time.sleep(self.args.settle)
                before, started = self.class_bytes(), time.time()
                rtts = self.probe()
                after, elapsed = self.class_bytes(), time.time() - started
                results[mode].extend(rtts)
                phases.append({"mode": mode, "p50_ms": percentile(rtts, 50), "p99_ms": percentile(rtts, 99),
                               "bulk_mbit": (after["1:20"] - before["1:20"]) * 8 / elapsed / 1e6,
                               "link_mbit": (after["1:1"] - before["1:1"]) * 8 / elapsed / 1e6})
                if not self.args.json:
                    print("  %-7s p50 %8.2f ms  p99 %8.2f ms  default class %6.2f Mbit/s, link %6.2f Mbit/s"
                          % (mode, phases[-1]["p50_ms"], phases[-1]["p99_ms"], phases[-1]["bulk_mbit"],
                             phases[-1]["link_mbit"]), flush=True)
        self.check_helpers()
        return results, phases


# The stages of the LLM bench, in the order each round runs them.
LLM_STAGES = ("no bulk", "bulk, without the classifier", "bulk, with the classifier")

CLIENT = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_llm
o = json.loads(sys.argv[1])
_summary, runs = edge_llm.measure(o["port"], o["prompt"], o["max_tokens"], o["runs"], o["warmup"], host=o["host"],
                                  timeout=o["timeout"])
print(json.dumps([{"ttft_ms": r["ttft_ms"], "gaps_ms": r["gaps_ms"]} for r in runs]))
"""


def default_llm():
    """(llama-server, GGUF) of this machine's LLM artifact cache (`make artifacts`), else (None, None)."""
    cache = os.environ.get("EDGETUNE_LLM_CACHE") or os.path.expanduser("~/.cache/edgetune/llm")
    servers = sorted(glob.glob(os.path.join(cache, "build", "*", "llama-server")), key=os.path.getmtime)
    models = sorted(glob.glob(os.path.join(cache, "model", "*", "*.gguf")), key=os.path.getmtime)
    return (servers[-1] if servers else None), (models[-1] if models else None)


class LlmBench(Bench):
    """llama-server in A streaming to the gate's client in B, through the shaped egress."""

    def start_server(self):
        env = dict(os.environ, LLAMA_ARG_HOST=A_ADDR, LLAMA_ARG_PORT=str(INFER_PORT), LLAMA_ARG_CTX_SIZE="2048",
                   LLAMA_ARG_N_PARALLEL="1", LLAMA_ARG_THREADS=str(len(self.server_cpus)))
        log = open("/tmp/edgetune-bench-server-%s.log" % self.a, "w")
        proc = subprocess.Popen(self.nsenter(self.ns_a, self.server_cpus) + [self.args.server, "--model",
                                                                             self.args.model],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        deadline = time.time() + 120
        while True:
            probe = subprocess.run(self.nsenter(self.ns_b) + [PYTHON, "-c", "import sys\nsys.path.insert(0, %r)\n"
                                   "from ansible_collections.edgetune.fleet.plugins.module_utils.device "
                                   "import edge_llm\n"
                                   "edge_llm.wait_ready(%d, host=%r, timeout=2)" % (netqos.collections_root(),
                                                                                     INFER_PORT, A_ADDR)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            if probe.returncode == 0:
                return
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit("bench_netqos: llama-server did not answer (log /tmp/edgetune-bench-server-%s.log)"
                                 % self.a)

    def generations(self, runs, warmup):
        options = {"port": INFER_PORT, "host": A_ADDR, "prompt": self.args.prompt, "max_tokens": self.args.max_tokens,
                   "runs": runs, "warmup": warmup, "timeout": 120}
        out = sh(*(self.nsenter(self.ns_b, self.system_cpus) + [PYTHON, "-c", CLIENT, json.dumps(options),
                                                                 netqos.collections_root()]))
        return json.loads(out)

    def stage(self, name):
        bulk = name != "no bulk"
        if bulk:
            if name.endswith("without the classifier"):
                self.without_classifier()
            else:
                self.apply()
            self.start_bulk()
            time.sleep(self.args.warmup)  # the flows out of slow start, the queue filled
        (sent, since), before = self.received(), self.class_bytes()
        runs = self.generations(self.args.generations, self.args.warmup_generations)
        (got, until), after = self.received(), self.class_bytes()
        if bulk:
            self.stop_bulk()
            self.apply()
        elapsed = max(until - since, 1e-6)
        gaps = [gap for run in runs for gap in run["gaps_ms"]]
        return {"stage": name, "gaps_ms": gaps, "ttft_ms": [run["ttft_ms"] for run in runs],
                "goodput_mbit": (got - sent) * 8 / elapsed / 1e6,
                "inference_class_mbit": (after["1:10"] - before["1:10"]) * 8 / elapsed / 1e6,
                "default_class_mbit": (after["1:20"] - before["1:20"]) * 8 / elapsed / 1e6}

    def unavailable(self, candidates):
        """{name: why} for the candidates whose leaf queue this kernel refuses (tried on the bench's link)."""
        refused = {}
        for candidate in candidates:
            if candidate["leaf"] == "default":
                continue
            tried = sh(*(self.nsenter(self.ns_a) + ["tc", "qdisc", "replace", "dev", self.a, "parent", "1:20",
                                                    "handle", "20:"] + candidate["leaf"].split()), check=False)
            if tried is None:
                refused[candidate["name"]] = "this kernel has no %s qdisc" % candidate["leaf"].split()[0]
        self.apply()
        return refused

    def run(self, candidates=None):
        """Rounds of the three stages; with ``candidates`` (the sweep), every candidate's three stages in
        each round, in an order shuffled per round. Returns [stage, ...], each naming its round and candidate.
        Candidates whose leaf queue the kernel lacks are left out (``self.refused`` says why)."""
        self.setup()
        self.refused = self.unavailable(candidates or [self.config])
        if (candidates or [self.config])[0]["name"] in self.refused:
            raise SystemExit("bench_netqos: the default candidate cannot run here: %s"
                             % "; ".join(self.refused.values()))
        candidates = [c for c in candidates or [] if c["name"] not in self.refused]
        for name, why in sorted(self.refused.items()):
            print("bench_netqos: candidate %s left out: %s" % (name, why), file=sys.stderr, flush=True)
        self.start_server()
        self.generations(1, 1)  # the model paged in before the first measured stage
        measured = []
        for round_index in range(1, self.args.rounds + 1):
            order = list(candidates or [self.config])
            random.Random(round_index).shuffle(order)
            for candidate in order:
                if candidates:
                    self.configure(candidate)
                for name in LLM_STAGES:
                    stage = dict(self.stage(name), round=round_index, candidate=candidate["name"])
                    measured.append(stage)
                    if not self.args.json:
                        inter = summary(stage["gaps_ms"])
                        print("  round %d, %s%-30s inter-token P50 %7.2f P99 %7.2f max %7.2f ms; bulk goodput "
                              "%6.2f Mbit/s" % (round_index, "%s, " % candidate["name"] if candidates else "", name,
                                                inter["p50_ms"], inter["p99_ms"], inter["max_ms"],
                                                stage["goodput_mbit"]), flush=True)
            self.check_helpers()
        return measured


def llm_summary(measured, link_mbit):
    """Per stage over all rounds: TTFT and inter-token P50/P99/max, per-round P99s and goodput; then
    the acceptance ratios (medians of the per-round P99s)."""
    stages = {}
    for name in LLM_STAGES:
        chosen = [stage for stage in measured if stage["stage"] == name]
        gaps = [gap for stage in chosen for gap in stage["gaps_ms"]]
        stages[name] = {"inter_token": summary(gaps), "ttft": summary([t for s in chosen for t in s["ttft_ms"]]),
                        "round_p99_ms": [summary(s["gaps_ms"])["p99_ms"] for s in chosen],
                        "goodput_mbit": [s["goodput_mbit"] for s in chosen]}
    quiet = median(stages["no bulk"]["round_p99_ms"])
    without = median(stages[LLM_STAGES[1]]["round_p99_ms"])
    with_classifier = median(stages[LLM_STAGES[2]]["round_p99_ms"])
    goodput = median(stages[LLM_STAGES[2]]["goodput_mbit"])
    return {"stages": stages,
            "with_vs_no_bulk_p99": with_classifier / quiet,
            "without_vs_no_bulk_p99": without / quiet,
            "goodput_share": goodput / link_mbit if link_mbit else None,
            # The rule: the run counts only where the load hurt without the classifier (2x).
            "load_strong_enough": without / quiet >= 2.0,
            "met": with_classifier / quiet <= 1.3 and (goodput / link_mbit if link_mbit else 0) >= 0.9,
            "with_round_p99_range_ms": [min(stages[LLM_STAGES[2]]["round_p99_ms"]),
                                        max(stages[LLM_STAGES[2]]["round_p99_ms"])]}


# The sweep's candidates (NAME:key=value,...): the role's tree as it is today first.
SWEEP_CANDIDATES = (
    "role-today:leaf=default,gso=on,high_rate=20%",
    "gso-off:leaf=default,gso=off,high_rate=20%",
    "fq_codel:leaf=fq_codel,gso=on,high_rate=20%",
    "fq_codel-gso-off:leaf=fq_codel,gso=off,high_rate=20%",
    "cake:leaf=cake,gso=on,high_rate=20%",
    "high-50:leaf=default,gso=on,high_rate=50%",
)


def llm_flows(rate):
    return max(4, int(netqos.parse_rate(rate) * 8 / 1e6 // 6))


def parse_sweep_candidate(text, rate):
    name, _sep, rest = text.partition(":")
    config = {"name": name, "leaf": "default", "gso": False, "high_rate": "20%", "rate": rate}
    for item in filter(None, rest.split(",")):
        key, _sep, value = item.partition("=")
        if key not in ("leaf", "gso", "high_rate") or not value:
            raise SystemExit("bench_netqos: candidate %r: %r is not leaf=, gso=on|off or high_rate=" % (text, item))
        config[key] = value if key != "gso" else value == "on"
    return config


def decide(per_candidate):
    """The issue's rule: the best is the lowest with-classifier P99 (median of rounds) among the candidates that
    keep >= 90% goodput at every rate measured; it replaces the first (today's) only where its per-round P99
    range lies below the default's at every rate."""
    names = list(next(iter(per_candidate.values())))
    default = names[0]
    keeps = [n for n in names if all(rate[n]["goodput_share"] >= 0.9 for rate in per_candidate.values())]
    if not keeps:
        return {"best": None, "replaces_default": False, "why": "no candidate keeps 90% of the link for bulk"}

    def worst_p99(name):
        return max(median(rate[name]["stages"][LLM_STAGES[2]]["round_p99_ms"]) for rate in per_candidate.values())
    best = min(keeps, key=worst_p99)
    apart = best != default and all(
        rate[best]["with_round_p99_range_ms"][1] < rate[default]["with_round_p99_range_ms"][0]
        for rate in per_candidate.values())
    return {"best": best, "default": default, "replaces_default": apart,
            "why": "best by with-classifier P99 among %s; %s" % (
                ", ".join(keeps), "its per-round P99 range lies below the default's at every rate" if apart else
                "the default stays (it is the best, or their per-round P99 ranges overlap)")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="20mbit", help="shaped link rate (default %(default)s)")
    parser.add_argument("--high-rate", default="20%", help="inference class rate (default %(default)s)")
    parser.add_argument("--rounds", type=int, help="alternated rounds (default 3 echo, 5 --llm)")
    parser.add_argument("--count", type=int, default=300, help="echo: probes per phase (default %(default)s)")
    parser.add_argument("--size", type=int, default=256, help="echo: request and response bytes (default %(default)s)")
    parser.add_argument("--gap", type=float, default=0.005, help="echo: seconds between probes (default %(default)s)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of bulk before measuring")
    parser.add_argument("--settle", type=float, default=1.0, help="echo: seconds after switching mode")
    parser.add_argument("--flows", type=int, help="bulk TCP flows (default 1 echo; --llm: one per 6 Mbit/s of "
                                                  "the rate, at least 4: 4 at 20 Mbit/s, 16 at 100)")
    parser.add_argument("--keep-gso", action="store_true", help="leave GSO/TSO on the veth pair")
    parser.add_argument("--leaf", default="default",
                        help="the queue behind each HTB class: default (what the role's tree has) or a tc qdisc "
                             "with its options, e.g. fq_codel, cake, 'pfifo limit 100'")
    parser.add_argument("--llm", action="store_true", help="measure llama-server's streamed tokens instead of echoes")
    parser.add_argument("--server", help="--llm: llama-server (default: this machine's `make artifacts` build)")
    parser.add_argument("--model", help="--llm: the GGUF (default: this machine's `make artifacts` model)")
    parser.add_argument("--server-cpus", help="the server's CPUs (default: the last); the rest run the bulk "
                                              "senders, the sink and the client")
    parser.add_argument("--generations", type=int, default=16, help="--llm: generations per stage and round")
    parser.add_argument("--warmup-generations", type=int, default=1, help="--llm: unmeasured ones per stage")
    parser.add_argument("--max-tokens", type=int, default=64, help="--llm: tokens per generation")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--rates", help="--llm: link rates to measure one after the other, e.g. 20mbit,100mbit")
    parser.add_argument("--sweep", action="store_true",
                        help="--llm: the queue's candidates side by side in each round (%s), then the decision"
                             % "; ".join(SWEEP_CANDIDATES))
    parser.add_argument("--candidate", action="append", metavar="NAME:leaf=Q,gso=on|off,high_rate=R",
                        help="--llm: a candidate of the sweep (repeat; the first is today's default)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", metavar="FILE", help="also write the raw result (JSON, with host, date and commit) "
                                                      "for the docs' benchmark pages")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (5 if args.llm else 3)
    args.flows_given = args.flows
    args.flows = args.flows or (4 if args.llm else 1)
    if os.geteuid() != 0:
        raise SystemExit("bench_netqos: run as root (network namespaces, tc, eBPF)")
    if args.llm:
        found_server, found_model = default_llm()
        args.server, args.model = args.server or found_server, args.model or found_model
        if not (args.server and os.access(args.server, os.X_OK) and args.model and os.path.isfile(args.model)):
            raise SystemExit("bench_netqos: --llm needs llama-server and a GGUF: run `make artifacts` or give "
                             "--server and --model")
        return run_llm(args)
    return run_echo(args)


def settings_of(args):
    return {key: value for key, value in vars(args).items() if key not in ("json", "out")}


def write_result(args, result):
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    if args.json:
        print(json.dumps(result, indent=2))


def run_llm(args):
    stamp = bench_pages.stamp("netqos-llm")  # the checkout as it was when the run began
    rates = [rate for rate in (args.rates or args.rate).split(",") if rate]
    candidate_texts = args.candidate or (SWEEP_CANDIDATES if args.sweep else None)
    runs, per_candidate, refused = [], {}, {}
    for rate in rates:
        args.rate = rate
        # At 100 Mbit/s 4 flows barely disturb the gaps between tokens (a steady queue delays every
        # token alike); 16 did (measured): the load grows with the rate.
        args.flows = args.flows_given or llm_flows(rate)
        bench = LlmBench(args)
        candidates = [parse_sweep_candidate(text, rate) for text in candidate_texts] if candidate_texts else None
        if not args.json:
            print("bench_netqos --llm: %d rounds of %s%s; %d generations of %d tokens per stage; link %s shaped by "
                  "HTB, %d bulk TCP flow(s); server on CPUs %s, the rest on %s" % (
                      args.rounds, ", ".join(LLM_STAGES), " per candidate (%s)" % ", ".join(
                          c["name"] for c in candidates) if candidates else "", args.generations, args.max_tokens,
                      rate, args.flows, format_cpulist(bench.server_cpus), format_cpulist(bench.system_cpus)),
                  flush=True)
        try:
            measured = bench.run(candidates)
        finally:
            bench.cleanup()
        link_mbit = netqos.parse_rate(rate) * 8 / 1e6
        refused.update(bench.refused)
        configs = [c for c in candidates if c["name"] not in refused] if candidates else [bench.config]
        per_candidate[rate] = dict((c["name"], llm_summary([m for m in measured if m["candidate"] == c["name"]],
                                                           link_mbit)) for c in configs)
        runs.append({"rate": rate, "link_mbit": link_mbit, "flows": args.flows, "candidates": configs,
                     "stages": measured})
        if not args.json:
            for config in configs:
                print_llm_summary(config["name"], per_candidate[rate][config["name"]])
    decision = decide(per_candidate) if candidate_texts else None
    if decision and not args.json:
        print("decision: %s" % decision["why"] + (": %s replaces the default" % decision["best"]
                                                   if decision["replaces_default"] else ""))
    write_result(args, dict(stamp, settings=settings_of(args),
                            server_cpus=format_cpulist(bench.server_cpus),
                            system_cpus=format_cpulist(bench.system_cpus), receive_steered=True,
                            summary=per_candidate, decision=decision, runs=runs, left_out=refused))
    return 0


def print_llm_summary(name, summed):
    print("%s:" % name)
    print("  %-32s %9s %9s %9s %9s %9s %12s" % ("stage", "TTFT P50", "TTFT P99", "tok P50", "tok P99", "tok max",
                                                "goodput"))
    for stage in LLM_STAGES:
        s = summed["stages"][stage]
        print("  %-32s %9.1f %9.1f %9.2f %9.2f %9.2f %7.2f Mbit" % (
            stage, s["ttft"]["p50_ms"], s["ttft"]["p99_ms"], s["inter_token"]["p50_ms"], s["inter_token"]["p99_ms"],
            s["inter_token"]["max_ms"], median(s["goodput_mbit"])))
    print("  inter-token P99 (median of rounds): with the classifier / no bulk %.2fx (goal <= 1.3), without / no "
          "bulk %.2fx (the load counts at >= 2); bulk goodput with the classifier %.0f%% of the link (goal >= 90%%)"
          % (summed["with_vs_no_bulk_p99"], summed["without_vs_no_bulk_p99"], 100 * summed["goodput_share"]))


def run_echo(args):
    stamp = bench_pages.stamp("netqos-echo")
    bench = EchoBench(args)
    if not args.json:
        print("bench_netqos: %d rounds, %d probes of %d B per phase, link %s shaped by HTB (inference class %s), "
              "%d bulk TCP flow(s), GSO %s" % (args.rounds, args.count, args.size, args.rate, args.high_rate,
                                              args.flows, "on" if args.keep_gso else "off"), flush=True)
    try:
        results, phases = bench.run()
    finally:
        bench.cleanup()
    summed = {}
    for mode in ("without", "with"):
        summed[mode] = {"p50_ms": percentile(results[mode], 50), "p99_ms": percentile(results[mode], 99),
                        "samples": len(results[mode])}
    summed["ratio_p50"] = summed["without"]["p50_ms"] / summed["with"]["p50_ms"]
    summed["ratio_p99"] = summed["without"]["p99_ms"] / summed["with"]["p99_ms"]
    write_result(args, dict(stamp, settings=settings_of(args), receive_steered=True, summary=summed,
                            phases=phases))
    if args.json:
        return 0
    print("%-20s %12s %12s" % ("", "P50 (ms)", "P99 (ms)"))
    print("%-20s %12.2f %12.2f" % ("without classifier", summed["without"]["p50_ms"], summed["without"]["p99_ms"]))
    print("%-20s %12.2f %12.2f" % ("with classifier", summed["with"]["p50_ms"], summed["with"]["p99_ms"]))
    print("%-20s %11.1fx %11.1fx" % ("ratio without/with", summed["ratio_p50"], summed["ratio_p99"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
