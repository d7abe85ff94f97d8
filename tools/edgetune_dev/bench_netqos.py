#!/usr/bin/python3
"""Benchmark (not a test): request/response latency on the inference port under a
saturating bulk flow, with and without the edgetune classifier, in one run.

Two network namespaces joined by a veth pair; the sender's egress is shaped by
the same HTB tree `edgetune-netqos apply` makes (link rate --rate, inference
class 1:10, default class 1:20). A bulk TCP flow to another port keeps the
link saturated the whole time; a probe sends --size bytes to the inference
port and waits for the echo, --count times per phase. Phases alternate
(without, with, without, with, ...) so that drift hits both alike; "without"
is the same HTB tree with the classifier's filter removed, so every packet
takes the default class. Prints P50/P99 per mode and their ratio.

Run as root after `edgetune-dev netqos-host` (bcc, pyroute2, kernel headers):
    edgetune-dev bench netqos [--rate 20mbit] [--rounds 3] [--json]
which runs this module with the system Python (bcc is Debian's, not the venv's). The loader is
the collection's edge_netqos_loader, run as the role's edgetune-netqos command runs it. Traffic
stays inside the namespaces this script makes and removes.
"""
import argparse
import json
import os
import secrets
import subprocess
import sys
import time

from edgetune_dev import bench_pages  # (edgetune_dev also puts the checkout's collection on the import path)
from ansible_collections.edgetune.fleet.plugins.module_utils import edge_netqos_loader as netqos

A_ADDR, B_ADDR = "10.78.0.1", "10.78.0.2"
INFER_PORT, BULK_PORT = 8000, 5001
PYTHON = "/usr/bin/python3"

SINK = r"""
import socket, threading
def drain(conn):
    while conn.recv(1 << 16):
        pass
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", %d)); srv.listen(8)
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
    if check and result.returncode != 0:
        raise SystemExit("bench_netqos: %s failed: %s" % (" ".join(map(str, argv)), result.stderr.strip()))
    return result.stdout


def percentile(values, pct):
    ordered = sorted(values)
    rank = max(1, int(-(-pct * len(ordered) // 100)))  # nearest rank
    return ordered[rank - 1]


class Bench(object):
    def __init__(self, args):
        tag = secrets.token_hex(3)
        self.args = args
        self.ns_a, self.ns_b = "etqb-%s-a" % tag, "etqb-%s-b" % tag
        self.a, self.b = "nqb%sa" % tag, "nqb%sb" % tag
        self.procs = []

    def nsenter(self, ns):
        return ["nsenter", "--net=/run/netns/%s" % ns]

    def setup(self):
        sh("ip", "netns", "add", self.ns_a)
        sh("ip", "netns", "add", self.ns_b)
        sh("ip", "link", "add", self.a, "netns", self.ns_a, "type", "veth", "peer", "name", self.b, "netns", self.ns_b)
        for ns, dev, addr in ((self.ns_a, self.a, A_ADDR), (self.ns_b, self.b, B_ADDR)):
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            if not self.args.keep_gso:
                # One segment per skb, as on a link shaped without TSO: a 64 KiB GSO
                # packet would hold the wire for 26 ms at 20 Mbit/s whatever its class.
                sh("ip", "-n", ns, "link", "set", dev, "gso_max_segs", "1")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", dev, "up")
        self.start(self.ns_b, SINK)
        self.start(self.ns_b, ECHO)
        self.apply()

    def start(self, ns, script, *argv):
        proc = subprocess.Popen(self.nsenter(ns) + [PYTHON, "-c", script] + [str(a) for a in argv],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def loader(self, *argv):
        return sh(*(self.nsenter(self.ns_a) + netqos.command(PYTHON, netqos.collections_root()) + list(argv)))

    def apply(self):
        self.loader("apply", "-i", self.a, "--rate", self.args.rate, "--high-rate", self.args.high_rate,
                    "--ports", str(INFER_PORT))

    def without_classifier(self):
        sh(*(self.nsenter(self.ns_a) + ["tc", "filter", "del", "dev", self.a, "egress", "pref", netqos.FILTER_PREF]))

    def class_bytes(self):
        out = json.loads(self.loader("status", "-i", self.a, "--json"))["interfaces"][0]
        return dict((c["class"], c["bytes"]) for c in out["classes"])

    def probe(self):
        out = sh(*(self.nsenter(self.ns_a) + [PYTHON, "-c", PROBE, B_ADDR, INFER_PORT, self.args.count,
                                              self.args.size, self.args.gap]))
        return json.loads(out)

    def run(self):
        self.setup()
        for _ in range(self.args.flows):
            self.start(self.ns_a, BULK, B_ADDR, BULK_PORT)
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
        for proc in self.procs:
            if proc.poll() is not None:
                raise SystemExit("bench_netqos: a helper exited early: %s" % proc.stderr.read().decode().strip())
        return results, phases

    def cleanup(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for ns in (self.ns_a, self.ns_b):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, check=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="20mbit", help="shaped link rate (default %(default)s)")
    parser.add_argument("--high-rate", default="20%", help="inference class rate (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="without/with pairs (default %(default)s)")
    parser.add_argument("--count", type=int, default=300, help="probes per phase (default %(default)s)")
    parser.add_argument("--size", type=int, default=256, help="request and response bytes (default %(default)s)")
    parser.add_argument("--gap", type=float, default=0.005, help="seconds between probes (default %(default)s)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of bulk before the first phase")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after switching mode")
    parser.add_argument("--flows", type=int, default=1, help="bulk TCP flows (default %(default)s)")
    parser.add_argument("--keep-gso", action="store_true", help="leave GSO/TSO on the veth pair")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", metavar="FILE", help="also write the raw result (JSON, with host, date and commit) "
                                                      "for the docs' benchmark pages")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_netqos: run as root (network namespaces, tc, eBPF)")
    bench = Bench(args)
    if not args.json:
        print("bench_netqos: %d rounds, %d probes of %d B per phase, link %s shaped by HTB (inference class %s), "
              "%d bulk TCP flow(s), GSO %s" % (args.rounds, args.count, args.size, args.rate, args.high_rate,
                                              args.flows, "on" if args.keep_gso else "off"), flush=True)
    try:
        results, phases = bench.run()
    finally:
        bench.cleanup()
    summary = {}
    for mode in ("without", "with"):
        summary[mode] = {"p50_ms": percentile(results[mode], 50), "p99_ms": percentile(results[mode], 99),
                         "samples": len(results[mode])}
    summary["ratio_p50"] = summary["without"]["p50_ms"] / summary["with"]["p50_ms"]
    summary["ratio_p99"] = summary["without"]["p99_ms"] / summary["with"]["p99_ms"]
    settings = {key: value for key, value in vars(args).items() if key not in ("json", "out")}
    result = dict(bench_pages.stamp("netqos-echo"), settings=settings, summary=summary, phases=phases)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("%-20s %12s %12s" % ("", "P50 (ms)", "P99 (ms)"))
    print("%-20s %12.2f %12.2f" % ("without classifier", summary["without"]["p50_ms"], summary["without"]["p99_ms"]))
    print("%-20s %12.2f %12.2f" % ("with classifier", summary["with"]["p50_ms"], summary["with"]["p99_ms"]))
    print("%-20s %11.1fx %11.1fx" % ("ratio without/with", summary["ratio_p50"], summary["ratio_p99"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
