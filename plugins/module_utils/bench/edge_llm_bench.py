# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Token latency of llama-server under noise on the host this runs on, side by
side in rounds: quiet, noisy untuned, and every candidate runtime setting under
the same noise (``edgetune bench llm --host``). Python 3.8+, stdlib only; root;
no Ansible, systemd or Docker needed.

It places the server and the noise the way the roles would: the server on the
inference CPUs in a cgroup v2 cpuset partition (``cpuset.cpus.partition``)
where the kernel has one, else a plain cpuset, else CPU affinity; the noise on
the housekeeping CPUs; the scheduling policy and priority on every thread (a
thread inherits them from the process, as under systemd's
``CPUSchedulingPolicy=``). Untuned: server and noise anywhere, SCHED_OTHER.
Where a child cgroup has no RT budget (RT group scheduling), a FIFO candidate
runs from the root cgroup with affinity, and the result says so.

The client is the deploy gate's own (edge_llm.stream_completion), so numbers
from a board (tools/bench-runtime over Ansible) and from a host mean the same.
It is a fixed instrument, the same in every stage: on the housekeeping CPUs at
SCHED_FIFO 1 (each where the kernel grants it: a twin's or a container's cgroup
may refuse either), so neither the noise nor
the candidate's policy delays its reads. ``--client server`` runs it with the
placement and scheduling of the server it measures instead (an application in
the same slice): there it competes with the server's threads for the inference
CPUs, which favours candidates that leave a CPU free or run at RT priority.

Run from any copy of the collection without installing anything:
``python3 plugins/module_utils/bench/edge_llm_bench.py --help``.
"""

import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

if __name__ == "__main__" and not __package__:
    # Run as a plain script from a copy of the collection: make the collection importable by its name.
    _collection = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    _paths = tempfile.mkdtemp(prefix="edgetune-collection-")
    os.makedirs(os.path.join(_paths, "ansible_collections", "edgetune"))
    os.symlink(_collection, os.path.join(_paths, "ansible_collections", "edgetune", "fleet"))
    sys.path.insert(0, _paths)

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_llm  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import (  # noqa: E402
    format_cpulist, parse_cpulist)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, EdgeError  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_sched import (  # noqa: E402
    resolve_threads, threads_of)

CGROUP_ROOT = "/sys/fs/cgroup"
RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"
PREFIX = "edgetune-bench-"
QUIET, UNTUNED = "quiet", "noisy untuned"
# The server as started without edgetune at all: llama.cpp picks its own thread count, any CPU.
UNTUNED_STOCK = "noisy untuned, llama.cpp's threads"
NOISE_KINDS = {"cpu": "CPU: one busy worker per CPU the kernel runs (nice 0)",
               "cpu+mem": "CPU + memory bandwidth: the same, plus 4 workers copying 256 MB continuously"}
MEM_WORKERS, MEM_BYTES = 4, 256 << 20
# The settings a candidate may name. threads and threads_batch are rules, not numbers: "n" is one
# per inference CPU, "n-1" one fewer, "n/2" half; a plain number is taken as it is.
CANDIDATE_KEYS = ("policy", "priority", "threads", "threads_batch", "poll", "rt_runtime_us", "partition")
DEFAULT_SETTINGS = {"policy": "other", "priority": 0, "threads": "n", "threads_batch": None, "poll": None,
                    "rt_runtime_us": None, "partition": "root"}
DEFAULT_CANDIDATES = (
    "pinned-other:policy=other",
    "pinned-fifo:policy=fifo,priority=40",
    "pinned-fifo-poll0:policy=fifo,priority=40,poll=0",
    "pinned-other-threads-n-1:threads=n-1",
    "pinned-other-threads-n-1-batch-n:threads=n-1,threads_batch=n",
)

_BUSY = "while True:\n    pass\n"
# A worker that counts its work in a file the bench reads when the stage ends (ops/s, bytes/s).
_COUNTING = r'''
import os, sys, time
path, kind = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
began, done, last = time.monotonic(), 0, 0.0
if kind == "mem":
    src, dst = bytearray(%d), bytearray(%d)
    while True:
        dst[:] = src
        done += len(src)
        os.pwrite(fd, ("%%d %%f\n" %% (done, time.monotonic() - began)).encode().ljust(64), 0)
else:
    while True:
        for _ in range(100000):
            pass
        done += 100000
        now = time.monotonic()
        if now - last > 0.5:
            os.pwrite(fd, ("%%d %%f\n" %% (done, now - began)).encode().ljust(64), 0)
            last = now
''' % (MEM_BYTES, MEM_BYTES)


def _say(text, stream=None):
    """A line for a person: progress and errors to stderr, the report to stdout."""
    stream = stream or sys.stderr
    stream.write(text + "\n")
    stream.flush()


class BenchError(EdgeError):
    """The bench cannot run as asked; the message says why and what to do."""


# ------------------------------------------------------------------ candidates
def parse_candidate(text):
    """'NAME:key=value,...' -> {"name", settings...} over DEFAULT_SETTINGS (pinned SCHED_OTHER)."""
    name, _colon, body = text.partition(":")
    name = name.strip()
    if not name:
        raise BenchError("candidate %r has no name (NAME:key=value,...)" % text)
    settings = dict(DEFAULT_SETTINGS)
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, equals, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not equals or key not in CANDIDATE_KEYS:
            raise BenchError("candidate %s: %r is not key=value with a key of %s"
                             % (name, item, ", ".join(CANDIDATE_KEYS)))
        settings[key] = value.strip()
    if settings["policy"] not in ("other", "fifo", "rr"):
        raise BenchError("candidate %s: policy %r is not other, fifo or rr" % (name, settings["policy"]))
    try:
        settings["priority"] = int(settings["priority"])
        for key in ("poll", "rt_runtime_us"):
            settings[key] = None if settings[key] in (None, "") else int(settings[key])
    except ValueError:
        raise BenchError("candidate %s: priority, poll and rt_runtime_us are integers" % name) from None
    if settings["policy"] == "other":
        settings["priority"] = 0
    elif not 1 <= settings["priority"] <= 99:
        raise BenchError("candidate %s: an RT priority is 1 to 99" % name)
    if settings["partition"] not in ("root", "isolated", "none"):
        raise BenchError("candidate %s: partition %r is not root, isolated or none" % (name, settings["partition"]))
    for key in ("threads", "threads_batch"):
        if settings[key] is not None:
            try:
                resolve_threads(settings[key], 4, "candidate %s: %s" % (name, key))
            except BadInput as exc:
                raise BenchError(str(exc)) from None
    settings["name"] = name
    return settings


# ------------------------------------------------------------------ host
def _read(path, default=None):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return default


def _write(path, value):
    with open(path, "w") as handle:
        handle.write(str(value))


def online_cpus():
    return parse_cpulist(_read("/sys/devices/system/cpu/online", "")) or sorted(os.sched_getaffinity(0))


def default_inference_cpus(cpus):
    """The highest quarter of the online CPUs (at least 1), leaving the rest to housekeeping."""
    count = max(1, len(cpus) // 4)
    if len(cpus) < 2:
        raise BenchError("this host runs %d CPU: there is nothing to partition" % len(cpus))
    return cpus[-count:]


def cgroup_v2():
    """True where /sys/fs/cgroup is the cgroup v2 hierarchy with the cpuset controller available."""
    controllers = _read(os.path.join(CGROUP_ROOT, "cgroup.controllers"))
    return controllers is not None and "cpuset" in controllers.split()


def host_facts(infer, housekeeping):
    gpus = ""
    if shutil.which("nvidia-smi"):
        result = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                universal_newlines=True, check=False)
        gpus = result.stdout.strip()
    model = ""
    for line in (_read("/proc/cpuinfo", "") or "").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"hostname": socket.gethostname(), "kernel": platform.release(), "machine": platform.machine(),
            "cpu_model": model, "cpus": format_cpulist(online_cpus()), "inference_cpus": format_cpulist(infer),
            "housekeeping_cpus": format_cpulist(housekeeping), "cgroup_v2_cpuset": cgroup_v2(),
            "sched_rt_runtime_us": _read(RT_RUNTIME), "gpus": gpus, "python": platform.python_version()}


# ------------------------------------------------------------------ placement
class Cgroups:
    """The bench's own cgroups, direct children of the v2 root: infer (a cpuset partition while a tuned
    stage runs), housekeeping and untuned. Removed at the end."""

    def __init__(self, enabled):
        self.enabled = enabled
        self.made = []
        self.subtree_added = False
        if enabled:
            control = os.path.join(CGROUP_ROOT, "cgroup.subtree_control")
            if "cpuset" not in (_read(control) or "").split():
                _write(control, "+cpuset")
                self.subtree_added = True

    def path(self, name):
        return os.path.join(CGROUP_ROOT, PREFIX + name)

    def make(self, name, cpus, partition=None):
        """The cgroup ``name`` with ``cpus`` (None: all) and, for the inference one, the partition asked
        for; returns (path, what was really made, for the record)."""
        path = self.path(name)
        if not os.path.isdir(path):
            os.mkdir(path)
            self.made.append(path)
        if cpus:
            _write(os.path.join(path, "cpuset.cpus"), format_cpulist(cpus))
        note = "cgroup %s, cpuset %s" % (os.path.basename(path), format_cpulist(cpus) if cpus else "all")
        state = os.path.join(path, "cpuset.cpus.partition")
        if os.path.exists(state):
            wanted = partition if partition in ("root", "isolated") else "member"
            try:
                _write(state, wanted)
            except OSError as exc:
                note += ", partition %s refused (%s)" % (wanted, exc.strerror)
            else:
                got = _read(state, "")
                if wanted != "member":
                    note += ", partition %s" % got
        return path, note

    def release(self, name):
        path = self.path(name)
        state = os.path.join(path, "cpuset.cpus.partition")
        if os.path.exists(state):
            try:
                _write(state, "member")
            except OSError:
                pass

    def cleanup(self):
        for path in reversed(self.made):
            procs = _read(os.path.join(path, "cgroup.procs"), "") or ""
            for pid in procs.split():
                _move(int(pid), CGROUP_ROOT)
            for _attempt in range(50):
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.1)
        self.made = []
        if self.subtree_added:
            try:
                _write(os.path.join(CGROUP_ROOT, "cgroup.subtree_control"), "-cpuset")
            except OSError:
                pass


def _move(pid, cgroup):
    try:
        _write(os.path.join(cgroup, "cgroup.procs"), pid)
    except OSError:
        pass


def _placer(cgroup, cpus, policy="other", priority=0, best_effort=False):
    """preexec_fn: into the cgroup, onto the CPUs, with the policy (inherited by every thread it makes).
    best_effort: a step the kernel refuses is left out (the process stays as placed so far) instead of
    failing, for the measuring client."""
    def place():
        step = "joining cgroup %s" % cgroup
        try:
            if cgroup:
                _optional(best_effort, _write, os.path.join(cgroup, "cgroup.procs"), os.getpid())
            step = "pinning to CPUs %s" % format_cpulist(cpus or [])
            if cpus:
                _optional(best_effort, os.sched_setaffinity, 0, cpus)
            step = "SCHED_%s priority %d" % (policy.upper(), priority)
            if policy in ("fifo", "rr"):
                kind = os.SCHED_FIFO if policy == "fifo" else os.SCHED_RR
                _optional(best_effort, os.sched_setscheduler, 0, kind, os.sched_param(priority))
        except OSError as exc:
            # subprocess reports only "Exception occurred in preexec_fn": the cause goes to the child's
            # stderr (the server's log, or the pipe of the client), where the caller reads it.
            os.write(2, ("edgetune-bench: %s refused: %s\n" % (step, exc.strerror or exc)).encode())
            raise
    return place


def _optional(best_effort, call, *args):
    try:
        call(*args)
    except OSError:
        if not best_effort:
            raise


def _spawn(argv, place, env=None, log=None):
    return subprocess.Popen(argv, preexec_fn=place, env=env, stdin=subprocess.DEVNULL,
                            stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                            start_new_session=True)


def _stop(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()


# ------------------------------------------------------------------ noise
class Noise:
    """One busy worker per CPU the kernel runs, plus (cpu+mem) 4 workers copying 256 MB, placed in a
    cgroup or on CPUs; stop() returns their throughput."""

    def __init__(self, kind, cgroup, cpus, ncpus):
        self.kind, self.dir = kind, tempfile.mkdtemp(prefix="edgetune-noise-")
        self.procs = []
        place = _placer(cgroup, cpus)
        jobs = [("cpu", i) for i in range(ncpus)] + [("mem", i) for i in range(MEM_WORKERS if kind == "cpu+mem" else 0)]
        for job, index in jobs:
            counter = os.path.join(self.dir, "%s-%d" % (job, index))
            self.procs.append((job, counter, _spawn([sys.executable, "-c", _COUNTING, counter, job], place)))

    def stop(self):
        totals = {"cpu": [0, 0.0, 0], "mem": [0, 0.0, 0]}
        for job, counter, proc in self.procs:
            _stop(proc)
            # Every worker started counts; the throughput is that of those that reported (a worker
            # starved for the whole stage on a loaded host has not written its counter yet).
            totals[job][2] += 1
            fields = (_read(counter, "") or "").split()
            if len(fields) == 2 and float(fields[1]) > 0:
                totals[job][0] += int(fields[0]) / float(fields[1])
        shutil.rmtree(self.dir, ignore_errors=True)
        out = {"cpu_workers": totals["cpu"][2], "cpu_mloops_per_s": round(totals["cpu"][0] / 1e6, 1)}
        if self.kind == "cpu+mem":
            out.update(mem_workers=totals["mem"][2], mem_copy_gb_per_s=round(totals["mem"][0] / 1e9, 2))
        return out


# ------------------------------------------------------------------ server
def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_argv(server, model, settings, ncpus, backend):
    """llama-server's command line for a candidate: the role's settings (one slot, its context) and
    the candidate's threads, batch threads and polling."""
    argv = [server, "--model", model]
    if settings["threads"] is not None:  # None: llama.cpp's own default (the untuned stock server)
        argv += ["--threads", str(resolve_threads(settings["threads"], ncpus))]
    if settings.get("threads_batch") is not None:
        argv += ["--threads-batch", str(resolve_threads(settings["threads_batch"], ncpus))]
    if settings.get("poll") is not None:
        argv += ["--poll", str(settings["poll"])]
    if backend == "cuda":
        argv += ["--n-gpu-layers", "99"]
    return argv


def server_env(port):
    env = dict(os.environ)
    env.update(LLAMA_ARG_HOST="127.0.0.1", LLAMA_ARG_PORT=str(port), LLAMA_ARG_CTX_SIZE="2048",
               LLAMA_ARG_N_PARALLEL="1", LLAMA_ARG_THREADS_HTTP="4", LLAMA_ARG_LOAD_MODE="mmap+mlock")
    return env


class Bench:
    def __init__(self, options, say=None):
        self.o = options
        self.say = say or _say
        self.cpus = online_cpus()
        self.infer = parse_cpulist(options.infer_cpus) if options.infer_cpus else default_inference_cpus(self.cpus)
        if not self.infer or not set(self.infer) <= set(self.cpus):
            raise BenchError("inference CPUs %s are not among the online CPUs %s"
                             % (options.infer_cpus, format_cpulist(self.cpus)))
        self.housekeeping = [cpu for cpu in self.cpus if cpu not in self.infer]
        if not self.housekeeping and options.noise:
            raise BenchError("no housekeeping CPU is left beside the inference CPUs %s" % format_cpulist(self.infer))
        self.candidates = [parse_candidate(text) for text in (options.candidate or DEFAULT_CANDIDATES)]
        self.default = self.candidates[0]
        self.stock = dict(self.default, name="llama.cpp defaults", threads=None, threads_batch=None, poll=None)
        self.cgroups = None
        self.rt_saved = _read(RT_RUNTIME)
        self.logdir = tempfile.mkdtemp(prefix="edgetune-bench-logs-")

    # -- one server, placed
    def start_server(self, settings, tuned):
        """Start llama-server with ``settings``; tuned: on the inference CPUs (partition, cpuset or
        affinity), untuned: anywhere, SCHED_OTHER. Returns (proc, port, placement note, client placer)."""
        port = free_port()
        argv = server_argv(self.o.server, self.o.model, settings, len(self.infer), self.o.backend)
        policy, priority = (settings["policy"], settings["priority"]) if tuned else ("other", 0)
        if not tuned:
            cgroup, note = self.cgroups.make("untuned", None) if self.cgroups.enabled else (None, "no cgroup")
            places = [(cgroup, None, note + ", any CPU")]
        else:
            places = []
            if self.cgroups.enabled and settings["partition"] != "none":
                cgroup, note = self.cgroups.make("infer", self.infer, settings["partition"])
                places.append((cgroup, self.infer, note))
            # Where a child cgroup has no RT budget, an RT candidate runs from the root cgroup.
            places.append((CGROUP_ROOT if self.cgroups.enabled else None, self.infer,
                           ("root cgroup, affinity %s" if self.cgroups.enabled else "affinity %s")
                           % format_cpulist(self.infer)))
        refusals = []
        for cgroup, cpus, note in places:
            if cgroup == CGROUP_ROOT:
                # The partition's CPUs belong to it alone: give them back before pinning from the root.
                self.cgroups.release("infer")
            log_path = os.path.join(self.logdir, "server-%d.log" % port)
            log = open(log_path, "w")
            try:
                proc = _spawn(argv, _placer(cgroup, cpus, policy, priority), env=server_env(port), log=log)
            except (OSError, subprocess.SubprocessError) as exc:
                said = [line for line in (_read(log_path, "") or "").splitlines() if line.startswith("edgetune-bench:")]
                refusals.append("%s: %s" % (note, said[-1][len("edgetune-bench: "):] if said else exc))
                continue
            finally:
                log.close()
            try:
                edge_llm.wait_ready(port, "/health", self.o.ready_timeout, check=lambda p=proc: self._alive(p, port))
            except (edge_llm.LLMError, BenchError):
                _stop(proc)
                raise
            if refusals:
                note += " (%s was refused: %s)" % (policy.upper(), "; ".join(refusals))
            return proc, port, note, _placer(cgroup, cpus, policy, priority)
        raise BenchError("llama-server could not be started with %s: %s" % (policy.upper(), "; ".join(refusals)))

    def _alive(self, proc, port):
        if proc.poll() is not None:
            tail = (_read(os.path.join(self.logdir, "server-%d.log" % port), "") or "")[-600:]
            raise BenchError("llama-server exited with %s before it was ready: %s" % (proc.returncode, tail))

    # -- one stage
    def stage(self, name, noise_kind, settings, tuned, generations, round_index, timeout=None):
        if settings.get("rt_runtime_us") is not None:
            _write(RT_RUNTIME, settings["rt_runtime_us"])
        proc, port, note, client_place = self.start_server(settings, tuned)
        noise = None
        try:
            if noise_kind:
                cgroup, cpus = (None, None)
                if tuned:
                    if self.cgroups.enabled:
                        cgroup, _note = self.cgroups.make("housekeeping", self.housekeeping)
                    cpus = self.housekeeping
                elif self.cgroups.enabled:
                    cgroup, _note = self.cgroups.make("untuned", None)
                noise = Noise(noise_kind, cgroup, cpus, len(self.cpus))
                time.sleep(self.o.settle)
            if getattr(self.o, "client", "housekeeping") == "housekeeping":
                # The instrument, the same in every stage: outside the server's CPUs, ahead of the noise
                # (SCHED_FIFO 1), each where the kernel grants it, so its reads wait on the server alone.
                client_place = _placer(CGROUP_ROOT if self.cgroups.enabled else None, self.housekeeping or None,
                                       "fifo", 1, best_effort=True)
            runs = self._client(port, generations, client_place, timeout)
            threads = threads_of(proc.pid)
        finally:
            throughput = noise.stop() if noise else None
            _stop(proc)
            if self.cgroups.enabled:
                self.cgroups.release("infer")
            if settings.get("rt_runtime_us") is not None and self.rt_saved is not None:
                _write(RT_RUNTIME, self.rt_saved)
        policies = sorted({"%s %d" % (t["policy"], t["rt_priority"]) if t["policy"] in ("fifo", "rr") else t["policy"]
                           for t in threads})
        cpusets = sorted({format_cpulist(t["cpus"]) for t in threads})
        return {"stage": name, "noise": noise_kind, "round": round_index, "candidate": settings["name"],
                "settings": {k: settings[k] for k in CANDIDATE_KEYS}, "tuned": tuned, "placement": note,
                "threads_seen": {"count": len(threads), "policies": policies, "cpus": cpusets},
                "noise_throughput": throughput, "runs": runs}

    def _client(self, port, generations, place, timeout=None):
        """The gate's streaming client in a child process, placed by ``place``."""
        options = {"port": port, "prompt": self.o.prompt, "max_tokens": self.o.max_tokens, "runs": generations,
                   "warmup": self.o.warmup, "timeout": timeout or self.o.request_timeout}
        code = ("import json, sys\n"
                "from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_llm\n"
                "o = json.loads(sys.argv[1])\n"
                "_s, runs = edge_llm.measure(o['port'], o['prompt'], o['max_tokens'], o['runs'], o['warmup'],"
                " timeout=o['timeout'])\n"
                "print(json.dumps([{'ttft_ms': r['ttft_ms'], 'gaps_ms': r['gaps_ms'], 'tokens': r['tokens']}"
                " for r in runs]))\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        result = subprocess.run([sys.executable, "-c", code, json.dumps(options)], preexec_fn=place, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise BenchError("the client failed: %s" % last.split("Error: ", 1)[-1])
        return json.loads(result.stdout)

    # -- the candidates alone (the device's autotune)
    def candidate_stages(self, noise_kind, deadline):
        """Every candidate in each round, shuffled per round, under ``noise_kind`` (None: the device's
        own load), tuned placement only. Returns (stages, refusals {name: why}, rounds measured):
        a candidate that cannot start (FIFO refused) is left out with the reason; the rounds stop at
        ``deadline`` (time.monotonic()), which the first round must not pass."""
        self.cgroups = Cgroups(cgroup_v2() and not self.o.affinity_only)
        stages, refusals, measured = [], {}, 0
        per_stage = max(1, -(-self.o.generations // self.o.rounds))
        try:
            for round_index in range(1, self.o.rounds + 1):
                order = [c for c in self.candidates if c["name"] not in refusals]
                random.Random(round_index).shuffle(order)
                for candidate in order:
                    if time.monotonic() > deadline:
                        if round_index == 1:
                            raise BenchError("the time bound was reached before every candidate was measured "
                                             "once (%d of %d): allow more time or fewer generations"
                                             % (len({s["candidate"] for s in stages}), len(order)))
                        return stages, refusals, measured
                    self.say("round %d: %s" % (round_index, candidate["name"]))
                    try:
                        stages.append(self.stage(candidate["name"], noise_kind, candidate, True, per_stage,
                                                 round_index))
                    except (BenchError, edge_llm.LLMError) as exc:
                        refusals[candidate["name"]] = str(exc)
                measured = round_index
        finally:
            self.cgroups.cleanup()
            if self.rt_saved is not None and _read(RT_RUNTIME) != self.rt_saved:
                _write(RT_RUNTIME, self.rt_saved)
            shutil.rmtree(self.logdir, ignore_errors=True)
        return stages, refusals, measured

    # -- the whole run
    def run(self):
        # A bench stopped from outside still stops its servers and noise and removes its cgroups.
        for number in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, _exit_on_signal)
        self.cgroups = Cgroups(cgroup_v2() and not self.o.affinity_only)
        stages, stock_failed = [], {}
        per_stage = max(1, -(-self.o.generations // self.o.rounds))
        try:
            for round_index in range(1, self.o.rounds + 1):
                self.say("round %d of %d: quiet" % (round_index, self.o.rounds))
                stages.append(self.stage(QUIET, None, self.default, True, per_stage, round_index))
                for kind in self.o.noise:
                    self.say("round %d: %s noise, untuned" % (round_index, kind))
                    stages.append(self.stage(UNTUNED, kind, self.default, False, per_stage, round_index))
                    if kind not in stock_failed:
                        self.say("round %d: %s noise, untuned with llama.cpp's thread count" % (round_index, kind))
                        try:
                            stages.append(self.stage(UNTUNED_STOCK, kind, self.stock, False, per_stage,
                                                     round_index, self.o.stock_timeout))
                        except (BenchError, edge_llm.LLMError) as exc:
                            # It may not finish a generation under this noise at all: said, and not run again.
                            stock_failed[kind] = "round %d: %s" % (round_index, exc)
                    order = list(self.candidates)
                    random.Random(round_index).shuffle(order)
                    for candidate in order:
                        self.say("round %d: %s noise, %s" % (round_index, kind, candidate["name"]))
                        stages.append(self.stage(candidate["name"], kind, candidate, True, per_stage, round_index))
        finally:
            self.cgroups.cleanup()
            if self.rt_saved is not None and _read(RT_RUNTIME) != self.rt_saved:
                _write(RT_RUNTIME, self.rt_saved)
            shutil.rmtree(self.logdir, ignore_errors=True)
        return report(stages, self.candidates, self.o, host_facts(self.infer, self.housekeeping), stock_failed)


def _exit_on_signal(number, _frame):
    raise SystemExit(128 + number)


# ------------------------------------------------------------------ results
def summarize(runs):
    """edge_llm.token_latency of a stage's runs (all rounds), plus the samples for a histogram."""
    summary = edge_llm.token_latency(runs)
    summary["gaps_ms"] = [gap for run in runs for gap in run["gaps_ms"]]
    summary["ttft_ms"] = [run["ttft_ms"] for run in runs]
    return summary


def _ratio(over, under):
    return round(over / under, 2) if over is not None and under else None


def report(stages, candidates, options, host, stock_failed=None):
    """Stages merged over rounds: per noise kind quiet, untuned and each candidate, with the ratios
    (noisy tuned / quiet, noisy untuned / noisy tuned) and the best candidate by inter-token P99
    (TTFT P99 as tie-break)."""
    default = candidates[0]["name"]

    def merged(stage, noise):
        chosen = [s for s in stages if s["stage"] == stage and s["noise"] == noise]
        if not chosen:
            return None
        summary = summarize([run for s in chosen for run in s["runs"]])
        summary.update(placement=chosen[0]["placement"], threads_seen=chosen[0]["threads_seen"],
                       settings=chosen[0]["settings"], noise_throughput=[s["noise_throughput"] for s in chosen])
        return summary

    quiet = merged(QUIET, None)
    noises = {}
    for kind in options.noise:
        rows = {UNTUNED: merged(UNTUNED, kind), UNTUNED_STOCK: merged(UNTUNED_STOCK, kind)}
        rows.update((c["name"], merged(c["name"], kind)) for c in candidates)
        ranked = sorted((c["name"] for c in candidates),
                        key=lambda n: (rows[n]["inter_token"]["p99_ms"], rows[n]["ttft"]["p99_ms"]))
        best = ranked[0]
        tuned_p99 = rows[default]["inter_token"]["p99_ms"]
        noises[kind] = {
            "noise": NOISE_KINDS[kind], "rows": rows, "best": best, "ranking": ranked,
            "default": default,
            "default_vs_best": _ratio(tuned_p99, rows[best]["inter_token"]["p99_ms"]),
            "noisy_tuned_vs_quiet": _ratio(tuned_p99, quiet["inter_token"]["p99_ms"]),
            "noisy_untuned_vs_noisy_tuned": _ratio(rows[UNTUNED]["inter_token"]["p99_ms"], tuned_p99),
            "untuned_stock_failed": (stock_failed or {}).get(kind),
            "noisy_untuned_stock_vs_noisy_tuned": _ratio(
                rows[UNTUNED_STOCK]["inter_token"]["p99_ms"] if rows[UNTUNED_STOCK] else None, tuned_p99),
            "ttft_noisy_tuned_vs_quiet": _ratio(rows[default]["ttft"]["p99_ms"], quiet["ttft"]["p99_ms"]),
            "ttft_noisy_untuned_vs_noisy_tuned": _ratio(rows[UNTUNED]["ttft"]["p99_ms"],
                                                        rows[default]["ttft"]["p99_ms"]),
        }
    return {"format": 1, "bench": "llm-host", "host": host,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": getattr(options, "commit", None), "backend": options.backend, "server": options.server,
            "model": os.path.basename(options.model), "rounds": options.rounds,
            "generations_per_stage": options.generations, "max_tokens": options.max_tokens,
            "client": getattr(options, "client", "housekeeping"),
            "candidates": candidates, "quiet": quiet, "noises": noises, "stages": stages}


def _ms(value):
    return "%.1f" % value if value is not None else "-"


def table(result):
    """Per noise kind: quiet, untuned and every candidate under that noise; then the ratios."""
    lines = ["host %s: %s, %s CPUs (%s), kernel %s; backend %s%s; inference CPUs %s, housekeeping %s" % (
        result["host"]["hostname"], result["host"]["cpu_model"] or result["host"]["machine"],
        len(parse_cpulist(result["host"]["cpus"])), result["host"]["cpus"], result["host"]["kernel"],
        result["backend"], (" (%s)" % result["host"]["gpus"].splitlines()[0]) if result["host"]["gpus"] else "",
        result["host"]["inference_cpus"], result["host"]["housekeeping_cpus"]),
        "%s; %d rounds, %d generations of %d tokens per stage; the client %s" % (
            result["model"], result["rounds"], result["generations_per_stage"], result["max_tokens"],
            "on the housekeeping CPUs at SCHED_FIFO 1" if result.get("client") == "housekeeping"
            else "with the server's placement and scheduling")]
    head = "%-40s %9s %9s %9s %9s %9s" % ("stage", "TTFT P99", "tok P50", "tok P99", "tok max", "tokens/s")

    def row(label, s):
        cells = (s["ttft"]["p99_ms"], s["inter_token"]["p50_ms"], s["inter_token"]["p99_ms"],
                 s["inter_token"]["max_ms"], s["tokens_per_s"])
        return "%-40s %9s %9s %9s %9s %9s" % ((label,) + tuple(_ms(cell) for cell in cells))

    for kind, block in result["noises"].items():
        throughput = [t for t in block["rows"][block["default"]]["noise_throughput"] if t]
        lines += ["", "noise %s: %s%s" % (kind, block["noise"], (" (%s)" % ", ".join(
            "%s %s" % (k, v) for k, v in throughput[0].items())) if throughput else ""), head + "  (ms)"]
        lines.append(row("quiet, %s" % block["default"], result["quiet"]))
        lines.append(row("noisy untuned (any CPU, SCHED_OTHER)", block["rows"][UNTUNED]))
        if block.get("untuned_stock_failed"):
            lines.append("%-40s did not finish (%s)" % (UNTUNED_STOCK, block["untuned_stock_failed"]))
        elif block["rows"].get(UNTUNED_STOCK):
            lines.append(row(UNTUNED_STOCK, block["rows"][UNTUNED_STOCK]))
        for name in block["ranking"]:
            mark = " *" if name == block["best"] else ""
            lines.append(row("noisy %s%s" % (name, mark), block["rows"][name]))
        lines.append("inter-token P99: noisy tuned / quiet %sx, noisy untuned / noisy tuned %sx; "
                     "default %s is %sx the best (%s)" % (
                         block["noisy_tuned_vs_quiet"], block["noisy_untuned_vs_noisy_tuned"], block["default"],
                         block["default_vs_best"], block["best"]))
        if block.get("noisy_untuned_stock_vs_noisy_tuned") and not block.get("untuned_stock_failed"):
            lines.append("inter-token P99: noisy untuned with llama.cpp's threads / noisy tuned %sx"
                         % block["noisy_untuned_stock_vs_noisy_tuned"])
        lines.append("TTFT P99: noisy tuned / quiet %sx, noisy untuned / noisy tuned %sx" % (
            block["ttft_noisy_tuned_vs_quiet"], block["ttft_noisy_untuned_vs_noisy_tuned"]))
    lines.append("")
    lines.append("placement and threads seen (noisy, first round):")
    first = next(iter(result["noises"].values()))
    for candidate in result["candidates"]:
        s = first["rows"][candidate["name"]]
        lines.append("  %-34s %s; %d threads, %s on CPUs %s" % (
            candidate["name"], s["placement"], s["threads_seen"]["count"], "/".join(s["threads_seen"]["policies"]),
            "/".join(s["threads_seen"]["cpus"])))
    stock = first["rows"].get(UNTUNED_STOCK)
    if stock:
        lines.append("  %-34s %s; %d threads in all, %s" % (
            "untuned, llama.cpp's threads", stock["placement"], stock["threads_seen"]["count"],
            "/".join(stock["threads_seen"]["policies"])))
    return "\n".join(lines)


# ------------------------------------------------------------------ command line
def add_arguments(parser):
    parser.add_argument("--server", required=True, help="llama-server binary (a release's runtime/llama-server)")
    parser.add_argument("--model", required=True, help="the GGUF model file")
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: all layers on the GPU (--n-gpu-layers 99)")
    parser.add_argument("--infer-cpus", help="the inference CPUs (default: the highest quarter of the online CPUs)")
    parser.add_argument("--noise", default="cpu,cpu+mem", help="noise kinds, comma-separated: cpu, cpu+mem")
    parser.add_argument("--candidate", action="append",
                        help="NAME:key=value,... (keys: %s); the first is the default, the others are compared "
                             "with it; repeat (default: %s)"
                             % (", ".join(CANDIDATE_KEYS), " ".join(DEFAULT_CANDIDATES)))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--generations", type=int, default=20, help="generations per stage, over all rounds")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured generations per stage")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds the noise runs before measuring")
    parser.add_argument("--ready-timeout", type=float, default=60.0)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--stock-timeout", type=float, default=30.0,
                        help="seconds one generation of the untuned server with llama.cpp's own thread count may "
                             "take before that stage is reported as not finishing (and not run again)")
    parser.add_argument("--client", choices=("housekeeping", "server"), default="housekeeping",
                        help="where the measuring client runs: on the housekeeping CPUs at SCHED_FIFO 1 in every "
                             "stage (the default: a fixed instrument), or with the placement and scheduling of the "
                             "server it measures (an application in its slice, competing with its threads)")
    parser.add_argument("--affinity-only", action="store_true", help="no cgroups: CPU affinity only")
    parser.add_argument("--out", default="reports", help="directory for bench-llm-host.json (and .png)")
    parser.add_argument("--commit", help="the commit of edgetune measured, recorded with the results (the harness "
                                         "passes its checkout's)")


def check_options(options):
    """Refuse before anything starts: one line per problem."""
    options.noise = [kind.strip() for kind in options.noise.split(",") if kind.strip()]
    problems = ["noise %r is not one of %s" % (kind, ", ".join(NOISE_KINDS))
                for kind in options.noise if kind not in NOISE_KINDS]
    if os.geteuid() != 0:
        problems.append("run as root: the bench makes cgroups and sets scheduling policies")
    for what in ("server", "model"):
        path = getattr(options, what)
        if not os.path.isfile(path):
            problems.append("--%s %s is not a file" % (what, path))
    if not os.access(options.server, os.X_OK):
        problems.append("--server %s is not executable" % options.server)
    if options.rounds < 2:
        problems.append("--rounds must be 2 or more (stages are compared within rounds)")
    if options.generations < 1 or options.max_tokens < 2:
        problems.append("--generations must be 1 or more and --max-tokens 2 or more")
    if problems:
        raise BenchError(problems)


def main(argv=None, draw=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    options = parser.parse_args(argv)
    return run(options, draw)


def run(options, draw=None):
    try:
        check_options(options)
        os.makedirs(options.out, exist_ok=True)
        result = Bench(options).run()
    except (BenchError, edge_llm.LLMError) as exc:
        for line in getattr(exc, "errors", [str(exc)]):
            _say("bench: error: %s" % line)
        return 2
    except OSError as exc:
        _say("bench: error: %s" % exc)
        return 2
    path = os.path.join(options.out, "bench-llm-host.json")
    with open(path, "w") as handle:
        json.dump(result, handle, indent=1)
    _say(table(result), sys.stdout)
    _say("wrote %s" % path, sys.stdout)
    if draw:
        _say(draw(result, os.path.join(options.out, "bench-llm-host.png")), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
