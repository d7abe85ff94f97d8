"""plugins/module_utils/plan/edge_plan.py: one plan per device from the validated intent and the board.

The boards are test_edge_intent's (facts as edge_facts reads them, the real
board profiles); the expected values are written here from the boards'
documented hardware (Orin NX: clusters 0-3 and 4-7, GPU 17000000.gpu on r36;
AGX Orin on r35: three clusters, cgroup v1/hybrid by default; RK3588: policies
0, 4 and 6, devfreq fb000000.gpu, fdab0000.npu and dmc), not from the planner.
"""
import pytest
from test_edge_intent import BOARDS, SPECS, board

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_intent as intent
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_plan


def plan_for(name, values=None):
    facts, profile = board(name)
    checked = intent.validate(dict(values or {}), SPECS, facts=facts, profile=profile)
    assert checked["problems"] == [], checked["problems"]
    return edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"])


def test_orin_nx_defaults():
    plan = plan_for("orin-nx")
    assert plan["cpu"]["inference"] == [4, 5, 6, 7]
    assert plan["cpu"]["housekeeping_list"] == "0-3"
    assert plan["bootargs"]["args"] == ["isolcpus=managed_irq,domain,4-7", "nohz_full=4-7", "rcu_nocbs=4-7",
                                        "irqaffinity=0-3"]
    # r36 boots cgroup v2 by default: no switch
    assert plan["bootargs"]["cgroup_v2"] is False
    assert plan["power"]["nvpmodel_mode"] == "MAXN_SUPER"
    assert plan["power"]["jetson_clocks"] is True
    assert plan["power"]["cpufreq"] == [{"policy": 4, "governor": "performance"}]
    assert plan["power"]["devfreq"] == [{"node": "17000000.gpu", "governor": "performance"}]
    assert plan["slice"]["cpulist"] == "4-7"
    assert plan["slice"]["cpu_quota"] == "400%"
    assert plan["slice"]["memory_max_bytes"] == int(16 * 1024 ** 3 * 0.9)
    assert plan["slice"]["v1"] is False
    assert plan["runtime"]["cpulist"] == "4-7"
    assert plan["runtime"]["threads"] == 4


def test_agx_orin_r35_switches_to_cgroup_v2_and_tunes_the_offline_cluster():
    plan = plan_for("agx-r35")
    assert plan["cpu"]["inference_list"] == "4-11"
    assert plan["cpu"]["offline_inference"] == [8, 9, 10, 11]
    assert plan["bootargs"]["args"][-1] == "systemd.unified_cgroup_hierarchy=1"
    assert plan["power"]["nvpmodel_mode"] == "MAXN"
    assert [p["policy"] for p in plan["power"]["cpufreq"]] == [4, 8]
    assert plan["power"]["devfreq"] == [{"node": "17000000.ga10b", "governor": "performance"}]
    assert plan["slice"]["v1"] is True


def test_rk3588_has_no_jetson_tools_and_three_devfreq_nodes():
    plan = plan_for("rock5b")
    assert plan["cpu"]["inference_list"] == "4-7"
    assert plan["power"]["jetson"] is False
    assert plan["power"]["nvpmodel_managed"] is False and plan["power"]["nvpmodel_mode"] == ""
    assert plan["power"]["jetson_clocks_managed"] is False
    assert any("not a Jetson" in note for note in plan["power"]["notes"])
    assert [p["policy"] for p in plan["power"]["cpufreq"]] == [4, 6]
    assert [d["node"] for d in plan["power"]["devfreq"]] == ["fb000000.gpu", "fdab0000.npu", "dmc"]


def test_no_isolation_leaves_nothing_to_isolate_or_tune():
    """edge_cpu_isolate: none gives no inference CPUs anywhere (power tuned the profile's clusters before)."""
    plan = plan_for("orin-nx", {"edge_cpu_isolate": "none", "edge_cgroups_enabled": False})
    assert plan["cpu"]["inference"] == []
    assert plan["bootargs"]["args"] == []
    assert plan["power"]["cpufreq"] == []
    assert any("no inference CPUs" in note for note in plan["power"]["notes"])
    assert plan["slice"] == {"enabled": False, "name": "ai-infer.slice"}
    # Unpinned on 8 CPUs shared with everything else: half of them compute.
    assert plan["runtime"]["cpulist"] == "" and plan["runtime"]["threads"] == 4


def test_every_value_follows_one_cpu_choice():
    plan = plan_for("orin-nx", {"edge_cpu_isolate": "6-7", "edge_bootargs_nohz_full": False,
                                "edge_bootargs_cgroup_v2": True, "edge_bootargs_extra": ["quiet"]})
    assert plan["cpu"]["housekeeping_list"] == "0-5"
    assert plan["bootargs"]["args"] == ["isolcpus=managed_irq,domain,6-7", "rcu_nocbs=6-7", "irqaffinity=0-5",
                                        "systemd.unified_cgroup_hierarchy=1", "quiet"]
    assert plan["slice"]["cpu_quota"] == "200%"
    assert plan["runtime"]["threads"] == 2
    assert plan["power"]["cpufreq"] == [{"policy": 4, "governor": "performance"}]


def test_explicit_settings_pass_through():
    plan = plan_for("orin-nx", {"edge_power_nvpmodel_mode": "15W", "edge_power_jetson_clocks": None,
                                "edge_power_cpufreq": [], "edge_runtime_cpus": "5,6,7",
                                "edge_runtime_sched_policy": "other"})
    assert plan["power"]["nvpmodel_mode"] == "15W"
    assert plan["power"]["jetson_clocks_managed"] is False
    assert plan["power"]["cpufreq"] == []
    assert plan["runtime"]["cpulist"] == "5-7" and plan["runtime"]["threads"] == 3
    assert plan["runtime"]["sched_policy"] == "other"


def test_the_runtime_defaults_follow_the_measurements():
    """Pinned SCHED_OTHER by default; one compute thread per inference CPU on the CPU backend, half
    of them (at least one) where the GPU computes (README, "Measured")."""
    plan = plan_for("orin-nx")
    assert plan["runtime"]["sched_policy"] == "other" and plan["runtime"]["backend"] == "cpu"
    assert plan["runtime"]["cpulist"] == "4-7" and plan["runtime"]["threads"] == 4
    cuda = plan_for("orin-nx", {"edge_runtime_backend": "cuda"})
    assert cuda["runtime"]["threads"] == 2 and cuda["runtime"]["backend"] == "cuda"
    one = plan_for("orin-nx", {"edge_runtime_backend": "cuda", "edge_runtime_cpus": "7"})
    assert one["runtime"]["threads"] == 1
    unpinned = plan_for("orin-nx", {"edge_runtime_backend": "cuda", "edge_runtime_cpus": "none"})
    assert unpinned["runtime"]["threads"] == 4   # half of the 8 CPUs the kernel runs, whatever the backend


def test_roles_switched_off_are_marked():
    plan = plan_for("rock5b", {"edge_bootargs_enabled": False, "edge_power_enabled": False})
    assert plan["bootargs"] == {"enabled": False, "args": []}
    assert plan["power"] == {"enabled": False}
    # the CPU split does not depend on the boot arguments role
    assert plan["cpu"]["inference_list"] == "4-7"


@pytest.mark.parametrize("name", BOARDS)
def test_no_board_no_plan(name):
    facts, profile = board(name)
    checked = intent.validate({}, SPECS, facts=facts, profile=profile)
    with pytest.raises(edge_plan.PlanError):
        edge_plan.build(checked["intent"], {}, profile, checked["partition"], checked["slice"])
    with pytest.raises(edge_plan.PlanError):
        edge_plan.build(checked["intent"], facts, profile, None, checked["slice"])


def test_a_bad_intent_is_refused_before_planning():
    """The planner runs only on a validated intent: the validation names every bad variable at once."""
    facts, profile = board("orin-nx")
    checked = intent.validate({"edge_cpu_isolate": "4-9", "edge_power_nvpmodel_mode": "TURBO"}, SPECS,
                              facts=facts, profile=profile)
    assert {p["variable"] for p in checked["problems"]} == {"edge_cpu_isolate", "edge_power_nvpmodel_mode"}
    assert checked["partition"] is None


def tuned_plan(values=None, record=None, name="orin-nx"):
    facts, profile = board(name)
    checked = intent.validate(dict(values or {}), SPECS, facts=facts, profile=profile)
    assert checked["problems"] == [], checked["problems"]
    options = dict((role, list(spec)) for role, spec in SPECS.items())
    return edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                           role_options=options, autotune=record)


RECORD = {"cpus": "4-7", "backend": "cpu", "noise": "none", "measured_at": "2026-12-05T10:00:00Z",
          "candidates": [{"name": "default", "policy": "other", "priority": 0, "threads": "4"},
                         {"name": "pinned-fifo", "policy": "fifo", "priority": 40, "threads": "n"},
                         {"name": "threads-n-1", "policy": "other", "priority": 0, "threads": "n-1"},
                         {"name": "threads-n-2", "policy": "other", "priority": 0, "threads": "n/2"}],
          "results": [{"name": "pinned-fifo", "inter_token_p99_ms": 7.8, "ttft_p99_ms": 20.0}],
          "choice": {"name": "pinned-fifo", "policy": "fifo", "priority": 30, "threads": "n-1"}}


def test_a_recorded_autotune_choice_is_applied_where_it_was_measured():
    plan = tuned_plan(record=RECORD)
    runtime = plan["runtime"]
    assert (runtime["sched_policy"], runtime["sched_priority"], runtime["threads"]) == ("fifo", 30, 3)
    assert runtime["autotune"]["in_force"] and runtime["autotune"]["choice"]["name"] == "pinned-fifo"
    assert runtime["autotune_measure"] == dict(runtime["autotune_measure"], enabled=False, needed=False)
    # Measured on other CPUs or another backend: the defaults, and why.
    elsewhere = tuned_plan({"edge_runtime_cpus": "5-7"}, RECORD)["runtime"]
    assert (elsewhere["sched_policy"], elsewhere["threads"]) == ("other", 3)
    assert elsewhere["autotune"]["not_in_force"] == "it was measured on CPUs 4-7, the plan's are 5-7"
    cuda = tuned_plan({"edge_runtime_backend": "cuda"}, RECORD)["runtime"]
    assert cuda["threads"] == 2 and not cuda["autotune"]["in_force"]


def test_an_apply_measures_only_when_asked_and_no_matching_choice_is_recorded():
    on = {"edge_runtime_autotune": True}
    assert tuned_plan(on)["runtime"]["autotune_measure"]["needed"]                 # nothing recorded
    assert not tuned_plan(on, RECORD)["runtime"]["autotune_measure"]["needed"]     # measured with these
    assert tuned_plan(dict(on, edge_runtime_autotune_again=True), RECORD)["runtime"]["autotune_measure"]["needed"]
    assert tuned_plan(dict(on, edge_runtime_autotune_noise="cpu"), RECORD)["runtime"]["autotune_measure"]["needed"]
    other = dict(on, edge_runtime_autotune_candidates=["fifo-50:policy=fifo,priority=50"])
    assert tuned_plan(other, RECORD)["runtime"]["autotune_measure"]["needed"]


def test_how_autotune_measures_is_not_desired_state_but_its_choice_is():
    """`edgetune tune runtime` with its own candidates leaves an audit clean: the variables of the
    measurement are not recorded inputs; the choice (the plan's runtime part) is."""
    plain, tuned = tuned_plan(record=RECORD), tuned_plan({"edge_runtime_autotune": True,
                                                          "edge_runtime_autotune_candidates": ["x:threads=1"],
                                                          "edge_runtime_autotune_timeout": 60}, RECORD)
    assert plain["audit"]["roles"]["edge_runtime"]["inputs"] == tuned["audit"]["roles"]["edge_runtime"]["inputs"]
    assert not any(n.startswith("edge_runtime_autotune")
                   for n in plain["audit"]["roles"]["edge_runtime"]["inputs"]["variables"])
    untuned = tuned_plan()
    assert untuned["audit"]["roles"]["edge_runtime"]["inputs"]["plan"] != \
        plain["audit"]["roles"]["edge_runtime"]["inputs"]["plan"]


# --------------------------------------------------------------------------
# The audit part: what each recorded role's desired state is made of.

def audit_plan(name, values=None):
    facts, profile = board(name)
    checked = intent.validate(dict(values or {}), SPECS, facts=facts, profile=profile)
    assert checked["problems"] == [], checked["problems"]
    return edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                           role_options=dict((role, list(options)) for role, options in SPECS.items()))


def test_audit_part_names_every_recorded_role_with_its_own_variables():
    roles = audit_plan("orin-nx")["audit"]["roles"]
    assert sorted(roles) == ["edge_audit_timer", "edge_boot", "edge_bootargs", "edge_cgroups", "edge_cpu",
                             "edge_netqos", "edge_package", "edge_pcie_qos", "edge_power", "edge_runtime"]
    assert roles["edge_cgroups"]["inputs"]["variables"]["edge_cgroups_cpu_weight"] == \
        SPECS["edge_cgroups"]["edge_cgroups_cpu_weight"]["default"]
    assert not any(name.startswith("edge_cgroups_") for name in roles["edge_power"]["inputs"]["variables"])
    assert sorted(roles["edge_cgroups"]["inputs"]["plan"]) == ["cpu", "slice"]
    # edge_netqos acts (and is audited) only where the inventory lists interfaces.
    assert all(role["enabled"] for name, role in roles.items() if name != "edge_netqos")
    assert roles["edge_netqos"]["enabled"] is False


def test_netqos_is_recorded_where_interfaces_are_listed_and_present():
    roles = audit_plan("orin-nx", {"edge_netqos_interfaces": ["eth0"], "edge_netqos_rate": "900mbit"})["audit"]["roles"]
    assert roles["edge_netqos"]["enabled"] is True
    assert roles["edge_netqos"]["inputs"]["variables"]["edge_netqos_interfaces"] == ["eth0"]
    absent = audit_plan("orin-nx", {"edge_netqos_interfaces": ["eth0"], "edge_netqos_rate": "900mbit",
                                    "edge_netqos_state": "absent"})["audit"]["roles"]
    assert absent["edge_netqos"]["enabled"] is False


def test_audit_inputs_change_with_the_intent_and_only_where_it_is_used():
    before = audit_plan("orin-nx")["audit"]["roles"]
    after = audit_plan("orin-nx", {"edge_cgroups_cpu_weight": 321})["audit"]["roles"]
    changed = sorted(role for role in before if before[role]["inputs"] != after[role]["inputs"])
    assert changed == ["edge_cgroups"]
    assert after["edge_cgroups"]["inputs"]["variables"]["edge_cgroups_cpu_weight"] == 321
    # The CPU split feeds the plan parts of every role that applies them.
    moved = audit_plan("orin-nx", {"edge_cpu_isolate": "6-7"})["audit"]["roles"]
    assert sorted(role for role in before if before[role]["inputs"]["plan"] != moved[role]["inputs"]["plan"]) == [
        "edge_bootargs", "edge_cgroups", "edge_cpu", "edge_power", "edge_runtime"]


def test_audit_part_marks_a_role_switched_off():
    roles = audit_plan("orin-nx", {"edge_audit_timer_enabled": False})["audit"]["roles"]
    assert roles["edge_audit_timer"]["enabled"] is False and roles["edge_cpu"]["enabled"] is True


def test_audit_inputs_do_not_change_when_an_offline_cluster_comes_online():
    """AGX Orin r35: cluster 8-11 is offline until the power mode's reboot; the
    desired state (and so the recorded inputs) is the same before and after."""
    facts, profile = board("agx-r35")
    checked = intent.validate({}, SPECS, facts=facts, profile=profile)
    options = dict((role, list(o)) for role, o in SPECS.items())
    before = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                             role_options=options)
    partition = dict(checked["partition"], offline_inference=[])
    after = edge_plan.build(checked["intent"], facts, profile, partition, checked["slice"], role_options=options)
    assert before["cpu"]["offline_inference"] != after["cpu"]["offline_inference"]
    assert before["audit"] == after["audit"]


def test_audit_inputs_do_not_change_when_memtotal_moves_by_some_kib():
    """MemoryMax=90% is systemd's to resolve; MemTotal moves across reboots (and on VMs within a boot).
    A limit given in bytes, or a new percentage, is a change of the inputs."""
    facts, profile = board("orin-nx")
    options = dict((role, list(o)) for role, o in SPECS.items())

    def audit_of(memory_kb, **extra):
        moved = dict(facts, memory_kb=memory_kb)
        checked = intent.validate(extra, SPECS, facts=moved, profile=profile)
        return edge_plan.build(checked["intent"], moved, profile, checked["partition"], checked["slice"],
                               role_options=options)["audit"]["roles"]["edge_cgroups"]["inputs"]

    kb = facts["memory_kb"]
    assert audit_of(kb) == audit_of(kb + 62)
    assert audit_of(kb) != audit_of(kb, edge_cgroups_memory_max="80%")
    assert audit_of(kb, edge_cgroups_memory_max="2G") != audit_of(kb, edge_cgroups_memory_max="3G")


@pytest.mark.controller
def test_code_digests_are_each_role_s_own_code():
    """The planner's digests (once per process) are edge_code's, with edge_boot's program files;
    the fake collections of test_edge_code show which change marks which role."""
    from ansible_collections.edgetune.fleet.plugins.action.edge_plan import code_digests
    from ansible_collections.edgetune.fleet.plugins.lookup.collection_file import COLLECTION_ROOT
    from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_code
    found = code_digests(edge_plan.RECORDED_ROLES)
    assert code_digests(edge_plan.RECORDED_ROLES) == found
    assert len(set(found.values())) == len(edge_plan.RECORDED_ROLES)
    shipped = edge_plan.shipped_files()
    assert found == edge_code.role_code_digests(edge_plan.RECORDED_ROLES, COLLECTION_ROOT, shipped)
    facts, profile = board("orin-nx")
    checked = intent.validate({}, SPECS, facts=facts, profile=profile)
    plan = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"], code=found)
    assert dict((role, part["inputs"]["code"]) for role, part in plan["audit"]["roles"].items()) == found


def test_the_slice_has_one_name_for_every_role():
    """edge_cgroups_slice names the slice part, and the runtime and netqos parts take it from there."""
    facts, profile = board("orin-nx")
    for values in ({}, {"edge_cgroups_slice": "llm.slice"}, {"edge_cgroups_slice": "llm.slice",
                                                             "edge_runtime_slice": "llm.slice",
                                                             "edge_netqos_cgroup": "llm.slice"},
                   {"edge_cgroups_enabled": False, "edge_cgroups_slice": "llm.slice"}):
        checked = intent.validate(values, SPECS, facts=facts, profile=profile)
        assert checked["problems"] == [], checked["problems"]
        plan = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"])
        name = values.get("edge_cgroups_slice", "ai-infer.slice")
        assert plan["slice"]["name"] == plan["runtime"]["slice"] == plan["netqos"]["slice"] == name


def test_the_netqos_record_follows_the_slice_name():
    options = dict((role, list(opts)) for role, opts in SPECS.items())
    facts, profile = board("orin-nx")

    def netqos_inputs(values):
        checked = intent.validate(dict(values, edge_netqos_interfaces=["eth0"], edge_netqos_rate="1gbit"),
                                  SPECS, facts=facts, profile=profile)
        plan = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                               role_options=options)
        return plan["audit"]["roles"]["edge_netqos"]["inputs"]

    before, after = netqos_inputs({}), netqos_inputs({"edge_cgroups_slice": "llm.slice"})
    assert sorted(before["plan"]) == ["netqos", "package"]
    assert before["plan"]["netqos"] != after["plan"]["netqos"]
    assert netqos_inputs({}) == before


def test_the_device_package_directory_is_an_input_of_the_roles_that_run_its_programs():
    """Another edge_package_install_dir re-installs the package and rewrites what runs it (the boot unit,
    the audit service, the netqos command), and changes no other role's inputs."""
    before = audit_plan("orin-nx")
    after = audit_plan("orin-nx", {"edge_package_install_dir": "/opt/edgetune/package"})
    assert after["package"] == {"install_dir": "/opt/edgetune/package",
                                "audit_program": "/opt/edgetune/package/edge_audit.py"}
    assert before["package"]["install_dir"] == "/usr/local/lib/edgetune/package"
    changed = sorted(role for role, entry in after["audit"]["roles"].items()
                     if entry["inputs"] != before["audit"]["roles"][role]["inputs"])
    assert changed == ["edge_audit_timer", "edge_boot", "edge_netqos", "edge_package"]


# --------------------------------------------------------------------------
# NUMA: the layout edge_facts reads (a fixture sysfs tree), bound once in the plan.

def two_node_layout(root, nodes, accelerator_node):
    from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_numa
    for number, cpus in enumerate(nodes):
        directory = root / "sys/devices/system/node" / ("node%d" % number)
        directory.mkdir(parents=True)
        (directory / "cpulist").write_text(cpus + "\n")
    gpu = root / "sys/bus/pci/devices/0000:81:00.0"
    gpu.mkdir(parents=True)
    (gpu / "class").write_text("0x030200\n")
    (gpu / "numa_node").write_text("%d\n" % accelerator_node)
    return edge_numa.layout(str(root))


def numa_plan(layout, values=None):
    facts, profile = board("orin-nx")
    facts = dict(facts, numa=layout)
    checked = intent.validate(dict({"edge_cgroups_cpu_quota": "auto"}, **(values or {})), SPECS, facts=facts,
                              profile=profile)
    return checked, (edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                                     numa=checked["numa"]) if not checked["problems"] else None)


def test_on_two_nodes_the_slice_the_runtime_and_the_probe_take_the_accelerator_s_node(tmp_path):
    checked, plan = numa_plan(two_node_layout(tmp_path, ["0-5", "6-7"], 1))
    assert checked["problems"] == []
    assert plan["cpu"]["inference"] == [4, 5, 6, 7]            # isolated by cluster, as before
    assert plan["numa"]["node"] == 1 and plan["numa"]["cpus"] == [6, 7]
    assert (plan["slice"]["cpus"], plan["slice"]["cpulist"], plan["slice"]["numa_node"]) == ([6, 7], "6-7", 1)
    assert plan["slice"]["cpu_quota"] == "200%"               # auto follows the bound CPUs
    assert (plan["runtime"]["cpus"], plan["runtime"]["cpulist"], plan["runtime"]["threads"]) == ([6, 7], "6-7", 2)
    # One node (every Jetson Orin and RK3588): bound by cluster.
    _checked, single = numa_plan(None)
    assert single["numa"]["node"] is None and single["slice"]["cpulist"] == single["runtime"]["cpulist"] == "4-7"
    # Binding off: the cluster's CPUs, whatever the layout.
    _checked, off = numa_plan(two_node_layout(tmp_path / "off", ["0-5", "6-7"], 1), {"edge_cpu_numa_bind": False})
    assert off["slice"]["cpus"] == [4, 5, 6, 7] and off["runtime"]["cpulist"] == "4-7"


def test_no_inference_cpu_on_the_accelerator_s_node_is_refused_before_any_change(tmp_path):
    checked, plan = numa_plan(two_node_layout(tmp_path, ["0-3", "4-7"], 0))
    assert plan is None
    [problem] = [p for p in checked["problems"] if p["variable"] == "edge_cpu_numa_accelerator"]
    assert "none of the inference CPUs 4-7 is on node 0 (CPUs 0-3)" in problem["message"]


@pytest.mark.parametrize("values", [{"edge_runtime_cpus": "none"}, {"edge_cpu_isolate": "none"}])
def test_autotune_is_refused_before_any_change_where_there_are_no_inference_cpus(values):
    facts, profile = board("orin-nx")
    for switch in ("edge_runtime_autotune", "edge_runtime_autotune_again"):
        checked = intent.validate(dict(values, **{switch: True}), SPECS, facts=facts, profile=profile)
        found = [p for p in checked["problems"] if p["variable"] == switch]
        assert found and "there are no inference CPUs to tune" in found[0]["message"], checked["problems"]
    assert not [p for p in intent.validate(dict(values), SPECS, facts=facts, profile=profile)["problems"]
                if p["variable"].startswith("edge_runtime_autotune")]


@pytest.mark.parametrize("flags, listed", [
    ([], True), (["domain"], True), (["managed_irq", "domain"], True), (["nohz", "managed_irq"], False),
    (["managed_irq"], False)])
def test_the_plan_says_what_the_kernel_will_list_as_isolated(flags, listed):
    """The kernel lists the isolcpus CPUs in /sys/devices/system/cpu/isolated for the domain flag (also the
    default): what `edgetune verify` expects there, from the plan."""
    facts, profile = board("orin-nx")
    checked = intent.validate({"edge_bootargs_isolcpus_flags": flags}, SPECS, facts=facts, profile=profile)
    assert not checked["problems"], checked["problems"]
    plan = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"])
    assert plan["bootargs"]["kernel_isolated"] == (plan["cpu"]["inference_list"] if listed else "")
    assert plan["cpu"]["inference_list"]


def test_the_node_exporter_part_from_a_package_name_or_a_file(tmp_path):
    assert audit_plan("orin-nx")["audit"]["node_exporter"]["enabled"] is False
    named = audit_plan("orin-nx", {"edge_audit_timer_node_exporter": True})["audit"]["node_exporter"]
    assert (named["package"], named["package_file"], named["metrics_url"]) == (
        "prometheus-node-exporter", None, "http://127.0.0.1:9100/metrics")
    assert named["args"] == ("--collector.textfile.directory=/var/lib/prometheus/node-exporter "
                             "--web.listen-address=:9100")
    deb = tmp_path / "prometheus-node-exporter_1.5.0-1_arm64.deb"
    deb.write_bytes(b"!<arch>\n")
    from_file = audit_plan("rock5b", {"edge_audit_timer_node_exporter": True,
                                      "edge_audit_timer_node_exporter_package": str(deb),
                                      "edge_audit_timer_node_exporter_listen": "[::1]:9200",
                                      "edge_audit_timer_textfile": "/srv/metrics/edgetune.prom"}
                           )["audit"]["node_exporter"]
    assert (from_file["package"], from_file["package_file"], from_file["package_dest"]) == (
        None, str(deb), "/var/cache/edgetune/prometheus-node-exporter_1.5.0-1_arm64.deb")
    assert from_file["metrics_url"] == "http://[::1]:9200/metrics"
    assert from_file["args"] == "--collector.textfile.directory=/srv/metrics --web.listen-address=[::1]:9200"
    # Off with the timer: nothing to read.
    assert audit_plan("orin-nx", {"edge_audit_timer_node_exporter": True,
                                  "edge_audit_timer_enabled": False})["audit"]["node_exporter"]["enabled"] is False


@pytest.mark.parametrize("mode", ["always", "madvise", "never"])
def test_transparent_hugepages_are_one_more_boot_argument_and_none_by_default(mode):
    assert not any(a.startswith("transparent_hugepage=") for a in plan_for("orin-nx")["bootargs"]["args"])
    args = plan_for("rk3588", {"edge_bootargs_transparent_hugepage": mode})["bootargs"]["args"]
    assert args[-1] == "transparent_hugepage=" + mode and args.count(args[-1]) == 1
    # The role's record holds the digest of its plan part: a changed mode makes the next converge run the role.
    digests = {plan_for("orin-nx", values)["audit"]["roles"]["edge_bootargs"]["inputs"]["plan"]["bootargs"]
               for values in ({}, {"edge_bootargs_transparent_hugepage": mode})}
    assert len(digests) == 2
