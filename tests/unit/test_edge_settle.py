"""The decisions the controller makes from the device's answers (plugins/module_utils/plan/edge_settle.py):
the runtime's scheduling, CPUs and threads once the kernel was probed, and whether a host can run the
inference traffic classifier. The plan's power summary and sysctl selection are checked here too."""
from test_edge_plan import SPECS, board, edge_plan, intent, plan_for

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_settle

GRANTED = {"fifo": {"ok": True, "reason": ""}, "affinity": {"ok": True, "reason": ""}, "unpinned_threads": 3}


def refused(**which):
    probe = dict(GRANTED)
    for key, reason in which.items():
        probe[key] = {"ok": False, "reason": reason}
    return probe


# ------------------------------------------------------------------ the runtime
def test_the_plan_as_it_is_where_the_kernel_grants_it():
    runtime = plan_for("orin-nx", {"edge_runtime_sched_policy": "fifo"})["runtime"]
    settled = edge_settle.settle_runtime(runtime, GRANTED)
    assert settled["expect"] == {"policy": "fifo", "priority": 40, "cpus": "4-7", "fallback_reason": "",
                                 "cpus_fallback_reason": ""}
    assert (settled["realtime"], settled["threads"], settled["fallbacks"]) == (True, 4, [])
    assert settled["scheduling"] == "FIFO prio 40"


def test_sched_other_where_the_kernel_refuses_fifo_and_the_reason_is_said():
    runtime = plan_for("orin-nx", {"edge_runtime_sched_policy": "fifo"})["runtime"]
    settled = edge_settle.settle_runtime(runtime, refused(fifo="no RT budget in the slice"))
    assert settled["expect"]["policy"] == "other" and settled["realtime"] is False
    assert settled["expect"]["fallback_reason"] == settled["sched_note"] == "no RT budget in the slice"
    assert settled["fallbacks"] == ["running SCHED_OTHER: no RT budget in the slice"]
    assert settled["scheduling"] == "OTHER" and settled["expect"]["cpus"] == "4-7"


def test_unpinned_where_the_kernel_refuses_the_cpus_takes_the_probes_threads():
    runtime = plan_for("orin-nx")["runtime"]
    settled = edge_settle.settle_runtime(runtime, refused(affinity="CPUs 4-7 offline"))
    assert settled["expect"]["cpus"] == "" and settled["threads"] == 3
    assert settled["expect"]["cpus_fallback_reason"] == "CPUs 4-7 offline"
    assert settled["fallbacks"] == ["running unpinned: CPUs 4-7 offline"]
    # A measured choice keeps its threads even unpinned.
    tuned = dict(runtime, autotune=dict(runtime["autotune"], in_force=True))
    assert edge_settle.settle_runtime(tuned, refused(affinity="x"))["threads"] == runtime["threads"]


def test_no_cpus_asked_is_no_fallback():
    runtime = plan_for("orin-nx", {"edge_runtime_cpus": "none"})["runtime"]
    settled = edge_settle.settle_runtime(runtime, dict(GRANTED, fifo=None, affinity=None))
    assert settled["expect"]["cpus"] == "" and settled["expect"]["cpus_fallback_reason"] == ""
    assert settled["affinity_note"] == "edge_runtime_cpus is none" and settled["fallbacks"] == []


# ------------------------------------------------------------------ the classifier
FEATURES = {"bpf_syscall": True, "htb": True, "cls_bpf": True, "clsact": True, "sock_cgroup_data": True}
KERNEL = {"release": "5.15.148-tegra", "features": FEATURES}
READY = {"imports": {"rc": 0}, "tc": {"stat": {"exists": True}}, "installed": {"skipped": True},
         "headers_installed": {"skipped": True}, "headers": {"results": [{"stat": {"exists": True}}]},
         "python": "/usr/bin/python3", "packages": ["python3-bpfcc", "python3-pyroute2", "iproute2"],
         "header_packages": ["nvidia-l4t-kernel-headers"], "uses_cgroup": True, "check_mode": False}


def test_a_ready_host_is_supported():
    assert edge_settle.netqos_support(KERNEL, READY) == {
        "missing_config": [], "header_packages": ["nvidia-l4t-kernel-headers"], "status": "supported",
        "changed": "role edge_netqos changed nothing"}


def test_auto_header_packages_by_board_family():
    auto = dict(READY, header_packages="auto")
    assert edge_settle.netqos_support(KERNEL, dict(auto, family="jetson"))["header_packages"] == \
        ["nvidia-l4t-kernel-headers"]
    assert edge_settle.netqos_support(KERNEL, dict(auto, family="rockchip"))["header_packages"] == []
    assert edge_settle.netqos_support(KERNEL, dict(auto, header_packages=["linux-headers-x"]))["header_packages"] == \
        ["linux-headers-x"]


def test_missing_kernel_options_come_first_and_the_cgroup_one_only_when_used():
    kernel = dict(KERNEL, features=dict(FEATURES, htb=False, sock_cgroup_data=False))
    found = edge_settle.netqos_support(kernel, READY)
    assert found["missing_config"] == ["CONFIG_NET_SCH_HTB", "CONFIG_SOCK_CGROUP_DATA"]
    assert found["status"] == ("unsupported: missing CONFIG_NET_SCH_HTB, CONFIG_SOCK_CGROUP_DATA in kernel "
                               "5.15.148-tegra")
    assert edge_settle.netqos_support(kernel, dict(READY, uses_cgroup=False))["missing_config"] == \
        ["CONFIG_NET_SCH_HTB"]
    # A kernel config nobody could read (None) is not a missing option.
    unknown = dict(KERNEL, features=dict((name, None) for name in FEATURES))
    assert edge_settle.netqos_support(unknown, READY)["missing_config"] == []


def test_what_the_package_manager_said_is_kept_on_one_line():
    answers = dict(READY, imports={"rc": 1}, installed={"changed": False, "msg": "No package  matching\n'bcc'"})
    assert edge_settle.netqos_support(KERNEL, answers)["status"] == (
        "unsupported: /usr/bin/python3 cannot import bcc and pyroute2 (No package matching 'bcc'); install "
        "python3-bpfcc python3-pyroute2 iproute2 on the device, or set edge_netqos_python")
    off = dict(READY, imports={"skipped": True}, installed={"skipped": True})
    assert "(package installation is off)" in edge_settle.netqos_support(KERNEL, off)["status"]


def test_no_tc_no_headers_and_a_check_run_that_would_install():
    assert edge_settle.netqos_support(KERNEL, dict(READY, tc={"stat": {"exists": False}}))["status"] == \
        "unsupported: no tc on the device; install iproute2"
    headless = dict(READY, headers={"results": [{"stat": {"exists": False}}, {"skipped": True}]})
    assert edge_settle.netqos_support(KERNEL, headless)["status"].startswith(
        "unsupported: no kernel headers for 5.15.148-tegra at /lib/modules/5.15.148-tegra/build")
    pending = dict(headless, imports={"rc": 1}, installed={"changed": True}, check_mode=True)
    assert edge_settle.netqos_support(KERNEL, pending)["status"] == "pending"


def test_what_the_role_changed_on_a_host_it_skips():
    answers = dict(READY, tc={"stat": {"exists": False}}, installed={"changed": True},
                   headers_installed={"changed": True})
    assert edge_settle.netqos_support(KERNEL, answers)["changed"] == (
        "role edge_netqos installed packages (python3-bpfcc python3-pyroute2 iproute2, nvidia-l4t-kernel-headers) "
        "but changed nothing of the network configuration")


# ------------------------------------------------------------------ the plan's parts the roles now read
def test_the_plan_leaves_out_a_sysctl_the_kernel_lacks():
    assert [s["name"] for s in plan_for("orin-nx")["cpu"]["sysctl"]][-1] == "kernel.numa_balancing"
    facts, profile = board("orin-nx")
    facts = dict(facts, kernel=dict(facts["kernel"], numa_balancing=False))
    checked = intent.validate({}, SPECS, facts=facts, profile=profile)
    cpu = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"])["cpu"]
    assert "kernel.numa_balancing" not in [s["name"] for s in cpu["sysctl"]]
    assert cpu["sysctl_absent"] == ["kernel.numa_balancing"]
    assert plan_for("orin-nx", {"edge_cpu_sysctl": False})["cpu"]["sysctl"] == []


def test_the_power_summary_says_what_the_role_does():
    power = plan_for("orin-nx")["power"]
    assert power["jetson_clocks_state"] == "pinned"
    assert power["summary"] == ('nvpmodel MAXN_SUPER, jetson_clocks pinned, cpufreq [{"policy": 4, "governor": '
                                '"performance"}], devfreq [{"node": "17000000.gpu", "governor": "performance"}]')
    alone = plan_for("orin-nx", {"edge_power_nvpmodel_mode": "", "edge_power_jetson_clocks": None})["power"]
    assert alone["summary"].startswith("nvpmodel left alone, jetson_clocks left alone, ")
    assert alone["jetson_clocks_state"] == ""
    assert plan_for("orin-nx", {"edge_power_persist": False})["power"]["state_files"] == {"dvfs": "",
                                                                                          "jetson_clocks": ""}
    assert power["state_files"]["dvfs"].endswith("/dvfs.json")


# ------------------------------------------------------------------ the slice's RT budget
def test_the_probe_policy_and_the_boot_program_from_the_rt_budget():
    v1 = {"mode": "v1-rt-group", "ready": True, "reason": "950000 us of 1000000 us for the slice"}
    settled = edge_settle.settle_rt_budget(v1, "auto", "ai-infer.slice")
    assert (settled["probe_policy"], settled["probe_realtime"], settled["probe_can_run"], settled["boot_in_slice"]) \
        == ("fifo", True, True, True)
    assert settled["report"] == ("SCHED_FIFO in ai-infer.slice: works (v1-rt-group): 950000 us of 1000000 us for "
                                 "the slice")
    refused = {"mode": "v2", "ready": False, "reason": "no RT group scheduling"}
    settled = edge_settle.settle_rt_budget(refused, "auto", "ai-infer.slice")
    assert (settled["probe_policy"], settled["probe_can_run"], settled["boot_in_slice"]) == ("other", True, False)
    assert "does NOT work (v2)" in settled["report"]
    # Asked for by name where it cannot work: the role's assert refuses it.
    assert edge_settle.settle_rt_budget(refused, "fifo", "ai-infer.slice")["probe_can_run"] is False
    # A budget the next boot gives (check mode, or a reboot pending) still needs the boot program in the slice.
    assert edge_settle.settle_rt_budget(dict(v1, ready=False, pending=True), "rr", "x")["boot_in_slice"] is True


def test_the_plan_says_whether_the_tune_play_has_anything_to_do():
    # Not an apply (no records read): every role runs.
    assert plan_for("orin-nx")["converge"]["tune"] is True
    facts, profile = board("orin-nx")
    checked = intent.validate({}, SPECS, facts=facts, profile=profile)
    first = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"])
    roles = first["audit"]["roles"]
    current = dict((role, {"inputs": entry["inputs"], "holds": True, "artifacts": []})
                   for role, entry in roles.items() if entry.get("enabled"))
    again = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                            applied=current)
    assert set(again["converge"]["run"]) <= {"edge_runtime"} and again["converge"]["tune"] is False
    drifted = dict(current, edge_cpu=dict(current["edge_cpu"], holds=False, not_holding=["IRQ affinity"]))
    assert edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                           applied=drifted)["converge"]["tune"] is True
