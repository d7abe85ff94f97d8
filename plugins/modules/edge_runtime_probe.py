#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_runtime_probe: can the runtime's service start as planned, before anything changes?"""

DOCUMENTATION = r"""
---
module: edge_runtime_probe
short_description: Before a deploy, find who holds the runtime's port and whether SCHED_FIFO and the CPUs are granted
description:
  - Reads C(/proc/net/tcp) and C(/proc/net/tcp6) for a listener on O(port) and names each holder
    (PID, command, systemd unit). A holder that is O(service) itself is expected and reported
    as C(ours).
  - With O(sched), asks systemd itself whether the service's scheduling settings will be granted,
    by starting short transient units (C(systemd-run --wait --collect)) with the same C(Slice=)
    and, in turn, C(CPUSchedulingPolicy=)/C(CPUSchedulingPriority=) and C(CPUAffinity=) that run
    C(/bin/true). systemd exits such a unit with status 214 when C(sched_setscheduler) is refused
    and 215 when C(sched_setaffinity) is; the module explains a refusal from the kernel's RT settings
    and the RT budget (C(cpu.rt_runtime_us)) of the cgroup such a unit runs in.
  - Also lists the CPUs the kernel schedules on (C(/proc/stat)), which is what affinity can use.
  - Never fails because of what it finds; the caller decides. It fails only when it cannot probe.
version_added: "0.1.0"
requirements:
  - systemd and C(systemd-run) on the board
author:
  - edgetune contributors (!UNKNOWN)
options:
  port:
    description: The TCP port the runtime will listen on.
    type: int
    required: true
  service:
    description: The runtime's unit; a listener inside it is not a conflict.
    type: str
    default: edgetune-runtime.service
  sched:
    description: The scheduling the unit will ask for. Omit to skip the scheduling probes.
    type: dict
    suboptions:
      slice:
        description: The unit's C(Slice=).
        type: str
        default: system.slice
      policy:
        description: C(fifo), C(rr) or C(other) (C(other) needs no probe).
        type: str
        default: fifo
        choices: [fifo, rr, other]
      priority:
        description: The RT priority (1-99).
        type: int
        default: 40
      cpus:
        description: The C(CPUAffinity=) list, for example C(4-7); empty to skip the affinity probe.
        type: str
        default: ''
notes:
  - The probes start transient units in the slice; systemd loads the slice if no unit file defines it yet.
    Slices that were not active before the probes (the slice and the slices it is nested in) are
    stopped again afterwards, so that a probe leaves no cgroup behind.
    Nothing is written to disk, and the units are collected when they exit.
attributes:
  check_mode:
    description:
      - Runs the same in check mode. It reads C(/proc) and starts short transient units that run
        C(/bin/true) (or C(/bin/cat /proc/self/cgroup)); they write nothing and are collected when they exit.
    support: full
extends_documentation_fragment:
  - edgetune.fleet.edge
  - edgetune.fleet.edge.reads_only
"""

EXAMPLES = r"""
- name: Probe the port and the scheduling before deploying
  edge_runtime_probe:
    port: 8470
    sched: {slice: ai-infer.slice, policy: fifo, priority: 40, cpus: "4-7"}
  register: probe
"""

RETURN = r"""
port:
  description: C(free) (no listener, or only O(service)), C(ours) (O(service) listens), C(holders) (pid, comm, unit)
    and C(held_by), the other holders in words.
  returned: always
  type: dict
  sample: {free: false, ours: false, holders: [{pid: 812, comm: python3, unit: other.service}]}
stopped_slices:
  description: The slices the probes started (inactive before) and that were stopped again, deepest first.
  returned: when O(sched) is given
  type: list
  elements: str
  sample: [ai-infer.slice, ai.slice]
fifo:
  description: C(ok) and, when refused, C(reason) and C(exit_status). Null without O(sched) or for policy other.
  returned: always
  type: dict
  sample: {ok: false, exit_status: 214, reason: "cpu.rt_runtime_us is 0 in /sys/fs/cgroup/cpu/docker/1f2e"}
affinity:
  description: C(ok), C(requested), C(missing) (requested CPUs the kernel does not run) and, when refused, C(reason).
  returned: always
  type: dict
kernel_cpus:
  description: The CPUs listed in /proc/stat (online in the running kernel).
  returned: always
  type: str
  sample: 0-7
kernel_cpu_count:
  description: How many CPUs C(kernel_cpus) lists.
  returned: always
  type: int
  sample: 8
unpinned_threads:
  description:
    - The compute threads of a runtime that runs unpinned (its CPU affinity refused), half of
      C(kernel_cpu_count) and at least one, as the CPUs are shared with other work.
  returned: always
  type: int
  sample: 4
"""

import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_slice  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist, parse_cpulist  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_sched import (  # noqa: E402
    compute_threads, explain_rt_refusal, port_holders, rt_budget_chain)

SYSTEMD_EXIT = {214: "SETSCHEDULER", 215: "CPUAFFINITY"}


def kernel_cpus(proc="/proc"):
    with open(proc + "/stat") as handle:
        return sorted(int(m.group(1)) for m in re.finditer(r"^cpu(\d+)\s", handle.read(), re.M))


def transient(module, slice_name, properties, argv):
    systemd_run = module.get_bin_path("systemd-run", required=True)
    command = [systemd_run, "--quiet", "--wait", "--collect", "--pipe", "-p", "Slice=" + slice_name]
    for prop in properties:
        command += ["-p", prop]
    return module.run_command(command + argv)


def inactive_slices(module, slice_name):
    """The slices of the chain that are not active now (a probe's transient unit starts them)."""
    systemctl = module.get_bin_path("systemctl", required=True)
    found = []
    for name in edge_slice.slice_chain(slice_name):
        rc, out, _err = module.run_command([systemctl, "show", "--property=ActiveState", "--value", name])
        if rc == 0 and out.strip() != "active":
            found.append(name)
    return found


def stop_slices(module, names):
    """Stop again the slices the probes started (deepest first), so that a probe leaves no cgroup behind."""
    systemctl = module.get_bin_path("systemctl", required=True)
    stopped = []
    for name in names:
        rc, _out, _err = module.run_command([systemctl, "stop", name])
        if rc == 0:
            stopped.append(name)
    return stopped


def probe_cgroup(module, slice_name):
    """The cpu cgroup a unit of this slice runs in, as seen from inside one."""
    rc, out, _err = transient(module, slice_name, [], ["/bin/cat", "/proc/self/cgroup"])
    if rc != 0:
        return None, None
    v2 = None
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "cpu" in parts[1].split(","):
            return "v1", parts[2]
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    return ("v2", v2) if v2 else (None, None)


def probe_fifo(module, sched):
    policy = sched["policy"]
    if policy == "other":
        return None
    rc, out, err = transient(module, sched["slice"], ["CPUSchedulingPolicy=" + policy,
                                                      "CPUSchedulingPriority=%d" % sched["priority"]], ["/bin/true"])
    if rc == 0:
        return {"ok": True, "exit_status": 0, "reason": None}
    kind, path = probe_cgroup(module, sched["slice"])
    reasons = []
    for directory, budget in rt_budget_chain(kind, path):
        if budget == 0:
            reasons.append("cpu.rt_runtime_us is 0 in %s (RT group scheduling gives that cgroup no RT time: a "
                           "container needs Docker's --cpu-rt-runtime, a cgroup-v1 slice needs an RT budget)"
                           % directory)
            break
    if not reasons:
        reasons.append(explain_rt_refusal())
    detail = "systemd exit status %d%s" % (rc, " (%s)" % SYSTEMD_EXIT[rc] if rc in SYSTEMD_EXIT else "")
    if rc not in SYSTEMD_EXIT:
        detail += ": " + (err or out).strip()[-200:]
    return {"ok": False, "exit_status": rc,
            "reason": "SCHED_%s priority %d refused in %s (%s): %s" % (
                policy.upper(), sched["priority"], sched["slice"], detail, "; ".join(reasons))}


def probe_affinity(module, sched, online):
    if not sched["cpus"]:
        return None
    try:
        requested = parse_cpulist(sched["cpus"])
    except ValueError as exc:
        module.fail_json(msg="sched.cpus: %s" % exc)
    missing = [c for c in requested if c not in online]
    rc, out, err = transient(module, sched["slice"], ["CPUAffinity=" + format_cpulist(requested)], ["/bin/true"])
    result = {"ok": rc == 0 and not missing, "exit_status": rc, "requested": format_cpulist(requested),
              "missing": format_cpulist(missing), "reason": None}
    if rc != 0:
        result["reason"] = ("CPUAffinity=%s refused (systemd exit status %d%s): the running kernel schedules on "
                            "CPUs %s only" % (format_cpulist(requested), rc,
                                              " (CPUAFFINITY)" if rc == 215 else "", format_cpulist(online)))
    elif missing:
        result["reason"] = ("CPUs %s of CPUAffinity=%s are not online in the running kernel (it runs %s)"
                            % (format_cpulist(missing), format_cpulist(requested), format_cpulist(online)))
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            port=dict(type="int", required=True),
            service=dict(type="str", default="edgetune-runtime.service"),
            sched=dict(type="dict", options=dict(
                slice=dict(type="str", default="system.slice"),
                policy=dict(type="str", default="fifo", choices=["fifo", "rr", "other"]),
                priority=dict(type="int", default=40),
                cpus=dict(type="str", default=""))),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not 1 <= params["port"] <= 65535:
        module.fail_json(msg="port %d is not a TCP port (1-65535)" % params["port"])
    try:
        holders = port_holders(params["port"])
        online = kernel_cpus()
    except OSError as exc:
        module.fail_json(msg="cannot read /proc: %s" % exc)
    ours = [h for h in holders if h["unit"] == params["service"]]
    others = [h for h in holders if h["unit"] != params["service"]]
    described = ", ".join("%s (pid %s%s)" % (h["comm"] or "a process this module cannot see", h["pid"] or "?",
                                             ", unit " + h["unit"] if h["unit"] else "") for h in others)
    result = {"changed": False, "port": {"free": not others, "ours": bool(ours), "holders": holders,
                                         "held_by": described},
              "kernel_cpus": format_cpulist(online), "kernel_cpu_count": len(online),
              "unpinned_threads": compute_threads(0, len(online)), "fifo": None,
              "affinity": None}
    sched = params["sched"]
    if sched:
        if not 1 <= sched["priority"] <= 99:
            module.fail_json(msg="sched.priority %d is not an RT priority (1-99)" % sched["priority"])
        try:
            edge_slice.slice_chain(sched["slice"])
        except ValueError as exc:
            module.fail_json(msg="sched.slice: %s" % exc)
        started = inactive_slices(module, sched["slice"]) if sched["policy"] != "other" or sched["cpus"] else []
        try:
            result["fifo"] = probe_fifo(module, sched)
            result["affinity"] = probe_affinity(module, sched, online)
        finally:
            result["stopped_slices"] = stop_slices(module, started)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
