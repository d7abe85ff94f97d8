"""edge_jetson_clocks (and edge_clocks, its work) against the twin's jetson_clocks and nvpmodel
simulators on a temporary tree.

The simulators stand in for the board (they are independent of the module), so the tests
assert what lands in the fake sysfs: CPU and GPU minimum frequencies, the EMC lock, the store
file, not only what the module says.
"""
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import edge_jetson_clocks as ejc
import pytest
from conftest import install_boot_program
import yaml

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot, edge_clocks
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

REPO = Path(__file__).resolve().parents[2]
GUEST = REPO / "tools" / "edgetune_dev" / "twin" / "guest"
JETSON_CLOCKS = GUEST / "jetson_clocks"
NVPMODEL = GUEST / "nvpmodel"
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"

# cpufreq tables (kHz) and GPU OPPs (Hz): tools/edgetune_dev/twin/guest/boards/*.json
ORIN_CPU = [115200 + 76800 * k for k in range(28)] + [2201600]
NX_CPU = ORIN_CPU[:24] + [1958400, 1984000]
GPU_OPPS = [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000,
            1020000000, 1122000000]
BOARDS = {
    "agx_r35": {
        "conf": "nvpmodel_p3701_0000.conf",
        "clusters": {0: range(0, 4), 4: range(4, 8), 8: range(8, 12)},
        "cpu_table": ORIN_CPU,
        "gpu": ("/sys/devices/17000000.ga10b/devfreq/17000000.ga10b", "17000000.ga10b"),
        "gpu_table": GPU_OPPS + [1224000000, 1300500000],
        "emc_cap": "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap",
        "release": "# R35 (release), REVISION: 6.0, GCID: 37391689, BOARD: t186ref, EABI: aarch64",
    },
    "nx_r36": {
        "conf": "nvpmodel_p3767_0000_super.conf",
        "clusters": {0: range(0, 4), 4: range(4, 8)},
        "cpu_table": NX_CPU,
        "gpu": ("/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu", "17000000.gpu"),
        "gpu_table": GPU_OPPS + [1173000000],
        "emc_cap": "/sys/kernel/nvpmodel_clk_cap/emc",
        "release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64",
    },
}
CPU = "/sys/devices/system/cpu"
EMC = "/sys/kernel/debug/bpmp/debug/clk/emc"


def put(root, path, value):
    target = Path(root) / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("%s\n" % value)


def get(root, path):
    return (Path(root) / path.lstrip("/")).read_text().strip()


def sim(root, script, *args):
    env = dict(os.environ, EDGETUNE_TWIN_ROOT=str(root))
    done = subprocess.run([sys.executable, str(script)] + [str(a) for a in args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def boot(root, board_name, mode_id=None):
    """Power-on values as the twin makes them, then ``nvpmodel -f`` as nvpmodel.service does."""
    if root.exists():
        shutil.rmtree(str(root))
    board = BOARDS[board_name]
    table = board["cpu_table"]
    for policy, cpus in board["clusters"].items():
        for leaf, value in {
            "scaling_governor": "schedutil", "scaling_available_governors": "userspace ondemand performance schedutil",
            "scaling_available_frequencies": " ".join(map(str, table)),
            "scaling_min_freq": table[0], "scaling_max_freq": table[-1], "scaling_cur_freq": table[-1],
            "cpuinfo_min_freq": table[0], "cpuinfo_max_freq": table[-1],
            "related_cpus": " ".join(map(str, cpus)), "affected_cpus": " ".join(map(str, cpus)),
        }.items():
            put(root, "%s/cpufreq/policy%d/%s" % (CPU, policy, leaf), value)
        for n in cpus:
            put(root, "%s/cpu%d/online" % (CPU, n), 1)
            os.symlink("../cpufreq/policy%d" % policy, str(root / CPU.lstrip("/") / ("cpu%d" % n) / "cpufreq"))
    for leaf in ("online", "offline", "possible", "present"):
        put(root, "%s/%s" % (CPU, leaf), "")
    gdir, gname = board["gpu"]
    gtable = board["gpu_table"]
    for leaf, value in {"governor": "nvhost_podgov", "available_frequencies": " ".join(map(str, gtable)),
                        "min_freq": gtable[0], "max_freq": gtable[-1], "cur_freq": gtable[-1]}.items():
        put(root, "%s/%s" % (gdir, leaf), value)
    (root / "sys/class/devfreq").mkdir(parents=True)
    os.symlink(os.path.relpath(str(root / gdir.lstrip("/")), str(root / "sys/class/devfreq")),
               str(root / "sys/class/devfreq" / gname))
    put(root, board["emc_cap"], 0)
    for leaf, value in {"rate": 3199000000, "min_rate": 204000000, "max_rate": 3199000000,
                        "mrq_rate_locked": 0}.items():
        put(root, "%s/%s" % (EMC, leaf), value)
    put(root, "/etc/nv_tegra_release", board["release"])
    put(root, "/sys/firmware/devicetree/base/model", "NVIDIA Jetson test board\x00")
    shutil.copyfile(str(GUEST / "nvpmodel_confs" / board["conf"]), str(root / "etc/nvpmodel.conf"))
    if mode_id is not None:
        put(root, "/var/lib/nvpmodel/status", "pmode:%04d fmode:fanNull" % mode_id)
    sim(root, NVPMODEL, "-f", "/etc/nvpmodel.conf")
    return root


def clock_files(root, board_name):
    """Every file jetson_clocks pins or restores, with its content."""
    board = BOARDS[board_name]
    paths = []
    for policy in board["clusters"]:
        paths += ["%s/cpufreq/policy%d/%s" % (CPU, policy, leaf)
                  for leaf in ("scaling_governor", "scaling_min_freq", "scaling_max_freq")]
    paths += ["%s/%s" % (board["gpu"][0], leaf) for leaf in ("governor", "min_freq", "max_freq")]
    paths += ["%s/%s" % (EMC, leaf) for leaf in ("rate", "mrq_rate_locked")]
    return {path: get(root, path) for path in paths}


def snapshot(root):
    found = {}
    for directory, _dirs, names in os.walk(str(root)):
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                with open(path, "rb") as handle:
                    found[path] = (handle.read(), os.stat(path).st_mtime_ns)
    return found


def runner(root, calls=None):
    """module.run_command's contract, running the simulator on ``root``."""
    def run_command(argv):
        if calls is not None:
            calls.append(list(argv))
        env = dict(os.environ, EDGETUNE_TWIN_ROOT=str(root))
        done = subprocess.run([sys.executable] + list(argv), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=60, check=False)
        return done.returncode, done.stdout, done.stderr
    return run_command


def run(root, state="pinned", check_mode=False, diff=False, calls=None, store_file=None):
    params = {"state": state, "store_file": str(store_file or root.parent / "store" / "jetson_clocks.conf"),
              "jetson_clocks_path": str(JETSON_CLOCKS)}
    return edge_clocks.run(params, check_mode, diff, runner(root, calls), lambda name: None)


@pytest.fixture
def agx(tmp_path):
    return boot(tmp_path / "agx", "agx_r35")  # MODE_30W: cpu8-11 offline


@pytest.fixture
def nx(tmp_path):
    return boot(tmp_path / "nx", "nx_r36")  # 40W


# --------------------------------------------------------------------------
# Parsing --show

R35_SHOW = """\
SOC family:tegra234  Machine:Jetson AGX Orin Developer Kit
Online CPUs: 0-7
cpu0:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1728000 CurrentFreq=1728000 IdleStates: WFI=1 c7=1
cpu4:  Online=1 Governor=performance MinFreq=1728000 MaxFreq=1728000 CurrentFreq=1728000 IdleStates: WFI=1 c7=1
cpu8:  Online=0 Governor= MinFreq= MaxFreq= CurrentFreq= IdleStates:
GPU MinFreq=612000000 MaxFreq=612000000 CurrentFreq=612000000
Active GPU TPCs: 4
EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=3199000000 FreqOverride=1
NV Power Mode: MODE_30W
"""

NEWER_SHOW = """\
NVPM WARN: fan mode is not set!
SOC family:tegra234  Machine:NVIDIA Jetson Orin NX Engineering Reference Developer Kit
Online CPUs: 0-3, Offline CPUs: 4-7
cpu0: Governor=schedutil MinFreq=1984000 MaxFreq=1984000 CurrentFreq=1984000 IdleStates: WFI=1 c7=1
cpu4: Governor=schedutil MinFreq=729600 MaxFreq=1984000 CurrentFreq=729600 IdleStates: WFI=1 c7=1
GPU MinFreq=1173000000 MaxFreq=1173000000 CurrentFreq=1173000000
EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=2133000000
NV Power Mode: MAXN_SUPER
"""


def test_parse_r35_show_with_online_fields_and_an_offline_cpu():
    show = edge_clocks.parse_show(R35_SHOW)
    assert show["cpus"][8] == {"online": False, "governor": "", "min": None, "max": None, "cur": None}
    assert show["cpus"][4]["min"] == show["cpus"][4]["max"] == 1728000
    assert show["emc"]["override"] == 1
    assert show["power_mode"] == "MODE_30W"
    assert edge_clocks.not_pinned(show) == ["cpu0: MinFreq=729600 MaxFreq=1728000"]


def test_parse_newer_show_takes_online_cpus_from_the_header_and_skips_the_emc():
    show = edge_clocks.parse_show(NEWER_SHOW)
    assert [show["cpus"][n]["online"] for n in (0, 4)] == [True, False]
    assert show["emc"]["override"] is None
    # cpu4 is offline and the EMC has no FreqOverride field: nothing is judged unpinned.
    assert edge_clocks.not_pinned(show) == []
    assert show["power_mode"] == "MAXN_SUPER"


@pytest.mark.parametrize("text", ["", "NVPM ERROR: something\n", "GPU MinFreq=1 MaxFreq=1 CurrentFreq=1\n"])
def test_parse_refuses_output_without_cpu_lines(text):
    with pytest.raises(ValueError, match="no 'cpuN"):
        edge_clocks.parse_show(text)


def test_summary_predicts_what_pinning_leaves():
    show = edge_clocks.parse_show(R35_SHOW)
    assert edge_clocks.summary(show, pinned_prediction=True).splitlines() == [
        "cpu0: MinFreq=1728000 MaxFreq=1728000", "cpu4: MinFreq=1728000 MaxFreq=1728000",
        "GPU: MinFreq=612000000 MaxFreq=612000000", "EMC: FreqOverride=1"]


# --------------------------------------------------------------------------
# The module against the simulator

def test_pin_stores_first_then_pins_at_the_modes_caps_and_is_idempotent(agx, tmp_path):
    original = clock_files(agx, "agx_r35")
    calls = []
    result = run(agx, diff=True, calls=calls)
    store = tmp_path / "store" / "jetson_clocks.conf"
    assert result["changed"] is True and result["stored"] is True
    assert result["pinned_before"] is False and result["pinned"] is True
    assert result["power_mode"] == "MODE_30W"
    assert [argv[1:] for argv in calls] == [["--show"], ["--store", str(store)], [], ["--show"]]
    # MODE_30W caps the two online clusters at 1728000 and the GPU at 612 MHz.
    for policy in (0, 4):
        assert get(agx, "%s/cpufreq/policy%d/scaling_min_freq" % (CPU, policy)) == "1728000"
    gpu = BOARDS["agx_r35"]["gpu"][0]
    assert get(agx, gpu + "/min_freq") == get(agx, gpu + "/max_freq") == "612000000"
    assert get(agx, EMC + "/mrq_rate_locked") == "1"
    # The offline cluster is left alone.
    assert get(agx, CPU + "/cpufreq/policy8/scaling_min_freq") == "115200"
    # The store holds the values from before pinning.
    saved = dict(line.rsplit(":", 1) for line in store.read_text().splitlines())
    assert saved[CPU + "/cpufreq/policy4/scaling_min_freq"] == original[CPU + "/cpufreq/policy4/scaling_min_freq"]
    assert "cpu4: MinFreq=729600 MaxFreq=1728000" in result["diff"]["before"].splitlines()
    assert "cpu4: MinFreq=1728000 MaxFreq=1728000" in result["diff"]["after"].splitlines()

    mtime = store.stat().st_mtime_ns
    calls = []
    again = run(agx, calls=calls)
    assert again["changed"] is False and again["stored"] is False and again["pinned"] is True
    assert calls == [[str(JETSON_CLOCKS), "--show"]]
    assert store.stat().st_mtime_ns == mtime


def test_check_mode_writes_nothing_and_predicts_the_pin(agx, tmp_path):
    before = snapshot(tmp_path)
    calls = []
    result = run(agx, check_mode=True, diff=True, calls=calls)
    assert result["changed"] is True and result["stored"] is True and result["pinned"] is True
    assert calls == [[str(JETSON_CLOCKS), "--show"]]
    assert snapshot(tmp_path) == before
    # The prediction is what the real run then shows.
    real = run(agx, diff=True)
    assert real["diff"]["after"] == result["diff"]["after"]


def test_restore_writes_back_the_values_from_before_pinning(agx):
    original = clock_files(agx, "agx_r35")
    run(agx)
    assert clock_files(agx, "agx_r35") != original
    check = run(agx, state="restored", check_mode=True)
    assert check["changed"] is True and check["restored"] is True and check["pinned"] is False
    # What the restore will write, for the playbook's check-mode prediction.
    assert check["saved_values"][CPU + "/cpufreq/policy4/scaling_min_freq"] == "729600"
    assert check["saved_values"][CPU + "/cpufreq/policy4/scaling_governor"] == "schedutil"
    result = run(agx, state="restored", diff=True)
    assert result["changed"] is True and result["restored"] is True and result["pinned"] is False
    assert clock_files(agx, "agx_r35") == original
    assert result["diff"]["after"].splitlines()[0] == "cpu0: MinFreq=729600 MaxFreq=1728000"
    again = run(agx, state="restored")
    assert again["changed"] is False and again["restored"] is False


def test_restore_without_a_store_file_fails_and_changes_nothing(agx, tmp_path):
    sim(agx, JETSON_CLOCKS)  # pinned by hand, never stored
    before = snapshot(tmp_path)
    with pytest.raises(EdgeError, match="does not exist: nothing was changed"):
        run(agx, state="restored")
    assert snapshot(tmp_path) == before


def test_restore_of_a_file_holding_pinned_values_is_an_error(agx, tmp_path):
    sim(agx, JETSON_CLOCKS)
    store = tmp_path / "pinned.conf"
    sim(agx, JETSON_CLOCKS, "--store", store)
    with pytest.raises(EdgeError, match="left the clocks pinned"):
        run(agx, state="restored", store_file=store)


def test_a_mode_switch_unpins_and_the_next_pin_stores_the_new_modes_values(nx, tmp_path):
    run(nx)
    assert get(nx, CPU + "/cpufreq/policy4/scaling_min_freq") == "1497600"  # 40W's CPU cap
    sim(nx, NVPMODEL, "-m", "0")  # MAXN_SUPER, a live switch: nvpmodel resets the minimums
    result = run(nx)
    assert result["pinned_before"] is False and result["stored"] is True
    assert result["power_mode"] == "MAXN_SUPER"
    assert get(nx, CPU + "/cpufreq/policy4/scaling_min_freq") == "1984000"  # no cap in MAXN_SUPER
    saved = dict(line.rsplit(":", 1) for line in (tmp_path / "store/jetson_clocks.conf").read_text().splitlines())
    assert saved[CPU + "/cpufreq/policy4/scaling_max_freq"] == "1984000"
    assert saved[CPU + "/cpufreq/policy4/scaling_min_freq"] == "729600"


def test_jetson_clocks_that_does_not_pin_is_an_error(agx):
    def lazy(argv):
        if argv[1:] == []:
            return 0, "", ""  # claims success, pins nothing
        return runner(agx)(argv)

    params = {"state": "pinned", "store_file": str(agx.parent / "s.conf"), "jetson_clocks_path": str(JETSON_CLOCKS)}
    with pytest.raises(EdgeError, match="not pinned: cpu0: MinFreq=729600 MaxFreq=1728000"):
        edge_clocks.run(params, False, False, lazy, lambda name: None)


@pytest.mark.parametrize("reply, message", [
    ((1, "", "permission denied\n"), "--show failed with rc=1: permission denied"),
    ((0, "Usage: something else\n", ""), "cannot read the clocks from"),
])
def test_command_failures_are_reported_not_raised(tmp_path, reply, message):
    params = {"state": "pinned", "store_file": str(tmp_path / "s.conf"), "jetson_clocks_path": str(JETSON_CLOCKS)}
    with pytest.raises(EdgeError, match=message):
        edge_clocks.run(params, False, False, lambda argv: reply, lambda name: None)
    assert not (tmp_path / "s.conf").exists()


def test_missing_program_is_a_clear_error(tmp_path):
    params = {"state": "pinned", "store_file": str(tmp_path / "s.conf"), "jetson_clocks_path": None}
    with pytest.raises(EdgeError, match="jetson_clocks was not found"):
        edge_clocks.run(params, False, False, lambda argv: (0, "", ""), lambda name: None)


# --------------------------------------------------------------------------
# The boot program (edge_boot, kind jetson_clocks)

def apply_boot(state_dir, root="/"):
    """edge_boot.apply_dir as the boot unit runs it: (status, stdout lines, stderr lines)."""
    out, err = io.StringIO(), io.StringIO()
    status = edge_boot.apply_dir(str(state_dir), str(root), out, err)
    return status, out.getvalue().splitlines(), err.getvalue().splitlines()


def save(state_dir, settings):
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "jetson-clocks.json"
    path.write_text(edge_boot.document("jetson_clocks", settings, "edge_jetson_clocks"))
    return state_dir


def test_boot_pins_after_every_reboot(agx, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_TWIN_ROOT", str(agx))  # the simulator's sysfs
    store = tmp_path / "var/lib/edgetune/jetson_clocks.conf"
    state_dir = save(tmp_path / "boot.d", {"store_file": str(store), "program": str(JETSON_CLOCKS)})
    # root is not used by this kind: jetson_clocks acts on the system it runs on.
    assert apply_boot(state_dir, tmp_path / "unused") == (0, [
        "edgetune-boot: jetson_clocks: saved the clocks to %s and pinned them (NV Power Mode: MODE_30W)" % store], [])
    assert get(agx, CPU + "/cpufreq/policy4/scaling_min_freq") == "1728000"
    assert get(agx, EMC + "/mrq_rate_locked") == "1"
    saved = dict(line.rsplit(":", 1) for line in store.read_text().splitlines())
    assert saved[CPU + "/cpufreq/policy4/scaling_min_freq"] == "729600"  # from before pinning
    mtime = store.stat().st_mtime_ns
    assert apply_boot(state_dir) == (0, ["edgetune-boot: jetson_clocks: clocks already pinned (NV Power Mode: "
                                         "MODE_30W)"], [])
    assert store.stat().st_mtime_ns == mtime  # never stores pinned values

    # A reboot into MAXN (recorded by nvpmodel): fresh clocks; the boot stores MAXN's and pins.
    boot(agx, "agx_r35", mode_id=0)
    status, out, err = apply_boot(state_dir)
    assert (status, err) == (0, [])
    assert out == ["edgetune-boot: jetson_clocks: saved the clocks to %s and pinned them (NV Power Mode: MAXN)"
                   % store]
    assert [get(agx, CPU + "/cpufreq/policy%d/scaling_min_freq" % p) for p in (0, 4, 8)] == ["2201600"] * 3
    saved = dict(line.rsplit(":", 1) for line in store.read_text().splitlines())
    assert saved[CPU + "/cpufreq/policy8/scaling_min_freq"] == "729600"


def test_boot_finds_jetson_clocks_on_path_when_no_program_is_saved(agx, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "jetson_clocks").symlink_to(JETSON_CLOCKS)
    monkeypatch.setenv("PATH", "%s%s%s" % (bin_dir, os.pathsep, os.environ["PATH"]))
    monkeypatch.setenv("EDGETUNE_TWIN_ROOT", str(agx))
    store = tmp_path / "s.conf"
    status, out, err = apply_boot(save(tmp_path / "boot.d", {"store_file": str(store), "program": None}))
    assert (status, err) == (0, [])
    assert out == ["edgetune-boot: jetson_clocks: saved the clocks to %s and pinned them (NV Power Mode: MODE_30W)"
                   % store]
    assert get(agx, EMC + "/mrq_rate_locked") == "1"


def test_boot_reports_a_failing_jetson_clocks_in_one_line(tmp_path):
    program = tmp_path / "jetson_clocks"
    program.write_text("#!/bin/sh\necho Permission denied >&2\nexit 1\n")
    program.chmod(0o755)
    store = tmp_path / "s.conf"
    status, out, err = apply_boot(save(tmp_path / "boot.d", {"store_file": str(store), "program": str(program)}))
    assert (status, out) == (1, [])
    assert err == ["edgetune-boot: jetson_clocks: error: %s --show failed with rc=1: Permission denied" % program]
    assert not store.exists()


def test_boot_with_a_program_that_is_not_there(tmp_path):
    program = tmp_path / "absent"
    status, out, err = apply_boot(save(tmp_path / "boot.d", {"store_file": str(tmp_path / "s"),
                                                             "program": str(program)}))
    assert (status, out) == (1, [])
    assert err == ["edgetune-boot: jetson_clocks: error: jetson_clocks_path %s is not an executable file" % program]


@pytest.mark.parametrize("settings, messages", [
    ({}, ["store_file must be an absolute path, not None"]),
    ({"store_file": "s.conf", "program": None}, ["store_file must be an absolute path, not 's.conf'"]),
    ({"store_file": 3, "program": None}, ["store_file must be an absolute path, not 3"]),
    ({"store_file": "/var/s.conf", "program": "jetson_clocks"},
     ["program must be null (jetson_clocks on PATH, /usr/bin or /usr/sbin) or an absolute path, not "
      "'jetson_clocks'"]),
    ({"store_file": "/var/s.conf", "program": False}, ["program must be null"]),
    ({"store_file": "", "program": ["/usr/bin/jetson_clocks"]}, ["store_file must be", "program must be"]),
])
def test_boot_apply_refuses_malformed_settings(tmp_path, settings, messages):
    with pytest.raises(EdgeError) as refused:
        edge_clocks.boot_apply(settings, "/")
    assert len(refused.value.errors) == len(messages)
    for error, message in zip(refused.value.errors, messages):
        assert error.startswith("jetson_clocks settings: ") and message in error
    with pytest.raises(EdgeError, match="must be a mapping"):
        edge_clocks.boot_apply(["/var/s.conf"], "/")


def test_boot_with_malformed_settings_runs_nothing_and_says_why(tmp_path):
    status, out, err = apply_boot(save(tmp_path / "boot.d", {"store_file": "jetson_clocks.conf", "program": None}))
    assert (status, out) == (1, [])
    assert err == ["edgetune-boot: jetson_clocks: error: jetson_clocks settings: store_file must be an absolute "
                   "path, not 'jetson_clocks.conf'"]


def _interpreters():
    found = [sys.executable]
    if os.path.exists(PY38):
        found.append(PY38)
    return found


@pytest.mark.parametrize("python", _interpreters())
def test_boot_program_on_the_device_without_ansible(agx, tmp_path, python):
    """As the role edge_boot installs it (the plan's files, in the collection's layout), run by the
    device's Python (3.8 too) with nothing else on its path."""
    store = tmp_path / "var/lib/edgetune/jetson_clocks.conf"
    state_dir = save(tmp_path / "boot.d", {"store_file": str(store), "program": str(JETSON_CLOCKS)})
    install = install_boot_program(tmp_path / "usr/local/lib/edgetune/boot")
    command = [python, "-m", edge_boot.PACKAGE + ".edge_boot", "--state-dir", str(state_dir)]
    done = subprocess.run(command, cwd=str(install), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, EDGETUNE_TWIN_ROOT=str(agx), PYTHONPATH=""),
                          check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == ("edgetune-boot: jetson_clocks: saved the clocks to %s and pinned them "
                           "(NV Power Mode: MODE_30W)\n" % store)
    assert get(agx, CPU + "/cpufreq/policy4/scaling_min_freq") == "1728000"


# --------------------------------------------------------------------------
# Through Ansible's module machinery

def run_main(args, capsys):
    from ansible.module_utils.testing import patch_module_args

    with patch_module_args(args):
        with pytest.raises(SystemExit):
            ejc.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.controller
def test_main_fails_with_json_not_a_traceback(tmp_path, capsys):
    result = run_main({"jetson_clocks_path": str(tmp_path / "absent"), "store_file": str(tmp_path / "s")}, capsys)
    assert result["failed"] is True
    assert result["msg"] == "jetson_clocks_path %s is not an executable file" % (tmp_path / "absent")


@pytest.mark.controller
def test_main_check_mode_through_ansible(agx, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGETUNE_TWIN_ROOT", str(agx))
    before = snapshot(agx)
    result = run_main({"jetson_clocks_path": str(JETSON_CLOCKS), "store_file": str(tmp_path / "s.conf"),
                       "_ansible_check_mode": True, "_ansible_diff": True}, capsys)
    assert result["changed"] is True and result["pinned"] is True and result["stored"] is True
    assert "diff" in result
    assert snapshot(agx) == before and not (tmp_path / "s.conf").exists()


@pytest.mark.controller
def test_main_saves_the_boot_state_when_pinned_and_removes_it_when_restored(agx, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGETUNE_TWIN_ROOT", str(agx))
    original = clock_files(agx, "agx_r35")
    store = tmp_path / "s.conf"
    state_dir = tmp_path / "boot.d"
    state = state_dir / "jetson-clocks.json"
    args = {"jetson_clocks_path": str(JETSON_CLOCKS), "store_file": str(store), "state_file": str(state)}
    before = snapshot(tmp_path)
    check = run_main(dict(args, _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert check["changed"] is True and check["state_file_changed"] is True
    assert snapshot(tmp_path) == before
    assert [d["before_header"] for d in check["diff"]] == ["jetson_clocks", str(state)]

    pinned = run_main(dict(args, _ansible_diff=True), capsys)
    assert pinned["changed"] is True and pinned["pinned"] is True and pinned["state_file_changed"] is True
    assert json.loads(state.read_text()) == {
        "format": 1, "kind": "jetson_clocks", "generated_by": "edge_jetson_clocks",
        "settings": {"store_file": str(store), "program": str(JETSON_CLOCKS)}}
    assert pinned["diff"][1] == {"before_header": str(state), "after_header": str(state), "before": "",
                                 "after": state.read_text()}
    assert pinned["diff"][1]["after"] == check["diff"][1]["after"]
    again = run_main(args, capsys)
    assert again["changed"] is False and again["state_file_changed"] is False

    # What the module saved pins the clocks again after a reboot.
    boot(agx, "agx_r35")
    assert clock_files(agx, "agx_r35") == original
    assert apply_boot(state_dir) == (0, ["edgetune-boot: jetson_clocks: saved the clocks to %s and pinned them "
                                         "(NV Power Mode: MODE_30W)" % store], [])
    assert get(agx, CPU + "/cpufreq/policy4/scaling_min_freq") == "1728000"

    text = state.read_text()
    check = run_main(dict(args, state="restored", _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert check["changed"] is True and check["state_file_changed"] is True and state.read_text() == text
    assert check["diff"][1] == {"before_header": str(state), "after_header": str(state), "before": text,
                                "after": ""}
    restored = run_main(dict(args, state="restored"), capsys)
    assert restored["restored"] is True and restored["state_file_changed"] is True and not state.exists()
    assert clock_files(agx, "agx_r35") == original
    assert apply_boot(state_dir) == (0, [], [])  # nothing pins them at the next boot
    again = run_main(dict(args, state="restored"), capsys)
    assert again["changed"] is False and again["state_file_changed"] is False


@pytest.mark.controller
def test_main_state_file_change_alone_is_a_change(agx, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGETUNE_TWIN_ROOT", str(agx))
    sim(agx, JETSON_CLOCKS)  # pinned already
    state = tmp_path / "jetson-clocks.json"
    result = run_main({"jetson_clocks_path": str(JETSON_CLOCKS), "store_file": str(tmp_path / "s.conf"),
                       "state_file": str(state)}, capsys)
    assert result["pinned_before"] is True and result["stored"] is False
    assert result["changed"] is True and result["state_file_changed"] is True
    assert edge_boot.read(str(state), "jetson_clocks")[1] == {"store_file": str(tmp_path / "s.conf"),
                                                              "program": str(JETSON_CLOCKS)}


@pytest.mark.controller
def test_main_refuses_a_relative_program_for_the_boot_before_pinning(agx, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGETUNE_TWIN_ROOT", str(agx))
    monkeypatch.chdir(str(JETSON_CLOCKS.parent))
    before = snapshot(tmp_path)
    result = run_main({"jetson_clocks_path": "jetson_clocks", "store_file": str(tmp_path / "s.conf"),
                       "state_file": str(tmp_path / "jetson-clocks.json")}, capsys)
    assert result["failed"] is True
    assert result["msg"] == ("jetson_clocks settings: program must be null (jetson_clocks on PATH, /usr/bin or "
                             "/usr/sbin) or an absolute path, not 'jetson_clocks'")
    assert snapshot(tmp_path) == before


@pytest.mark.controller
def test_documentation_matches_argument_spec(monkeypatch):
    captured = {}

    class Stop(Exception):
        pass

    def fake_module(**kwargs):
        captured.update(kwargs)
        raise Stop()

    monkeypatch.setattr(ejc, "AnsibleModule", fake_module)
    with pytest.raises(Stop):
        ejc.main()
    doc = yaml.safe_load(ejc.DOCUMENTATION)
    yaml.safe_load(ejc.EXAMPLES)
    yaml.safe_load(ejc.RETURN)
    spec = captured["argument_spec"]
    assert set(doc["options"]) == set(spec)
    for name, option in spec.items():
        assert doc["options"][name]["type"] == option.get("type", "str"), name
        assert doc["options"][name].get("default") == option.get("default"), name
        assert doc["options"][name].get("choices") == option.get("choices"), name
    assert captured["supports_check_mode"] is True
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert doc["attributes"]["diff_mode"]["support"] == "full"
