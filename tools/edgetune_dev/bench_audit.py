"""Benchmark: the audit's cost, and `edgetune audit` against `ansible-playbook site.yml --check`.

First, on the converged twin fleet: the audit (facts, plan, one edge_audit
call per device) for 1, 3 and 30 devices (inventory aliases of the twins
beyond their number): module executions per device, controller CPU seconds
per device, wall time, against the goals (1 device: 3 s and 2 executions;
30: 30 s), and whether every alias finds what its twin does
(below).
Then the audit of 100 real twins made for it beside the demo's (`--real N`; 60% orin-nx, 40% rock5b,
never tuned, removed after), with ansible.cfg's 20 forks: wall and controller CPU per device against
the goal (0.3 CPU-seconds per device, 40 s for 100).
Then a site.yml that changes nothing, on 6 Orin NX twins made and converged for it (`--converge-fleet N`;
0: the demo's twins): the converge path (roles whose last apply is current and holds are not included)
beside the full path (edge_converge_full) and the audit, in alternated rounds: executions and task
results per device, median wall and controller CPU per device, against the goals (3 executions,
25 task results, 10 s, and the converge's controller CPU at most twice the audit's).
Then, with the same drift injected on every twin: `edgetune audit` and
`site.yml --check` must find the same drifted roles per host; the time ratio.
Not a test: timings on this noisy machine vary.
Usage: edgetune-dev bench audit [--rounds N] [--sizes 1,3,30] [--real 100]   (after `make demo` converged the twins)

The audit's cost (playbooks/audit.yml: facts, the plan, one edge_audit call per device, evaluating
the records of the last apply) for fleets of growing size, on the same converged devices in one run.
(Until 0.3 it ran beside the old audit, which ran every role in audit mode: 12 module executions
and about 9 CPU-seconds per device; that path is gone.)

Per fleet size: module executions per device (tasks that ran a module on the device, each loop item
counted), controller CPU seconds per device (ansible-playbook and its workers), and wall time. A
fleet larger than the twins that run is made of inventory aliases of them (the docker connection's
``ansible_host``): the controller's work per device is the same; the devices' is shared.
Every alias of a twin must find the same settings in the same states as the twin itself. Not a
test: the numbers on this 2-core machine vary with its load.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgetune import ansible_setup
from edgetune.ansible_options import Options
from edgetune.audit import run_audit
from edgetune_dev import CHECKOUT as PROJECT
from edgetune_dev import bench_pages
from edgetune_dev.twin import manager

PLAYBOOK = "audit"
# The goals: one converged device in 3 s and 2 module executions, 30 in 30 s.
GOALS = {"executions": 2, "wall": {1: 3.0, 30: 30.0}}
# A fleet of real twins (one container each, `twin up`): 60% Orin NX and 40% RK3588 boards, audited
# with the forks of ansible.cfg (20), within 0.3 controller CPU-seconds per device and 40 s for 100.
REAL_FLEET_BOARDS = (("orin-nx-16gb-r36", 0.6), ("rock5b-rk3588", 0.4))
REAL_FLEET_GOALS = {"cpu_per_device": 0.3, "wall_per_100": 40.0}
REAL_FLEET_PREFIX = "bench-"
# Actions that run on the controller only (no module is sent to the device).
CONTROLLER_ACTIONS = frozenset((
    "set_fact", "debug", "assert", "fail", "meta", "include_tasks", "import_tasks", "include_role",
    "import_role", "include_vars", "add_host", "group_by", "validate_argument_spec", "edge_plan", "edge_validate"))


def short_action(action):
    return (action or "").rsplit(".", 1)[-1]


def executions(report):
    """{host: module executions} from ansible.posix.json's report (skipped tasks and items not counted)."""
    counts = {}
    for play in report.get("plays") or []:
        for task in play.get("tasks") or []:
            for host, res in (task.get("hosts") or {}).items():
                counts.setdefault(host, 0)
                if (short_action(res.get("action")) in CONTROLLER_ACTIONS or res.get("skipped")
                        or res.get("judged_on") == "controller"):
                    continue
                items = res.get("results")
                if isinstance(items, list) and items and all(isinstance(i, dict) and "ansible_loop_var" in i
                                                             for i in items):
                    counts[host] += sum(1 for item in items if not item.get("skipped"))
                else:
                    counts[host] += 1
    return counts


def audit_results(report):
    """{host: {setting: state}} of the edge_audit task, without the records' own "applied state" results."""
    found = {}
    for play in report.get("plays") or []:
        for task in play.get("tasks") or []:
            for host, res in (task.get("hosts") or {}).items():
                if short_action(res.get("action")) == "edge_audit" and "results" in res:
                    found[host] = dict((r["setting"], r["state"]) for r in res["results"]
                                       if not r["setting"].endswith(" applied state"))
    return found


def alias_inventory(twins, size, directory, source):
    """An inventory directory of ``size`` hosts cycling over the running twins, with the variables
    of the twins' own inventory ``source`` (its group_vars; host_vars copied to every alias)."""
    path = Path(directory) / ("fleet-%d" % size)
    path.mkdir()
    if (Path(source) / "group_vars").is_dir():
        shutil.copytree(str(Path(source) / "group_vars"), str(path / "group_vars"))
    (path / "host_vars").mkdir()
    hosts = {}
    for index in range(size):
        twin = twins[index % len(twins)]
        alias = "%s-as-%02d" % (twin, index)
        hosts[alias] = {"ansible_host": twin}
        for own in sorted((Path(source) / "host_vars").glob(twin + ".*")):
            shutil.copy(str(own), str(path / "host_vars" / (alias + own.suffix)))
    inventory = {"all": {"vars": {"ansible_connection": "community.docker.docker",
                                  "ansible_python_interpreter": "/usr/bin/python3"},
                         "hosts": hosts}}
    (path / "hosts.yml").write_text(json.dumps(inventory, indent=2))
    return path


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(playbook, inventory, extra_vars=()):
    """One run: (report, wall seconds, controller CPU seconds)."""
    cpu, started = children_cpu(), time.perf_counter()
    report = ansible_setup.run_json_playbook(playbook, Options(inventory=[str(inventory)], extra_vars=extra_vars))
    return report, time.perf_counter() - started, children_cpu() - cpu


def same_as_the_twins(found, twins):
    """Whether every alias (TWIN-as-NN) found what its twin's first alias found, and every device was audited."""
    first = {}
    for host in sorted(found):
        first.setdefault(host.rsplit("-as-", 1)[0], found[host])
    return all(found[host] == first[host.rsplit("-as-", 1)[0]] for host in found) and \
        set(first) <= set(twins)


def run(twins, sizes, source, extra_vars=(), say=print):
    """Rows of {size, playbook, executions, cpu_per_device, wall, audited} and the findings' agreement per size."""
    rows, agreement = [], {}
    with tempfile.TemporaryDirectory(prefix="edgetune-bench-audit-") as directory:
        for size in sizes:
            inventory = alias_inventory(twins, size, directory, source)
            say("bench audit: %s on %d device(s)" % (PLAYBOOK, size))
            report, wall, cpu = measure(PLAYBOOK, inventory, extra_vars)
            counts = executions(report)
            found = audit_results(report)
            rows.append({"size": size, "playbook": PLAYBOOK, "wall": wall, "cpu_per_device": cpu / size,
                         "executions": max(counts.values()) if counts else 0, "audited": len(found)})
            agreement[size] = len(found) == size and same_as_the_twins(found, twins)
    return rows, agreement


def within_goals(row):
    wall = GOALS["wall"].get(row["size"])
    return row["executions"] <= GOALS["executions"] and (wall is None or row["wall"] <= wall)


def table(rows, agreement):
    lines = ["%-8s %10s %14s %9s %8s %-13s %s" % ("devices", "executions", "CPU-s/device", "wall s", "audited",
                                                  "same findings", "goal")]
    for row in rows:
        wall = GOALS["wall"].get(row["size"])
        goal = "<= %d executions%s" % (GOALS["executions"], ", <= %.0f s" % wall if wall else "")
        lines.append("%-8d %10d %14.2f %9.1f %8d %-13s %s: %s" % (
            row["size"], row["executions"], row["cpu_per_device"], row["wall"], row["audited"],
            "yes" if agreement[row["size"]] else "NO", goal, "met" if within_goals(row) else "NOT met"))
    return "\n".join(lines)


# A no-change site.yml on converged devices: the converge path (roles whose record is current and
# holds are skipped) beside the full path (edge_converge_full), in alternating rounds.
# A no-change site.yml: 3 module executions, 10 s, at most 25 task results per device (a skipped role is one
# result, not one per task), and the controller's CPU at most twice the audit's of the same twins.
CONVERGE_GOALS = {"executions": 3, "wall": 10.0, "results": 25, "cpu_vs_audit": 2.0}
# (path, playbook, extra vars), measured in alternated rounds: the converge path, the full path and the audit.
CONVERGE_PATHS = (("converge", "site", ()), ("full", "site", ('{"edge_converge_full": true}',)),
                  ("audit", "audit", ()))
# The fleet the converge is measured on (`--converge-fleet N` twins of this board, made for the run).
CONVERGE_BOARD = "orin-nx-16gb-r36"
CONVERGE_PREFIX = "bench-converge-"


def changed_tasks(report):
    return sum(1 for play in report.get("plays") or [] for task in play.get("tasks") or []
               for res in (task.get("hosts") or {}).values() if res.get("changed"))


def task_results(report):
    """{host: task results the controller dispatched for it} (skipped ones too; an include is one)."""
    counts = {}
    for play in report.get("plays") or []:
        for task in play.get("tasks") or []:
            for host in task.get("hosts") or {}:
                counts[host] = counts.get(host, 0) + 1
    return counts


def converge_rows(inventory, rounds, say=print, paths=CONVERGE_PATHS):
    """Per path (a no-change site.yml's converge and full paths, and the audit): the most module executions and
    task results of any device, the changes (0 on converged devices), and the median wall and controller CPU per
    device over ``rounds`` alternated rounds."""
    runs = dict((path, []) for path, _, _ in paths)
    for round_index in range(1, rounds + 1):
        for path, playbook, extra_vars in paths:
            say("bench converge: round %d, %s path" % (round_index, path))
            report, wall, cpu = measure(playbook, inventory, extra_vars)
            counts, results = executions(report), task_results(report)
            devices = max(1, len(counts))
            runs[path].append({"executions": max(counts.values()) if counts else 0,
                               "results": max(results.values()) if results else 0, "wall": wall,
                               "cpu_per_device": cpu / devices, "changed": changed_tasks(report), "devices": devices})
    rows = []
    for path, _, _ in paths:
        done = runs[path]
        rows.append({"path": path, "devices": done[0]["devices"], "rounds": len(done),
                     "executions": max(r["executions"] for r in done), "results": max(r["results"] for r in done),
                     "changed": max(r["changed"] for r in done),
                     "wall": statistics.median(r["wall"] for r in done),
                     "cpu_per_device": statistics.median(r["cpu_per_device"] for r in done)})
    return rows


def converge_fleet(count, source, rounds, say=print, paths=CONVERGE_PATHS):
    """converge_rows on ``count`` Orin NX twins made for this run (the issue's fleet: 6), which site.yml converges
    first; removed after. Their own fleet, so that the demo's three different boards do not set the pace."""
    directory = Path(tempfile.mkdtemp(prefix="edgetune-bench-converge-"))
    try:
        started = time.perf_counter()
        names = manager.up([(CONVERGE_BOARD, count)], say=say, inventory_dir=directory, prefix=CONVERGE_PREFIX)
        manager.write_inventory(directory)
        os.symlink(str(Path(source).resolve() / "group_vars"), str(directory / "group_vars"))
        say("bench converge: %d twins up in %.0f s; converging them" % (len(names), time.perf_counter() - started))
        report, wall, _ = measure("site", directory)
        failed = sorted(host for host, stats in report.get("stats", {}).items()
                        if stats.get("failures") or stats.get("unreachable"))
        if failed:
            raise SystemExit("bench converge: site.yml failed on %s" % ", ".join(failed))
        say("bench converge: converged in %.0f s" % wall)
        return converge_rows(directory, rounds, say=say, paths=paths)
    finally:
        manager.remove_all([twin["name"] for twin in manager.twins(fleet_only=True, inventory_dir=directory)])
        shutil.rmtree(str(directory), ignore_errors=True)


def cpu_vs_audit(rows):
    """The converge path's median controller CPU per device over the audit's, or None."""
    by_path = dict((row["path"], row) for row in rows)
    if "converge" in by_path and by_path.get("audit", {}).get("cpu_per_device"):
        return by_path["converge"]["cpu_per_device"] / by_path["audit"]["cpu_per_device"]
    return None


def converge_table(rows):
    lines = ["%-10s %8s %10s %14s %9s %8s %8s %s" % ("path", "devices", "executions", "CPU-s/device", "wall s",
                                                     "changed", "results", "goal (converge path)")]
    for row in rows:
        goal = ""
        if row["path"] == "converge":
            met = row["executions"] <= CONVERGE_GOALS["executions"] and row["wall"] <= CONVERGE_GOALS["wall"]
            goal = "<= %d executions, <= %.0f s" % (CONVERGE_GOALS["executions"], CONVERGE_GOALS["wall"])
            if "results" in row:
                met = met and row["results"] <= CONVERGE_GOALS["results"]
                goal += ", <= %d results" % CONVERGE_GOALS["results"]
            goal += ": %s" % ("met" if met else "NOT met")
        lines.append(("%-10s %8d %10d %14.2f %9.1f %8d %8s %s" % (
            row["path"], row["devices"], row["executions"], row["cpu_per_device"], row["wall"], row["changed"],
            row.get("results", ""), goal)).rstrip())
    by_path = dict((row["path"], row) for row in rows)
    if "converge" in by_path and "full" in by_path and by_path["converge"]["wall"]:
        converge, full = by_path["converge"], by_path["full"]
        lines.append("full / converge: wall %.1fx, executions %.1fx" % (
            full["wall"] / converge["wall"], full["executions"] / max(1, converge["executions"])))
    ratio = cpu_vs_audit(rows)
    if ratio is not None:
        lines.append("converge / audit controller CPU per device: %.1fx (goal <= %.0fx: %s), medians of %d rounds" % (
            ratio, CONVERGE_GOALS["cpu_vs_audit"], "met" if ratio <= CONVERGE_GOALS["cpu_vs_audit"] else "NOT met",
            by_path["converge"].get("rounds", 1)))
    return "\n".join(lines)


def real_fleet(count):
    """[(board, twins)] of a real fleet of ``count`` twins, in REAL_FLEET_BOARDS' shares."""
    first = int(round(count * REAL_FLEET_BOARDS[0][1]))
    return [(REAL_FLEET_BOARDS[0][0], first), (REAL_FLEET_BOARDS[1][0], count - first)]


def run_real(count, source, keep=False, say=print):
    """The audit of ``count`` real twins (never tuned: each role is reported as never applied, and every
    check is still evaluated), made for this run beside the demo's twins and removed after unless
    ``keep``: a row of {size, executions, cpu_per_device, wall, audited}."""
    directory = Path(tempfile.mkdtemp(prefix="edgetune-bench-fleet-"))
    try:
        started = time.perf_counter()
        names = manager.up(real_fleet(count), say=say, inventory_dir=directory, prefix=REAL_FLEET_PREFIX)
        say("bench audit: %d twins up in %.0f s" % (len(names), time.perf_counter() - started))
        manager.write_inventory(directory)
        os.symlink(str(Path(source).resolve() / "group_vars"), str(directory / "group_vars"))
        say("bench audit: %s on %d real twins" % (PLAYBOOK, len(names)))
        report, wall, cpu = measure(PLAYBOOK, directory)
    finally:
        if keep:
            say("bench audit: the real twins stay up, inventory %s (`edgetune-dev twin down --inventory-dir %s`)"
                % (directory, directory))
        else:  # every twin made for this directory, also where bringing the fleet up failed
            manager.remove_all([twin["name"] for twin in manager.twins(fleet_only=True, inventory_dir=directory)])
            shutil.rmtree(str(directory), ignore_errors=True)
    counts = executions(report)
    return {"size": len(names), "playbook": PLAYBOOK, "wall": wall, "cpu_per_device": cpu / len(names),
            "executions": max(counts.values()) if counts else 0, "audited": len(audit_results(report))}


def real_table(row):
    wall_goal = REAL_FLEET_GOALS["wall_per_100"] * row["size"] / 100.0
    met = row["cpu_per_device"] <= REAL_FLEET_GOALS["cpu_per_device"] and row["wall"] <= wall_goal \
        and row["executions"] <= GOALS["executions"] and row["audited"] == row["size"]
    return "\n".join([
        "%-12s %10s %14s %9s %8s %s" % ("real twins", "executions", "CPU-s/device", "wall s", "audited", "goal"),
        "%-12d %10d %14.2f %9.1f %8d <= %d executions, <= %.2f CPU-s/device, <= %.0f s: %s" % (
            row["size"], row["executions"], row["cpu_per_device"], row["wall"], row["audited"], GOALS["executions"],
            REAL_FLEET_GOALS["cpu_per_device"], wall_goal, "met" if met else "NOT met")])


# ---------------------------------------------------------------- the command
TWIN_INVENTORY = PROJECT / "inventory" / "twin"


def inject_drift():
    """One boot argument removed from the boot file of each twin of the demo fleet."""
    for twin in manager.twins(fleet_only=True, inventory_dir=TWIN_INVENTORY):
        board = manager.board(twin["board"])
        path = next(iter(board["boot_files"]))
        subprocess.run(["docker", "exec", twin["name"], "sed", "-i", "s/ nohz_full=[^ ]*//", path], check=True)


def check_mode_findings():
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               EDGETUNE_NO_SUMMARY="1")
    result = subprocess.run(["ansible-playbook", "site.yml", "--check"], cwd=str(PROJECT), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    report = json.loads(result.stdout)
    found = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            role = task["task"].get("path", "").split("/roles/")[-1].split("/")[0] if "/roles/" in \
                task["task"].get("path", "") else None
            for host, res in task["hosts"].items():
                if res.get("changed") and role:
                    found.setdefault(host, set()).add(role)
    return found


def audit_findings():
    hosts = run_audit(Options())
    return {host: {r["role"] for r in entry["results"] if r["state"] in ("drifted", "error")}
            for host, entry in hosts.items() if entry["results"]}


def timed(function):
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="edgetune-dev bench audit", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1,3,30", help="fleet sizes to audit")
    parser.add_argument("--real", type=int, default=100, metavar="N",
                        help="then audit N real twins made for it (60%% orin-nx, 40%% rock5b; 0: none)")
    parser.add_argument("--keep-real", action="store_true", help="leave the real twins running after")
    parser.add_argument("--converge-fleet", type=int, default=6, metavar="N",
                        help="measure the no-change converge on N Orin NX twins made and converged for it "
                             "(0: on the demo's twins)")
    parser.add_argument("--skip-full", action="store_true",
                        help="leave the full path (edge_converge_full, minutes a round) out of the converge's rounds")
    parser.add_argument("--out", metavar="FILE", help="also write the raw result (JSON, with host, date and commit) "
                                                      "for the docs' benchmark pages")
    args = parser.parse_args(argv)
    result = dict(bench_pages.stamp("audit"), rounds=args.rounds)
    os.chdir(str(PROJECT))  # the audit, like ansible-playbook, reads the ansible.cfg of where it runs
    twins = sorted(twin["name"] for twin in manager.twins(fleet_only=True, inventory_dir=TWIN_INVENTORY))
    if not twins:
        sys.exit("bench audit: no twins; run `make demo` first")
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    rows, agreement = run(twins, sizes, TWIN_INVENTORY,
                                      say=lambda text: print(text, file=sys.stderr))
    print(table(rows, agreement))
    print()
    result["fleet_sizes"] = [dict(row, same_findings=agreement[row["size"]]) for row in rows]
    if args.real > 0:
        result["real"] = run_real(args.real, TWIN_INVENTORY, args.keep_real,
                                  say=lambda text: print(text, file=sys.stderr))
        print(real_table(result["real"]))
        print()
    paths = [p for p in CONVERGE_PATHS if not (args.skip_full and p[0] == "full")]
    if args.converge_fleet > 0:
        result["converge_fleet"] = {"board": CONVERGE_BOARD, "count": args.converge_fleet}
        result["converge"] = converge_fleet(args.converge_fleet, TWIN_INVENTORY, args.rounds,
                                            say=lambda text: print(text, file=sys.stderr), paths=paths)
    else:
        result["converge"] = converge_rows(TWIN_INVENTORY, args.rounds, say=lambda text: print(text, file=sys.stderr),
                                           paths=paths)
    print(converge_table(result["converge"]))
    print()
    inject_drift()
    audit_times, check_times = [], []
    for _ in range(args.rounds):
        seconds, by_audit = timed(audit_findings)
        audit_times.append(seconds)
        seconds, by_check = timed(check_mode_findings)
        check_times.append(seconds)
    hosts = sorted(set(by_audit) | set(by_check))
    print("%-26s %-40s %s" % ("host", "drifted roles (edgetune audit)", "changed roles (site.yml --check)"))
    for host in hosts:
        print("%-26s %-40s %s" % (host, ",".join(sorted(by_audit.get(host, ()))) or "-",
                                  ",".join(sorted(by_check.get(host, ()))) or "-"))
    same = all(by_audit.get(h, set()) == by_check.get(h, set()) for h in hosts)
    best_audit, best_check = min(audit_times), min(check_times)
    print("same findings: %s" % ("yes" if same else "NO"))
    print("edgetune audit: best %.1f s, site.yml --check: best %.1f s, ratio %.1fx (%d rounds, %d hosts)"
          % (best_audit, best_check, best_check / best_audit, args.rounds, len(hosts)))
    result["check"] = {"hosts": len(hosts), "same_findings": same, "audit_best_s": best_audit,
                       "check_best_s": best_check}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    subprocess.run(["ansible-playbook", "site.yml"], cwd=str(PROJECT), stdout=subprocess.DEVNULL, check=False)
    return 0 if same and all(agreement.values()) else 1
