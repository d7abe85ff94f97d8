#!/usr/bin/env python3
"""Benchmark the deployed LLM (llama-server) on a device: token latency quiet, under
a noisy neighbour untuned, and under the same noise tuned, side by side.

    edgetune-dev bench runtime [-i INVENTORY -l HOST | --board orin-nx-16gb-r36] [--rounds 3]
                        [--generations 5] [--max-tokens 32] [--deploy site|deploy|none]
                        [--become] [--out reports] [--keep]

1. The device: an inventory host (-i/-l: a real board or a twin, reached the way
   Ansible reaches it, nothing deployed unless --deploy says so), or a twin of
   --board this run creates (removed at the end unless --keep) and converges
   with site.yml, deploying the llama-server build its glibc runs and the
   SmolLM2 GGUF (tools/package-runtime packages them).
2. In each round, measured on the device with its system Python by the deploy
   gate's own streaming client (tools/edgetune_dev/bench_llm.py): streamed
   greedy generations through /v1/completions, time to first token and the
   gaps between tokens as the client sees them:
   - quiet: the deployed service (its slice, CPUs and policy);
   - noisy untuned: a second llama-server of the same release, binary, model
     and settings, started as a plain service in system.slice (SCHED_OTHER, any
     CPU), with one busy worker per CPU the kernel runs (stress-ng, or shell
     loops where the image lacks it) in system.slice;
   - noisy tuned: the deployed service under the same noise.
   The client runs with the scheduling of the service it measures.
3. Prints the table (stage, TTFT P50/P99, inter-token P50/P99, tokens/s), the
   ratios noisy tuned / quiet and noisy untuned / noisy tuned, and whether a
   board or a twin was measured; writes reports/bench-llm.json and a PNG
   histogram of the inter-token gaps (matplotlib on the controller; without
   it the PNG is skipped and said so).

Twins share the host's kernel and CPUs (2 on the reference machine, shared
with everything else running there): the numbers describe that, not a board.
Exit codes: 0 done (whatever the numbers), 1 with --strict when the noisy tuned
inter-token P99 is over 1.2x quiet, 2 on errors.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgetune.errors import UsageError
from edgetune_dev import CHECKOUT as REPO
from edgetune_dev import artifacts, bench, bench_llm, llm

UNIT = "edgetune-runtime.service"
UNTUNED_UNIT, NOISE_UNIT = "edgetune-bench-untuned", "edgetune-bench-noise"
UNTUNED_PORT = 8471
GOAL = 1.2
PROMPT = "Once upon a time"


def say(message):
    print("bench-runtime: " + message, file=sys.stderr, flush=True)


def run(argv, check=True, **kwargs):
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    result = subprocess.run(argv, universal_newlines=True, **kwargs)
    if check and result.returncode != 0:
        raise UsageError("%s failed (%d): %s" % (" ".join(argv[:6]), result.returncode,
                                                 (result.stderr or result.stdout).strip()[-600:]))
    return result


class Host:
    """An inventory host, reached with Ansible's ad hoc shell module: a board over SSH, a twin
    through docker, whatever the inventory says."""

    def __init__(self, inventory, name, become=False):
        self.inventory, self.name, self.become = str(inventory), name, become

    def sh(self, command, stdin=None, check=True):
        args = {"cmd": command}
        if stdin is not None:
            args.update(stdin=stdin, stdin_add_newline=False)
        env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                   EDGETUNE_NO_SUMMARY="1", ANSIBLE_NOCOLOR="1")
        done = run(["ansible", self.name, "-i", self.inventory, "-m", "ansible.builtin.shell", "-a", json.dumps(args)]
                   + (["--become"] if self.become else []), check=False, cwd=str(REPO), env=env)
        try:
            outcome = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"][self.name]
        except (ValueError, KeyError, IndexError):
            raise UsageError("ansible could not run a command on %s: %s" % (
                self.name, (done.stderr or done.stdout).strip()[-600:])) from None
        if outcome.get("unreachable"):
            raise UsageError("%s is unreachable: %s" % (self.name, outcome.get("msg", "")))
        result = subprocess.CompletedProcess(command, outcome.get("rc", 1), outcome.get("stdout", ""),
                                             outcome.get("stderr", "") or outcome.get("msg", ""))
        if check and result.returncode != 0:
            raise UsageError("on %s, %s failed (%d): %s" % (self.name, command[:80], result.returncode,
                                                            (result.stderr or result.stdout).strip()[-600:]))
        return result

    def show(self, prop, unit=UNIT):
        return self.sh("systemctl show -p %s --value %s" % (prop, unit)).stdout.strip()


def twin_inventory(name, path):
    """The inventory of a twin this run created: the LLM its glibc runs, gates that only measure."""
    glibc = run(["docker", "exec", name, "getconf", "GNU_LIBC_VERSION"]).stdout.split()[-1]
    server, engine = llm.deployable(REPO / ".cache" / "artifacts", llm.host_arch(), glibc)
    path.write_text(json.dumps({"all": {
        "vars": {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
                 "edge_runtime_require_fifo": False, "edge_runtime_require_affinity": False,
                 "edge_runtime_ttft_p99_ms": 0, "edge_runtime_token_p99_ms": 0,
                 "edge_runtime_runtime_src": server["path"], "edge_runtime_engine_src": engine["path"]},
        "children": {"bench": {"hosts": {name: None}}}}}))


def converge(host, mode, workdir):
    if mode == "none":
        return
    playbooks = (["site.yml"] if mode == "site" else ["playbooks/preflight.yml"]) + ["playbooks/deploy.yml"]
    say("converging %s with %s" % (host.name, " + ".join(playbooks)))
    result = run(["ansible-playbook", "-i", host.inventory, "-l", host.name] + playbooks, check=False,
                 cwd=str(REPO), env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    (workdir / "converge.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise UsageError("converge failed; see %s (last lines: %s)" % (
            workdir / "converge.log", " | ".join(result.stdout.strip().splitlines()[-4:])))


def server_argv(host):
    """The deployed llama-server's command line, from systemd (the unit as it runs)."""
    shown = host.show("ExecStart")
    argv = shown.split("argv[]=", 1)[1].split(" ;", 1)[0].split() if "argv[]=" in shown else []
    if not argv or not argv[0].endswith("/llama-server"):
        raise UsageError("%s on %s does not run llama-server (%s): deploy the LLM first, e.g. with the "
                         "edge_runtime_runtime_src and edge_runtime_engine_src of `make artifacts`"
                         % (UNIT, host.name, argv[0] if argv else "no ExecStart"))
    return argv


def kernel_cpus(host):
    stat = host.sh("cat /proc/stat").stdout
    return [int(line.split()[0][3:]) for line in stat.splitlines() if line.startswith("cpu") and line[3:4].isdigit()]


SCHED_CODE = r"""
import json, os, re, sys
pid = sys.argv[1]
out = []
for tid in os.listdir("/proc/%s/task" % pid):
    stat = open("/proc/%s/task/%s/stat" % (pid, tid)).read()
    fields = stat[stat.rindex(")") + 2:].split()
    cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", open("/proc/%s/task/%s/status" % (pid, tid)).read()).group(1)
    out.append([int(fields[38]), int(fields[37]), cpus])
print(json.dumps(out))
"""


def service_sched(host):
    """What the deployed service really runs with, read from /proc."""
    pid = host.show("MainPID")
    if pid in ("", "0"):
        raise UsageError("%s is not running on %s" % (UNIT, host.name))
    threads = json.loads(host.sh("python3 - %s" % pid, stdin=SCHED_CODE).stdout)
    policies = {0: "other", 1: "fifo", 2: "rr"}
    return {"policy": ",".join(sorted({policies.get(t[0], str(t[0])) for t in threads})),
            "priority": max(t[1] for t in threads), "cpus": ",".join(sorted({t[2] for t in threads})),
            "slice": host.show("Slice"), "threads": len(threads)}


def client_props(host, tuned):
    """systemd-run properties for the client: the service's own scheduling when tuned."""
    if not tuned:
        return ["--slice=system.slice"]
    props = ["--slice=" + host.show("Slice")]
    affinity = host.show("CPUAffinity")
    if affinity:
        props += ["-p", "CPUAffinity=" + affinity]
    policy = host.show("CPUSchedulingPolicy")
    if policy in ("fifo", "rr"):
        props += ["-p", "CPUSchedulingPolicy=" + policy, "-p", "CPUSchedulingPriority=" + host.show(
            "CPUSchedulingPriority")]
    return props


def measure(host, program, port, tuned, args):
    options = {"port": port, "prompt": PROMPT, "max_tokens": args.max_tokens, "runs": args.generations,
               "warmup": 1, "timeout": 120}
    argv = (["systemd-run", "--quiet", "--pipe", "--wait", "--collect"] + client_props(host, tuned)
            + ["python3", "-", "measure", json.dumps(options)])
    result = host.sh(" ".join(shlex.quote(a) for a in argv), stdin=program, check=False)
    try:
        measured = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UsageError("the client failed on %s: %s" % (host.name, (result.stderr or result.stdout)[-400:])) from None
    if "error" in measured:
        raise UsageError("on %s, port %d: %s" % (host.name, port, measured["error"]))
    return measured["runs"]


def start_untuned(host, program, argv):
    """The same llama-server, binary, model and settings, as a plain service in system.slice."""
    stop_units(host)
    env_file = host.show("EnvironmentFiles").split(" ", 1)[0]
    props = ["--unit", UNTUNED_UNIT, "--slice=system.slice", "-p", "User=" + (host.show("User") or "root"),
             "-p", "LimitMEMLOCK=" + host.show("LimitMEMLOCK")] + (["-p", "EnvironmentFile=" + env_file]
                                                                   if env_file else [])
    # llama-server's command-line options win over its LLAMA_ARG_* environment.
    host.sh(" ".join(shlex.quote(a) for a in ["systemd-run"] + props + argv + ["--port", str(UNTUNED_PORT)]))
    host.sh("python3 - ready %d 120" % UNTUNED_PORT, stdin=program)


def start_noise(host, cpus):
    has_stress = host.sh("command -v stress-ng", check=False).returncode == 0
    cpulist = ",".join(str(c) for c in cpus)
    if has_stress:
        command = "stress-ng --cpu %d --taskset %s --cpu-method matrixprod --quiet" % (len(cpus), cpulist)
    else:
        command = "sh -c '%s wait'" % " ".join("taskset -c %d sh -c \"while :; do :; done\" &" % c for c in cpus)
    host.sh("systemd-run --unit %s --slice=system.slice %s" % (NOISE_UNIT, command))
    time.sleep(1.0)
    return "stress-ng --cpu %d on CPUs %s" % (len(cpus), cpulist) if has_stress else \
        "%d shell busy loops on CPUs %s (stress-ng is not on this device)" % (len(cpus), cpulist)


def stop_units(host):
    host.sh("systemctl stop %s %s 2>/dev/null; systemctl reset-failed %s %s 2>/dev/null; true"
            % (NOISE_UNIT, UNTUNED_UNIT, NOISE_UNIT, UNTUNED_UNIT), check=False)


def main(argv=None):
    p = argparse.ArgumentParser(prog="edgetune-dev bench runtime", description=__doc__.splitlines()[0])
    p.add_argument("-i", "--inventory", help="an Ansible inventory (with -l)")
    p.add_argument("-l", "--limit", help="the inventory host to measure (a board or a twin)")
    p.add_argument("--board", default="orin-nx-16gb-r36", help="without -l: the board of the twin to create")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--generations", type=int, default=5, help="measured generations per phase and round")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--deploy", choices=["site", "deploy", "none"],
                   help="converge first (default: site for a created twin, none for an inventory host)")
    p.add_argument("--become", action="store_true", help="run the device commands with become (a board's sudo)")
    p.add_argument("--out", default=str(REPO / "reports"))
    p.add_argument("--keep", action="store_true", help="keep the twin this run created")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when the noisy tuned inter-token P99 is over %.1fx quiet" % GOAL)
    args = p.parse_args(argv)
    if bool(args.inventory) != bool(args.limit):
        p.error("-i and -l go together: the inventory and the host of it to measure")
    if args.rounds < 1 or args.generations < 1 or args.max_tokens < 2:
        p.error("--rounds and --generations must be at least 1, --max-tokens at least 2")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    created = host = None
    try:
        if args.limit:
            host = Host(Path(args.inventory).resolve(), args.limit, args.become)
        else:
            artifacts.main([])
            created = "bench-runtime-%s" % args.board.split("-")[0]
            say("creating twin %s (%s)" % (created, args.board))
            run(["edgetune-dev", "twin", "create", created, "--board", args.board])
            twin_inventory(created, workdir / "inventory.json")
            host = Host(workdir / "inventory.json", created)
        converge(host, args.deploy or ("site" if created else "none"), workdir)
        program = bench_llm.device_program()
        server = server_argv(host)
        is_twin = host.sh("test -e /run/edgetune-twin/boot.json", check=False).returncode == 0
        cpus = kernel_cpus(host)
        sched = service_sched(host)
        say("%s: llama-server runs %s prio %d on CPUs %s in %s (%d threads); kernel CPUs %s" % (
            host.name, sched["policy"], sched["priority"], sched["cpus"], sched["slice"], sched["threads"], cpus))
        port = int(host.sh("sed -n 's/^LLAMA_ARG_PORT=//p' %s" % host.show("EnvironmentFiles").split(" ", 1)[0])
                   .stdout.strip() or 8470)
        phases = {phase: [] for phase in bench_llm.PHASES}
        noise = None
        for index in range(args.rounds):
            start_untuned(host, program, server)
            phases[bench_llm.QUIET] += measure(host, program, port, True, args)
            noise = start_noise(host, cpus)
            phases[bench_llm.UNTUNED] += measure(host, program, UNTUNED_PORT, False, args)
            phases[bench_llm.TUNED] += measure(host, program, port, True, args)
            stop_units(host)
            say("round %d: inter-token P99 quiet %s ms, noisy untuned %s ms, noisy tuned %s ms" % (
                index + 1, *(bench_llm.summarize(phases[phase])["inter_token"]["p99_ms"]
                             for phase in bench_llm.PHASES)))
        summaries = {phase: bench_llm.summarize(runs) for phase, runs in phases.items()}
        found = bench_llm.ratios(summaries)
        measured = bench_llm.what_was_measured(is_twin, cpus, sched)
        goal_met = (found["inter_token"]["noisy_tuned_vs_quiet"] or 0) <= GOAL
        report = {"host": host.name, "twin": is_twin, "board": args.board if created else None, "measured": measured,
                  "kernel_cpus": cpus, "service": sched, "server_argv": server, "noise": noise,
                  "rounds": args.rounds, "generations_per_phase_per_round": args.generations,
                  "max_tokens": args.max_tokens, "prompt": PROMPT,
                  "phases": {bench_llm.STAGES[phase]: s for phase, s in summaries.items()},
                  "ratios": found, "goal": "noisy tuned inter-token P99 <= %.1fx quiet" % GOAL, "goal_met": goal_met}
        (out / "bench-llm.json").write_text(json.dumps(report, indent=2) + "\n")
        print(bench_llm.table(summaries))
        print(measured)
        print("noise: %s; llama-server: %s" % (noise, " ".join(server)))
        try:
            png = bench.write_histogram_png(
                str(out / "bench-llm.png"), {bench_llm.STAGES[p]: s["gaps_ms"] for p, s in summaries.items()},
                "llama-server inter-token gaps on %s (%d rounds)" % (host.name, args.rounds),
                xlabel="gap between tokens", ylabel="gaps")
            print("report: %s, histogram: %s" % (out / "bench-llm.json", png))
        except UsageError as exc:
            print("report: %s; no histogram: %s" % (out / "bench-llm.json", exc))
        return 1 if args.strict and not goal_met else 0
    except UsageError as exc:
        print("bench-runtime: error: %s" % exc, file=sys.stderr)
        return 2
    finally:
        if host is not None:
            try:
                stop_units(host)
            except UsageError:
                pass
        if created is not None and not args.keep:
            run(["edgetune-dev", "twin", "rm", created], check=False)


if __name__ == "__main__":
    sys.exit(main())
