"""plugins/filter/edge_cpu_partition.py (edge_cpu_partition) and the CPU list helpers it uses.

Boards as their cpufreq policies have them: Orin NX 16GB 2x4 cores, AGX Orin 64GB 3x4,
RK3588 4xA55 + 2x2 A76, Orin NX 8GB / Nano 4+2.
"""
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.controller
# Filter plugins run on the controller (ansible-core), not on the Python 3.8 device.
AnsibleFilterError = pytest.importorskip("ansible.errors", reason="needs ansible-core").AnsibleFilterError


from ansible_collections.edgetune.fleet.plugins.filter import edge_cpu_partition as plugin  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_cpulist as cpulist  # noqa: E402
partition = plugin.edge_cpu_partition

PROFILES = {
    "orin-nx-16gb": {"clusters": [[0, 1, 2, 3], [4, 5, 6, 7]], "inference_clusters": [1]},
    "agx-orin-64gb": {"clusters": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], "inference_clusters": [1, 2]},
    "rk3588": {"clusters": [[0, 1, 2, 3], [4, 5], [6, 7]], "inference_clusters": [1, 2]},
    "orin-nano-8gb": {"clusters": [[0, 1, 2, 3], [4, 5]], "inference_clusters": [1]},
}


def facts(ncpus, online=None, present=None):
    return {"cpu": {"online": online if online is not None else list(range(ncpus)),
                    "present": present if present is not None else list(range(ncpus))}}


# --------------------------------------------------------------------------
# CPU lists and masks

@pytest.mark.parametrize("text, cpus", [
    ("0-3", [0, 1, 2, 3]), ("0-3,6", [0, 1, 2, 3, 6]), ("8-11:2", [8, 10]), ("4", [4]), ("", []),
    (" 1 , 3 ", [1, 3]), ("3,1,1", [1, 3]), ("0-1,1-2", [0, 1, 2]),
])
def test_parse_cpulist(text, cpus):
    assert cpulist.parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "1-", "0-3:0", "1,,2", "0x3"])
def test_parse_cpulist_rejects(text):
    with pytest.raises(ValueError, match="invalid CPU list item"):
        cpulist.parse_cpulist(text)


@pytest.mark.parametrize("cpus, text", [([0, 1, 2, 3, 6], "0-3,6"), ([], ""), ([5], "5"), ([1, 3, 5], "1,3,5"),
                                        ([8, 9, 10, 11, 0], "0,8-11")])
def test_format_cpulist(cpus, text):
    assert cpulist.format_cpulist(cpus) == text


@pytest.mark.parametrize("text, cpus", [
    ("f0", [4, 5, 6, 7]), ("00f", [0, 1, 2, 3]), ("fff", list(range(12))), ("1,00000000", [32]), ("0", []),
    ("ff,0000000f", [0, 1, 2, 3] + list(range(32, 40))),
])
def test_parse_cpumask(text, cpus):
    assert cpulist.parse_cpumask(text) == cpus


@pytest.mark.parametrize("cpus, ncpus, text", [([0, 1, 2, 3], 8, "0f"), ([0, 1, 2, 3], 12, "00f"),
                                               ([4, 5, 6, 7], 8, "f0"), ([32], 40, "01,00000000"), ([], 4, "0")])
def test_format_cpumask(cpus, ncpus, text):
    assert cpulist.format_cpumask(cpus, ncpus) == text


def test_parse_cpumask_rejects_garbage():
    with pytest.raises(ValueError, match="invalid CPU mask"):
        cpulist.parse_cpumask("zz")


@given(st.sets(st.integers(min_value=0, max_value=95)))
def test_lists_and_masks_round_trip(cpus):
    assert cpulist.parse_cpulist(cpulist.format_cpulist(cpus)) == sorted(cpus)
    assert cpulist.parse_cpumask(cpulist.format_cpumask(cpus, 96)) == sorted(cpus)


# --------------------------------------------------------------------------
# Cluster derivation

@pytest.mark.parametrize("board, ncpus, inference, housekeeping", [
    ("orin-nx-16gb", 8, "4-7", "0-3"),
    ("agx-orin-64gb", 12, "4-11", "0-3"),
    ("rk3588", 8, "4-7", "0-3"),
    ("orin-nano-8gb", 6, "4-5", "0-3"),
])
def test_auto_isolates_the_profiles_inference_clusters(board, ncpus, inference, housekeeping):
    result = partition(facts(ncpus), PROFILES[board], "auto", "auto")
    assert result["inference_list"] == inference and result["housekeeping_list"] == housekeeping
    assert result["inference"] == cpulist.parse_cpulist(inference)
    assert result["housekeeping"] == cpulist.parse_cpulist(housekeeping)


def test_auto_housekeeping_is_the_online_cpus_not_isolated():
    # AGX Orin in MODE_30W: cpu8-11 offline.
    result = partition(facts(12, online=list(range(8))), PROFILES["agx-orin-64gb"], "4-7", "auto")
    assert result["housekeeping_list"] == "0-3"


def test_offline_inference_cpus_are_allowed_and_listed():
    # AGX Orin in MODE_30W: cpu8-11 offline; isolcpus applies when they come online.
    result = partition(facts(12, online=list(range(8))), PROFILES["agx-orin-64gb"], "auto", "auto")
    assert result["inference_list"] == "4-11" and result["housekeeping_list"] == "0-3"
    assert result["offline_inference"] == [8, 9, 10, 11]
    assert partition(facts(8), PROFILES["rk3588"], "auto", "auto")["offline_inference"] == []


def test_none_isolates_nothing():
    result = partition(facts(8), PROFILES["rk3588"], "none", "auto")
    assert result["inference"] == [] and result["housekeeping_list"] == "0-7" and result["inference_list"] == ""


def test_explicit_sets():
    result = partition(facts(8), PROFILES["rk3588"], "6-7", "0-1")
    assert (result["inference_list"], result["housekeeping_list"]) == ("6-7", "0-1")


def test_cpu0_allowed_when_forced():
    result = partition(facts(8), PROFILES["rk3588"], "0,4-7", "1-3", True)
    assert result["inference_list"] == "0,4-7"


# --------------------------------------------------------------------------
# Each error

@pytest.mark.parametrize("isolate, housekeeping, ncpus, online, message", [
    ("4-x", "auto", 8, None, "edge_cpu_isolate: invalid CPU list item '4-x' in '4-x'"),
    ("auto", "0-y", 8, None, "edge_cpu_housekeeping: invalid CPU list item '0-y' in '0-y'"),
    ("4-9", "auto", 8, None, "inference CPUs 8-9 do not exist on this board (CPUs 0-7)"),
    ("4-7", "0-3,12", 8, None, "housekeeping CPUs 12 do not exist on this board (CPUs 0-7)"),
    ("4-7", "0-3,9", 12, list(range(8)),
     "housekeeping CPUs 9 are offline (online: 0-7); bring them online or choose others"),
    ("0-7", "auto", 8, None, "the housekeeping set is empty: keep at least one CPU for the system"),
    ("4-7", "0-4", 8, None, "CPUs 4 are in both the inference and the housekeeping set"),
    ("0,4-7", "1-3", 8, None, "cpu0 handles boot-time and unmovable work; keep it for housekeeping "
                              "or set edge_cpu_allow_cpu0: true"),
])
def test_errors(isolate, housekeeping, ncpus, online, message):
    with pytest.raises(AnsibleFilterError) as info:
        partition(facts(ncpus, online=online), PROFILES["agx-orin-64gb"] if ncpus == 12 else PROFILES["rk3588"],
                  isolate, housekeeping)
    assert str(info.value) == message


def test_registered_under_its_name():
    assert plugin.FilterModule().filters() == {"edge_cpu_partition": partition}
