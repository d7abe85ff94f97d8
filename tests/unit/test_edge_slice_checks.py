"""The inference slice's live cgroup values the drift audit checks (plugins/module_utils/
edge_slice_checks.py), from the plan's slice part: the paths below systemd's own cgroup on cgroup v2
and v1, the values systemd writes, and the v2-only settings reported unsupported with the reason."""
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_slice_checks as checks

SLICE = {"name": "ai-infer.slice", "cpus": [4, 5, 6, 7], "cpulist": "4-7", "numa_node": None, "cgroup": "unified",
         "v1": False, "cpu_weight": 1000, "cpu_quota": "400%", "memory_max": "90%", "memory_high": "6G",
         "memory_max_bytes": 15000000000, "memory_high_bytes": 6442450944, "io_weight": 500,
         "rt_runtime_us": 800000}
DEVICE = "0::/init.scope\n"
TWIN_V1 = ("12:cpu,cpuacct:/docker/4f2a\n11:memory:/docker/4f2a\n1:name=systemd:/docker/4f2a/init.scope\n"
           "0::/docker/4f2a/init.scope\n")


def by_setting(found):
    return dict((c["setting"].split(" ", 1)[1], c) for c in found)


def test_cgroup_v2_values_at_the_slice_below_systemd():
    found = by_setting(checks.value_checks(SLICE, DEVICE))
    assert sorted(found) == ["AllowedCPUs", "CPUQuota", "CPUWeight", "IOWeight", "MemoryHigh", "MemoryMax"]
    assert found["CPUWeight"] == {"setting": "ai-infer.slice CPUWeight", "role": "edge_cgroups", "kind": "value",
                                  "path": "/sys/fs/cgroup/ai.slice/ai-infer.slice/cpu.weight", "desired": "1000",
                                  "compare": "text"}
    assert found["CPUQuota"]["desired"] == "400000 100000"
    assert (found["MemoryMax"]["desired"], found["MemoryMax"]["compare"]) == ("90%", "ram-share")
    assert (found["MemoryHigh"]["desired"], found["MemoryHigh"]["compare"]) == ("6442450944", "bytes")
    assert found["IOWeight"]["desired"] == "default 500"
    assert (found["AllowedCPUs"]["desired"], found["AllowedCPUs"]["compare"]) == ("4-7", "cpulist")
    bound = by_setting(checks.value_checks(dict(SLICE, numa_node=1, cpu_quota=""), DEVICE))
    assert bound["AllowedMemoryNodes"]["path"].endswith("/ai.slice/ai-infer.slice/cpuset.mems")
    assert bound["CPUQuota"]["desired"] == "max 100000"


def test_cgroup_v1_values_below_the_twin_s_own_systemd_and_the_v2_only_settings_unsupported():
    v1 = dict(SLICE, v1=True, cgroup="hybrid", memory_max="8G", memory_max_bytes=8589934592)
    found = by_setting(checks.value_checks(v1, TWIN_V1, rt_budget=True, mode="hybrid"))
    assert found["CPUWeight"]["path"] == "/sys/fs/cgroup/cpu/docker/4f2a/ai.slice/ai-infer.slice/cpu.shares"
    assert found["CPUWeight"]["desired"] == "10240"
    assert found["CPUQuota"]["path"].endswith("/cpu/docker/4f2a/ai.slice/ai-infer.slice/cpu.cfs_quota_us")
    assert found["MemoryMax"]["path"] == \
        "/sys/fs/cgroup/memory/docker/4f2a/ai.slice/ai-infer.slice/memory.limit_in_bytes"
    assert found["RT budget"]["desired"] == "800000"
    unsupported = found["AllowedCPUs, MemoryHigh"]
    assert unsupported["kind"] == "unsupported" and "cgroup mode is hybrid" in unsupported["reason"]
    assert "set edge_bootargs_cgroup_v2: true" in unsupported["reason"]
    assert "RT budget" not in by_setting(checks.value_checks(v1, TWIN_V1, rt_budget=False, mode="hybrid"))
    # Weights map to shares within 2-262144, as systemd maps them.
    assert by_setting(checks.value_checks(dict(v1, cpu_weight=10000), TWIN_V1))["CPUWeight"]["desired"] == "102400"
    assert by_setting(checks.value_checks(dict(v1, cpu_weight=1), TWIN_V1))["CPUWeight"]["desired"] == "10"


def test_the_reason_names_what_enforces_the_unified_hierarchy_and_stays_the_same_across_the_reboot():
    v1 = dict(SLICE, v1=True, cgroup="hybrid")
    before = checks.v2_only_reason(v1, "hybrid", ["isolcpus=4-7", checks.UNIFIED_ARG], "quiet")
    after = checks.v2_only_reason(v1, "hybrid", ["isolcpus=4-7", checks.UNIFIED_ARG], "quiet " + checks.UNIFIED_ARG)
    # Recorded with the apply: the apply's own reboot must not change the record.
    assert before == after
    assert "role edge_bootargs adds systemd.unified_cgroup_hierarchy=1" in before and "pending" not in before
    # Booted with it by hand and still hybrid (a twin: the host's hierarchy): no reboot will change it.
    by_hand = checks.v2_only_reason(v1, "hybrid", [], "quiet " + checks.UNIFIED_ARG)
    assert "systemd still mounts the hybrid hierarchy" in by_hand


def test_a_nested_slice_lives_in_its_parents():
    assert checks.slice_dir("ai-infer.slice") == "ai.slice/ai-infer.slice"
    assert checks.slice_dir("edge-ai-infer.slice") == "edge.slice/edge-ai.slice/edge-ai-infer.slice"
    assert checks.slice_dir("infer.slice") == "infer.slice"
