"""edgetune reference runtime: an HTTP inference server around the reference engine.

The contract (endpoints, readiness, arguments, exit codes) is in ../README.md.
Python 3.8+, standard library only.
"""
import argparse
import ctypes
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from edgetune_runtime import __version__
from edgetune_runtime.engine import Engine, EngineError

# Exit codes (README.md, "Exit codes"); systemd's RestartPreventExitStatus
# lists the ones a restart cannot cure.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_ENGINE = 3
EXIT_WARMUP = 4
EXIT_LISTEN = 5

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
POLICIES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline"}
PR_SET_NAME = 15
MCL_CURRENT = 1


def log(message):
    print("edgetune-runtime: " + message, file=sys.stderr, flush=True)


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


LIBC = _libc()


def name_this_thread(name):
    """Give the calling OS thread a name (15 bytes max), seen in /proc/<pid>/task/<tid>/comm."""
    threading.current_thread().name = name
    if LIBC is not None:
        try:
            LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
        except AttributeError:
            pass


def sd_notify(message):
    """systemd's notification protocol (Type=notify), without libsystemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as exc:
        log("cannot notify systemd (%s): %s" % (address, exc))
        return False


def thread_scheduling():
    """Each thread of this process: name, policy, RT priority and allowed CPUs, read from /proc."""
    threads = []
    base = "/proc/self/task"
    for tid in sorted(os.listdir(base), key=int):
        try:
            with open("%s/%s/stat" % (base, tid)) as handle:
                stat = handle.read()
            with open("%s/%s/status" % (base, tid)) as handle:
                status = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat[stat.rindex(")") + 2:].split()
        threads.append({"tid": int(tid), "name": stat[stat.index("(") + 1:stat.rindex(")")],
                        "policy": POLICIES.get(int(fields[38]), fields[38]), "rt_priority": int(fields[37]),
                        "cpus": status.get("Cpus_allowed_list", "").strip()})
    return threads


class Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count); thread-safe."""

    def __init__(self, buckets=LATENCY_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.lock = threading.Lock()

    def observe(self, seconds):
        with self.lock:
            for i, bound in enumerate(self.buckets):
                if seconds <= bound:
                    self.counts[i] += 1
                    break
            else:
                self.counts[-1] += 1
            self.total += seconds

    def render(self, name, labels=""):
        with self.lock:
            counts, total = list(self.counts), self.total
        lines, running = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.buckets + (None,), counts):
            running += count
            le = "+Inf" if bound is None else repr(float(bound))
            lines.append('%s_bucket{%s%sle="%s"} %d' % (name, labels, sep, le, running))
        suffix = "{%s}" % labels if labels else ""
        lines.append("%s_sum%s %.9f" % (name, suffix, total))
        lines.append("%s_count%s %d" % (name, suffix, running))
        return lines


class Job:
    __slots__ = ("vectors", "done", "result", "error", "seconds")

    def __init__(self, vectors):
        self.vectors = vectors
        self.done = threading.Event()
        self.result = self.error = None
        self.seconds = 0.0


class Runtime:
    """State shared by the HTTP and inference threads."""

    def __init__(self, args):
        self.args = args
        self.state = "loading"  # loading -> ready -> draining; or failed
        self.engine = None
        self.warmup = {}
        self.started = time.time()
        self.jobs = queue.Queue(maxsize=args.queue_depth)
        self.inference_hist = Histogram()
        self.request_hist = Histogram()
        self.requests = {}
        self.lock = threading.Lock()
        self.in_flight = 0
        self.mlocked = None

    def count(self, endpoint, code):
        with self.lock:
            key = (endpoint, code)
            self.requests[key] = self.requests.get(key, 0) + 1

    # ---------------------------------------------------------- inference
    def inference_worker(self, index):
        name_this_thread("et-infer-%d" % index)
        for job in iter(self.jobs.get, None):  # None stops the worker
            began = time.perf_counter()
            try:
                job.result = [self.engine.infer(v) for v in job.vectors]
            except Exception as exc:  # a bad vector must not kill the worker
                job.error = str(exc)
            job.seconds = time.perf_counter() - began
            self.inference_hist.observe(job.seconds)
            job.done.set()

    def submit(self, vectors, timeout):
        job = Job(vectors)
        self.jobs.put_nowait(job)  # queue.Full -> 503 busy
        if not job.done.wait(timeout):
            raise TimeoutError("inference did not finish within %.1f s" % timeout)
        if job.error:
            raise ValueError(job.error)
        return job

    # ---------------------------------------------------------- readiness
    def scheduling_report(self):
        threads = thread_scheduling()
        expected = self.args.expect_sched
        wrong = [t for t in threads if expected != "any" and t["policy"] != expected]
        return {"expected": expected, "ok": not wrong, "threads": threads,
                "mismatch": ["%s(%d) runs %s" % (t["name"], t["tid"], t["policy"]) for t in wrong]}

    def health(self):
        body = {"status": self.state, "runtime_version": __version__, "uptime_s": round(time.time() - self.started, 3)}
        if self.engine is not None:
            body["engine"] = {"name": self.engine.name, "version": self.engine.version,
                              "inputs": self.engine.input_size, "outputs": self.engine.output_size,
                              "macs": self.engine.macs}
        if self.warmup:
            body["warmup"] = self.warmup
        body["mlocked"] = self.mlocked
        body["scheduling"] = self.scheduling_report()
        return body

    def metrics(self):
        out = ["# HELP edgetune_runtime_info Runtime and engine versions.",
               "# TYPE edgetune_runtime_info gauge",
               'edgetune_runtime_info{version="%s",engine="%s",engine_version="%s"} 1' % (
                   __version__, self.engine.name if self.engine else "", self.engine.version if self.engine else ""),
               "# HELP edgetune_runtime_ready 1 when the engine is loaded and warmed up and the runtime is serving.",
               "# TYPE edgetune_runtime_ready gauge",
               "edgetune_runtime_ready %d" % (self.state == "ready"),
               "# HELP edgetune_inference_duration_seconds Time in the engine per request (all its vectors).",
               "# TYPE edgetune_inference_duration_seconds histogram"]
        out += self.inference_hist.render("edgetune_inference_duration_seconds")
        out += ["# HELP edgetune_request_duration_seconds POST /infer from request read to response written, "
                "queueing included.",
                "# TYPE edgetune_request_duration_seconds histogram"]
        out += self.request_hist.render("edgetune_request_duration_seconds")
        out += ["# HELP edgetune_requests_total HTTP requests by endpoint and status code.",
                "# TYPE edgetune_requests_total counter"]
        with self.lock:
            items = sorted(self.requests.items())
        out += ['edgetune_requests_total{endpoint="%s",code="%d"} %d' % (e, c, n) for (e, c), n in items]
        out += ["# HELP edgetune_inference_queue_depth Requests waiting for an inference thread.",
                "# TYPE edgetune_inference_queue_depth gauge",
                "edgetune_inference_queue_depth %d" % self.jobs.qsize()]
        report = self.scheduling_report()
        out += ["# HELP edgetune_runtime_thread_policy_ok 1 when every thread runs the expected scheduling policy.",
                "# TYPE edgetune_runtime_thread_policy_ok gauge",
                "edgetune_runtime_thread_policy_ok %d" % report["ok"]]
        return "\n".join(out) + "\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in separate writes: without TCP_NODELAY, Nagle's
    # algorithm and the client's delayed ACK add ~40 ms to every response.
    disable_nagle_algorithm = True
    server_version = "edgetune-runtime/" + __version__
    runtime = None  # set by serve()

    def log_message(self, fmt, *args):  # access logs would dominate the journal
        pass

    def setup(self):
        self.timeout = self.runtime.args.keepalive
        super().setup()

    def send_json(self, code, body, endpoint):
        data = (json.dumps(body, separators=(",", ":")) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.runtime.state == "draining":
            self.send_header("Connection", "close")
            self.close_connection = True
        # Counted before the body goes out: a client that reads /metrics right after
        # its answer must find its own request counted.
        self.runtime.count(endpoint, code)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            body = self.runtime.health()
            self.send_json(200 if body["status"] == "ready" else 503, body, path)
        elif path == "/metrics":
            data = self.runtime.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.runtime.count(path, 200)
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_json(404, {"error": "no such endpoint; try /healthz, /metrics or POST /infer"}, "other")

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if path != "/infer":
            self.send_json(404, {"error": "POST goes to /infer"}, "other")
            return
        began = time.perf_counter()
        runtime = self.runtime
        with runtime.lock:
            runtime.in_flight += 1
        try:
            code, body = self.infer()
        finally:
            with runtime.lock:
                runtime.in_flight -= 1
        if code == 200:  # observed before the answer is sent, for the same reason as the count
            runtime.request_hist.observe(time.perf_counter() - began)
        self.send_json(code, body, path)

    def infer(self):
        runtime = self.runtime
        length = int(self.headers.get("Content-Length") or 0)
        if length > runtime.args.max_body:
            self.close_connection = True
            return 413, {"error": "request body over %d bytes" % runtime.args.max_body}
        raw = self.rfile.read(length) if length else b"{}"
        if runtime.state != "ready":
            return 503, {"error": "not ready (%s)" % runtime.state}
        try:
            request = json.loads(raw.decode() or "{}")
            vectors, samples = parse_request(request, runtime.engine)
        except (ValueError, TypeError) as exc:
            return 400, {"error": str(exc)}
        try:
            job = runtime.submit(vectors, runtime.args.infer_timeout)
        except queue.Full:
            return 503, {"error": "busy: %d requests already queued" % runtime.args.queue_depth}
        except TimeoutError as exc:
            return 504, {"error": str(exc)}
        except ValueError as exc:
            return 400, {"error": str(exc)}
        engine = runtime.engine
        outputs = []
        for logits in job.result:
            index, label = engine.classify(logits)
            item = {"class": index, "label": label, "logits": logits}
            if request.get("probabilities"):
                item["probabilities"] = engine.softmax(logits)
            outputs.append(item)
        body = {"engine": engine.name, "engine_version": engine.version, "outputs": outputs,
                "inference_ms": round(job.seconds * 1000.0, 3)}
        if samples is not None:
            body["samples"] = samples
        return 200, body


def parse_request(request, engine):
    """{"inputs": [[...], ...]} or {"sample": n} / {"samples": [n, ...]} -> (vectors, sample ids or None)."""
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object")
    if "inputs" in request:
        vectors = request["inputs"]
        if not isinstance(vectors, list) or not vectors or not all(isinstance(v, list) for v in vectors):
            raise ValueError('"inputs" must be a non-empty list of vectors')
        for v in vectors:
            if len(v) != engine.input_size:
                raise ValueError("each input needs %d values, got %d" % (engine.input_size, len(v)))
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ValueError("inputs must be numbers")
        return vectors, None
    samples = request.get("samples", [request.get("sample", 0)])
    if not isinstance(samples, list) or not samples or not all(isinstance(s, int) and s >= 0 for s in samples):
        raise ValueError('"sample" must be a non-negative integer ("samples" a list of them)')
    if len(samples) > 64:
        raise ValueError("at most 64 samples per request")
    return [engine.sample(s) for s in samples], samples


class PooledHTTPServer(HTTPServer):
    """HTTPServer whose connections are served by a fixed pool of named threads."""

    allow_reuse_address = True  # TIME_WAIT only; a live listener still gives EADDRINUSE
    request_queue_size = 64

    def __init__(self, address, handler, workers):
        super().__init__(address, handler)
        self.pending = queue.Queue()
        self.connections = set()
        self.connections_lock = threading.Lock()
        self.workers = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(workers)]
        for thread in self.workers:
            thread.start()

    def process_request(self, request, client_address):
        self.pending.put((request, client_address))

    def worker(self, index):
        name_this_thread("et-http-%d" % index)
        for request, client_address in iter(self.pending.get, None):  # None stops the worker
            with self.connections_lock:
                self.connections.add(request)
            try:
                self.finish_request(request, client_address)
            except Exception:  # one broken connection must not end the worker
                self.handle_error(request, client_address)
            finally:
                with self.connections_lock:
                    self.connections.discard(request)
                self.shutdown_request(request)

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, socket.timeout)):
            log("error serving %s: %r" % (client_address[0], exc))

    def close_idle(self):
        """End keep-alive connections waiting for their next request (drain)."""
        with self.connections_lock:
            for request in list(self.connections):
                try:
                    request.shutdown(socket.SHUT_RD)
                except OSError:
                    pass

    def stop_workers(self, timeout):
        for _ in self.workers:
            self.pending.put(None)
        deadline = time.time() + timeout
        for thread in self.workers:
            thread.join(max(0.0, deadline - time.time()))


def env_default(name, default, kind=str):
    value = os.environ.get("EDGETUNE_" + name)
    if value is None or value == "":
        return default
    try:
        return kind(value)
    except ValueError:
        log("EDGETUNE_%s=%r is not a valid %s" % (name, value, kind.__name__))
        raise SystemExit(EXIT_USAGE) from None


def parse_args(argv):
    p = argparse.ArgumentParser(prog="edgetune-runtime", description="edgetune reference inference runtime")
    p.add_argument("--engine", default=env_default("ENGINE", None), help="engine file (EDGETUNE_ENGINE)")
    p.add_argument("--host", default=env_default("HOST", "127.0.0.1"), help="listen address (EDGETUNE_HOST)")
    p.add_argument("--port", type=int, default=env_default("PORT", 8470, int), help="listen port (EDGETUNE_PORT)")
    p.add_argument("--http-threads", type=int, default=env_default("HTTP_THREADS", 4, int))
    p.add_argument("--infer-threads", type=int, default=env_default("INFER_THREADS", 1, int))
    p.add_argument("--queue-depth", type=int, default=env_default("QUEUE_DEPTH", 64, int))
    p.add_argument("--warmup", type=int, default=env_default("WARMUP", 20, int),
                   help="warm-up inferences after the golden self-test")
    p.add_argument("--infer-timeout", type=float, default=env_default("INFER_TIMEOUT", 10.0, float))
    p.add_argument("--keepalive", type=float, default=env_default("KEEPALIVE", 5.0, float),
                   help="idle seconds before a keep-alive connection is closed")
    p.add_argument("--drain-timeout", type=float, default=env_default("DRAIN_TIMEOUT", 10.0, float))
    p.add_argument("--max-body", type=int, default=env_default("MAX_BODY", 1 << 20, int))
    p.add_argument("--expect-sched", choices=["fifo", "rr", "other", "any"], default=env_default("EXPECT_SCHED", "any"),
                   help="scheduling policy the threads must run; a mismatch is reported by /healthz and /metrics")
    p.add_argument("--mlock", action="store_true", default=env_default("MLOCK", "0") == "1",
                   help="lock all memory (mlockall) after loading (EDGETUNE_MLOCK=1)")
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    if not args.engine:
        p.error("--engine (or EDGETUNE_ENGINE) is required")
    for name in ("http_threads", "infer_threads", "queue_depth"):
        if getattr(args, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if args.warmup < 0:
        p.error("--warmup must be 0 or more")
    return args


def lock_memory():
    """Lock what is mapped now (code, engine, warmed-up heap). Not MCL_FUTURE: with a bounded
    LimitMEMLOCK it would make later mappings (thread stacks, malloc arenas) fail."""
    if LIBC is None:
        return False
    if LIBC.mlockall(MCL_CURRENT) != 0:
        log("mlockall failed (%s): pages may fault under memory pressure; raise LimitMEMLOCK"
            % os.strerror(ctypes.get_errno()))
        return False
    return True


def serve(args):
    name_this_thread("et-main")
    runtime = Runtime(args)
    Handler.runtime = runtime
    try:
        server = PooledHTTPServer((args.host, args.port), Handler, args.http_threads)
    except OSError as exc:
        log("cannot listen on %s:%d: %s" % (args.host, args.port, exc.strerror or exc))
        return EXIT_LISTEN
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    acceptor = threading.Thread(target=lambda: (name_this_thread("et-accept"), server.serve_forever(0.2)),
                                daemon=True)
    acceptor.start()
    log("listening on %s:%d, loading %s" % (args.host, args.port, args.engine))
    sd_notify("STATUS=loading %s" % args.engine)

    code = EXIT_OK
    try:
        began = time.perf_counter()
        runtime.engine = Engine.load(args.engine)
        loaded = time.perf_counter()
        golden = runtime.engine.self_test()
        for i in range(args.warmup):
            runtime.engine.infer(runtime.engine.sample(1000 + i))
        runtime.warmup = {"load_ms": round((loaded - began) * 1000, 1), "golden_checked": golden,
                          "warmup_inferences": args.warmup,
                          "warmup_ms": round((time.perf_counter() - loaded) * 1000, 1)}
    except EngineError as exc:
        runtime.state = "failed"
        log("engine rejected: %s" % exc)
        code = EXIT_WARMUP if runtime.engine is not None else EXIT_ENGINE
    if code == EXIT_OK:
        if args.mlock:
            runtime.mlocked = lock_memory()
        workers = [threading.Thread(target=runtime.inference_worker, args=(i,), daemon=True)
                   for i in range(args.infer_threads)]
        for thread in workers:
            thread.start()
        runtime.state = "ready"
        report = runtime.scheduling_report()
        if not report["ok"]:
            log("WARNING: expected SCHED_%s but %s" % (args.expect_sched.upper(), "; ".join(report["mismatch"])))
        log("ready: engine %s %s, %d MACs, warm-up %s" % (runtime.engine.name, runtime.engine.version,
                                                          runtime.engine.macs, runtime.warmup))
        sd_notify("READY=1\nSTATUS=serving %s %s" % (runtime.engine.name, runtime.engine.version))
        stop.wait()
        log("draining")
        sd_notify("STOPPING=1")
        runtime.state = "draining"
        deadline = time.time() + args.drain_timeout
        while time.time() < deadline and (runtime.in_flight or runtime.jobs.qsize()):
            time.sleep(0.01)
        for _ in workers:
            runtime.jobs.put(None)
        for thread in workers:
            thread.join(max(0.0, deadline - time.time()))
    server.shutdown()
    server.server_close()
    server.close_idle()
    server.stop_workers(2.0)
    log("stopped (exit %d)" % code)
    return code


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return serve(args)
    except Exception as exc:  # last resort: say what happened, exit 1
        log("unexpected error: %r" % exc)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
