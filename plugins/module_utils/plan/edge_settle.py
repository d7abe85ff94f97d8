# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the controller decides from the device's answers, after the plan and before the role changes anything.

The plan (edge_plan) is computed from the intent and the facts. A few decisions
also need what only a read on the device tells (whether the kernel grants the
real-time policy and the CPUs, whether the classifier's Python packages and
kernel headers are there): those are made here, once, from the modules'
results, and the roles render and report what these functions return.
"""
import re


def settle_runtime(runtime, probe):
    """What the runtime's unit asks for once the device's kernel was asked (``probe``: the module
    edge_runtime_probe's result for the plan's ``runtime`` part). Where the kernel refused the real-time
    policy or the CPUs and the inventory allows it (the refusals that it does not allow failed before),
    the unit runs SCHED_OTHER or unpinned; unpinned without a measured choice, its compute threads are
    the probe's (half of the CPUs the kernel runs, shared with other work). ``expect`` is what the gates
    check of the running threads; ``fallbacks`` the lines the run reports loudly."""
    fifo, affinity = probe.get("fifo"), probe.get("affinity")
    fifo_refused = fifo is not None and not fifo.get("ok")
    affinity_refused = affinity is not None and not affinity.get("ok")
    policy = "other" if fifo_refused else runtime["sched_policy"]
    cpus = "" if affinity_refused else runtime["cpulist"]
    sched_note = fifo["reason"] if fifo_refused else "the plan's policy is other"
    affinity_note = affinity["reason"] if affinity_refused else "edge_runtime_cpus is none"
    fallback_reason = sched_note if policy != runtime["sched_policy"] else ""
    cpus_fallback_reason = affinity_note if cpus != runtime["cpulist"] else ""
    unpinned = affinity_refused and not runtime["autotune"].get("in_force")
    return {
        "expect": {"policy": policy, "priority": runtime["sched_priority"], "cpus": cpus,
                   "fallback_reason": fallback_reason, "cpus_fallback_reason": cpus_fallback_reason},
        "realtime": policy in ("fifo", "rr"),
        "threads": probe["unpinned_threads"] if unpinned else runtime["threads"],
        "sched_note": sched_note,
        "affinity_note": affinity_note,
        "scheduling": policy.upper() + (" prio %s" % runtime["sched_priority"] if policy != "other" else ""),
        "fallbacks": (["running SCHED_OTHER: " + fallback_reason] if policy != runtime["sched_policy"] else [])
        + (["running unpinned: " + cpus_fallback_reason] if cpus != runtime["cpulist"] else []),
    }


# Kernel options by the feature names of the facts' kernel.features: the classifier's, and the socket
# cgroup data it matches the inference slice's sockets by.
NETQOS_KERNEL_OPTIONS = (("bpf_syscall", "CONFIG_BPF_SYSCALL"), ("htb", "CONFIG_NET_SCH_HTB"),
                         ("cls_bpf", "CONFIG_NET_CLS_BPF"), ("clsact", "CONFIG_NET_SCH_INGRESS"))
NETQOS_CGROUP_OPTION = ("sock_cgroup_data", "CONFIG_SOCK_CGROUP_DATA")
# The kernel headers bcc compiles against, by board family, for edge_netqos_header_packages "auto".
NETQOS_HEADER_PACKAGES = {"jetson": ["nvidia-l4t-kernel-headers"]}
# The first message of the package manager a report keeps.
SAID_LENGTH = 200


def _ran_ok(result):
    return (result or {}).get("rc") == 0


def _changed(result):
    return bool((result or {}).get("changed"))


def netqos_support(kernel, answers):
    """Whether this host can run the classifier: ``kernel`` is the facts' kernel part (its release and
    features); ``answers`` the role's reads and installs so far (the registered results ``imports``,
    ``imports_after``, ``tc``, ``installed``, ``headers_installed`` and ``headers``, each absent or skipped
    until it ran) with ``uses_cgroup``, ``check_mode``, ``python``, ``packages``, ``header_packages`` (a list,
    or "auto": the board ``family``'s). Returns the kernel options missing and the header packages
    (``missing_config``, ``header_packages``: known before any read), the ``status``
    (the first reason that applies as "unsupported: ...", else "pending" in a check run that would install
    packages first, else "supported") and ``changed``, what the role changed on a host it then skips."""
    features = kernel.get("features") or {}
    wanted = NETQOS_KERNEL_OPTIONS + ((NETQOS_CGROUP_OPTION,) if answers.get("uses_cgroup") else ())
    missing = [option for feature, option in wanted if features.get(feature) is False]
    release = kernel.get("release", "")
    header_packages = answers.get("header_packages", "auto")
    if header_packages == "auto":
        header_packages = NETQOS_HEADER_PACKAGES.get(answers.get("family"), [])
    installed, headers_installed = answers.get("installed"), answers.get("headers_installed")
    # In check mode the packages are not really installed: the rest is reported as it would be done.
    pending = bool(answers.get("check_mode")) and _changed(installed)
    said = next((str(r["msg"]) for r in (installed, headers_installed) if r and r.get("msg")), "")
    said = re.sub(r"\s+", " ", said)
    said = said if len(said) <= SAID_LENGTH else said[:SAID_LENGTH - 3] + "..."
    python_ok = _ran_ok(answers.get("imports")) or _ran_ok(answers.get("imports_after")) or pending
    tc_ok = bool(((answers.get("tc") or {}).get("stat") or {}).get("exists")) or _changed(installed)
    headers_ok = pending or any((r.get("stat") or {}).get("exists") for r in
                                (answers.get("headers") or {}).get("results") or [])
    reasons = []
    if missing:
        reasons.append("unsupported: missing %s in kernel %s" % (", ".join(missing), release))
    if not python_ok:
        reasons.append("unsupported: %s cannot import bcc and pyroute2 (%s); install %s on the device, or set "
                       "edge_netqos_python" % (answers.get("python"), said or "package installation is off",
                                               " ".join(answers.get("packages") or [])))
    if not tc_ok:
        reasons.append("unsupported: no tc on the device; install iproute2")
    if not headers_ok:
        reasons.append("unsupported: no kernel headers for %s at /lib/modules/%s/build (nor CONFIG_IKHEADERS); "
                       "install them (Jetson: nvidia-l4t-kernel-headers; Armbian: linux-headers-BRANCH-FAMILY) or "
                       "set edge_netqos_header_packages" % (release, release))
    touched = ([" ".join(answers.get("packages") or [])] if _changed(installed) else []) \
        + ([" ".join(header_packages)] if _changed(headers_installed) else [])
    return {
        "missing_config": missing,
        "header_packages": list(header_packages),
        "status": reasons[0] if reasons else ("pending" if pending else "supported"),
        "changed": ("role edge_netqos installed packages (%s) but changed nothing of the network configuration"
                    % ", ".join(touched)) if touched else "role edge_netqos changed nothing",
    }


def settle_rt_budget(rt, probe_policy, slice_name):
    """From the module edge_cgroup_rt's result (``rt``): the probe's scheduling policy (``probe_policy``,
    "auto": fifo where SCHED_FIFO works in the slice, else other), whether the boot program must run in
    the slice (the budget lives in its v1 cgroup file, which exists only while a unit of the slice runs),
    whether a real-time probe can work, and the line the run reports."""
    ready = bool(rt.get("ready"))
    works = ready or bool(rt.get("pending"))
    policy = ("fifo" if ready else "other") if probe_policy == "auto" else probe_policy
    return {
        "probe_policy": policy,
        "probe_realtime": policy in ("fifo", "rr"),
        "probe_can_run": policy == "other" or works,
        "boot_in_slice": rt.get("mode") == "v1-rt-group" and works,
        "report": "SCHED_FIFO in %s: %s (%s): %s" % (
            slice_name, "works" if ready else "does NOT work", rt.get("mode"), rt.get("reason")),
    }
