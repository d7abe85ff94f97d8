"""Tests for the twin's jetson_clocks simulator on a temporary Jetson tree.

The tree is booted with the twin's nvpmodel simulator first, so the caps that
jetson_clocks pins at are the ones NVIDIA's conf gives the mode.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUEST = REPO / "tools" / "edgetune_dev" / "twin" / "guest"
JETSON_CLOCKS = GUEST / "jetson_clocks"
NVPMODEL = GUEST / "nvpmodel"

# jtop's parser for jetson_clocks --show (jetson_stats jtop/core/jetson_clocks.py).
JTOP_LINE = re.compile(r"^(?P<name>[^ ]+) .* MaxFreq=(?P<frq>[^ ]+) .*")

ORIN_CPU = [115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400,
            883200, 960000, 1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600,
            1574400, 1651200, 1728000, 1804800, 1881600, 1958400, 2035200, 2112000, 2188800, 2201600]
AGX = {
    "conf": "nvpmodel_p3701_0000.conf",
    "clusters": {0: range(0, 4), 4: range(4, 8), 8: range(8, 12)},
    "cpu_table": ORIN_CPU,
    "gpu": ("/sys/devices/17000000.ga10b/devfreq/17000000.ga10b", "17000000.ga10b"),
    "gpu_table": [306000000, 408000000, 612000000, 816000000, 1020000000, 1300500000],
    "emc_cap": "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap",
    "release": "# R35 (release), REVISION: 6.0, GCID: 37391689, BOARD: t186ref, EABI: aarch64",
}
NX = {
    "conf": "nvpmodel_p3767_0000_super.conf",
    "clusters": {0: range(0, 4), 4: range(4, 8)},
    "cpu_table": ORIN_CPU[:24] + [1958400, 1984000],
    "gpu": ("/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu", "17000000.gpu"),
    "gpu_table": [306000000, 408000000, 612000000, 918000000, 1173000000],
    "emc_cap": "/sys/kernel/nvpmodel_clk_cap/emc",
    "release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64",
}
EMC = "/sys/kernel/debug/bpmp/debug/clk/emc"


def put(root, path, value):
    target = Path(root) / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{value}\n")


def get(root, path):
    return (Path(root) / path.lstrip("/")).read_text().strip()


def make_twin(root, board, mode_id=None):
    """Power-on sysfs as the twin makes it, then nvpmodel -f as at boot."""
    cpu = "/sys/devices/system/cpu"
    table = board["cpu_table"]
    for policy, cpus in board["clusters"].items():
        for leaf, value in {
            "scaling_governor": "schedutil", "scaling_available_frequencies": " ".join(map(str, table)),
            "scaling_min_freq": table[0], "scaling_max_freq": table[-1], "scaling_cur_freq": table[0],
            "cpuinfo_min_freq": table[0], "cpuinfo_max_freq": table[-1],
            "related_cpus": " ".join(map(str, cpus)), "affected_cpus": " ".join(map(str, cpus)),
        }.items():
            put(root, f"{cpu}/cpufreq/policy{policy}/{leaf}", value)
        for n in cpus:
            put(root, f"{cpu}/cpu{n}/online", 1)
            os.symlink(f"../cpufreq/policy{policy}", Path(root) / cpu.lstrip("/") / f"cpu{n}" / "cpufreq")
    for leaf in ("online", "offline", "possible", "present"):
        put(root, f"{cpu}/{leaf}", "")
    gdir, gname = board["gpu"]
    gtable = board["gpu_table"]
    for leaf, value in {"governor": "nvhost_podgov", "available_frequencies": " ".join(map(str, gtable)),
                        "min_freq": gtable[0], "max_freq": gtable[-1], "cur_freq": gtable[0]}.items():
        put(root, f"{gdir}/{leaf}", value)
    (Path(root) / "sys/class/devfreq").mkdir(parents=True)
    os.symlink(os.path.relpath(Path(root) / gdir.lstrip("/"), Path(root) / "sys/class/devfreq"),
               Path(root) / "sys/class/devfreq" / gname)
    put(root, board["emc_cap"], 0)
    for leaf, value in {"rate": 2133000000, "min_rate": 204000000, "max_rate": 3199000000,
                        "mrq_rate_locked": 0}.items():
        put(root, f"{EMC}/{leaf}", value)
    put(root, "/etc/nv_tegra_release", board["release"])
    put(root, "/sys/firmware/devicetree/base/model", "NVIDIA Jetson test board\x00")
    put(root, "/sys/firmware/devicetree/base/compatible", "nvidia,p3701-0005\x00nvidia,tegra234\x00")
    shutil.copyfile(GUEST / "nvpmodel_confs" / board["conf"], Path(root) / "etc/nvpmodel.conf")
    if mode_id is not None:
        put(root, "/var/lib/nvpmodel/status", f"pmode:{mode_id:04d} fmode:fanNull")
    booted = run(root, NVPMODEL, "-f", "/etc/nvpmodel.conf")
    assert booted.returncode == 0, booted.stdout


def run(root, script, *args, home=None):
    env = dict(os.environ, EDGETUNE_TWIN_ROOT=str(root))
    if home:
        env["HOME"] = str(home)
    return subprocess.run([sys.executable, str(script)] + list(args), env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def clocks(root, *args, home=None):
    done = run(root, JETSON_CLOCKS, *args, home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def clock_files(root, board):
    """Everything jetson_clocks may touch, with its content."""
    paths = []
    for policy in board["clusters"]:
        paths += [f"/sys/devices/system/cpu/cpufreq/policy{policy}/{leaf}"
                  for leaf in ("scaling_governor", "scaling_min_freq", "scaling_max_freq")]
    paths += [f"{board['gpu'][0]}/{leaf}" for leaf in ("governor", "min_freq", "max_freq")]
    paths += [f"{EMC}/{leaf}" for leaf in ("rate", "min_rate", "max_rate", "mrq_rate_locked")]
    paths.append(board["emc_cap"])
    return {path: get(root, path) for path in paths}


@pytest.fixture
def twin(tmp_path):
    return tmp_path / "twin"


def test_store_pin_restore_round_trip(twin, tmp_path):
    make_twin(twin, AGX)  # MODE_30W: cpu0-7 online, CPU cap 1728000, GPU 612000000
    original = clock_files(twin, AGX)
    saved = tmp_path / "l4t_dfs.conf"
    clocks(twin, "--store", str(saved))
    lines = saved.read_text().splitlines()
    assert "/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq:1728000" in lines
    assert "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor:schedutil" in lines
    assert AGX["gpu"][0] + "/min_freq:306000000" in lines
    assert EMC + "/mrq_rate_locked:0" in lines
    assert all(re.match(r"^/sys/\S+:\S+$", line) for line in lines)

    clocks(twin)
    policy = "/sys/devices/system/cpu/cpufreq/policy{}/{}"
    for p in (0, 4):
        assert get(twin, policy.format(p, "scaling_min_freq")) == "1728000"
        assert get(twin, policy.format(p, "scaling_max_freq")) == "1728000"
        assert get(twin, policy.format(p, "scaling_cur_freq")) == "1728000"
    # cpu8-11 are offline in MODE_30W: their policy is left alone.
    assert get(twin, policy.format(8, "scaling_min_freq")) == original[policy.format(8, "scaling_min_freq")]
    gpu = AGX["gpu"][0]
    assert get(twin, gpu + "/min_freq") == get(twin, gpu + "/max_freq") == "612000000"
    assert get(twin, EMC + "/rate") == "3199000000"  # no EMC cap in MODE_30W
    assert get(twin, EMC + "/mrq_rate_locked") == "1"

    clocks(twin, "--restore", str(saved))
    restored = clock_files(twin, AGX)
    # Governors, min/max limits, the EMC rate and its lock: all back as stored.
    assert restored == original
    assert get(twin, policy.format(0, "scaling_cur_freq")) == "1728000"


def test_pin_never_goes_beyond_the_modes_caps(twin):
    make_twin(twin, AGX, mode_id=1)  # MODE_15W: 4 CPUs at 1113600, GPU 408000000, EMC 2133000000
    clocks(twin)
    assert get(twin, "/sys/devices/system/cpu/cpufreq/policy0/scaling_min_freq") == "1113600"
    assert get(twin, AGX["gpu"][0] + "/min_freq") == "408000000"
    assert get(twin, EMC + "/rate") == "2133000000"


def test_show_is_parseable_by_jtop(twin):
    make_twin(twin, AGX)
    out = clocks(twin, "--show")
    lines = out.splitlines()
    assert lines[0] == "SOC family:tegra234  Machine:NVIDIA Jetson test board"
    assert lines[1] == "Online CPUs: 0-7"
    parsed = {m.group("name"): m.group("frq") for m in map(JTOP_LINE.match, lines) if m}
    assert [f"cpu{n}:" for n in range(12)] == [name for name in parsed if name.startswith("cpu")]
    assert parsed["cpu0:"] == parsed["cpu7:"] == "1728000"
    assert parsed["GPU"] == "612000000"
    assert parsed["EMC"] == "3199000000"
    assert "cpu0:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1728000 " in out
    assert "cpu10: Online=0 " in out
    assert re.search(r"^EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=\d+ FreqOverride=0$", out, re.M)
    assert "Active GPU TPCs: 4" in lines  # TPC_PG_MASK 240
    assert lines[-1] == "NV Power Mode: MODE_30W"
    clocks(twin)
    pinned = clocks(twin, "--show")
    assert "MinFreq=1728000 MaxFreq=1728000 CurrentFreq=1728000" in pinned
    assert "FreqOverride=1" in pinned


def test_show_on_r36_gpu_and_newer_line_format(twin):
    make_twin(twin, NX, mode_id=1)  # 10W: cpu0-3, GPU 612000000, EMC cap 2133000000
    out = clocks(twin, "--show")
    assert "GPU MinFreq=306000000 MaxFreq=612000000 CurrentFreq=306000000" in out
    assert "EMC MinFreq=204000000 MaxFreq=2133000000 " in out
    assert out.splitlines()[-1] == "NV Power Mode: 10W"
    put(twin, "/etc/nv_tegra_release", "# R36 (release), REVISION: 5.0, GCID: 1, BOARD: generic, EABI: aarch64")
    newer = clocks(twin, "--show").splitlines()
    assert newer[1] == "Online CPUs: 0-3, Offline CPUs: 4-7"
    assert newer[2].startswith("cpu0:  Governor=schedutil MinFreq=729600 MaxFreq=1190400 ")
    assert all(JTOP_LINE.match(line) for line in newer if line.startswith(("cpu", "GPU ", "EMC ")))
    assert not any("FreqOverride" in line for line in newer)


def test_default_store_file_is_in_home(twin, tmp_path):
    make_twin(twin, NX)
    home = tmp_path / "home"
    home.mkdir()
    clocks(twin, "--store", home=home)
    assert (home / "l4t_dfs.conf").read_text().startswith("/sys/devices/system/cpu/cpufreq/policy0/")
    clocks(twin, home=home)
    clocks(twin, "--restore", home=home)
    assert get(twin, "/sys/devices/system/cpu/cpufreq/policy0/scaling_min_freq") == "729600"


def test_restore_without_a_stored_file_fails(twin, tmp_path):
    make_twin(twin, NX)
    done = run(twin, JETSON_CLOCKS, "--restore", str(tmp_path / "missing.conf"))
    assert done.returncode == 1
    assert "does not exist" in done.stderr
    assert run(twin, JETSON_CLOCKS, "--bogus").returncode == 1
