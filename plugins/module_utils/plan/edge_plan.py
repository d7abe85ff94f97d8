# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan of one device: every derived value of the desired state, computed once.

From the host's validated intent (plugins/module_utils/plan/edge_intent.py's
``validate``: typed values of every role's variables) and what the board is
(edge_facts' ``ansible_facts.edge`` and the matched board profile), ``build``
returns one dict that the roles apply part by part and the tools print
(`edgetune plan`). Nothing here reads a device: what only the device can tell
(the NUMA node of the accelerator, whether the kernel grants SCHED_FIFO to the
slice, the modes in /etc/nvpmodel.conf) stays with the role that asks it.

Parts: ``cpu`` (the partition: inference, housekeeping, IRQ default, the
nohz_full and rcu_nocbs sets), ``bootargs`` (the arguments for the bootloader
in use), ``power`` (nvpmodel mode by name, jetson_clocks, cpufreq and devfreq
settings), ``slice`` (the inference slice and its limits), ``runtime`` (the
service's slice, CPUs, thread count and scheduling), ``netqos`` (the slice
whose sockets' traffic is inference traffic), ``boot`` (where the roles save
what a reboot loses, and the program that re-applies it), ``reboot`` (the policy) and
``audit`` (what each role's desired state is made of: the drift audit compares
it with the record the last apply left on the device, see ``audit_part``).
A part whose role is switched off is ``{"enabled": false}`` (with what other
parts still need from it).
"""

import functools
import hashlib
import json
import os

from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_autotune
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact, edge_audit, edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_code, edge_package
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_cpulist import format_cpulist, parse_cpulist
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_sched import compute_threads, resolve_threads
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

PLAN_VERSION = 1

# Kernel arguments the roles set themselves (a user's extra of the same key
# is refused by the validation).
CGROUP_V2_ARG = "systemd.unified_cgroup_hierarchy=1"
THP_ARG = "transparent_hugepage="

# The devfreq kinds a board profile names nodes for, in the order they are tuned.
DEVFREQ_KINDS = ("gpu", "npu", "memory")


# The roles whose apply leaves a record for the drift audit (the checks they
# render, with what their desired state was made of), and the plan parts each
# applies besides its own variables.
RECORDED_ROLES = {
    "edge_bootargs": ("cpu", "bootargs"),
    "edge_cpu": ("cpu",),
    "edge_cgroups": ("cpu", "slice"),
    "edge_power": ("cpu", "power"),
    "edge_pcie_qos": (),
    "edge_package": ("package",),
    "edge_netqos": ("netqos", "package"),
    "edge_runtime": ("runtime",),
    "edge_audit_timer": ("package",),
    "edge_boot": ("boot", "package"),
}
RECORD_DIR = edge_audit.RECORD_DIR
# Plan fields that describe the running device, not its desired state: they
# change across the apply's own reboot (a power mode that brings a cluster
# online; MemTotal, which a NN% memory limit is resolved against, moves by
# some KiB from boot to boot), so they are left out of the recorded inputs.
# The memory limits stay recorded as given (memory_max, memory_high).
OBSERVED = {"cpu": ("offline_inference",),
            "slice": ("memory_max_bytes", "memory_high_bytes", "probe_cpus", "probe_cpulist"),
            "runtime": ("autotune_measure",)}


class PlanError(BadInput):
    """The intent cannot be planned on this board (the validation should have said why)."""


def _jetson_clocks(value):
    """edge_power_jetson_clocks as True, False or None (leave alone); -e gives strings."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("", "null", "none"):
        return None
    return text in ("true", "yes", "1", "on")


def sysctls(intent, facts):
    """The kernel settings role edge_cpu sets and persists, in the sysctl file's order, and those it
    leaves out: kernel.numa_balancing where the kernel has no such switch (the facts' kernel part)."""
    if not intent.get("edge_cpu_enabled", True) or not intent.get("edge_cpu_sysctl", True):
        return [], []
    settings = [
        {"name": "kernel.sched_rt_runtime_us", "value": intent.get("edge_cpu_sched_rt_runtime_us", 950000)},
        {"name": "kernel.timer_migration", "value": intent.get("edge_cpu_timer_migration", 0)},
        {"name": "vm.stat_interval", "value": intent.get("edge_cpu_vm_stat_interval", 10)},
    ]
    numa = {"name": "kernel.numa_balancing", "value": intent.get("edge_cpu_numa_balancing", 0)}
    if (facts.get("kernel") or {}).get("numa_balancing", True):
        return settings + [numa], []
    return settings, [numa["name"]]


def cpu_part(intent, partition, facts):
    inference, housekeeping = partition["inference"], partition["housekeeping"]
    isolated = partition["inference_list"]
    sysctl, sysctl_absent = sysctls(intent, facts)
    return {
        "inference": inference,
        "inference_list": isolated,
        "housekeeping": housekeeping,
        "housekeeping_list": partition["housekeeping_list"],
        "offline_inference": partition.get("offline_inference", []),
        # irqbalance before 1.8 takes the banned CPUs as a hex mask only.
        "inference_mask": "%x" % sum(1 << c for c in inference),
        # Where IRQs go by default and what the tick and RCU leave alone.
        "irq_default_list": partition["housekeeping_list"],
        "nohz_full_list": isolated if intent.get("edge_bootargs_nohz_full", True) else "",
        "rcu_nocbs_list": isolated if intent.get("edge_bootargs_rcu_nocbs", True) else "",
        "sysctl": sysctl,
        # The settings this kernel does not have (the audit reports them unsupported).
        "sysctl_absent": sysctl_absent,
    }


def bootargs_part(intent, facts, profile, cpu):
    if not intent.get("edge_bootargs_enabled", True):
        return {"enabled": False, "args": []}
    args = []
    isolated = cpu["inference_list"]
    flags = list(intent.get("edge_bootargs_isolcpus_flags") or [])
    if isolated:
        args.append("isolcpus=" + ",".join(flags + [isolated]))
        if cpu["nohz_full_list"]:
            args.append("nohz_full=" + cpu["nohz_full_list"])
        if cpu["rcu_nocbs_list"]:
            args.append("rcu_nocbs=" + cpu["rcu_nocbs_list"])
        if intent.get("edge_bootargs_irqaffinity", True):
            args.append("irqaffinity=" + cpu["irq_default_list"])
    cgroup_v2 = intent.get("edge_bootargs_cgroup_v2", "auto")
    if cgroup_v2 == "auto":
        cgroup_v2 = profile.get("cgroup_default") in ("hybrid", "legacy")
    if cgroup_v2 is True:
        args.append(CGROUP_V2_ARG)
    if intent.get("edge_bootargs_transparent_hugepage"):
        args.append(THP_ARG + intent["edge_bootargs_transparent_hugepage"])
    args += list(intent.get("edge_bootargs_extra") or [])
    bootloader = (facts.get("bootloader") or {})
    return {
        "enabled": True,
        "bootloader": intent.get("edge_bootargs_bootloader") or bootloader.get("name") or "",
        "path": intent.get("edge_bootargs_path") or bootloader.get("path") or "",
        "args": args,
        "absent": list(intent.get("edge_bootargs_absent") or []),
        "cgroup_v2": cgroup_v2 is True,
        # What the kernel will list in /sys/devices/system/cpu/isolated once booted with these
        # arguments: the isolcpus CPUs for the domain flag, which is also the default (no flags,
        # or flags without nohz and managed_irq).
        "kernel_isolated": isolated if ("domain" in flags or not {"nohz", "managed_irq"} & set(flags)) else "",
    }


def power_part(intent, facts, profile, cpu):
    """nvpmodel and jetson_clocks on a Jetson; cpufreq and devfreq settings ("auto" resolved).

    Latency-first defaults: the performance governor keeps a cluster or an
    accelerator at its maximum, so an inference burst never waits for a
    governor to ramp up (schedutil reacts within ms; devfreq's simple_ondemand
    and nvhost_podgov sample every few tens of ms). Limits are left to nvpmodel.
    """
    if not intent.get("edge_power_enabled", True):
        return {"enabled": False}
    jetson = profile.get("family") == "jetson"
    mode_intent = intent.get("edge_power_nvpmodel_mode", "recommended") or ""
    mode = (profile.get("nvpmodel_recommended") or "") if mode_intent == "recommended" else mode_intent
    clocks = _jetson_clocks(intent.get("edge_power_jetson_clocks", True))
    notes = []
    if not jetson and (mode_intent or clocks is not None):
        notes.append("%s is not a Jetson: nvpmodel and jetson_clocks are not applicable "
                     "(edge_power_nvpmodel_mode and edge_power_jetson_clocks are left out)"
                     % (profile.get("title") or "this board"))

    cpufreq = intent.get("edge_power_cpufreq", "auto")
    if cpufreq == "auto":
        cpufreq = []
        inference = set(cpu["inference"])
        if not inference:
            notes.append("no inference CPUs (edge_cpu_isolate: none): no cpufreq policy is tuned")
        for cluster in (facts.get("cpu") or {}).get("clusters") or []:
            if not inference & set(cluster.get("cpus") or []):
                continue
            governors = cluster.get("governors") or []
            if not governors or "performance" in governors:
                cpufreq.append({"policy": cluster["policy"], "governor": "performance"})
            else:
                notes.append("policy%d offers no performance governor" % cluster["policy"])
    devfreq = intent.get("edge_power_devfreq", "auto")
    if devfreq == "auto":
        devfreq = []
        nodes = profile.get("devfreq") or {}
        present = facts.get("devfreq") or {}
        for kind in DEVFREQ_KINDS:
            node = nodes.get(kind)
            if not node:
                continue
            if node not in present:
                notes.append("%s node %s is not on this board (driver not loaded?)" % (kind, node))
            elif "performance" in (present[node].get("governors") or []):
                devfreq.append({"node": node, "governor": "performance"})
            else:
                notes.append("%s node %s offers no performance governor" % (kind, node))
    nvpmodel_managed, clocks_managed = jetson and bool(mode_intent), jetson and clocks is not None
    clocks_state = ("pinned" if clocks else "restored") if clocks_managed else ""
    summary = "nvpmodel %s, jetson_clocks %s, cpufreq %s, devfreq %s%s" % (
        mode if nvpmodel_managed else "left alone", clocks_state or "left alone", json.dumps(cpufreq),
        json.dumps(devfreq), "".join("; " + note for note in notes))
    return {
        "enabled": True,
        "jetson": jetson,
        "nvpmodel_managed": nvpmodel_managed,
        "nvpmodel_mode": mode if jetson else "",
        "jetson_clocks_managed": clocks_managed,
        "jetson_clocks": clocks if jetson else None,
        # The module edge_jetson_clocks' state where the role manages the clocks.
        "jetson_clocks_state": clocks_state,
        # Where the settings are saved for the boot (edge_power_persist), else "".
        "state_files": dict((kind, edge_boot.state_path(kind) if intent.get("edge_power_persist", True) else "")
                            for kind in ("dvfs", "jetson_clocks")),
        "cpufreq": cpufreq,
        "devfreq": devfreq,
        "notes": notes,
        "summary": summary,
    }


def numa_part(numa):
    """The inference slice's NUMA binding (edge_intent's, from the layout edge_facts read): on several
    nodes, the node of the accelerator and the inference CPUs on it, which the slice, the runtime and
    the probe all take; else none (bound by cluster) and why."""
    numa = numa or {}
    return {"applicable": bool(numa.get("applicable")), "node": numa.get("node"),
            "cpus": numa.get("cpus") if numa.get("node") is not None else None,
            "cpulist": numa.get("cpulist") if numa.get("node") is not None else None,
            "reason": numa.get("reason") or "the NUMA layout was not read"}


def bound_cpus(cpu, numa):
    """(cpus, cpulist) of the inference slice: the NUMA binding's where it has a node, else the cluster's."""
    if numa["node"] is not None:
        return numa["cpus"], numa["cpulist"]
    return cpu["inference"], cpu["inference_list"]


def slice_part(intent, facts, cpu, slice_values, numa):
    if not intent.get("edge_cgroups_enabled", True):
        return {"enabled": False, "name": intent.get("edge_cgroups_slice", "ai-infer.slice")}
    values = dict(slice_values or {})
    cpus, cpulist = bound_cpus(cpu, numa)
    # The probe pins to what the running kernel has: on a board all of the slice's CPUs, on a
    # device twin (the board's sysfs on a smaller host) fewer, or none (systemd's affinity then).
    scheduled = (facts.get("cpu") or {}).get("scheduled")
    probe = [c for c in cpus if c in scheduled] if scheduled else list(cpus)
    return {
        "enabled": True,
        "name": intent.get("edge_cgroups_slice", "ai-infer.slice"),
        # Bound by cluster, or on a multi-node host to the accelerator's NUMA node (its memory too).
        "cpus": cpus,
        "cpulist": cpulist,
        "numa_node": numa["node"],
        "probe_cpus": probe,
        "probe_cpulist": format_cpulist(probe) if probe else "",
        "cgroup": facts.get("cgroup") or "",
        "v1": facts.get("cgroup") in ("hybrid", "legacy"),
        "cpu_weight": intent.get("edge_cgroups_cpu_weight"),
        "cpu_quota": values.get("cpu_quota", ""),
        "memory_max": values.get("memory_max", ""),
        "memory_high": values.get("memory_high", ""),
        "memory_max_bytes": values.get("memory_max_bytes"),
        "memory_high_bytes": values.get("memory_high_bytes"),
        "io_weight": intent.get("edge_cgroups_io_weight"),
        "rt_runtime_us": intent.get("edge_cgroups_rt_runtime_us"),
    }


def runtime_part(intent, facts, cpu, slice_, autotune=None, numa=None):
    """The service's slice (the slice part's name: edge_cgroups_slice names it for every role), CPUs,
    compute threads and scheduling: the intent's, or the choice of the device's autotune record
    (``autotune``, edge_facts' ``edge_autotune``) where it was measured on these CPUs and backend."""
    choice = str(intent.get("edge_runtime_cpus", "auto")).strip()
    if choice == "auto":
        cpulist = bound_cpus(cpu, numa or numa_part(None))[1]
    elif choice in ("none", ""):
        cpulist = ""
    else:
        cpulist = format_cpulist(parse_cpulist(choice))
    cpus = sorted(parse_cpulist(cpulist)) if cpulist else []
    online = (facts.get("cpu") or {}).get("online") or []
    backend = intent.get("edge_runtime_backend", "cpu")
    default = {"policy": intent.get("edge_runtime_sched_policy", "other"),
               "priority": intent.get("edge_runtime_sched_priority", 40),
               "threads": str(compute_threads(len(cpus), len(online), backend))}
    tuned = autotune_part(intent, autotune, cpulist, backend, default)
    chosen = tuned["state"]["choice"] if tuned["state"]["in_force"] else None
    policy = (chosen or default)["policy"]
    return {
        "cpus": cpus,
        "cpulist": cpulist,
        "backend": backend,
        "threads": resolve_threads(chosen["threads"], len(cpus)) if chosen else int(default["threads"]),
        "slice": slice_["name"],
        "sched_policy": policy,
        "sched_priority": (chosen or default)["priority"] if policy != "other" else default["priority"],
        "require_fifo": intent.get("edge_runtime_require_fifo", True),
        "require_affinity": intent.get("edge_runtime_require_affinity", True),
        "autotune": tuned["state"],
        "autotune_measure": tuned["measure"],
    }


def autotune_part(intent, record, cpulist, backend, default):
    """What the runtime's autotune gives the plan. ``state``: the recorded choice and whether it is in
    force (measured on the plan's CPUs and backend; else why not), part of the desired state;
    ``measure``: whether this apply measures (edge_runtime_autotune on, and no matching choice, other
    candidates or noise than measured, or edge_runtime_autotune_again), which is not."""
    why_not = edge_autotune.in_force(record, cpulist, backend)
    candidates = [dict((k, c[k]) for k in ("name",) + edge_autotune.KEYS)
                  for c in edge_autotune.parse_candidates(intent.get("edge_runtime_autotune_candidates") or [],
                                                          default)]
    noise = intent.get("edge_runtime_autotune_noise", "none")
    enabled = bool(intent.get("edge_runtime_autotune", False))
    record = record if isinstance(record, dict) and not record.get("error") else {}
    # The default candidate is the deploy's own settings there (unpinned where the kernel refused the CPUs).
    stale = (why_not is not None or candidates[1:] != (record.get("candidates") or [])[1:]
             or noise != record.get("noise"))
    return {
        "state": {
            "in_force": why_not is None,
            "not_in_force": why_not,
            "choice": record.get("choice"),
            "measured_at": record.get("measured_at"),
            "release": record.get("release"),
            "results": [dict((k, r.get(k)) for k in ("name", "inter_token_p99_ms", "ttft_p99_ms"))
                        for r in record.get("results") or []],
        },
        "measure": {
            "enabled": enabled,
            "needed": enabled and bool(cpulist) and (bool(intent.get("edge_runtime_autotune_again", False)) or stale),
            "candidates": candidates,
            "noise": noise,
        },
    }


def netqos_part(slice_):
    """What role edge_netqos classifies besides its ports: the sockets of the inference slice (the
    slice part's name; the role starts the slice so that its cgroup exists)."""
    return {"slice": slice_["name"]}


COLLECTION = edge_code.COLLECTION


@functools.lru_cache(maxsize=None)
def collection_state(root=COLLECTION):
    """The state of the collection's files (name, size, time of each: edge_code.tree_state), once per
    process: the key of what the controller computes once for many devices and keeps on disk."""
    return edge_code.tree_state(root)


@functools.lru_cache(maxsize=None)
def collection_code(root=COLLECTION):
    """{"programs": {program: its files}, "digests": {role: the digest of its own code}} of the
    collection at ``root`` (plugins/module_utils/plan/edge_code.py): once per process, and kept on the
    controller's disk while the collection's files are unchanged."""
    return edge_code.cached_code_facts(sorted(RECORDED_ROLES), root, edge_package.DEVICE_PROGRAMS,
                                       dict.fromkeys(edge_package.DEVICE_PROGRAMS, edge_package.ROLE),
                                       state=collection_state(root))


def shipped_files(root=COLLECTION):
    """{role: the collection files it installs on the device}: the device package's role, so that the
    programs' code counts as that role's own (plugins/module_utils/plan/edge_code.py)."""
    found = collection_code(root)["programs"].values()
    return {edge_package.ROLE: sorted(set(src for files in found for src in files))}


def package_part(intent):
    """Where role edge_package installs the device package, and how the roles that run its programs
    name them there: the audit's command (edge_audit_timer's service; edge_boot's unit runs the boot
    program's module, the boot part's, from that directory). The files are edge_package.files()."""
    install_dir = intent.get("edge_package_install_dir", edge_package.DEFAULT_DIR)
    return {"install_dir": install_dir, "audit_program": install_dir.rstrip("/") + "/edge_audit.py"}


def boot_part():
    """Where the roles save the settings a reboot loses, and the unit of the one program that
    re-applies them (plugins/module_utils/device/edge_boot.py), run from the device package's directory."""
    return {
        "state_dir": edge_boot.STATE_DIR,
        "state_files": dict((kind, edge_boot.state_path(kind)) for kind in edge_boot.UTILS),
        "unit": edge_boot.UNIT,
        "module": edge_boot.PACKAGE + ".edge_boot",
    }


def _canonical(value):
    """JSON-shaped (tuples as lists, keys sorted) so that a record read back compares equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def digest(value):
    return hashlib.sha1(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _desired(part, values):
    return dict((k, v) for k, v in values.items() if k not in OBSERVED.get(part, ()))


# Variables that say how and when to measure, not what is deployed: the measured choice is (the plan's
# runtime.autotune), so `edgetune tune runtime` with other candidates leaves a clean audit behind.
HOW_NOT_WHAT = ("edge_runtime_autotune",)


# Where the controller keeps a file is no part of a device's desired state: a fleet applied from one copy
# of the collection (AWX) is audited from another (a laptop), with the same artifacts elsewhere. The
# recorded inputs know what the controller ships by what it is, never by where it lies:
#
# - a variable that names a place on the controller (CONTROLLER_LOCATIONS, where controller_locations
#   says it does) is left out of the role's ``variables``;
# - each file such a variable names enters the role's ``files`` instead (controller_files): a runtime or
#   engine tarball as its manifest's name and version and its sha256 (edge_artifact.identity), another
#   file (the node exporter's .deb) as its file name, which names it on the device, and its sha256;
# - the plan parts hold no controller path (paths in them are the device's); the node exporter part's
#   ``package_file``, the .deb's place on the controller, is the role's to copy and is no recorded input;
# - the roles' code enters as its digest, of the collection's relative paths and contents
#   (plugins/module_utils/plan/edge_code.py): the device package's files likewise.
#
# So the same artifact in another directory gives the same inputs, and a byte changed gives other ones,
# the change named ("runtime artifact sha256 0a1b2c3d4e5f -> ...").
def _controller_source(intent):
    return intent.get("edge_runtime_artifact_source", "controller") == "controller"


# {variable: whether, in an intent, it names a place on the controller}.
CONTROLLER_LOCATIONS = {
    # The directory of the artifacts named by a file name or auto (read for the controller source only).
    "edge_runtime_artifacts_dir": lambda intent: True,
    # The runtime's and the engine's tarballs with the controller source: a file name, a path or auto.
    "edge_runtime_runtime_src": _controller_source,
    "edge_runtime_engine_src": _controller_source,
    # The node exporter's package where it is a .deb file on the controller (else a package name).
    "edge_audit_timer_node_exporter_package":
        lambda intent: str(intent.get("edge_audit_timer_node_exporter_package") or "").endswith(".deb"),
}
ARTIFACT_KINDS = ("runtime", "engine")


def controller_locations(intent):
    """The variables of CONTROLLER_LOCATIONS that name a place on the controller in ``intent``."""
    return set(name for name, names_a_place in CONTROLLER_LOCATIONS.items() if names_a_place(intent))


def controller_files(intent, facts, artifacts=None):
    """{role: {what: its identity}}: each file a recorded role ships from a place on the controller
    (CONTROLLER_LOCATIONS), as what it is. ``artifacts``: the runtime's tarballs as the validation
    resolved and hashed them ([{kind, path, sha256}], an apply), else resolved here the same way (the
    audit, a role run on its own). A file that cannot be read is {"unresolved": why}."""
    found = {}
    if _recorded("edge_runtime", intent) and _controller_source(intent):
        found["edge_runtime"] = dict(("%s artifact" % kind, item) for kind, item in
                                     sorted(_artifact_identities(intent, facts, artifacts).items()))
    exporter = node_exporter_part(intent)
    if _recorded("edge_audit_timer", intent) and exporter["enabled"] and exporter["package_file"]:
        found["edge_audit_timer"] = {"node exporter package": _file_identity(exporter["package_file"])}
    return found


def _artifact_identities(intent, facts, artifacts):
    resolved = dict((item["kind"], item) for item in artifacts or ())
    if sorted(resolved) != sorted(ARTIFACT_KINDS):
        try:
            resolved = dict((kind, {"path": path}) for kind, path in _artifact_paths(intent, facts).items())
        except edge_artifact.ArtifactError as exc:
            return dict((kind, {"unresolved": str(exc)}) for kind in ARTIFACT_KINDS)
    found = {}
    for kind in ARTIFACT_KINDS:
        try:
            found[kind] = edge_artifact.identity(resolved[kind]["path"], kind, resolved[kind].get("sha256"))
        except OSError as exc:
            found[kind] = {"unresolved": "%s: %s" % (resolved[kind]["path"], exc.strerror or exc)}
    return found


def _artifact_paths(intent, facts):
    """{kind: tarball path on the controller}, as the validation finds them (edge_intent's
    check_controller_artifacts): ``auto`` the release edge_artifact.default_release picks for the device."""
    directory = intent.get("edge_runtime_artifacts_dir") or "."
    srcs = dict((kind, str(intent.get("edge_runtime_%s_src" % kind, edge_artifact.AUTO))) for kind in ARTIFACT_KINDS)
    chosen = {}
    if edge_artifact.AUTO in srcs.values():
        if not (facts or {}).get("architecture"):
            raise edge_artifact.ArtifactError("auto picks the build for the device's architecture, which role "
                                              "edge_facts reads")
        server, engine = edge_artifact.default_release(directory, edge_artifact.release_device(facts),
                                                       unknown=edge_artifact.AUTO_UNKNOWN)
        chosen = {"runtime": server["path"], "engine": engine["path"]}
    return dict((kind, chosen[kind] if src == edge_artifact.AUTO else edge_artifact.controller_tarball(src, directory))
                for kind, src in srcs.items())


def _file_identity(path):
    try:
        return {"name": os.path.basename(path), "sha256": edge_artifact.cached_sha256_file(path)}
    except OSError as exc:
        return {"unresolved": "%s: %s" % (path, exc.strerror or exc)}


def audit_part(intent, plan, role_options, code=None, files=None):
    """What each recorded role's desired state is made of, for the drift audit.

    Per role: ``enabled``, and ``inputs``: its own variables (typed, defaults
    filled in; those naming a place on the controller left out), the sha1 of
    each plan part it applies and ``files``: what it ships from the controller
    (``files``: controller_files', see CONTROLLER_LOCATIONS). The apply writes
    them with the role's checks to RECORD_DIR/ROLE.json; the audit
    evaluates those checks, and reports the role drifted where today's
    inputs differ from the recorded ones (the inventory or the board changed
    since the last apply), naming what changed. ``role_options``: {role:
    option names} (the roles' argument specs); ``code``: {role: digest of the
    role's own code} (its role files, the modules and plugins its tasks name
    and the module utilities they import: plugins/module_utils/plan/edge_code.py),
    so that a new edgetune is a change to the roles whose code changed only.
    """
    roles = {}
    controller = controller_locations(intent)
    for role, parts in sorted(RECORDED_ROLES.items()):
        names = sorted(n for n in role_options.get(role) or ()
                       if n in intent and not n.startswith(HOW_NOT_WHAT) and n not in controller)
        roles[role] = {
            "enabled": _recorded(role, intent),
            "inputs": {
                "variables": _canonical(dict((n, intent[n]) for n in names)),
                "plan": dict((part, digest(_canonical(_desired(part, plan[part])))) for part in parts),
                "files": _canonical((files or {}).get(role) or {}),
                "code": (code or {}).get(role),
            },
        }
    return {"record_dir": RECORD_DIR, "roles": roles, "node_exporter": node_exporter_part(intent)}


# The distribution's node exporter (Debian and Ubuntu's package): its unit reads ARGS from this file.
NODE_EXPORTER_SERVICE = "prometheus-node-exporter.service"
NODE_EXPORTER_DEFAULTS = ("/etc/default", "prometheus-node-exporter")
PACKAGE_CACHE = "/var/cache/edgetune"


def node_exporter_part(intent):
    """The node exporter edge_audit_timer installs to read the audit's textfile (enabled false: none):
    the package by name or as a .deb file copied from the controller, its ARGS, and the URL on the
    device where the apply checks that its textfile collector reads the directory."""
    unit = {"service": NODE_EXPORTER_SERVICE, "defaults_dir": NODE_EXPORTER_DEFAULTS[0],
            "defaults_name": NODE_EXPORTER_DEFAULTS[1], "defaults_file": "/".join(NODE_EXPORTER_DEFAULTS)}
    if not (intent.get("edge_audit_timer_enabled", True) and intent.get("edge_audit_timer_node_exporter")):
        return dict(unit, enabled=False)
    package = intent["edge_audit_timer_node_exporter_package"]
    listen = intent["edge_audit_timer_node_exporter_listen"]
    host, _colon, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "[::]"):
        host = "127.0.0.1"
    from_file = package.endswith(".deb")
    return dict(
        unit, enabled=True,
        package=None if from_file else package,
        package_file=package if from_file else None,
        package_dir=PACKAGE_CACHE if from_file else None,
        package_dest="%s/%s" % (PACKAGE_CACHE, os.path.basename(package)) if from_file else None,
        args="--collector.textfile.directory=%s --web.listen-address=%s" % (
            os.path.dirname(intent["edge_audit_timer_textfile"]), listen),
        metrics_url="http://%s:%s/metrics" % (host, port))


def _recorded(role, intent):
    """Whether the role applies something the audit then checks. edge_netqos has no
    switch of its own: it acts where interfaces are listed (its state absent removes)."""
    if role == "edge_netqos":
        return bool(intent.get("edge_netqos_interfaces")) and intent.get("edge_netqos_state", "present") == "present"
    return bool(intent.get(role + "_enabled", True))


# The roles playbooks/deploy.yml applies; playbooks/tune.yml applies the others.
DEPLOY_ROLES = ("edge_runtime",)


def converge_part(audit, applied, full=False, artifacts=None):
    """Which roles an apply skips: {"full", "skip": {role: reason}, "run": {role: reason}}.

    A role is skipped when its record (``applied``, what the apply's first device execution read:
    ansible_facts.edge_applied) has today's inputs (intent, plan part, code) and every recorded check
    holds now, so that a run that changes nothing costs what the audit costs. The runtime also needs
    ``artifacts`` ([{kind, sha256}], the release the controller resolved today: ``auto`` may name a
    new build without any input changing) to be those of the release it serves. ``applied`` None
    (not an apply) or ``full`` (edge_converge_full, or --tags full) runs every role."""
    decisions = {"full": bool(full), "skip": {}, "run": {}}
    for role, entry in sorted((audit.get("roles") or {}).items()):
        if not entry.get("enabled"):
            continue
        record = (applied or {}).get(role)
        if full or applied is None:
            why = "full converge asked for" if full else "not an apply"
        elif record is None:
            why = "never applied here"
        elif "error" in record:
            why = "its record cannot be read: " + record["error"]
        else:
            changes = edge_audit.inputs_changes(record.get("inputs"), entry.get("inputs"))
            if role == "edge_runtime":
                changes += release_changes(record.get("artifacts"), artifacts)
            why = ("changed since the last apply: " + "; ".join(changes) if changes else
                   None if record.get("holds") else "drifted: " + ", ".join(record.get("not_holding") or []))
        if why is None:
            decisions["skip"][role] = "current and holds"
        else:
            decisions["run"][role] = why
    return decisions


def served_artifacts(intent, resolved):
    """[{kind, sha256}] of the release an apply deploys today: the controller's resolved tarballs
    (source controller), the checksums the inventory gives (url, device), None when not resolved."""
    if intent.get("edge_runtime_artifact_source", "controller") != "controller":
        return [{"kind": kind, "sha256": str(intent.get("edge_runtime_%s_sha256" % kind) or "").lower()}
                for kind in ("runtime", "engine")]
    return [{"kind": item["kind"], "sha256": item["sha256"]} for item in resolved] if resolved else None


def release_changes(served, resolved):
    """Why the release the runtime serves ({kind: sha256}, from its record) is not today's."""
    if resolved is None:
        return ["the artifacts were not resolved on the controller in this run"]
    wanted = dict((item["kind"], item["sha256"]) for item in resolved)
    served = served or {}
    return ["a new %s artifact (sha256 %s, serving %s)" % (kind, sha[:12], (served.get(kind) or "none")[:12])
            for kind, sha in sorted(wanted.items()) if served.get(kind) != sha]


def build(intent, facts, profile, partition, slice_values=None, role_options=None, code=None, applied=None,
          full=False, artifacts=None, autotune=None, numa=None):
    """The plan of one device.

    ``intent``: the typed values of every role's variables (defaults filled
    in); ``facts``/``profile``: ansible_facts.edge and the matched profile;
    ``partition``: edge_intent.cpu_partition's result; ``slice_values``:
    edge_intent.slice_plan's (quota resolved, memory limits in bytes);
    ``role_options``: {role: option names} and ``code``: {role: digest}, for
    the audit part; ``applied``/``full``/``artifacts`` (the runtime's, as the controller resolved
    them): for the converge part (see converge_part); ``autotune``: the device's autotune record
    (edge_facts' ``edge_autotune``), for the runtime part; ``numa``: edge_intent's NUMA binding
    (validate()'s "numa"), for the slice's and the runtime's CPUs.
    """
    if not facts or not profile:
        raise PlanError("no board facts: run role edge_facts before planning")
    if partition is None:
        raise PlanError("the CPU partition could not be computed (see the validation's messages)")
    cpu = cpu_part(intent, partition, facts)
    numa = numa_part(numa)
    # One slice name (edge_cgroups_slice) for every role: the runtime's and the classifier's are the slice part's.
    slice_ = slice_part(intent, facts, cpu, slice_values, numa)
    plan = {
        "version": PLAN_VERSION,
        "board": {
            "profile": profile.get("name"),
            "title": profile.get("title"),
            "family": profile.get("family"),
            "bootloader": (facts.get("bootloader") or {}).get("name"),
            "cgroup": facts.get("cgroup"),
        },
        "cpu": cpu,
        "bootargs": bootargs_part(intent, facts, profile, cpu),
        "power": power_part(intent, facts, profile, cpu),
        "slice": slice_,
        "numa": numa,
        "runtime": runtime_part(intent, facts, cpu, slice_, autotune, numa),
        "netqos": netqos_part(slice_),
        "boot": boot_part(),
        "package": package_part(intent),
        "reboot": {"policy": intent.get("edge_reboot_policy", "auto")},
    }
    plan["audit"] = audit_part(intent, plan, role_options or {}, code,
                               controller_files(intent, facts, artifacts))
    plan["converge"] = converge_part(plan["audit"], applied, full or intent.get("edge_converge_full", False),
                                     served_artifacts(intent, artifacts))
    # Whether playbooks/tune.yml has anything to do here: one of its roles runs, or the classifier is
    # to be removed (role edge_netqos records nothing then, so it has no record to be current).
    plan["converge"]["tune"] = bool(set(plan["converge"]["run"]) - set(DEPLOY_ROLES)) \
        or intent.get("edge_netqos_state", "present") == "absent"
    return plan
