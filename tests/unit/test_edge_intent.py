"""plugins/module_utils/plan/edge_intent.py: the intent validated before any change, every role at once.

The board profiles are the real ones (roles/edge_facts/files/board_profiles),
matched the way role edge_facts matches them; the specs are the roles' own
meta/argument_specs.yml. The facts are what edge_facts reads on each board
(CPU clusters with governors and frequencies, devfreq nodes, memory, RT
throttling).
"""
import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_intent as intent

REPO = Path(__file__).resolve().parents[2]
PROFILES = [yaml.safe_load(p.read_text())
            for p in sorted((REPO / "roles/edge_facts/files/board_profiles").glob("*.yml"))]
SPECS = {p.parents[1].name: yaml.safe_load(p.read_text())["argument_specs"]["main"]["options"]
         for p in sorted(REPO.glob("roles/*/meta/argument_specs.yml"))}
TENSORRT = yaml.safe_load((REPO / "roles/edge_runtime/vars/main.yml").read_text())["__edge_runtime_tensorrt_by_l4t"]
GIB_KB = 1024 * 1024


def resolve_release(value, major):
    if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
        return value.get(str(major)) if major is not None else None
    return value


def profile_for(compatible, major):
    """The profile role edge_facts matches (the edge_board_profile filter's rule, without ansible-core)."""
    for entry in compatible:
        for profile in PROFILES:
            if entry in profile["match"]:
                resolved = dict(profile)
                resolved["devfreq"] = {k: resolve_release(v, major) for k, v in (profile.get("devfreq") or {}).items()}
                resolved["cgroup_default"] = resolve_release(profile.get("cgroup_default"), major)
                return resolved
    raise AssertionError("no profile for %s" % compatible)


def cluster(policy, cpus, high):
    freqs = [115200, 729600, 1190400, 1574400, high]
    return {"policy": policy, "cpus": cpus, "governor": "schedutil",
            "governors": ["userspace", "ondemand", "performance", "schedutil"],
            "frequencies": freqs, "min_freq": freqs[0], "max_freq": freqs[-1]}


def board(name):
    """(facts, profile) of a board as edge_facts reads it."""
    features = {"no_hz_full": True, "rcu_nocb": True, "htb": True, "cls_bpf": True, "bpf_syscall": True,
                "clsact": True, "sock_cgroup_data": True, "rt_group_sched": False}
    sched = {"rt_period_us": 1000000, "rt_runtime_us": 950000}
    if name == "orin-nx":
        facts = {"compatible": ["nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"],
                 "soc": "tegra234", "l4t": {"major": 36, "revision": "4.3", "version": "36.4.3"},
                 "bsp": {"name": "ubuntu", "version": "22.04"},
                 "cpu": {"present": list(range(8)), "online": list(range(8)), "isolated": [],
                         "clusters": [cluster(0, [0, 1, 2, 3], 1984000), cluster(4, [4, 5, 6, 7], 1984000)]},
                 "devfreq": {"17000000.gpu": {"governor": "nvhost_podgov",
                                              "governors": ["nvhost_podgov", "performance", "simple_ondemand"],
                                              "frequencies": [306000000, 624750000, 918000000]}},
                 "memory_kb": 16 * GIB_KB, "cgroup": "unified"}
    elif name == "agx-r35":
        # MODE_30W: cpu8-11 offline.
        facts = {"compatible": ["nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"],
                 "soc": "tegra234", "l4t": {"major": 35, "revision": "6.0", "version": "35.6.0"},
                 "bsp": {"name": "ubuntu", "version": "20.04"},
                 "cpu": {"present": list(range(12)), "online": list(range(8)), "isolated": [],
                         "clusters": [cluster(0, [0, 1, 2, 3], 2201600), cluster(4, [4, 5, 6, 7], 2201600),
                                      cluster(8, [8, 9, 10, 11], 2201600)]},
                 "devfreq": {"17000000.ga10b": {"governor": "nvhost_podgov",
                                                "governors": ["nvhost_podgov", "performance"],
                                                "frequencies": [306000000, 1300500000]}},
                 "memory_kb": 64 * GIB_KB, "cgroup": "hybrid"}
    else:
        rk = {"governor": "simple_ondemand", "governors": ["userspace", "powersave", "performance", "simple_ondemand"],
              "frequencies": [300000000, 600000000, 1000000000]}
        facts = {"compatible": ["radxa,rock-5b", "rockchip,rk3588"], "soc": "rk3588", "l4t": None,
                 "bsp": {"name": "armbian", "version": "25.8.1"},
                 "cpu": {"present": list(range(8)), "online": list(range(8)), "isolated": [],
                         "clusters": [dict(cluster(0, [0, 1, 2, 3], 1800000), frequencies=[408000, 1800000]),
                                      dict(cluster(4, [4, 5], 2400000), frequencies=[408000, 1800000, 2400000]),
                                      dict(cluster(6, [6, 7], 2400000), frequencies=[408000, 1800000, 2400000])]},
                 "devfreq": {"fb000000.gpu": rk, "fdab0000.npu": rk, "dmc": dict(rk, governor="dmc_ondemand")},
                 "memory_kb": 8 * GIB_KB, "cgroup": "hybrid"}
    facts.update(kernel={"release": "5.15.148-tegra", "features": features}, sched=sched, architecture="aarch64",
                 glibc="2.35" if facts["bsp"]["version"] != "20.04" else "2.31")
    return facts, profile_for(facts["compatible"], (facts["l4t"] or {}).get("major"))


BOARDS = ["orin-nx", "agx-r35", "rock5b"]


def good_calendar(value):
    return None if value in ("*-*-* 05:30:00", "daily", "Mon..Fri 04:00") else \
        "Failed to parse calendar specification '%s': Invalid argument" % value


def check(values=None, name="orin-nx", roles=None, present=None, **kwargs):
    facts, profile = board(name)
    kwargs.setdefault("calendar", good_calendar)
    values = dict(values or {})
    return intent.validate(values, SPECS, facts=facts, profile=profile, roles=roles,
                           present=present if present is not None else list(values), **kwargs)


def problems(values=None, **kwargs):
    """{variable: message} of what the intent is refused for."""
    return {p["variable"]: p["message"] for p in check(values, **kwargs)["problems"]}


def only(values, name="orin-nx", **kwargs):
    """The one message for the one bad variable in ``values``."""
    found = problems(values, name=name, **kwargs)
    assert len(found) == 1, found
    (variable, message), = found.items()
    assert variable in values, found
    assert message.startswith("%s = %s: " % (variable, json.dumps(values[variable], sort_keys=True)[:117])), message
    return message


# --------------------------------------------------------------------------
# Good intents

@pytest.mark.parametrize("name", BOARDS)
def test_the_defaults_are_valid_on_every_board(name):
    assert problems(name=name) == {}


def test_the_project_inventories_are_valid():
    values = yaml.safe_load((REPO / "inventory/twin/group_vars/all.yml").read_text())
    values.update(yaml.safe_load((REPO / "inventory/sample/group_vars/all.yml").read_text()))
    for name in BOARDS:
        assert problems(values, name=name) == {}
    for path in sorted((REPO / "tools/edgetune_dev/vm/host_vars").glob("*.yml")):
        assert problems(dict(values, **yaml.safe_load(path.read_text()))) == {}, path
    # molecule's netqos check on a twin
    assert problems({"edge_netqos_interfaces": [{"name": "lo", "rate": "100mbit"}], "edge_netqos_ports": [8000],
                     "edge_netqos_install_packages": False}) == {}


@pytest.mark.parametrize("values", [
    {"edge_cpu_isolate": "6-7", "edge_cpu_housekeeping": "0-5"},
    {"edge_cpu_isolate": "none", "edge_cgroups_enabled": False},
    {"edge_bootargs_cgroup_v2": True}, {"edge_bootargs_cgroup_v2": False},
    {"edge_power_nvpmodel_mode": "25W"}, {"edge_power_nvpmodel_mode": ""},
    {"edge_power_jetson_clocks": None}, {"edge_power_jetson_clocks": False},
    {"edge_power_cpufreq": [{"policy": 4, "governor": "performance", "min_freq": 1190400, "max_freq": "max"}],
     "edge_power_jetson_clocks": False},
    {"edge_power_cpufreq": [{"cpus": 5, "governor": "schedutil"}], "edge_power_devfreq": []},
    {"edge_power_cpufreq": [{"policy": 4, "max_freq": 1500000}], "edge_power_snap": "down",
     "edge_power_jetson_clocks": None},
    {"edge_pcie_qos_mappings": [{"device": "0000:01:00.0", "tcs": [1, 2], "vc_id": 2}]},
    {"edge_netqos_interfaces": ["eth0", {"name": "eth1", "rate": "1gbit", "ports": ["9000-9003"]}],
     "edge_netqos_rate": "900mbit", "edge_netqos_ports": [8470, 50051]},
    {"edge_runtime_cpus": "4-7", "edge_runtime_health_timeout": "30", "edge_runtime_port": "8479",
     "edge_runtime_p99_ms": "0.5"},
    {"edge_runtime_env": {"EDGETUNE_LOG": "debug", "EDGETUNE_BATCH": 4}},
    {"edge_runtime_env": {"LLAMA_ARG_BATCH": 256}, "edge_runtime_ctx_size": 4096, "edge_runtime_ttft_p99_ms": 0,
     "edge_runtime_token_p99_ms": "50", "edge_runtime_gate_generations": 20, "edge_runtime_gate_max_tokens": 2},
    {"edge_audit_timer_calendar": "daily", "edge_audit_timer_random_delay": "1h 30min"},
    {"edge_reboot_policy": "never", "edge_reboot_serial": "20%", "edge_deploy_serial": [1, "50%"]},
    {"edge_cgroups_memory_max": "12G", "edge_cgroups_memory_high": "", "edge_cgroups_cpu_quota": "250%"},
])
def test_good_intents(values):
    assert problems(values) == {}


def test_agx_in_mode_30w_may_isolate_offline_cpus():
    assert problems({"edge_cpu_isolate": "4-11"}, name="agx-r35") == {}
    result = check({}, name="agx-r35")
    assert result["partition"]["offline_inference"] == [8, 9, 10, 11]


# --------------------------------------------------------------------------
# Each class of bad input of issue #16, and more

def test_unknown_nvpmodel_mode_names_the_boards_modes():
    message = only({"edge_power_nvpmodel_mode": "MODE_99W"})
    assert "not a power mode of the NVIDIA Jetson Orin NX 16GB" in message
    assert "MAXN_SUPER, 10W, 15W, 25W, 40W" in message and "recommended (MAXN_SUPER)" in message
    assert "MODE_50W" in only({"edge_power_nvpmodel_mode": "MODE_40W"}, name="agx-r35")


def test_nvpmodel_mode_is_left_out_on_a_board_without_nvpmodel():
    assert problems({"edge_power_nvpmodel_mode": "MAXN"}, name="rock5b") == {}


def test_bad_calendar_is_refused_with_systemds_words():
    message = only({"edge_audit_timer_calendar": "every tuesday-ish"})
    assert "Failed to parse calendar specification 'every tuesday-ish'" in message
    assert "allowed: a systemd OnCalendar expression" in message
    assert "edge_audit_timer_calendar" in only({"edge_audit_timer_calendar": "daily\n[Service]"})


def test_calendar_not_checked_without_a_checker_but_the_audit_timer_off_skips_it():
    assert problems({"edge_audit_timer_calendar": "whenever"}, calendar=None) == {}
    assert problems({"edge_audit_timer_calendar": "whenever", "edge_audit_timer_enabled": False}) == {}


@pytest.mark.parametrize("value", [-5, 0, "-5", 3601, "soon"])
def test_health_timeout(value):
    assert "edge_runtime_health_timeout = " in only({"edge_runtime_health_timeout": value})


def test_empty_isolate_is_not_none():
    message = only({"edge_cpu_isolate": ""})
    assert "empty (an empty string is not none); allowed: auto, none or a CPU list" in message
    assert "edge_cpu_housekeeping" in only({"edge_cpu_housekeeping": " "})


def test_misspelled_variable_is_warned_with_the_nearest_name():
    result = check({"edge_bootarg_isolate": "4-7", "edge_runtime_helth_timeout": 5, "edge_zzz_qqq": 1})
    assert result["problems"] == []
    assert result["warnings"] == [
        "edge_bootarg_isolate is not a variable of any edgetune role or playbook and is ignored "
        "(did you mean edge_cpu_isolate?)",
        "edge_runtime_helth_timeout is not a variable of any edgetune role or playbook and is ignored "
        "(did you mean edge_runtime_health_timeout?)",
        "edge_zzz_qqq is not a variable of any edgetune role or playbook and is ignored"]


def test_the_boot_state_files_of_edgetune_0_2_are_named_as_no_longer_used():
    result = check({"edge_power_state_file": "/etc/edgetune/power.json", "edge_cpu_lib_dir": "/opt/edgetune"})
    assert result["problems"] == []
    reason = ("is no longer used and is ignored: the settings a reboot loses are saved in /etc/edgetune/boot.d and "
              "re-applied by edgetune-boot.service (role edge_boot), whose program is the device package's "
              "(role edge_package)")
    assert result["warnings"] == ["edge_cpu_lib_dir " + reason, "edge_power_state_file " + reason]


def test_the_program_directories_of_the_roles_are_named_as_no_longer_used():
    result = check({"edge_boot_install_dir": "/opt/boot", "edge_netqos_install_dir": "/opt/netqos",
                    "edge_audit_timer_install_dir": "/opt/audit"})
    assert result["problems"] == []
    reason = ("is no longer used and is ignored: the boot program, the audit command and the network priority "
              "loader are one device package, installed by role edge_package in edge_package_install_dir")
    assert result["warnings"] == [name + " " + reason for name in (
        "edge_audit_timer_install_dir", "edge_boot_install_dir", "edge_netqos_install_dir")]


def test_exported_and_playbook_names_are_not_unknown():
    present = ["edge_facts_profile", "edge_bootargs_cpus", "edge_cgroups_audit", "edge_reboot_policy",
               "edge_audit_result", "edge_mode"]
    exports = ["edge_facts_profile", "edge_bootargs_cpus", "edge_cgroups_audit"]
    assert check({}, present=present, exports=exports)["warnings"] == []
    # The facts edge_facts and edge_plan publish, which Ansible also sets as variables: an apply's
    # plan reads them after edge_facts and must not call them unknown on every run.
    facts = ["edge_applied", "edge_autotune", "edge_plan"]
    assert check({}, present=facts, exports=exports)["warnings"] == []


@pytest.mark.parametrize("value", ["maybe", "true", "yes", 1, "1"])
def test_cgroup_v2_is_auto_or_a_real_boolean(value):
    message = only({"edge_bootargs_cgroup_v2": value})
    assert "allowed: auto, true or false" in message


@pytest.mark.parametrize("name", ["edge_bootargs_fallback", "edge_runtime_mlock", "edge_cpu_sysctl",
                                  "edge_netqos_required", "edge_pcie_qos_persist"])
@pytest.mark.parametrize("value", ["yes", "false", "no", "on", "True"])
def test_no_yaml_boolean_strings_where_a_bool_is_specified(name, value):
    message = only({name: value})
    assert "a string, not a boolean" in message and "allowed: true or false" in message


@pytest.mark.parametrize("value", ["ai/infer.slice", "system.slice", "ai-infer", "ai infer.slice", "-.slice",
                                   "ai--infer.slice"])
def test_the_slice_must_be_a_slice_of_its_own(value):
    assert "is not a slice of its own" in only({"edge_cgroups_slice": value})


@pytest.mark.parametrize("roles", [None, ["edge_runtime"], ["edge_netqos"]])
def test_the_slice_name_is_checked_for_the_roles_that_use_it(roles):
    assert "is not a slice of its own" in only({"edge_cgroups_slice": "ai/infer.slice"}, roles=roles)


@pytest.mark.parametrize("alias", ["edge_runtime_slice", "edge_netqos_cgroup"])
def test_the_old_slice_names_may_only_repeat_edge_cgroups_slice(alias):
    # Unset, "" or the same name: fine.
    assert problems({}) == {}
    assert problems({alias: ""}) == {}
    assert problems({alias: "ai-infer.slice"}) == {}
    assert problems({alias: "llm.slice", "edge_cgroups_slice": "llm.slice"}) == {}
    # Another name: one message naming both variables and values.
    message = only({alias: "llm.slice"})
    assert message.startswith('%s = "llm.slice": differs from edge_cgroups_slice = "ai-infer.slice"' % alias), message
    assert "allowed: unset, \"\" or \"ai-infer.slice\"" in message
    message = only({alias: "ai-infer.slice", "edge_cgroups_slice": "llm.slice"})
    assert 'differs from edge_cgroups_slice = "llm.slice"' in message
    # Also in the role's own check, where edge_cgroups is not among the roles checked.
    role = alias.rsplit("_", 1)[0]
    found = problems({alias: "llm.slice", "edge_cgroups_slice": "gpu.slice"}, roles=[role])
    assert list(found) == [alias] and 'differs from edge_cgroups_slice = "gpu.slice"' in found[alias]
    # A bad edge_cgroups_slice is reported for itself, not as a difference.
    found = problems({alias: "ai/infer.slice", "edge_cgroups_slice": "ai/infer.slice"})
    assert list(found) == ["edge_cgroups_slice"], found


def test_runtime_cpus_the_board_lacks():
    message = only({"edge_runtime_cpus": "4-19"})
    assert "CPUs 8-19 do not exist on this board (the NVIDIA Jetson Orin NX 16GB has CPUs 0-7)" in message
    assert "invalid CPU list item" in only({"edge_runtime_cpus": "four"})
    assert "empty" in only({"edge_runtime_cpus": ""})
    assert problems({"edge_runtime_cpus": "8-11"}, name="agx-r35") == {}


@pytest.mark.parametrize("tcs, words", [
    ("1,2", "is a string, not a list (a string is never split into one: write [1, 2])"),
    ([1, "2"], "is not an integer"), ([0], "TC0 cannot be moved"), ([8], "does not exist"),
    ([], "non-empty list"), ([1, 1], "lists a traffic class twice"),
])
def test_pcie_traffic_classes(tcs, words):
    message = only({"edge_pcie_qos_mappings": [{"device_class": "0x0108", "tcs": tcs, "vc_id": 1}]})
    assert words in message


@pytest.mark.parametrize("mapping, words", [
    ({"device_class": "0x0108", "tcs": [1], "vc_id": 0}, "vc_id 0 is not a VC ID of 1-7"),
    ({"device_class": "NVMe", "tcs": [1]}, "is not a PCI class like 0x0108"),
    ({"device": "01:00.0", "device_class": "0x0108", "tcs": [1]}, "exactly one of device and device_class"),
    ({"tcs": [1]}, "exactly one of device and device_class"),
    ({"device": "bus one", "tcs": [1]}, "bus one"),
    ({"device_class": "0x0108", "tcs": [1], "vc": 1}, "unknown keys vc"),
])
def test_pcie_mappings(mapping, words):
    assert words in only({"edge_pcie_qos_mappings": [mapping]})


def test_pcie_timeout():
    assert "above 0 and at most 60" in only({"edge_pcie_qos_timeout": 0})


def test_netqos_ports_and_rates_are_checked_whatever_the_host_can_run():
    found = problems({"edge_netqos_interfaces": ["eth0"], "edge_netqos_rate": "fast", "edge_netqos_ports": [70000],
                      "edge_netqos_high_rate": "120%", "edge_netqos_high_class": 70})
    assert sorted(found) == ["edge_netqos_high_class", "edge_netqos_high_rate", "edge_netqos_ports",
                             "edge_netqos_rate"]
    assert "invalid port 70000: ports are 1..65535" in found["edge_netqos_ports"]
    assert "rate 'fast' is not a rate" in found["edge_netqos_rate"]
    assert "1:10 unquoted is the number 70" in found["edge_netqos_high_class"]


def test_netqos_needs_a_rate_and_something_to_classify():
    found = problems({"edge_netqos_interfaces": ["eth0"], "edge_netqos_ports": [8470]})
    assert "edge_netqos_rate" in found and "rate is missing" in found["edge_netqos_rate"]
    # The inference slice (edge_cgroups_slice) is always classified; an interface may leave it out.
    assert problems({"edge_netqos_interfaces": ["eth0"], "edge_netqos_rate": "1gbit"}) == {}
    found = problems({"edge_netqos_interfaces": [{"name": "eth0", "cgroup": ""}], "edge_netqos_rate": "1gbit"})
    assert "nothing to classify" in found["edge_netqos_interfaces"]


def test_netqos_ports_must_be_a_list_and_interfaces_named_once():
    assert "a string, not a list (a string is never split into one: write [8470])" in only(
        {"edge_netqos_ports": "8470"})
    found = problems({"edge_netqos_interfaces": ["eth0", "eth0", {"name": "eth1", "speed": 1}],
                      "edge_netqos_rate": "1gbit", "edge_netqos_ports": [1]})
    assert "interface eth0 is listed twice" in found["edge_netqos_interfaces"]
    assert "unknown keys speed" in found["edge_netqos_interfaces"]


def test_netqos_is_not_checked_when_absent_or_empty():
    assert problems({"edge_netqos_ports": [70000]}) == {}
    assert problems({"edge_netqos_interfaces": ["eth0"], "edge_netqos_ports": [70000],
                     "edge_netqos_state": "absent"}) == {}


def test_every_problem_of_every_role_is_reported_at_once():
    values = {"edge_power_nvpmodel_mode": "MODE_99W", "edge_audit_timer_calendar": "bogus",
              "edge_runtime_health_timeout": -5, "edge_cpu_isolate": "", "edge_bootargs_cgroup_v2": "maybe",
              "edge_runtime_slice": "ai/infer.slice", "edge_runtime_cpus": "4-19",
              "edge_pcie_qos_mappings": [{"device_class": "0x0108", "tcs": "1,2"}],
              "edge_netqos_interfaces": ["eth0"], "edge_netqos_ports": [70000], "edge_netqos_rate": "1gbit",
              "edge_cpu_sched_rt_runtime_us": 1000000, "edge_cgroups_memory_max": "64T", "edge_reboot_policy": "now"}
    found = problems(values)
    assert sorted(found) == sorted(values.keys() - {"edge_netqos_interfaces", "edge_netqos_rate"})
    for name, message in found.items():
        assert message.startswith(name + " = "), message
        assert "allowed" in message or "Failed to parse" in message or "do not exist" in message, message


def test_one_message_per_variable_even_with_several_problems():
    found = check({"edge_power_cpufreq": [{"policy": 9, "governor": "performance"},
                                          {"policy": 4, "governor": "turbo"}]})["problems"]
    assert len(found) == 1
    assert "cpufreq policy9 is not on this board; it has policy0, policy4" in found[0]["message"]
    assert "governor 'turbo' not available on policy4; available: userspace ondemand performance schedutil" \
        in found[0]["message"]


def test_power_frequencies_against_the_boards_tables():
    message = only({"edge_power_cpufreq": [{"policy": 4, "max_freq": 1500000}], "edge_power_jetson_clocks": False})
    assert "is not an available frequency; nearest steps: 1190400 1574400" in message
    assert "out of range" in only({"edge_power_devfreq": [{"node": "fb000000.gpu", "min_freq": 5}]}, name="rock5b")
    assert "devfreq node 17000000.gpu is not on this board; it has 17000000.ga10b" in only(
        {"edge_power_devfreq": [{"node": "17000000.gpu"}]}, name="agx-r35")
    assert "min_freq 1984000 > max_freq 115200" in only(
        {"edge_power_cpufreq": [{"policy": 0, "min_freq": "max", "max_freq": "min"}],
         "edge_power_jetson_clocks": False})


def test_power_limits_conflict_with_pinned_clocks():
    assert "pins every CPU at min=max" in only({"edge_power_cpufreq": [{"policy": 4, "max_freq": 1574400}]})
    assert "pins it at min=max" in only({"edge_power_devfreq": [{"node": "17000000.gpu", "max_freq": 918000000}]})


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_jetson_clocks_is_a_real_boolean_or_null(value):
    assert "allowed: true (pin the clocks), false (restore them) or null" in only(
        {"edge_power_jetson_clocks": value})


def test_power_lists_are_lists():
    assert "allowed: auto or a list of mappings" in only({"edge_power_cpufreq": "performance"})
    assert "unknown keys gov" in only({"edge_power_devfreq": [{"node": "17000000.gpu", "gov": "performance"}]})


def test_isolation_the_board_cannot_have():
    assert "inference CPUs 8-19 do not exist on this board (CPUs 0-7)" in only({"edge_cpu_isolate": "8-19"})
    assert "cpu0 handles boot-time" in only({"edge_cpu_isolate": "0-3", "edge_cpu_housekeeping": "4-7"})
    assert "housekeeping CPUs 8-9 are offline" in only({"edge_cpu_housekeeping": "0-3,8-9"}, name="agx-r35")


def test_kernel_without_nohz_full():
    facts, profile = board("orin-nx")
    facts["kernel"]["features"]["no_hz_full"] = False
    found = intent.validate({}, SPECS, facts=facts, profile=profile)["problems"]
    assert [p["variable"] for p in found] == ["edge_bootargs_nohz_full"]
    assert "lacks CONFIG_NO_HZ_FULL; allowed here: false" in found[0]["message"]
    assert intent.validate({"edge_bootargs_nohz_full": False}, SPECS, facts=facts, profile=profile)["problems"] == []


def test_cgroup_limits_against_the_board():
    found = problems({"edge_cgroups_cpu_quota": "500%", "edge_cgroups_memory_max": "64T"})
    assert "is more than the 4 CPU(s) of the slice (4-7) can give: at most 400%" in found["edge_cgroups_cpu_quota"]
    assert "(64.0TiB) is more than the RAM (16.0GiB)" in found["edge_cgroups_memory_max"]
    assert "must be below kernel.sched_rt_runtime_us (950000)" in only({"edge_cgroups_rt_runtime_us": 950000})
    # edge_cpu sets the ceiling in the same run.
    found = problems({"edge_cgroups_rt_runtime_us": 900000, "edge_cpu_sched_rt_runtime_us": 900000})
    assert "must be below kernel.sched_rt_runtime_us (900000)" in found["edge_cgroups_rt_runtime_us"]


def test_cgroups_need_inference_cpus_but_not_the_bootargs_role():
    found = problems({"edge_cpu_isolate": "none"})
    assert list(found) == ["edge_cgroups_enabled"] and "there are no inference CPUs" in found["edge_cgroups_enabled"]
    # The CPU sets come from the plan, whether role edge_bootargs runs or not.
    assert problems({"edge_bootargs_enabled": False}) == {}


def test_rt_throttling_must_stay_on():
    assert "below kernel.sched_rt_period_us (1000000)" in only({"edge_cpu_sched_rt_runtime_us": -1})
    assert problems({"edge_cpu_sched_rt_runtime_us": -1, "edge_cpu_sysctl": False,
                     "edge_cgroups_rt_runtime_us": 0}) == {}


@pytest.mark.parametrize("values, name", [
    ({"edge_cpu_vm_stat_interval": 0}, "edge_cpu_vm_stat_interval"),
    ({"edge_cpu_numa_balancing": 4}, "edge_cpu_numa_balancing"),
    ({"edge_cpu_timer_migration": 2}, "edge_cpu_timer_migration"),
    ({"edge_cpu_irqbalance": "off"}, "edge_cpu_irqbalance"),
    ({"edge_cpu_irq_unmovable_names": ["(unclosed"]}, "edge_cpu_irq_unmovable_names"),
    ({"edge_cpu_sysctl_file": "/etc/sysctl.conf.d/x"}, "edge_cpu_sysctl_file"),
    ({"edge_cpu_numa_accelerator": "the gpu"}, "edge_cpu_numa_accelerator"),
    ({"edge_package_install_dir": "usr/local/lib"}, "edge_package_install_dir"),
    ({"edge_package_install_dir": "/usr/local/lib/edgetune/boot"}, "edge_package_install_dir"),
    ({"edge_package_install_dir": "/usr/local/lib/edgetune/netqos/x/"}, "edge_package_install_dir"),
    ({"edge_bootargs_state_file": "/etc/edge tune/x.json"}, "edge_bootargs_state_file"),
    ({"edge_bootargs_extra_paths": ["/mnt/b/boot/extlinux/../x"]}, "edge_bootargs_extra_paths"),
    ({"edge_bootargs_extra": "quiet splash"}, "edge_bootargs_extra"),
    ({"edge_bootargs_bootloader": "lilo"}, "edge_bootargs_bootloader"),
    ({"edge_runtime_port": 70000}, "edge_runtime_port"),
    ({"edge_runtime_port": "http"}, "edge_runtime_port"),
    ({"edge_runtime_port": True}, "edge_runtime_port"),
    ({"edge_runtime_keep": 1}, "edge_runtime_keep"),
    ({"edge_runtime_sched_priority": 0}, "edge_runtime_sched_priority"),
    ({"edge_runtime_sched_policy": "deadline"}, "edge_runtime_sched_policy"),
    ({"edge_runtime_gate_concurrency": 300, "edge_runtime_gate_requests": 200}, "edge_runtime_gate_concurrency"),
    ({"edge_runtime_p99_ms": 0}, "edge_runtime_p99_ms"),
    ({"edge_runtime_memlock": "lots"}, "edge_runtime_memlock"),
    ({"edge_runtime_user": "Edge RT"}, "edge_runtime_user"),
    ({"edge_runtime_host": "local host"}, "edge_runtime_host"),
    ({"edge_runtime_release": "1.0/evil"}, "edge_runtime_release"),
    ({"edge_runtime_env": {"PATH": "/tmp"}}, "edge_runtime_env"),
    ({"edge_runtime_env": {"EDGETUNE_PORT": 1}}, "edge_runtime_env"),
    ({"edge_runtime_env": {"LLAMA_ARG_THREADS": 8}}, "edge_runtime_env"),
    ({"edge_runtime_ctx_size": 16}, "edge_runtime_ctx_size"),
    ({"edge_runtime_gate_max_tokens": 1}, "edge_runtime_gate_max_tokens"),
    ({"edge_runtime_ttft_p99_ms": -1}, "edge_runtime_ttft_p99_ms"),
    ({"edge_runtime_env": {"EDGETUNE_X": "a\nb"}}, "edge_runtime_env"),
    ({"edge_runtime_env": ["EDGETUNE_X=1"]}, "edge_runtime_env"),
    ({"edge_runtime_artifact_source": "usb"}, "edge_runtime_artifact_source"),
    ({"edge_runtime_engine_sha256": "abc"}, "edge_runtime_engine_sha256"),
    ({"edge_audit_timer_random_delay": "a while"}, "edge_audit_timer_random_delay"),
    ({"edge_audit_timer_textfile": "/var/lib/node-exporter/edgetune.txt"}, "edge_audit_timer_textfile"),
    ({"edge_audit_timer_node_exporter": True, "edge_audit_timer_node_exporter_package": "node exporter"},
     "edge_audit_timer_node_exporter_package"),
    ({"edge_audit_timer_node_exporter": True, "edge_audit_timer_node_exporter_package": "/nonexistent/ne.deb"},
     "edge_audit_timer_node_exporter_package"),
    ({"edge_audit_timer_node_exporter": True, "edge_audit_timer_node_exporter_listen": "9100"},
     "edge_audit_timer_node_exporter_listen"),
    ({"edge_audit_timer_node_exporter": True, "edge_audit_timer_node_exporter_listen": ":70000"},
     "edge_audit_timer_node_exporter_listen"),
    ({"edge_reboot_policy": "sometimes"}, "edge_reboot_policy"),
    ({"edge_reboot_serial": "many"}, "edge_reboot_serial"),
    ({"edge_reboot_max_fail_percentage": 150}, "edge_reboot_max_fail_percentage"),
    ({"edge_mode": "dry-run"}, "edge_mode"),
    ({"edge_cgroups_cpu_weight": 0}, "edge_cgroups_cpu_weight"),
    ({"edge_cgroups_probe_policy": "deadline"}, "edge_cgroups_probe_policy"),
    ({"edge_netqos_state": "off"}, "edge_netqos_state"),
    ({"edge_netqos_packages": ["bcc; rm -rf /"]}, "edge_netqos_packages"),
    ({"edge_facts_profiles_dir": "/nonexistent/profiles"}, "edge_facts_profiles_dir"),
])
def test_more_bad_values(values, name):
    found = problems(values)
    assert list(found) == [name], found
    assert found[name].startswith(name + " = ")


def test_url_and_device_artifacts_need_checksums():
    found = problems({"edge_runtime_artifact_source": "url", "edge_runtime_runtime_src": "ftp://x/rt.tar.gz"})
    assert sorted(found) == ["edge_runtime_engine_src", "edge_runtime_runtime_sha256", "edge_runtime_runtime_src"]
    assert "not an http(s) URL" in found["edge_runtime_runtime_src"]
    assert "empty, and url artifacts need their sha256" in found["edge_runtime_runtime_sha256"]
    # the default engine (auto) is picked on the controller only
    assert found["edge_runtime_engine_src"] == 'edge_runtime_engine_src = "auto": auto picks a tarball on the ' \
        "controller, and edge_runtime_artifact_source is url; allowed: the engine's URL"
    found = problems({"edge_runtime_artifact_source": "device", "edge_runtime_runtime_src": "/srv/rt.tar.gz",
                      "edge_runtime_engine_src": "/srv/engine.tar.gz", "edge_runtime_runtime_sha256": "a" * 64,
                      "edge_runtime_engine_sha256": "B" * 64})
    assert found == {}


def test_roles_subset_checks_only_their_variables():
    values = {"edge_runtime_health_timeout": -5, "edge_netqos_rate": "fast"}
    assert list(problems(values, roles=["edge_runtime"])) == ["edge_runtime_health_timeout"]
    assert check(values, roles=["edge_runtime"], present=[])["warnings"] == []


def test_the_cpu_split_is_checked_with_every_role_that_uses_it():
    for role in intent.CPU_ROLES:
        assert list(problems({"edge_cpu_isolate": ""}, roles=[role])) == ["edge_cpu_isolate"], role
    assert problems({"edge_cpu_isolate": ""}, roles=["edge_netqos"]) == {}


def test_the_old_names_of_the_cpu_split_are_read_with_a_warning():
    checked = check({"edge_bootargs_isolate": "6-7", "edge_bootargs_allow_cpu0": False})
    assert checked["problems"] == []
    assert checked["partition"]["inference_list"] == "6-7"
    assert checked["deprecations"] == [
        "edge_bootargs_allow_cpu0 is deprecated: name it edge_cpu_allow_cpu0 (the old name is read until 0.4.0)",
        "edge_bootargs_isolate is deprecated: name it edge_cpu_isolate (the old name is read until 0.4.0)"]
    # a bad value is reported under the name the inventory used
    found = problems({"edge_bootargs_isolate": "6-19"})
    assert list(found) == ["edge_bootargs_isolate"] and found["edge_bootargs_isolate"].startswith(
        'edge_bootargs_isolate = "6-19": inference CPUs 8-19 do not exist')
    # the new name, when set, wins
    checked = check({"edge_bootargs_isolate": "6-7", "edge_cpu_isolate": "5-7"})
    assert checked["partition"]["inference_list"] == "5-7"
    assert "edge_bootargs_isolate is deprecated and ignored" in checked["deprecations"][0]
    # inside a role its defaults are among the host's variables: the old name still counts
    checked = check({"edge_bootargs_isolate": "6-7", "edge_cpu_isolate": "auto"})
    assert checked["partition"]["inference_list"] == "6-7"


def test_without_facts_only_types_and_ranges():
    found = intent.validate({"edge_runtime_cpus": "4-19", "edge_runtime_port": 0}, SPECS)["problems"]
    assert [p["variable"] for p in found] == ["edge_runtime_port"]


def test_summary_says_nothing_was_changed_only_for_the_preflight():
    found = check({"edge_runtime_port": 0})["problems"]
    assert "refused before any change on any device (nothing was changed)" in intent.summary("h", found)
    assert "refused before role edge_runtime changed anything" in intent.summary("h", found, ["edge_runtime"])
    assert "nothing was changed" not in intent.summary("h", found, ["edge_runtime"])


# --------------------------------------------------------------------------
# Artifacts, on the controller, before anything is copied

@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Reference artifacts, a corrupt one and an engine for another SoC, made by the project's packager."""
    from edgetune_dev import artifacts as packager
    out = tmp_path_factory.mktemp("artifacts")
    runtime = packager.package_runtime(out)
    engine = packager.package_engine(out)
    rk_only = dict(json.loads(Path(engine["path"] + ".manifest.json").read_text())["compatibility"], socs=["rk3588"])
    other = packager.package_engine(out / "rk", version="0.2.0", compatibility=rk_only)
    corrupt = out / "corrupt.tar.gz"
    corrupt.write_bytes(b"\x1f\x8b not a tarball")
    return {"dir": str(out), "runtime": runtime, "engine": engine, "rk_only": other, "corrupt": corrupt}


def with_artifacts(artifacts, **values):
    base = {"edge_runtime_artifacts_dir": artifacts["dir"],
            "edge_runtime_runtime_src": Path(artifacts["runtime"]["path"]).name,
            "edge_runtime_engine_src": Path(artifacts["engine"]["path"]).name}
    base.update(values)
    return base


def artifact_problems(artifacts, name="orin-nx", **values):
    return problems(with_artifacts(artifacts, **values), name=name, roles=["edge_runtime"],
                    controller_artifacts={"tensorrt_by_l4t": TENSORRT})


@pytest.mark.parametrize("name", BOARDS)
def test_reference_artifacts_pass_and_are_resolved(artifacts, name):
    result = check(with_artifacts(artifacts), name=name, roles=["edge_runtime"],
                   controller_artifacts={"tensorrt_by_l4t": TENSORRT})
    assert result["problems"] == []
    assert [a["kind"] for a in result["artifacts"]] == ["runtime", "engine"]
    assert result["artifacts"][1]["sha256"] == artifacts["engine"]["artifact"]["sha256"]


def test_checksum_mismatch(artifacts):
    found = artifact_problems(artifacts, edge_runtime_engine_sha256="0" * 64)
    assert list(found) == ["edge_runtime_engine_sha256"]
    assert "Checksum mismatch for the engine artifact" in found["edge_runtime_engine_sha256"]


def test_missing_artifact(artifacts):
    found = artifact_problems(artifacts, edge_runtime_runtime_src="/nonexistent/edgetune-runtime-9.tar.gz")
    assert "Missing artifact: /nonexistent/edgetune-runtime-9.tar.gz does not exist on the controller" \
        in found["edge_runtime_runtime_src"]


def test_corrupt_artifact(artifacts):
    found = artifact_problems(artifacts, edge_runtime_engine_src=str(artifacts["corrupt"]),
                              edge_runtime_engine_sha256=intent.artifact.sha256_file(str(artifacts["corrupt"])))
    assert list(found) == ["edge_runtime_engine_src"]
    assert "a corrupt or foreign artifact" in found["edge_runtime_engine_src"]
    assert "is not a readable tarball" in found["edge_runtime_engine_src"]


def test_a_runtime_tarball_given_as_the_engine(artifacts):
    found = artifact_problems(artifacts, edge_runtime_engine_src=artifacts["runtime"]["path"])
    assert "this is a runtime artifact where a engine was expected" in found["edge_runtime_engine_src"]


def test_incompatible_engine_is_refused_on_the_controller(artifacts):
    found = artifact_problems(artifacts, edge_runtime_engine_src=artifacts["rk_only"]["path"])
    assert list(found) == ["edge_runtime_engine_src"]
    assert "incompatible release: engine mlp-small 0.2.0 is built for SoC rk3588, but this board is tegra234" \
        in found["edge_runtime_engine_src"]
    assert artifact_problems(artifacts, name="rock5b", edge_runtime_engine_src=artifacts["rk_only"]["path"]) == {}


def test_a_context_longer_than_the_engines_is_refused(tmp_path):
    from edgetune_dev import artifacts as packager
    server = packager.package(
        {"kind": "runtime", "name": "llama-server", "version": "0.1.0", "entry": "bin/llama-server",
         "engine_formats": ["gguf"], "backend": "cpu", "compatibility": {}},
        {"bin/llama-server": (b"\x7fELF", 0o755)}, tmp_path, "edgetune-llama-server-0.1.0")
    model = packager.package(
        {"kind": "engine", "name": "tiny", "version": "0.1.0", "entry": "model.gguf", "format": "gguf",
         "model": {"context_length": 512}, "compatibility": {}}, {"model.gguf": (b"GGUF", 0o644)}, tmp_path,
        "edgetune-engine-tiny-0.1.0")
    values = {"edge_runtime_artifacts_dir": str(tmp_path), "edge_runtime_runtime_src": Path(server["path"]).name,
              "edge_runtime_engine_src": Path(model["path"]).name}
    kwargs = {"roles": ["edge_runtime"], "controller_artifacts": {"tensorrt_by_l4t": TENSORRT}}
    found = problems(dict(values, edge_runtime_ctx_size=2048), **kwargs)
    assert list(found) == ["edge_runtime_ctx_size"], found
    assert "more than the engine's context length; allowed: 64-512 (tiny)" in found["edge_runtime_ctx_size"]
    assert problems(dict(values, edge_runtime_ctx_size=512), **kwargs) == {}
    # The thread rule follows edge_runtime_backend, so it must be what the runtime was built for.
    found = problems(dict(values, edge_runtime_ctx_size=512, edge_runtime_backend="cuda"), **kwargs)
    assert found == {"edge_runtime_backend": found["edge_runtime_backend"]}
    assert "is built for the cpu backend; allowed: cpu" in found["edge_runtime_backend"]


def package_llm(out, arch, glibc, version="0.5.0", engine_version="0.1.2"):
    """A llama-server build and a GGUF engine as `make artifacts` packages them (contents are stand-ins)."""
    from edgetune_dev import artifacts as packager
    stem = "edgetune-llama-server-%s-%s" % (version, arch)
    server = packager.package(
        {"kind": "runtime", "name": "llama-server", "version": version, "entry": "bin/llama-server",
         "engine_formats": ["gguf"], "backend": "cpu", "architecture": arch,
         "compatibility": {"requires": {"glibc": ">=" + glibc}}},
        {"bin/llama-server": (b"\x7fELF" + arch.encode(), 0o755)}, out, stem)
    model = packager.package(
        {"kind": "engine", "name": "smollm2", "version": engine_version, "entry": "model.gguf", "format": "gguf",
         "model": {"context_length": 8192}, "compatibility": {}}, {"model.gguf": (b"GGUF", 0o644)}, out,
        "edgetune-engine-smollm2-%s" % engine_version)
    return server, model


@pytest.mark.parametrize("name", BOARDS)
def test_auto_deploys_the_llama_server_build_the_board_runs(tmp_path, name):
    for arch, glibc in (("aarch64", "2.31"), ("aarch64", "2.35"), ("x86_64", "2.31")):
        package_llm(tmp_path / ("%s-%s" % (arch, glibc)), arch, glibc)
    for directory in tmp_path.iterdir():
        for item in directory.iterdir():
            item.rename(tmp_path / ("%s-%s" % (directory.name, item.name) if "llama" in item.name else item.name))
    result = check({"edge_runtime_artifacts_dir": str(tmp_path)}, name=name, roles=["edge_runtime"],
                   controller_artifacts={"tensorrt_by_l4t": TENSORRT})
    assert result["problems"] == []
    wanted = "aarch64-2.31" if name == "agx-r35" else "aarch64-2.35"  # Ubuntu 20.04 has glibc 2.31
    assert [Path(a["path"]).name for a in result["artifacts"]] == [
        "%s-edgetune-llama-server-0.5.0-aarch64.tar.gz" % wanted, "edgetune-engine-smollm2-0.1.2.tar.gz"]


def test_auto_says_what_is_missing_and_what_to_do(tmp_path):
    kwargs = {"roles": ["edge_runtime"], "controller_artifacts": {"tensorrt_by_l4t": TENSORRT}}
    package_llm(tmp_path, "x86_64", "2.31")
    found = problems({"edge_runtime_artifacts_dir": str(tmp_path)}, **kwargs)
    assert list(found) == ["edge_runtime_runtime_src"]
    assert "auto: no llama-server build in %s runs on this board (aarch64, glibc 2.35): runtime llama-server 0.5.0 " \
           "is built for x86_64, but this board is aarch64. Build one with `make artifacts ARCH=aarch64`" % tmp_path \
        in found["edge_runtime_runtime_src"]
    found = problems({"edge_runtime_artifacts_dir": str(tmp_path), "edge_runtime_engine_sha256": "a" * 64}, **kwargs)
    assert "set for edge_runtime_engine_src: auto" in found["edge_runtime_engine_sha256"]
    # without the board's facts there is no architecture to pick by
    found = intent.validate({"edge_runtime_artifacts_dir": str(tmp_path)}, SPECS, facts={"soc": "rk3588"},
                            roles=["edge_runtime"], controller_artifacts={"tensorrt_by_l4t": TENSORRT})["problems"]
    assert [p["variable"] for p in found] == ["edge_runtime_runtime_src"]
    assert "which role edge_facts reads: run it first" in found[0]["message"]


def test_artifacts_not_checked_in_audit_mode(artifacts):
    values = with_artifacts(artifacts, edge_runtime_runtime_src="/nonexistent/x.tar.gz", edge_mode="audit")
    assert problems(values, roles=["edge_runtime"], controller_artifacts={"tensorrt_by_l4t": TENSORRT}) == {}


# --------------------------------------------------------------------------
# Types

@pytest.mark.parametrize("value, spec, expected", [
    ("5", {"type": "int"}, 5), (5, {"type": "float"}, 5), ("0.5", {"type": "float"}, 0.5),
    (4, {"type": "str"}, "4"), ([1, 2], {"type": "list", "elements": "int"}, [1, 2]),
    (None, {"type": "raw"}, None), ({"a": 1}, {"type": "dict"}, {"a": 1}),
])
def test_check_type_accepts(value, spec, expected):
    assert intent.check_type(value, spec) == expected


@pytest.mark.parametrize("value, spec", [
    ("yes", {"type": "bool"}), (1, {"type": "bool"}), (True, {"type": "int"}), (True, {"type": "str"}),
    ("1,2", {"type": "list"}), ({"a": 1}, {"type": "list"}), (["1"], {"type": "list", "elements": "int"}),
    ("x", {"type": "dict"}), (None, {"type": "str"}), (1.5, {"type": "str"}), ("1.5", {"type": "int"}),
    ("b", {"type": "str", "choices": ["a"]}),
])
def test_check_type_refuses(value, spec):
    with pytest.raises(intent._Bad):
        intent.check_type(value, spec)


def test_every_spec_option_has_a_type_the_checker_knows():
    for role, options in SPECS.items():
        for name, spec in options.items():
            assert spec.get("type", "str") in intent._TYPE_WORDS, (role, name)
            intent.check_type(spec.get("default"), spec)  # the defaults pass their own spec


def test_what_edge_facts_read_of_the_runtimes_is_checked_on_the_controller(artifacts, tmp_path):
    from edgetune_dev import artifacts as packager
    trt = packager.package_engine(tmp_path, version="0.3.0", fmt="tensorrt-plan", compatibility={
        "socs": ["tegra234"], "l4t": ">=36.4,<37", "requires": {"tensorrt": {"version": "10.3"}}})
    values = with_artifacts(artifacts, edge_runtime_engine_src=trt["path"])
    for name, words in (("orin-nx", "not installed on this board (no libnvinfer found)"),
                        ("agx-r35", "which ships TensorRT 8.5.2"), ("rock5b", "runs no L4T")):
        facts, profile = board(name)
        facts.update(inference_runtime={"tensorrt": None, "rknn": None},
                     python={"executable": "/usr/bin/python3.11", "executable_link": "/usr/bin/python3",
                             "version": "3.11.2"})
        found = {p["variable"]: p["message"] for p in intent.validate(
            values, SPECS, facts=facts, profile=profile, roles=["edge_runtime"],
            controller_artifacts={"tensorrt_by_l4t": TENSORRT})["problems"]}
        assert list(found) == ["edge_runtime_engine_src"], found
        assert "incompatible release: " in found["edge_runtime_engine_src"]
        assert words in found["edge_runtime_engine_src"], found
        assert "loads engine formats edgetune-mlp-json/1, not tensorrt-plan" in found["edge_runtime_engine_src"]
    # Without those facts (an older edge_facts) the installed TensorRT is the device's to check.
    facts, profile = board("orin-nx")
    found = intent.validate(values, SPECS, facts=facts, profile=profile, roles=["edge_runtime"],
                            controller_artifacts={"tensorrt_by_l4t": TENSORRT})["problems"]
    assert "not installed on this board" not in found[0]["message"]


def test_the_runtimes_python_is_checked_when_it_is_the_one_edge_facts_ran_with(artifacts):
    facts, profile = board("orin-nx")
    facts["python"] = {"executable": "/usr/bin/python3.6", "executable_link": "/usr/bin/python3", "version": "3.6.9"}
    found = intent.validate(with_artifacts(artifacts), SPECS, facts=facts, profile=profile, roles=["edge_runtime"],
                            controller_artifacts={"tensorrt_by_l4t": TENSORRT})["problems"]
    assert sorted(p["variable"] for p in found) == ["edge_runtime_engine_src", "edge_runtime_runtime_src"]
    assert "needs python3 >=3.8, but the runtime's interpreter is Python 3.6.9" in found[0]["message"]
    other = with_artifacts(artifacts, edge_runtime_python="/opt/py/bin/python3")
    assert intent.validate(other, SPECS, facts=facts, profile=profile, roles=["edge_runtime"],
                           controller_artifacts={"tensorrt_by_l4t": TENSORRT})["problems"] == []


# --------------------------------------------------------------------------
# What edge_facts reads for the checks (the preflight's one device read)

def test_edge_facts_reads_the_rt_throttling(tmp_path):
    from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_board
    sysctl = tmp_path / "proc/sys/kernel"
    sysctl.mkdir(parents=True)
    (sysctl / "sched_rt_period_us").write_text("1000000\n")
    (sysctl / "sched_rt_runtime_us").write_text("-1\n")
    assert edge_board.rt_throttle(str(tmp_path)) == {"rt_period_us": 1000000, "rt_runtime_us": -1}
    assert edge_board.rt_throttle(str(tmp_path / "none")) == {"rt_period_us": None, "rt_runtime_us": None}


def test_a_smaller_rt_period_is_the_limit():
    facts, profile = board("orin-nx")
    facts["sched"] = {"rt_period_us": 500000, "rt_runtime_us": 450000}
    found = intent.validate({"edge_cpu_sched_rt_runtime_us": 600000, "edge_cgroups_rt_runtime_us": 100000}, SPECS,
                            facts=facts, profile=profile)["problems"]
    assert [p["variable"] for p in found] == ["edge_cpu_sched_rt_runtime_us"]
    assert "below kernel.sched_rt_period_us (500000)" in found[0]["message"]


def test_transparent_hugepages_take_the_kernel_s_modes_and_are_set_in_one_place():
    assert only({"edge_bootargs_transparent_hugepage": "sometimes"}).endswith(
        'allowed: one of "", "always", "madvise", "never"')
    message = only({"edge_bootargs_transparent_hugepage": "never",
                    "edge_bootargs_extra": ["transparent_hugepage=always"]})
    assert message.endswith("edge_bootargs_extra also sets transparent_hugepage=always; set it in one of them")
    assert problems({"edge_bootargs_transparent_hugepage": "madvise", "edge_bootargs_extra": ["quiet"]}) == {}
