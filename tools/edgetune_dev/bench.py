"""`edgetune-dev bench latency`: request latency of an inference runtime.

    edgetune-dev bench latency --url http://127.0.0.1:8470 [--requests 500] [--concurrency 1]
                           [--warmup 20] [--body '{"sample": 0}'] [--p99-ms 50] [--json] [--png FILE]

Sends POST /infer requests over keep-alive connections and reports P50, P90,
P99, max, mean and QPS (nearest-rank percentiles, the same method as the
deploy gate in plugins/module_utils/device/edge_latency.py). Exit codes: 0, 1 when --p99-ms
is exceeded or requests failed, 2 on usage errors or when nothing answers.

The requests are sent by plugins/module_utils/device/edge_latency.py, the deploy gate's own
load generator. Both files use only the standard library and run on Python
3.8, so the same code measures on a device with its system Python:

    cat plugins/module_utils/device/edge_latency.py tools/edgetune_dev/bench.py | python3 - latency --url http://127.0.0.1:8470

(`edgetune-dev bench runtime` does that inside a twin). The PNG histogram needs
matplotlib on the controller (requirements.txt). The numbers are printed before
the plot is drawn: a plot that fails keeps them, says in one line why no PNG
was made, and exits 1.
"""
import argparse
import http.client
import json
import sys
from urllib.parse import urlsplit

try:
    from edgetune.errors import UsageError
except ImportError:  # piped onto a device, where edgetune is not installed
    class UsageError(Exception):
        pass
if "run_load" not in globals():  # imported as the harness's module (piped, edge_latency.py came first)
    # The deploy gate's load generator and percentiles: one implementation.
    # summarize is for the runtime bench (bench.summarize).
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_latency import (  # noqa: F401
        percentile, run_load, summarize)


def parse_url(url):
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError("--url must be http://HOST:PORT[/path], not %r" % url)
    path = parts.path if parts.path not in ("", "/") else "/infer"
    return parts.hostname, parts.port or 80, path


def measure(url, requests=500, concurrency=1, warmup=20, body=b'{"sample": 0}', timeout=10.0):
    """Latency samples (ms, completion order) of ``requests`` POSTs after ``warmup`` ones."""
    host, port, path = parse_url(url)
    result = run_load(host, port, path, body, requests, concurrency, warmup, timeout, keep_samples=True)
    result.update(url="http://%s:%d%s" % (host, port, path), concurrency=concurrency, warmup=warmup)
    return result


def write_histogram_png(path, series, title, limit_ms=None, xlabel="request latency", ylabel="requests"):
    """One PNG: a latency histogram per series (label -> samples in ms), log-spaced bins, P99 marked."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("matplotlib is not installed on the controller "
                         "(pip install -r requirements.txt)") from None
    values = [v for samples in series.values() for v in samples if v > 0]
    if not values:
        raise UsageError("no samples to plot")
    low, high = max(min(values) * 0.9, 0.01), max(values) * 1.1
    bins = [low * (high / low) ** (i / 60.0) for i in range(61)]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    colors = ["#2b7bba", "#d7301f", "#1a9850", "#984ea3", "#ff7f00"]
    for (label, samples), color in zip(series.items(), colors):
        ordered = sorted(samples)
        p99 = percentile(ordered, 99)
        ax.hist(samples, bins=bins, histtype="step", linewidth=1.6, color=color,
                label="%s: P50 %.2f ms, P99 %.2f ms (n=%d)" % (label, percentile(ordered, 50), p99, len(samples)))
        ax.axvline(p99, color=color, linestyle="--", linewidth=1)
    if limit_ms:
        ax.axvline(limit_ms, color="black", linestyle=":", linewidth=1, label="limit %.1f ms" % limit_ms)
    ax.set_xscale("log")
    ax.set_xlabel("%s (ms, log scale); dashed: P99" % xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def format_summary(result):
    return ("P50 %(p50_ms)s ms  P90 %(p90_ms)s ms  P99 %(p99_ms)s ms  max %(max_ms)s ms  mean %(mean_ms)s ms  "
            "QPS %(qps)s  errors %(errors)d" % result)


def cmd_latency(args):
    if args.requests < 1 or args.concurrency < 1 or args.warmup < 0:
        raise UsageError("--requests and --concurrency must be at least 1, --warmup 0 or more")
    try:
        body = json.dumps(json.loads(args.body)).encode()
    except ValueError as exc:
        raise UsageError("--body is not JSON: %s" % exc) from None
    host, port, path = parse_url(args.url)
    try:
        socket_probe = http.client.HTTPConnection(host, port, timeout=args.timeout)
        socket_probe.connect()
        socket_probe.close()
    except OSError as exc:
        raise UsageError("nothing answers at %s:%d (%s); is the runtime running?" % (host, port, exc)) from None
    result = measure(args.url, args.requests, args.concurrency, args.warmup, body, args.timeout)
    if result["count"] == 0:
        raise UsageError("every request failed; first: %s" % result["first_error"])
    result["p99_limit_ms"] = args.p99_ms
    over = args.p99_ms is not None and result["p99_ms"] > args.p99_ms
    samples = result["samples_ms"] if args.samples else result.pop("samples_ms")
    # The numbers first: a plot that fails afterwards cannot take them away.
    print_result(result, args, over)
    if args.png:
        try:
            write_histogram_png(args.png, {"%s c=%d" % (result["url"], args.concurrency): samples},
                                "edgetune-dev bench latency", args.p99_ms)
        except Exception as exc:  # whatever stops the plot (matplotlib, the file), the numbers stand
            reason = str(exc) if isinstance(exc, UsageError) else "%s: %s" % (type(exc).__name__, exc)
            print("edgetune: no PNG written to %s: %s" % (args.png, reason), file=sys.stderr)
            return 1
        if not args.json:
            print("  histogram: %s" % args.png)
    return 1 if over or result["errors"] else 0


def print_result(result, args, over):
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("%s: %d requests over %d connection(s) after %d warm-up" % (
            result["url"], result["count"] + result["errors"], args.concurrency, args.warmup))
        print("  " + format_summary(result))
        if over:
            print("  P99 %.3f ms is over the limit of %.3f ms" % (result["p99_ms"], args.p99_ms))
    sys.stdout.flush()


def add_parser(subparsers):
    # Other benchmarks may add their own `bench` subcommands: share the parser.
    bench = subparsers.choices.get("bench")
    if bench is None:
        bench = subparsers.add_parser("bench", help="benchmarks (latency of a runtime, ...)")
        bench.edgetune_sub = bench.add_subparsers(dest="bench_command", required=True)
    p = bench.edgetune_sub.add_parser("latency", help="P50/P90/P99/max latency and QPS of POST /infer")
    p.add_argument("--url", required=True, help="http://HOST:PORT[/path] of the runtime (path default /infer)")
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--body", default='{"sample": 0}', help="JSON body of each request")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--p99-ms", type=float, help="exit 1 when P99 is over this many ms")
    p.add_argument("--json", action="store_true")
    p.add_argument("--samples", action="store_true", help="include every sample in the JSON")
    p.add_argument("--png", metavar="FILE", help="also draw a latency histogram PNG, after the numbers are printed")
    p.set_defaults(func=cmd_latency)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench.py", description="edgetune latency benchmark (standalone)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["bench"] + list(sys.argv[1:] if argv is None else argv))
    try:
        return args.func(args)
    except UsageError as exc:
        print("bench: error: %s" % exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
