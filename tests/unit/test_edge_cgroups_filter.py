"""plugins/filter/edge_cgroups_plan.py: the slice settings checked against the board."""
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.controller
# Filter plugins run on the controller (ansible-core), not on the Python 3.8 device.
AnsibleFilterError = pytest.importorskip("ansible.errors", reason="needs ansible-core").AnsibleFilterError
GIB = 1024 ** 3


from ansible_collections.edgetune.fleet.plugins.filter import edge_cgroups_plan as plugin  # noqa: E402


def settings(**changes):
    """The role's defaults on an Orin NX 16GB (inference CPUs 4-7, 16 GiB)."""
    base = {"slice": "ai-infer.slice", "cpus": [4, 5, 6, 7], "cpulist": "4-7", "cpu_weight": 1000,
            "cpu_quota": "auto", "memory_max": "90%", "memory_high": "80%", "io_weight": 500,
            "rt_runtime_us": 800000, "rt_global": 950000, "ram_bytes": 16 * GIB, "probe_priority": 10}
    base.update(changes)
    return base


def fails(**changes):
    with pytest.raises(AnsibleFilterError) as info:
        plugin.edge_cgroups_plan(settings(**changes))
    message = str(info.value)
    assert message.startswith("Invalid slice settings (edge_cgroups changed nothing): ")
    return message


def test_defaults_resolve_auto_quota_to_the_slices_cpus():
    plan = plugin.edge_cgroups_plan(settings())
    assert plan["cpu_quota"] == "400%"
    assert plan["memory_max"] == "90%" and plan["memory_max_bytes"] == int(16 * GIB * 0.9)
    assert plan["memory_high_bytes"] == int(16 * GIB * 0.8)
    assert plugin.edge_cgroups_plan(settings(cpus=list(range(4, 12)), cpulist="4-11"))["cpu_quota"] == "800%"


@pytest.mark.parametrize("quota", ["", "100%", "400%", "1%"])
def test_quotas_the_cpus_can_give(quota):
    assert plugin.edge_cgroups_plan(settings(cpu_quota=quota))["cpu_quota"] == quota


def test_quota_larger_than_the_cpus_can_give():
    assert "edge_cgroups_cpu_quota 401% is more than the 4 CPU(s) of the slice (4-7) can give: at most 400%" \
        in fails(cpu_quota="401%")


@pytest.mark.parametrize("quota", ["0%", "2", "50 %", "1.5%", "half"])
def test_malformed_quota(quota):
    assert "is not auto, empty or NNN%" in fails(cpu_quota=quota)


@pytest.mark.parametrize("value, expected", [
    ("", None), ("infinity", None), ("50%", 8 * GIB), ("12G", 12 * GIB), ("512M", 512 * 1024 ** 2),
    ("1073741824", GIB), ("16G", 16 * GIB), ("2T", 2 * 1024 ** 4), ("12.5%", 2 * GIB),
])
def test_memory_forms(value, expected):
    assert plugin.memory_bytes(value, 16 * GIB) == expected


def test_memory_limit_larger_than_the_ram():
    message = fails(memory_max="17G")
    assert "edge_cgroups_memory_max 17G (17.0GiB) is more than the RAM (16.0GiB)" in message
    assert "is more than 100% of the RAM" in fails(memory_max="101%")


def test_memory_high_above_max():
    assert "edge_cgroups_memory_high 12G is above edge_cgroups_memory_max 8G" in fails(memory_max="8G",
                                                                                       memory_high="12G")
    assert plugin.edge_cgroups_plan(settings(memory_max="", memory_high="12G"))["memory_high_bytes"] == 12 * GIB


@pytest.mark.parametrize("value", ["12GB", "-1", "lots", "12g"])
def test_malformed_memory(value):
    assert "is not NN%, bytes with an optional K/M/G/T suffix, infinity or empty" in fails(memory_max=value)


def test_tiny_memory_limit():
    assert "is below 16 MiB" in fails(memory_high="1M")


def test_rt_budget_must_stay_below_the_kernels():
    assert "edge_cgroups_rt_runtime_us 950000 must be below kernel.sched_rt_runtime_us (950000)" \
        in fails(rt_runtime_us=950000)
    assert "must be a number of microseconds" in fails(rt_runtime_us=-5)
    # With RT throttling off (-1) any budget below the period is the module's to check.
    assert plugin.edge_cgroups_plan(settings(rt_global=-1))["cpu_quota"] == "400%"


@pytest.mark.parametrize("name", ["system.slice", "-.slice", "ai-infer", "ai infer.slice", "user.slice"])
def test_slice_must_be_one_of_its_own(name):
    assert "is not a slice of its own" in fails(slice=name)


@pytest.mark.parametrize("key, value", [("cpu_weight", 0), ("cpu_weight", 10001), ("io_weight", 0),
                                        ("io_weight", True)])
def test_weights(key, value):
    assert "must be 1-10000" in fails(**{key: value})


def test_probe_priority():
    assert "edge_cgroups_probe_priority 0 must be 1-99" in fails(probe_priority=0)


def test_every_problem_is_reported_at_once():
    message = fails(cpu_quota="900%", memory_max="40G", rt_runtime_us=990000, cpus=[], cpulist="")
    assert message.count("; ") >= 3
    assert "the slice has no CPUs" in message


def test_registered_under_its_name():
    assert plugin.FilterModule().filters() == {"edge_cgroups_plan": plugin.edge_cgroups_plan}
