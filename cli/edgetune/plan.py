"""`edgetune plan`: the plan of each device, as the roles will apply it.

Runs the collection's preflight playbook as the operator's ansible-playbook
would from the current directory (edgetune.ansible_setup; edge_facts reads each board; the action
edgetune.fleet.edge_plan validates the intent and computes the plan on the
controller) and prints each device's plan: nothing on the device changes and
nothing is read beyond the facts. Exit codes: 0 every device planned, 1 a
device could not be planned (bad intent, unknown board), 2 usage, 3 a device
unreachable, 130 interrupted.
"""
import json
import sys

from edgetune import ansible_options
from edgetune.ansible_setup import config_in_effect, outcomes, run_json_playbook
from edgetune.errors import CLEAN, FINDINGS, UNREACHABLE, UsageError

# The preflight's task that plans the device (playbooks/preflight.yml).
PLAN_TASK = "Validate the intent of every role and plan the device before the first change"


def collect(report):
    """{host: {"plan": {...}} or {"error": "unreachable"/"failed", "message": "task: message"}} from the JSON
    callback's report."""
    hosts = {}
    for host, outcome in outcomes(report, PLAN_TASK).items():
        if "error" in outcome:
            hosts[host] = {"error": outcome["error"]}
            if outcome["task"]:
                hosts[host]["message"] = "%s: %s" % (outcome["task"], outcome["message"])
        elif "plan" in outcome["result"]:
            hosts[host] = {"plan": outcome["result"]["plan"]}
    return hosts


def _settings(items, key):
    return ", ".join("%s%s %s" % ("policy" if key == "policy" else "", item[key], item.get("governor") or
                                  "limits %s-%s" % (item.get("min_freq", ""), item.get("max_freq", "")))
                     for item in items) or "none"


def autotune_line(tuned, measure):
    """What the runtime's autotune gives the plan: the choice in force (with its measurements), or
    why the defaults apply, and whether the next apply measures."""
    then = "; the next apply measures" if measure.get("needed") else ""
    choice = tuned.get("choice")
    if tuned.get("in_force") and choice:
        results = ", ".join("%s %s ms" % (r["name"], r["inter_token_p99_ms"]) for r in tuned.get("results") or [])
        return "choice %s (measured %s: inter-token P99 %s)%s" % (choice["name"], tuned.get("measured_at"),
                                                                  results or "none", then)
    if not measure.get("enabled") and not choice:
        return "off (edge_runtime_autotune)"
    return "defaults: %s%s" % (tuned.get("not_in_force") or "no choice recorded", then)


def describe(host, plan):
    """A person's view of one plan: one line per part."""
    board, cpu, boot, power, piece, runtime = (plan[k] for k in ("board", "cpu", "bootargs", "power", "slice",
                                                                  "runtime"))
    lines = ["%s: %s (bootloader %s, cgroup %s)" % (host, board["title"], board["bootloader"], board["cgroup"]),
             "  cpu       inference %s, housekeeping %s, IRQs by default on %s"
             % (cpu["inference_list"] or "none", cpu["housekeeping_list"], cpu["irq_default_list"])]
    lines.append("  bootargs  %s" % (" ".join(boot["args"]) or "none" if boot["enabled"] else "off (role disabled)")
                 + (" (remove: %s)" % " ".join(boot["absent"]) if boot.get("absent") else ""))
    if power["enabled"]:
        tools = []
        if power["jetson"]:
            tools.append("nvpmodel %s" % (power["nvpmodel_mode"] if power["nvpmodel_managed"] else "left alone"))
            tools.append("jetson_clocks %s" % ({True: "pinned", False: "restored"}.get(power["jetson_clocks"])
                                               if power["jetson_clocks_managed"] else "left alone"))
        tools.append("cpufreq %s" % _settings(power["cpufreq"], "policy" if power["cpufreq"] and "policy"
                                              in power["cpufreq"][0] else "cpus"))
        tools.append("devfreq %s" % _settings(power["devfreq"], "node"))
        lines.append("  power     " + "; ".join(tools))
        lines += ["            note: %s" % note for note in power["notes"]]
    else:
        lines.append("  power     off (role disabled)")
    if piece["enabled"]:
        lines.append("  slice     %s on %s: CPUWeight %s, CPUQuota %s, MemoryMax %s, MemoryHigh %s, IOWeight %s, "
                     "RT budget %s us%s" % (piece["name"], piece["cpulist"], piece["cpu_weight"],
                                            piece["cpu_quota"] or "none", piece["memory_max"] or "none",
                                            piece["memory_high"] or "none", piece["io_weight"],
                                            piece["rt_runtime_us"],
                                            " (cgroup v1: AllowedCPUs not enforced)" if piece["v1"] else ""))
    else:
        lines.append("  slice     off (role disabled)")
    numa = plan.get("numa") or {}
    if numa.get("node") is not None:
        lines.append("  numa      node %s: the slice, the runtime and the probe on CPUs %s (%s)"
                     % (numa["node"], numa["cpulist"], numa["reason"]))
    elif numa:
        lines.append("  numa      not bound: %s" % numa["reason"])
    policy = runtime["sched_policy"]
    lines.append("  runtime   CPUs %s, %d threads (%s backend), %s in %s"
                 % (runtime["cpulist"] or "unpinned", runtime["threads"], runtime.get("backend", "cpu"),
                    "SCHED_OTHER" if policy == "other" else "%s priority %s" % (policy, runtime["sched_priority"]),
                    runtime["slice"]))
    lines.append("  autotune  %s" % autotune_line(runtime.get("autotune") or {}, runtime.get("autotune_measure") or {}))
    lines.append("  reboot    policy %s" % plan["reboot"]["policy"])
    audit = plan.get("audit") or {}
    recorded = sorted(role for role, entry in (audit.get("roles") or {}).items() if entry["enabled"])
    if recorded:
        lines.append("  audit     the records in %s of %s" % (audit["record_dir"], ", ".join(recorded)))
    return "\n".join(lines)


def exit_code(hosts):
    if any(entry.get("error") == "unreachable" for entry in hosts.values()):
        return UNREACHABLE
    return CLEAN if all("plan" in entry for entry in hosts.values()) else FINDINGS


def cmd_plan(args):
    options = ansible_options.Options.from_args(args)
    options.check(config_in_effect().inventories)
    hosts = collect(run_json_playbook("preflight", options))
    if not hosts:
        raise UsageError("no hosts matched; check the inventory and --limit")
    if args.json:
        print(json.dumps(hosts, indent=2, sort_keys=True))
    else:
        for host in sorted(hosts):
            entry = hosts[host]
            if "plan" in entry:
                print(describe(host, entry["plan"]))
            else:
                print("%s: NOT PLANNED (%s)%s" % (host, entry["error"], (": " + " ".join(
                    entry.get("message", "").split())) if entry.get("message") else ""))
    return exit_code(hosts)


def add_parser(subparsers):
    p = subparsers.add_parser("plan", help="print each device's plan (the validated desired state), "
                                           "reading only the facts")
    ansible_options.add_to(p)
    p.add_argument("--json", action="store_true", help="machine-readable output: {host: {plan} or {error}}")
    p.set_defaults(func=cmd_plan)


if __name__ == "__main__":
    sys.exit("run it as `edgetune plan`")
