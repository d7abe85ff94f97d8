"""edge_dvfs on fake sysfs trees built like the real boards (L4T cpufreq, GPU and EMC devfreq; rk3588-opp.dtsi)."""
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import edge_dvfs
import pytest
from conftest import copy_module_util
from conftest import run_boot_program as boot
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_dvfs as dvfs
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"

# --------------------------------------------------------------------------
# Board fixtures

AGX_TABLE = [115200 + 76800 * k for k in range(28)] + [2201600]
NX_TABLE = [115200 + 76800 * k for k in range(25)] + [1984000]
RK_A55 = [408000, 600000, 816000, 1008000, 1200000, 1416000, 1608000, 1800000]
RK_A76 = RK_A55 + [2016000, 2208000, 2400000]
ORIN_GPU_GOVS = "wmark_active nvhost_podgov userspace performance simple_ondemand"
RK_DEVFREQ_GOVS = "userspace powersave performance simple_ondemand"
RK_NPU_GPU = [300000000 + 100000000 * k for k in range(8)]

BOARDS = {
    "agx-orin-64gb": {
        "governors": "userspace ondemand performance schedutil",
        "policies": {0: ([0, 1, 2, 3], AGX_TABLE), 4: ([4, 5, 6, 7], AGX_TABLE),
                     8: ([8, 9, 10, 11], AGX_TABLE)},
        "devfreq": {"17000000.ga10b": ("/sys/devices/17000000.ga10b", ORIN_GPU_GOVS, "nvhost_podgov",
                                       [306000000 + 102000000 * k for k in range(10)] + [1300500000])},
    },
    "orin-nx-16gb-r36": {
        "governors": "userspace ondemand performance schedutil",
        "policies": {0: ([0, 1, 2, 3], NX_TABLE), 4: ([4, 5, 6, 7], NX_TABLE)},
        "devfreq": {"17000000.gpu": ("/sys/devices/platform/bus@0/17000000.gpu", ORIN_GPU_GOVS,
                                     "nvhost_podgov",
                                     [306000000 + 102000000 * k for k in range(9)] + [1173000000])},
    },
    "rk3588": {
        "governors": "conservative ondemand userspace powersave performance schedutil",
        "policies": {0: ([0, 1, 2, 3], RK_A55), 4: ([4, 5], RK_A76), 6: ([6, 7], RK_A76)},
        "devfreq": {
            "fb000000.gpu": ("/sys/devices/platform/fb000000.gpu", RK_DEVFREQ_GOVS, "simple_ondemand",
                             RK_NPU_GPU),
            "fdab0000.npu": ("/sys/devices/platform/fdab0000.npu", RK_DEVFREQ_GOVS, "simple_ondemand",
                             RK_NPU_GPU),
            "dmc": ("/sys/devices/platform/dmc", "dmc_ondemand " + RK_DEVFREQ_GOVS, "dmc_ondemand",
                    [528000000, 1068000000, 1560000000, 2112000000]),
        },
    },
}


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def build_board(root, board):
    """The sysfs a freshly booted board shows: schedutil, full range, class links."""
    spec = BOARDS[board]
    cpu_dir = root / "sys/devices/system/cpu"
    for number, (cpus, table) in spec["policies"].items():
        policy = cpu_dir / "cpufreq" / ("policy%d" % number)
        files = {
            "scaling_governor": "schedutil",
            "scaling_min_freq": str(table[0]),
            "scaling_max_freq": str(table[-1]),
            "scaling_cur_freq": str(table[-1]),
            "cpuinfo_min_freq": str(table[0]),
            "cpuinfo_max_freq": str(table[-1]),
            # The kernel prints these lists with a trailing space.
            "scaling_available_governors": spec["governors"] + " ",
            "scaling_available_frequencies": " ".join(map(str, table)) + " ",
            "related_cpus": " ".join(map(str, cpus)),
            "affected_cpus": " ".join(map(str, cpus)),
        }
        for name, value in files.items():
            _write(policy / name, value)
        for cpu in cpus:
            (cpu_dir / ("cpu%d" % cpu)).mkdir(parents=True)
            os.symlink("../cpufreq/policy%d" % number, str(cpu_dir / ("cpu%d" % cpu) / "cpufreq"))
    class_dir = root / "sys/class/devfreq"
    class_dir.mkdir(parents=True, exist_ok=True)
    for node, (device, governors, governor, freqs) in spec["devfreq"].items():
        directory = root / device.lstrip("/") / "devfreq" / node
        files = {
            "governor": governor,
            "available_governors": governors,
            "available_frequencies": " ".join(map(str, freqs)) + " ",
            "min_freq": str(freqs[0]),
            "max_freq": str(freqs[-1]),
            "cur_freq": str(freqs[-1]),
        }
        for name, value in files.items():
            _write(directory / name, value)
        os.symlink(os.path.relpath(str(directory), str(class_dir)), str(class_dir / node))
    return root


@pytest.fixture
def rk(tmp_path):
    return build_board(tmp_path / "rk", "rk3588")


@pytest.fixture
def agx(tmp_path):
    return build_board(tmp_path / "agx", "agx-orin-64gb")


@pytest.fixture
def nx(tmp_path):
    return build_board(tmp_path / "nx", "orin-nx-16gb-r36")


def policy_file(root, number, name):
    return root / "sys/devices/system/cpu/cpufreq" / ("policy%d" % number) / name


def node_file(root, node, name):
    return root / "sys/class/devfreq" / node / name


def value(path):
    return path.read_text().strip()


def snapshot(root):
    """Bytes and mtime of every regular file under root (links not followed)."""
    found = {}
    for directory, _dirs, names in os.walk(str(root)):
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                with open(path, "rb") as handle:
                    found[path] = (handle.read(), os.stat(path).st_mtime_ns)
    return found


def run_module(args, capsys, check=False, diff=False):
    """Run main() as Ansible would; returns the parsed JSON result."""
    args = dict(args)
    args["_ansible_check_mode"] = check
    args["_ansible_diff"] = diff
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            edge_dvfs.main()
    return json.loads(capsys.readouterr().out)


class FakeKernel:
    """Stands in for write_sysfs with the kernel's behaviour on min/max limits.

    strict: a write that would leave min above max is rejected with EINVAL.
    reset_on_governor: a governor write resets the limits to the full range.
    ignore: file names whose writes are accepted but have no effect.
    """

    def __init__(self, strict=True, reset_on_governor=False, ignore=()):
        self.strict = strict
        self.reset_on_governor = reset_on_governor
        self.ignore = set(ignore)
        self.log = []

    def __call__(self, path, new):
        directory, name = os.path.split(path)
        self.log.append((name, new))
        if name in self.ignore:
            return
        pair = {"scaling_min_freq": ("scaling_min_freq", "scaling_max_freq"),
                "scaling_max_freq": ("scaling_min_freq", "scaling_max_freq"),
                "min_freq": ("min_freq", "max_freq"), "max_freq": ("min_freq", "max_freq")}.get(name)
        if pair and self.strict:
            low = int(new) if name == pair[0] else int(dvfs.read_sysfs(os.path.join(directory, pair[0])))
            high = int(new) if name == pair[1] else int(dvfs.read_sysfs(os.path.join(directory, pair[1])))
            if low > high:
                raise OSError(errno.EINVAL, "Invalid argument")
        with open(path, "w") as handle:
            handle.write("%s\n" % new)
        if self.reset_on_governor and name in ("scaling_governor", "governor"):
            if name == "scaling_governor":
                limits = [("scaling_min_freq", "cpuinfo_min_freq"), ("scaling_max_freq", "cpuinfo_max_freq")]
                for target, source in limits:
                    shutil.copyfile(os.path.join(directory, source), os.path.join(directory, target))


# --------------------------------------------------------------------------
# Reading and discovery

def test_reads_policies_nodes_and_tables(agx, nx, rk):
    assert sorted(dvfs.list_policies(str(agx))) == [0, 4, 8]
    assert sorted(dvfs.list_policies(str(nx))) == [0, 4]
    assert sorted(dvfs.list_policies(str(rk))) == [0, 4, 6]
    assert sorted(dvfs.list_devfreq(str(rk))) == ["dmc", "fb000000.gpu", "fdab0000.npu"]
    assert sorted(dvfs.list_devfreq(str(nx))) == ["17000000.gpu"]

    directory = dvfs.list_policies(str(agx))[8]
    assert dvfs.read_state(dvfs.CPUFREQ, directory) == {
        "governor": "schedutil", "min_freq": 115200, "max_freq": 2201600}
    available = dvfs.read_available(dvfs.CPUFREQ, directory, "policy8")
    assert available["frequencies"] == AGX_TABLE and len(AGX_TABLE) == 29
    assert available["governors"] == ["userspace", "ondemand", "performance", "schedutil"]
    assert available["range"] == (115200, 2201600)

    gpu = dvfs.read_available(dvfs.DEVFREQ, dvfs.list_devfreq(str(nx))["17000000.gpu"], "17000000.gpu")
    assert gpu["range"] == (306000000, 1173000000)
    assert "nvhost_podgov" in gpu["governors"]


def test_cpu_number_resolves_to_its_policy(agx, rk):
    assert dvfs.policy_for_cpu(str(agx), 9) == 8
    assert dvfs.policy_for_cpu(str(rk), 5) == 4
    assert dvfs.policy_for_cpu(str(rk), 7) == 6
    # Without the cpuN/cpufreq link, related_cpus decides.
    os.unlink(str(rk / "sys/devices/system/cpu/cpu7/cpufreq"))
    assert dvfs.policy_for_cpu(str(rk), 7) == 6
    with pytest.raises(LookupError, match=r"cpu8 has no cpufreq policy.*policy4 \(cpus 4-5\)"):
        dvfs.policy_for_cpu(str(rk), 8)


def test_cpulist_helpers():
    assert dvfs.parse_cpulist("0-3,8 9") == [0, 1, 2, 3, 8, 9]
    assert dvfs.format_cpulist([9, 0, 1, 2, 3, 8]) == "0-3,8-9"


# --------------------------------------------------------------------------
# Applying through the module

def test_apply_sets_governor_and_limits_and_is_idempotent(rk, capsys):
    args = {
        "sysfs_root": str(rk),
        "cpufreq": [
            {"policy": 4, "governor": "performance", "min_freq": "max", "max_freq": "max"},
            {"cpus": 6, "governor": "performance", "min_freq": 2016000},
            {"policy": 0, "max_freq": 1200000},
        ],
        "devfreq": [
            {"node": "fdab0000.npu", "governor": "userspace", "min_freq": 800000000,
             "max_freq": "max"},
            {"node": "dmc", "governor": "performance"},
        ],
    }
    result = run_module(args, capsys)
    assert result["changed"] is True, result
    assert value(policy_file(rk, 4, "scaling_governor")) == "performance"
    assert value(policy_file(rk, 4, "scaling_min_freq")) == "2400000"
    assert value(policy_file(rk, 4, "scaling_max_freq")) == "2400000"
    assert value(policy_file(rk, 6, "scaling_governor")) == "performance"
    assert value(policy_file(rk, 6, "scaling_min_freq")) == "2016000"
    assert value(policy_file(rk, 0, "scaling_max_freq")) == "1200000"
    assert value(policy_file(rk, 0, "scaling_governor")) == "schedutil"
    assert value(node_file(rk, "fdab0000.npu", "governor")) == "userspace"
    assert value(node_file(rk, "fdab0000.npu", "min_freq")) == "800000000"
    assert value(node_file(rk, "dmc", "governor")) == "performance"

    policy4 = result["settings"]["cpufreq"]["policy4"]
    assert policy4["before"] == {"governor": "schedutil", "min_freq": 408000, "max_freq": 2400000}
    assert policy4["after"] == {"governor": "performance", "min_freq": 2400000, "max_freq": 2400000}
    assert [w["file"] for w in policy4["writes"]] == ["scaling_governor", "scaling_min_freq"]
    assert result["settings"]["devfreq"]["dmc"]["writes"] == [
        {"file": "governor", "old": "dmc_ondemand", "new": "performance"}]
    assert policy4["managed"] == ["governor", "min_freq", "max_freq"]
    assert result["settings"]["devfreq"]["dmc"]["managed"] == ["governor"]
    assert result["settings"]["cpufreq"]["policy0"]["managed"] == ["max_freq"]
    assert result["left_out"] == []

    before = snapshot(rk)
    again = run_module(args, capsys)
    assert again["changed"] is False
    assert all(not s["writes"] for kind in again["settings"].values() for s in kind.values())
    assert snapshot(rk) == before


def test_jetson_nx_gpu_and_agx_third_cluster(nx, agx, capsys):
    result = run_module({"sysfs_root": str(nx), "devfreq": [
        {"node": "17000000.gpu", "governor": "userspace", "max_freq": 918000000},
    ], "cpufreq": [{"policy": 4, "min_freq": 729600, "max_freq": "max"}]}, capsys)
    assert result["changed"] is True
    assert value(node_file(nx, "17000000.gpu", "max_freq")) == "918000000"
    assert value(node_file(nx, "17000000.gpu", "governor")) == "userspace"
    assert value(policy_file(nx, 4, "scaling_min_freq")) == "729600"
    assert value(policy_file(nx, 4, "scaling_max_freq")) == "1984000"

    result = run_module({"sysfs_root": str(agx), "cpufreq": [
        {"cpus": 11, "governor": "performance", "max_freq": 2201600}]}, capsys)
    assert result["changed"] is True
    assert value(policy_file(agx, 8, "scaling_governor")) == "performance"
    assert value(policy_file(agx, 0, "scaling_governor")) == "schedutil"


def test_check_mode_writes_nothing_and_reports_the_plan(rk, capsys):
    before = snapshot(rk)
    result = run_module({
        "sysfs_root": str(rk),
        "cpufreq": [{"policy": 4, "governor": "performance", "min_freq": 1800000}],
        "devfreq": [{"node": "fb000000.gpu", "max_freq": 600000000}],
    }, capsys, check=True, diff=True)
    assert snapshot(rk) == before
    assert result["changed"] is True
    policy4 = result["settings"]["cpufreq"]["policy4"]
    assert policy4["after"] == {"governor": "performance", "min_freq": 1800000, "max_freq": 2400000}
    assert [w["file"] for w in policy4["writes"]] == ["scaling_governor", "scaling_min_freq"]

    sysfs_diff = result["diff"][0]
    root = str(rk)
    assert sysfs_diff["before"].splitlines() == [
        root + "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor: schedutil",
        root + "/sys/devices/system/cpu/cpufreq/policy4/scaling_min_freq: 408000",
        root + "/sys/class/devfreq/fb000000.gpu/max_freq: 1000000000",
    ]
    assert sysfs_diff["after"].splitlines() == [
        root + "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor: performance",
        root + "/sys/devices/system/cpu/cpufreq/policy4/scaling_min_freq: 1800000",
        root + "/sys/class/devfreq/fb000000.gpu/max_freq: 600000000",
    ]


def test_check_mode_on_a_tuned_board_reports_no_change(rk, capsys):
    args = {"sysfs_root": str(rk), "cpufreq": [{"policy": 0, "governor": "performance"}]}
    run_module(args, capsys)
    result = run_module(args, capsys, check=True, diff=True)
    assert result["changed"] is False
    assert result["diff"][0]["before"] == result["diff"][0]["after"]


# --------------------------------------------------------------------------
# Validation: one clear message, nothing written

@pytest.mark.parametrize("args, message", [
    ({"cpufreq": [{"policy": 4, "governor": "perf"}]},
     "governor 'perf' not available on policy4; available: "
     "conservative ondemand userspace powersave performance schedutil"),
    ({"devfreq": [{"node": "dmc", "governor": "nvhost_podgov"}]},
     "governor 'nvhost_podgov' not available on dmc; available: "
     "dmc_ondemand userspace powersave performance simple_ondemand"),
    ({"cpufreq": [{"policy": 4, "max_freq": 1500000}]},
     "max_freq 1500000 kHz on policy4 is not an available frequency; nearest steps: 1416000 1608000"),
    ({"cpufreq": [{"policy": 4, "max_freq": 2500000}]},
     "max_freq 2500000 kHz on policy4 is out of range 408000..2400000 kHz "
     "(cpuinfo_min_freq..cpuinfo_max_freq)"),
    ({"cpufreq": [{"policy": 0, "min_freq": 1800000, "max_freq": 1200000}]},
     "min_freq 1800000 kHz > max_freq 1200000 kHz on policy0"),
    ({"devfreq": [{"node": "fb000000.gpu", "min_freq": 1100000000}]},
     "min_freq 1100000000 Hz on fb000000.gpu is out of range 300000000..1000000000 Hz"),
    ({"cpufreq": [{"policy": 8, "governor": "performance"}]},
     "policy8 not found; present: policy0 (cpus 0-3), policy4 (cpus 4-5), policy6 (cpus 6-7)"),
    ({"cpufreq": [{"cpus": 9, "governor": "performance"}]},
     "cpu9 has no cpufreq policy on this board; present: policy0 (cpus 0-3)"),
    ({"devfreq": [{"node": "17000000.gpu", "governor": "performance"}]},
     "devfreq node 17000000.gpu not found; present: dmc fb000000.gpu fdab0000.npu"),
    ({"cpufreq": [{"policy": 4, "governor": "performance"}, {"cpus": 5, "max_freq": "max"}]},
     "policy4 is given more than once"),
    ({"cpufreq": [{"policy": 4, "max_freq": "fast"}]},
     "max_freq 'fast' on policy4: give a frequency in kHz, or min or max"),
])
def test_validation_error_writes_nothing(rk, capsys, args, message):
    # A valid item next to the bad one must not be written either.
    args = dict(args, sysfs_root=str(rk))
    args.setdefault("devfreq", []).append({"node": "fdab0000.npu", "governor": "performance"})
    before = snapshot(rk)
    result = run_module(args, capsys)
    assert result["failed"] is True
    assert message in result["msg"], result["msg"]
    assert snapshot(rk) == before


def test_min_above_current_max_is_an_error(rk):
    (policy_file(rk, 0, "scaling_max_freq")).write_text("1200000\n")
    with pytest.raises(EdgeError, match=r"min_freq 1416000 kHz > max_freq 1200000 kHz \(current\)"):
        dvfs.run(str(rk), [{"policy": 0, "min_freq": 1416000}])


def test_every_error_is_reported_at_once(rk):
    with pytest.raises(EdgeError) as caught:
        dvfs.run(str(rk), [{"policy": 4, "governor": "perf"}, {"policy": 2}],
                 [{"node": "dmc", "max_freq": 1}])
    assert len(caught.value.errors) == 3


def test_missing_items_are_skipped_when_allowed(nx, capsys):
    result = run_module({"sysfs_root": str(nx), "fail_on_missing": False,
                         "cpufreq": [{"policy": 8, "governor": "performance"},
                                     {"policy": 4, "governor": "performance"}],
                         "devfreq": [{"node": "17000000.ga10b", "governor": "performance"}]}, capsys)
    assert result["changed"] is True
    assert [(s["kind"], s["name"]) for s in result["left_out"]] == [
        ("cpufreq", "policy8"), ("devfreq", "17000000.ga10b")]
    assert "present: 17000000.gpu" in result["left_out"][1]["msg"]
    assert value(policy_file(nx, 4, "scaling_governor")) == "performance"


def test_policy_with_all_cpus_offline_is_inactive(agx, capsys):
    # AGX Orin MODE_30W: cpu8-11 offline, policy8 still listed.
    for cpu in range(8, 12):
        _write(agx / ("sys/devices/system/cpu/cpu%d/online" % cpu), "0")
    args = {"sysfs_root": str(agx), "cpufreq": [{"policy": 8, "governor": "performance"},
                                                {"policy": 0, "governor": "performance"}]}
    before = snapshot(agx)
    result = run_module(args, capsys)
    assert result["msg"] == "policy8 is inactive: its cpus 8-11 are offline"
    assert snapshot(agx) == before
    result = run_module(dict(args, fail_on_missing=False), capsys)
    assert result["changed"] is True
    assert result["left_out"][0]["name"] == "policy8"
    assert value(policy_file(agx, 0, "scaling_governor")) == "performance"


def test_policy_answering_ebusy_is_inactive(agx, monkeypatch, capsys):
    real_read = dvfs.read_sysfs

    def read(path):
        if "/policy8/" in path:
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real_read(path)

    monkeypatch.setattr(dvfs, "read_sysfs", read)
    result = run_module({"sysfs_root": str(agx), "cpufreq": [{"policy": 8, "governor": "performance"},
                                                             {"policy": 12}]}, capsys)
    assert result["errors"] == [
        "policy8 is inactive (the kernel answers EBUSY): its cpus are offline",
        "policy12 not found; present: policy0 (cpus 0-3), policy4 (cpus 4-7), policy8 (cpus ?)",
    ]


# --------------------------------------------------------------------------
# Frequency snapping

@pytest.mark.parametrize("snap, expected", [("down", 1416000), ("up", 1608000), ("nearest", 1416000)])
def test_snapping_between_steps(rk, capsys, snap, expected):
    result = run_module({"sysfs_root": str(rk), "snap": snap,
                         "cpufreq": [{"policy": 4, "max_freq": 1500000}]}, capsys)
    assert result["changed"] is True
    assert value(policy_file(rk, 4, "scaling_max_freq")) == str(expected)
    # The snapped value is what is kept: the next run with the same input is a no-op.
    assert run_module({"sysfs_root": str(rk), "snap": snap,
                       "cpufreq": [{"policy": 4, "max_freq": 1500000}]}, capsys)["changed"] is False


def test_snap_rules():
    available = {"name": "t", "kind": dvfs.DEVFREQ, "frequencies": [100, 200, 400],
                 "range": (100, 400), "range_source": "available_frequencies"}
    assert dvfs.resolve_freq("max_freq", 150, available, "nearest") == 100  # tie: lower step
    assert dvfs.resolve_freq("max_freq", 300, available, "nearest") == 200
    assert dvfs.resolve_freq("max_freq", 301, available, "nearest") == 400
    assert dvfs.resolve_freq("max_freq", "200", available, "exact") == 200
    assert dvfs.resolve_freq("min_freq", "min", available, "exact") == 100
    assert dvfs.resolve_freq("min_freq", "max", available, "down") == 400
    with pytest.raises(ValueError, match="nearest steps: 200 400"):
        dvfs.resolve_freq("max_freq", 300, available, "exact")
    with pytest.raises(ValueError, match="give a frequency"):
        dvfs.resolve_freq("max_freq", True, available, "exact")


def test_driver_without_frequency_table_accepts_any_value_in_range(agx, capsys):
    policy_file(agx, 0, "scaling_available_frequencies").unlink()
    result = run_module({"sysfs_root": str(agx), "cpufreq": [
        {"policy": 0, "min_freq": 1000000, "max_freq": 1500000}]}, capsys)
    assert result["changed"] is True
    assert value(policy_file(agx, 0, "scaling_min_freq")) == "1000000"
    assert value(policy_file(agx, 0, "scaling_max_freq")) == "1500000"
    result = run_module({"sysfs_root": str(agx), "cpufreq": [{"policy": 0, "max_freq": 2300000}]}, capsys)
    assert "out of range 115200..2201600 kHz" in result["msg"]
    run_module({"sysfs_root": str(agx), "cpufreq": [{"policy": 0, "max_freq": "max"}]}, capsys)
    assert value(policy_file(agx, 0, "scaling_max_freq")) == "2201600"


# --------------------------------------------------------------------------
# Write ordering, governor side effects, read-back

def test_plan_orders_limit_writes():
    available = {"name": "policy4", "kind": dvfs.CPUFREQ, "governors": ["performance", "schedutil"],
                 "frequencies": RK_A76, "range": (408000, 2400000), "range_source": "cpuinfo"}
    low = {"governor": "schedutil", "min_freq": 408000, "max_freq": 600000}
    high = {"governor": "schedutil", "min_freq": 2016000, "max_freq": 2400000}
    assert dvfs.plan(low, {"min_freq": 2016000, "max_freq": 2400000}, available) == [
        ("max_freq", 600000, 2400000), ("min_freq", 408000, 2016000)]
    assert dvfs.plan(high, {"min_freq": 408000, "max_freq": 600000}, available) == [
        ("min_freq", 2016000, 408000), ("max_freq", 2400000, 600000)]
    assert dvfs.plan(high, {"governor": "performance", "max_freq": 2400000}, available) == [
        ("governor", "schedutil", "performance")]


@pytest.mark.parametrize("start, goal", [
    ((408000, 600000), (2016000, 2400000)),   # raise both: max first
    ((2016000, 2400000), (408000, 600000)),   # lower both: min first
    ((408000, 2400000), (1200000, 1200000)),
    ((1200000, 1200000), (408000, 2400000)),
])
def test_strict_kernel_accepts_the_write_order(rk, monkeypatch, start, goal):
    policy_file(rk, 4, "scaling_min_freq").write_text("%d\n" % start[0])
    policy_file(rk, 4, "scaling_max_freq").write_text("%d\n" % start[1])
    kernel = FakeKernel(strict=True)
    monkeypatch.setattr(dvfs, "write_sysfs", kernel)
    result, _targets = dvfs.run(str(rk), [{"policy": 4, "min_freq": goal[0], "max_freq": goal[1]}])
    assert result["changed"] is True
    assert (int(value(policy_file(rk, 4, "scaling_min_freq"))),
            int(value(policy_file(rk, 4, "scaling_max_freq")))) == goal


def test_strict_kernel_rejects_the_wrong_order(rk, monkeypatch):
    """The fake kernel is strict: writing min first when raising both fails."""
    policy_file(rk, 4, "scaling_max_freq").write_text("600000\n")
    kernel = FakeKernel(strict=True)
    with pytest.raises(OSError):
        kernel(str(policy_file(rk, 4, "scaling_min_freq")), 2016000)


def test_limits_are_replanned_after_a_governor_change_resets_them(rk, monkeypatch):
    policy_file(rk, 4, "scaling_min_freq").write_text("1200000\n")
    policy_file(rk, 4, "scaling_max_freq").write_text("1800000\n")
    kernel = FakeKernel(strict=True, reset_on_governor=True)
    monkeypatch.setattr(dvfs, "write_sysfs", kernel)
    dvfs.run(str(rk), [{"policy": 4, "governor": "performance", "min_freq": 1200000,
                        "max_freq": 1800000}])
    # The governor write reset the limits to 408000..2400000; both are written again.
    assert kernel.log == [("scaling_governor", "performance"), ("scaling_min_freq", 1200000),
                          ("scaling_max_freq", 1800000)]
    assert value(policy_file(rk, 4, "scaling_min_freq")) == "1200000"
    assert value(policy_file(rk, 4, "scaling_max_freq")) == "1800000"


def test_value_that_does_not_stick_is_an_error(rk, monkeypatch, capsys):
    # Like an nvpmodel or thermal cap: the write is accepted, the value stays.
    monkeypatch.setattr(dvfs, "write_sysfs", FakeKernel(ignore={"scaling_max_freq"}))
    result = run_module({"sysfs_root": str(rk), "cpufreq": [
        {"policy": 0, "governor": "performance", "max_freq": 1200000}]}, capsys)
    assert result["failed"] is True
    path = str(policy_file(rk, 0, "scaling_max_freq"))
    assert result["msg"] == "%s: expected 1200000, read back 1800000" % path
    assert result["changed"] is True  # the governor was written
    assert result["settings"]["cpufreq"]["policy0"]["after"]["max_freq"] == 1800000


def test_rejected_write_is_an_error_naming_the_file(rk, monkeypatch, capsys):
    def reject(path, new):
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(dvfs, "write_sysfs", reject)
    result = run_module({"sysfs_root": str(rk), "devfreq": [{"node": "dmc", "governor": "performance"}]},
                        capsys)
    assert result["failed"] is True
    assert result["msg"] == "writing performance to %s failed: Device or resource busy" % node_file(
        rk, "dmc", "governor")


def test_garbage_in_sysfs_fails_cleanly(rk, capsys):
    policy_file(rk, 4, "scaling_min_freq").write_text("<unsupported>\n")
    result = run_module({"sysfs_root": str(rk), "cpufreq": [{"policy": 4, "governor": "performance"}]},
                        capsys)
    assert result["failed"] is True
    assert "scaling_min_freq: expected an integer, read '<unsupported>'" in result["msg"]


def test_writer_never_creates_files(tmp_path):
    with pytest.raises(OSError):
        dvfs.write_sysfs(str(tmp_path / "missing"), 1)
    assert not (tmp_path / "missing").exists()


@st.composite
def limit_scenarios(draw):
    table = sorted(draw(st.sets(st.integers(1, 60), min_size=1, max_size=12)))
    start = sorted(draw(st.lists(st.sampled_from(table), min_size=2, max_size=2)))
    desired = {}
    for attr in dvfs.FREQ_ATTRS:
        choice = draw(st.one_of(st.none(), st.sampled_from(table), st.sampled_from(["min", "max"])))
        if choice is not None:
            desired[attr] = choice
    if draw(st.booleans()):
        desired["governor"] = draw(st.sampled_from(["performance", "schedutil"]))
    return table, start, desired


@settings(max_examples=400, deadline=None)
@given(limit_scenarios())
def test_plan_never_puts_min_above_max(scenario):
    table, (start_min, start_max), desired = scenario
    current = {"governor": "schedutil", "min_freq": start_min, "max_freq": start_max}
    available = {"name": "p", "kind": dvfs.CPUFREQ, "governors": ["performance", "schedutil"],
                 "frequencies": table, "range": (table[0], table[-1]), "range_source": "cpuinfo"}
    try:
        final = dvfs.resolve(current, desired, available)
    except ValueError as exc:
        assert "> max_freq" in str(exc)  # the only invalid input this strategy makes
        return
    state = dict(current)
    writes = dvfs.plan(current, desired, available)
    assert [attr for attr, _o, _n in writes].count("governor") <= 1
    for attr, old, new in writes:
        assert state[attr] == old
        state[attr] = new
        assert state["min_freq"] <= state["max_freq"], (writes, state)
    for attr, wanted in final.items():
        assert state[attr] == wanted
    assert dvfs.plan(state, desired, available) == []


# --------------------------------------------------------------------------
# State file and the boot program (edge_boot, kind dvfs)

def reboot(root, board):
    """A reboot forgets every runtime setting: rebuild the fresh tree."""
    shutil.rmtree(str(root))
    build_board(root, board)


RK_TUNING = {
    "cpufreq": [{"cpus": 4, "governor": "performance", "min_freq": "max", "max_freq": "max"},
                {"policy": 0, "max_freq": 1500000}],
    "devfreq": [{"node": "fdab0000.npu", "governor": "userspace", "min_freq": 800000000},
                {"node": "dmc", "governor": "performance"}],
    "snap": "down",
}


@pytest.fixture
def state_dir(tmp_path):
    """The boot program's state directory (/etc/edgetune/boot.d on the device)."""
    return tmp_path / "etc/edgetune/boot.d"


def state_path(state_dir):
    return Path(edge_boot.state_path("dvfs", str(state_dir)))


def write_settings(state_dir, settings):
    """A dvfs state file as the module writes it, with these settings."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_path(state_dir)
    path.write_text(edge_boot.document("dvfs", settings, "edge_dvfs"))
    return path


def test_state_file_is_written_once_and_shown_in_diff(rk, state_dir, capsys):
    state = state_path(state_dir)
    args = dict(RK_TUNING, sysfs_root=str(rk), state_file=str(state))

    result = run_module(args, capsys, check=True, diff=True)
    assert result["changed"] is True and result["state_file_changed"] is True
    assert not state.exists()
    assert result["diff"][1]["after_header"] == str(state)

    result = run_module(args, capsys, diff=True)
    assert result["state_file_changed"] is True
    doc = json.loads(state.read_text())
    assert doc == {
        "format": 1,
        "kind": "dvfs",
        "generated_by": "edge_dvfs",
        "settings": {
            "cpufreq": [{"policy": 0, "max_freq": 1416000},
                        {"policy": 4, "governor": "performance", "min_freq": 2400000, "max_freq": 2400000}],
            "devfreq": [{"node": "dmc", "governor": "performance"},
                        {"node": "fdab0000.npu", "governor": "userspace", "min_freq": 800000000}],
        },
    }
    assert edge_boot.read(str(state), "dvfs") == (state.read_text(), doc["settings"])
    assert result["diff"][1]["before"] == "" and result["diff"][1]["after"] == state.read_text()
    assert oct(state.stat().st_mode & 0o777) == "0o644"

    mtime = state.stat().st_mtime_ns
    result = run_module(args, capsys, diff=True)
    assert result["changed"] is False and result["state_file_changed"] is False
    assert len(result["diff"]) == 1
    assert state.stat().st_mtime_ns == mtime


def test_state_file_of_the_old_format_is_replaced(rk, state_dir, capsys):
    state = state_path(state_dir)
    state_dir.mkdir(parents=True)
    old = json.dumps({"format": 1, "generated_by": "edge_dvfs", "cpufreq": [{"policy": 0, "governor": "performance"}],
                      "devfreq": []})
    state.write_text(old)
    result = run_module({"sysfs_root": str(rk), "state_file": str(state),
                         "cpufreq": [{"policy": 0, "governor": "performance"}]}, capsys, diff=True)
    assert result["changed"] is True and result["state_file_changed"] is True
    assert result["diff"][1]["before"] == old
    assert edge_boot.read(str(state), "dvfs")[1] == {
        "cpufreq": [{"policy": 0, "governor": "performance"}], "devfreq": []}


def test_state_file_is_not_written_when_apply_fails(rk, tmp_path, monkeypatch, capsys):
    state = tmp_path / "dvfs.json"
    monkeypatch.setattr(dvfs, "write_sysfs", FakeKernel(ignore={"governor"}))
    result = run_module(dict(RK_TUNING, sysfs_root=str(rk), state_file=str(state)), capsys)
    assert result["failed"] is True
    assert not state.exists()


def test_boot_reapplies_the_state_file_after_reboot(rk, state_dir, capsys):
    run_module(dict(RK_TUNING, sysfs_root=str(rk), state_file=str(state_path(state_dir))), capsys)
    tuned_values = {path: data for path, (data, mtime) in snapshot(rk).items()}

    reboot(rk, "rk3588")
    assert value(policy_file(rk, 4, "scaling_governor")) == "schedutil"
    status, out, err = boot(state_dir, rk)
    assert (status, err) == (0, [])
    assert out == [
        "edgetune-boot: dvfs: policy0 scaling_max_freq: 1800000 -> 1416000",
        "edgetune-boot: dvfs: policy4 scaling_governor: schedutil -> performance",
        "edgetune-boot: dvfs: policy4 scaling_min_freq: 408000 -> 2400000",
        "edgetune-boot: dvfs: dmc governor: dmc_ondemand -> performance",
        "edgetune-boot: dvfs: fdab0000.npu governor: simple_ondemand -> userspace",
        "edgetune-boot: dvfs: fdab0000.npu min_freq: 300000000 -> 800000000",
    ]
    assert {path: data for path, (data, mtime) in snapshot(rk).items()} == tuned_values

    # Applied already: nothing to write.
    before = snapshot(rk)
    assert boot(state_dir, rk) == (0, [], [])
    assert snapshot(rk) == before


def _interpreters():
    found = [sys.executable]
    if os.path.exists(PY38):
        found.append(PY38)  # the device's Python, without Ansible installed
    return found


@pytest.mark.parametrize("python", _interpreters())
def test_boot_program_runs_from_the_installed_layout_without_ansible(rk, state_dir, tmp_path, capsys, python):
    """The role edge_boot installs the program's files in the package layout and runs it with
    ``python3 -m``; the dvfs kind needs no other file (and no Ansible: -S, no site-packages)."""
    run_module(dict(RK_TUNING, sysfs_root=str(rk), state_file=str(state_path(state_dir))), capsys)
    reboot(rk, "rk3588")
    install = tmp_path / "usr/local/lib/edgetune"
    utils = install / "ansible_collections/edgetune/fleet/plugins/module_utils"
    utils.mkdir(parents=True)
    others = set(edge_boot.UTILS.values()) - {"edge_dvfs"}
    for name in boot_program_names():
        if name not in others:
            copy_module_util(name, utils)
    done = subprocess.run([python, "-S", "-m", edge_boot.PACKAGE + ".edge_boot", "--state-dir", str(state_dir),
                           "--root", str(rk)], cwd=str(install), env=dict(os.environ, PYTHONPATH=""),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "edgetune-boot: dvfs: policy4 scaling_governor: schedutil -> performance" in done.stdout.splitlines()
    assert value(policy_file(rk, 4, "scaling_governor")) == "performance"
    assert value(node_file(rk, "fdab0000.npu", "min_freq")) == "800000000"


def test_boot_reports_one_line_per_error_and_applies_the_rest(rk, state_dir):
    write_settings(state_dir, {
        "cpufreq": [{"policy": 4, "governor": "performance"}, {"policy": 8, "governor": "performance"}],
        "devfreq": [{"node": "dmc", "max_freq": 1000000000}, {"node": "dmc", "governor": "performance"},
                    {"node": "17000000.gpu", "governor": "performance"}],
    })
    status, out, err = boot(state_dir, rk)
    assert status == 1
    assert err == [
        "edgetune-boot: dvfs: error: policy8 not found; present: policy0 (cpus 0-3), policy4 (cpus 4-5), "
        "policy6 (cpus 6-7)",
        "edgetune-boot: dvfs: error: max_freq 1000000000 Hz on dmc is not an available frequency; nearest steps: "
        "528000000 1068000000 (set snap to down, up or nearest to round; available: "
        "528000000 1068000000 1560000000 2112000000)",
        "edgetune-boot: dvfs: error: devfreq node 17000000.gpu not found; present: dmc fb000000.gpu fdab0000.npu",
    ]
    assert out == ["edgetune-boot: dvfs: policy4 scaling_governor: schedutil -> performance",
                   "edgetune-boot: dvfs: dmc governor: dmc_ondemand -> performance"]
    assert value(policy_file(rk, 4, "scaling_governor")) == "performance"
    assert value(node_file(rk, "dmc", "governor")) == "performance"
    assert value(node_file(rk, "dmc", "max_freq")) == "2112000000"


def test_boot_reports_a_write_the_kernel_rejects_and_applies_the_rest(rk, state_dir, monkeypatch):
    write_settings(state_dir, {"cpufreq": [{"policy": 4, "governor": "performance"}],
                               "devfreq": [{"node": "dmc", "governor": "performance"}]})
    monkeypatch.setattr(dvfs, "write_sysfs", FakeKernel(ignore={"scaling_governor"}))
    status, out, err = boot(state_dir, rk)
    assert status == 1
    assert err == ["edgetune-boot: dvfs: error: %s: expected performance, read back schedutil"
                   % policy_file(rk, 4, "scaling_governor")]
    assert out == ["edgetune-boot: dvfs: dmc governor: dmc_ondemand -> performance"]
    assert value(node_file(rk, "dmc", "governor")) == "performance"


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 2}), json.dumps([1]),
                                     json.dumps({"format": 1, "generated_by": "edge_dvfs", "cpufreq": [],
                                                 "devfreq": []})])
def test_boot_rejects_a_bad_state_file(rk, state_dir, content):
    state_dir.mkdir(parents=True)
    state_path(state_dir).write_text(content)
    before = snapshot(rk)
    status, out, err = boot(state_dir, rk)
    assert (status, out) == (1, [])
    assert len(err) == 1 and err[0].startswith("edgetune-boot: error: state file %s" % state_path(state_dir))
    assert snapshot(rk) == before


@pytest.mark.parametrize("settings, messages", [
    ({"cpufreq": [{"policy": "4"}, {"governor": "performance"}], "devfreq": [{"node": "dmc", "speed": 1}]},
     ["cpufreq entry {'policy': '4'}: policy must be an integer",
      "cpufreq entry {'governor': 'performance'} needs exactly one of policy, cpus",
      "devfreq entry {'node': 'dmc', 'speed': 1}: unknown keys speed"]),
    ({"cpufreq": {"policy": 4}},
     ["settings: cpufreq is {'policy': 4}, not a list of entries"]),
    ({"cpufreq": [], "gpu": []},
     ["settings: unknown keys gpu (known: cpufreq, devfreq)"]),
    ({"devfreq": [{"node": ""}, "dmc"]},
     ["devfreq entry {'node': ''} needs a node name", "devfreq entry 'dmc' is not a mapping"]),
    ({"cpufreq": [{"policy": 4, "max_freq": 1500000, "snap": "round"}]},
     ["cpufreq entry {'policy': 4, 'max_freq': 1500000, 'snap': 'round'}: snap 'round' is not one of "
      "exact, down, up, nearest"]),
    ([{"policy": 4}],
     ["settings [{'policy': 4}] are not a mapping of cpufreq and devfreq entries"]),
])
def test_boot_apply_refuses_malformed_settings(rk, settings, messages):
    before = snapshot(rk)
    with pytest.raises(EdgeError) as caught:
        dvfs.boot_apply(settings, str(rk))
    assert caught.value.errors == messages
    assert snapshot(rk) == before


def test_boot_refuses_malformed_settings_and_writes_nothing(rk, state_dir):
    # A valid entry next to the malformed one is not applied either: the file is not what the module wrote.
    write_settings(state_dir, {"cpufreq": [{"policy": 4, "governor": "performance"}, {"cpus": True}],
                               "devfreq": []})
    before = snapshot(rk)
    assert boot(state_dir, rk) == (1, [], [
        "edgetune-boot: dvfs: error: cpufreq entry {'cpus': True}: cpus must be an integer"])
    assert snapshot(rk) == before


def test_boot_apply_of_empty_settings_does_nothing(rk):
    assert dvfs.boot_apply({}, str(rk)) == ([], [])
    assert dvfs.boot_apply({"cpufreq": [], "devfreq": []}, str(rk)) == ([], [])


def set_online(root, cpus, state):
    for cpu in cpus:
        _write(root / ("sys/devices/system/cpu/cpu%d/online" % cpu), state)


def test_inactive_policy_is_saved_for_the_boot_that_brings_its_cpus_online(agx, state_dir, capsys):
    # AGX Orin in MODE_30W (cpu8-11 offline) with MAXN recorded for the next boot.
    set_online(agx, range(8, 12), "0")
    state = state_path(state_dir)
    args = {"sysfs_root": str(agx), "fail_on_missing": False, "state_file": str(state), "snap": "down",
            "cpufreq": [{"policy": 4, "governor": "performance"},
                        {"policy": 8, "governor": "performance", "max_freq": 2000000}]}
    before8 = {name: value(policy_file(agx, 8, name)) for name in ("scaling_governor", "scaling_max_freq")}
    result = run_module(args, capsys, diff=True)
    assert result["left_out"] == [{"kind": "cpufreq", "name": "policy8", "reason": "inactive",
                                  "msg": "policy8 is inactive: its cpus 8-11 are offline"}]
    assert sorted(result["settings"]["cpufreq"]) == ["policy4"]
    assert "policy8" not in result["diff"][0]["before"] + result["diff"][0]["after"]
    assert {name: value(policy_file(agx, 8, name)) for name in before8} == before8
    assert json.loads(state.read_text())["settings"]["cpufreq"] == [
        {"policy": 4, "governor": "performance"},
        # As given: 2000000 is between steps and is snapped down when the CPUs are online.
        {"policy": 8, "governor": "performance", "max_freq": 2000000, "snap": "down"}]

    # The boot with MAXN: every CPU online, the boot program re-applies the file.
    reboot(agx, "agx-orin-64gb")
    status, out, err = boot(state_dir, agx)
    assert (status, err) == (0, [])
    assert value(policy_file(agx, 8, "scaling_governor")) == "performance"
    assert value(policy_file(agx, 8, "scaling_max_freq")) == "1958400"
    assert out == ["edgetune-boot: dvfs: policy4 scaling_governor: schedutil -> performance",
                   "edgetune-boot: dvfs: policy8 scaling_governor: schedutil -> performance",
                   "edgetune-boot: dvfs: policy8 scaling_max_freq: 2201600 -> 1958400"]

    # The next Ansible run finds everything applied; the file now holds the resolved value.
    result = run_module(args, capsys)
    assert result["left_out"] == []
    assert not any(item["writes"] for item in result["settings"]["cpufreq"].values())
    assert json.loads(state.read_text())["settings"]["cpufreq"][1] == {
        "policy": 8, "governor": "performance", "max_freq": 1958400}


def test_governor_only_inactive_entry_is_stable_across_the_reboot(agx, state_dir, capsys):
    """The role's default (governor only): the file does not change once the CPUs are online."""
    set_online(agx, range(8, 12), "0")
    state = state_path(state_dir)
    args = {"sysfs_root": str(agx), "fail_on_missing": False, "state_file": str(state),
            "cpufreq": [{"policy": 8, "governor": "performance"}]}
    run_module(args, capsys)
    saved = state.read_text()
    reboot(agx, "agx-orin-64gb")
    assert boot(state_dir, agx) == (0, ["edgetune-boot: dvfs: policy8 scaling_governor: schedutil -> performance"],
                                    [])
    result = run_module(args, capsys)
    assert result["changed"] is False and result["state_file_changed"] is False
    assert state.read_text() == saved


def test_boot_leaves_a_policy_the_mode_keeps_offline_without_failing(agx, state_dir):
    write_settings(state_dir, {"cpufreq": [{"policy": 8, "governor": "performance"},
                                           {"policy": 4, "governor": "performance"}],
                               "devfreq": []})
    set_online(agx, range(8, 12), "0")
    status, out, err = boot(state_dir, agx)
    assert (status, err) == (0, [])
    assert out == [
        "edgetune-boot: dvfs: policy8 left as it is: policy8 is inactive: its cpus 8-11 are offline",
        "edgetune-boot: dvfs: policy4 scaling_governor: schedutil -> performance",
    ]
    assert value(policy_file(agx, 8, "scaling_governor")) == "schedutil"


# --------------------------------------------------------------------------
# Documentation matches the argument spec

def test_documentation_matches_argument_spec(monkeypatch):
    captured = {}

    class Stop(Exception):
        pass

    def fake_module(**kwargs):
        captured.update(kwargs)
        raise Stop()

    monkeypatch.setattr(edge_dvfs, "AnsibleModule", fake_module)
    with pytest.raises(Stop):
        edge_dvfs.main()
    spec = captured["argument_spec"]
    doc = yaml.safe_load(edge_dvfs.DOCUMENTATION)
    yaml.safe_load(edge_dvfs.EXAMPLES)
    yaml.safe_load(edge_dvfs.RETURN)

    def compare(doc_options, spec_options):
        assert set(doc_options) == set(spec_options)
        for name, option in spec_options.items():
            documented = doc_options[name]
            assert documented["type"] == option.get("type", "str"), name
            assert documented.get("default") == option.get("default"), name
            assert documented.get("choices") == option.get("choices"), name
            assert documented.get("required", False) == option.get("required", False), name
            if "options" in option:
                compare(documented["suboptions"], option["options"])

    compare(doc["options"], spec)
    assert captured["supports_check_mode"] is True
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert doc["attributes"]["diff_mode"]["support"] == "full"


def boot_program_names():
    """The module names of the files role edge_boot installs for the boot program (the plan's)."""
    from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_package import program_files
    return [f["src"].rsplit("/", 1)[-1][:-len(".py")] for f in program_files("boot")]
