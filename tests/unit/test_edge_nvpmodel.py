"""Tests for the nvpmodel parser (module_utils), the twin's nvpmodel simulator
and the edge_nvpmodel module run against that simulator on a temporary tree.

The simulator is the stand-in for the board, so the module's tests assert the
effects on the fake sysfs (cpufreq caps, CPU online files, status file), not
only what the module says.
"""
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_command
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_nvpmodel import (
    parse_conf,
    parse_query_output,
    parse_status,
    pending_settings,
    reboot_needed,
    status_with_mode,
)

REPO = Path(__file__).resolve().parents[2]
GUEST = REPO / "tools" / "edgetune_dev" / "twin" / "guest"
CONFS = GUEST / "nvpmodel_confs"
SIM = GUEST / "nvpmodel"

# cpufreq tables (kHz) and GPU OPPs (Hz): tools/edgetune_dev/twin/guest/boards/*.json
ORIN_CPU = [115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400,
            883200, 960000, 1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600,
            1574400, 1651200, 1728000, 1804800, 1881600, 1958400, 2035200, 2112000, 2188800, 2201600]
NX_CPU = ORIN_CPU[:24] + [1958400, 1984000]
GPU_OPPS = [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000,
            1020000000, 1122000000]

BOARDS = {
    "agx_r35": {
        "conf": "nvpmodel_p3701_0000.conf",
        "clusters": {0: [0, 1, 2, 3], 4: [4, 5, 6, 7], 8: [8, 9, 10, 11]},
        "cpu_table": ORIN_CPU,
        "gpu": ("/sys/devices/17000000.ga10b/devfreq/17000000.ga10b", "17000000.ga10b"),
        "gpu_table": GPU_OPPS + [1224000000, 1300500000],
        "emc_cap": "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap",
        "release": "# R35 (release), REVISION: 6.0, GCID: 37391689, BOARD: t186ref, EABI: aarch64",
    },
    "nx_super_r36": {
        "conf": "nvpmodel_p3767_0000_super.conf",
        "clusters": {0: [0, 1, 2, 3], 4: [4, 5, 6, 7]},
        "cpu_table": NX_CPU,
        "gpu": ("/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu", "17000000.gpu"),
        "gpu_table": GPU_OPPS + [1173000000],
        "emc_cap": "/sys/kernel/nvpmodel_clk_cap/emc",
        "release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64",
    },
    "nano_super_r36": {
        "conf": "nvpmodel_p3767_0003_super.conf",
        "clusters": {0: [0, 1, 2, 3], 4: [4, 5]},
        "cpu_table": ORIN_CPU[:22],  # up to 1728000
        "gpu": ("/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu", "17000000.gpu"),
        "gpu_table": GPU_OPPS[:8],  # up to 1020000000
        "emc_cap": "/sys/kernel/nvpmodel_clk_cap/emc",
        "release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64",
    },
}


# ---------------------------------------------------------------------------
# A minimal Jetson tree, as the twin's boot script makes it (power-on values)
# ---------------------------------------------------------------------------

def put(root, path, value):
    target = Path(root) / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{value}\n")


def get(root, path):
    return (Path(root) / path.lstrip("/")).read_text().strip()


def make_sysfs(root, board):
    cpu = "/sys/devices/system/cpu"
    table = board["cpu_table"]
    all_cpus = [c for cpus in board["clusters"].values() for c in cpus]
    for policy, cpus in board["clusters"].items():
        pdir = f"{cpu}/cpufreq/policy{policy}"
        for leaf, value in {
            "scaling_governor": "schedutil", "scaling_driver": "tegra194",
            "scaling_available_governors": "userspace ondemand performance schedutil",
            "scaling_available_frequencies": " ".join(map(str, table)),
            "cpuinfo_min_freq": table[0], "cpuinfo_max_freq": table[-1],
            "scaling_min_freq": table[0], "scaling_max_freq": table[-1], "scaling_cur_freq": table[-1],
            "related_cpus": " ".join(map(str, cpus)), "affected_cpus": " ".join(map(str, cpus)),
        }.items():
            put(root, f"{pdir}/{leaf}", value)
        for n in cpus:
            put(root, f"{cpu}/cpu{n}/online", 1)
            os.symlink(f"../cpufreq/policy{policy}", Path(root) / cpu.lstrip("/") / f"cpu{n}" / "cpufreq")
    span = f"0-{max(all_cpus)}"
    for leaf, value in {"online": span, "offline": "", "possible": span, "present": span}.items():
        put(root, f"{cpu}/{leaf}", value)
    gdir, gname = board["gpu"]
    gtable = board["gpu_table"]
    for leaf, value in {
        "governor": "nvhost_podgov", "available_governors": "wmark_active nvhost_podgov userspace performance",
        "available_frequencies": " ".join(map(str, gtable)),
        "min_freq": gtable[0], "max_freq": gtable[-1], "cur_freq": gtable[0],
    }.items():
        put(root, f"{gdir}/{leaf}", value)
    (Path(root) / "sys/class/devfreq").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(Path(root) / gdir.lstrip("/"), Path(root) / "sys/class/devfreq"),
               Path(root) / "sys/class/devfreq" / gname)
    put(root, board["emc_cap"], 0)
    emc = "/sys/kernel/debug/bpmp/debug/clk/emc"
    for leaf, value in {"rate": 3199000000, "min_rate": 204000000, "max_rate": 3199000000,
                        "mrq_rate_locked": 0}.items():
        put(root, f"{emc}/{leaf}", value)


def make_tree(root, board_name):
    board = BOARDS[board_name]
    make_sysfs(root, board)
    put(root, "/etc/nv_tegra_release", board["release"])
    shutil.copyfile(CONFS / board["conf"], Path(root) / "etc" / "nvpmodel.conf")
    (Path(root) / "var/lib/nvpmodel").mkdir(parents=True)


def run_sim(root, *args, stdin=None):
    env = dict(os.environ, EDGETUNE_TWIN_ROOT=str(root))
    return subprocess.run([sys.executable, str(SIM)] + list(args), input=stdin, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def reboot(root, board_name):
    """A twin reboot: sysfs and /run back to power-on values, then nvpmodel.service."""
    shutil.rmtree(Path(root) / "sys")
    shutil.rmtree(Path(root) / "run", ignore_errors=True)
    make_sysfs(root, BOARDS[board_name])
    done = run_sim(root, "-f", "/etc/nvpmodel.conf")
    assert done.returncode == 0, done.stdout + done.stderr


def boot_in(root, board_name, mode_id=None):
    """A booted twin; with mode_id, as if that mode had been chosen before the boot."""
    make_tree(root, board_name)
    if mode_id is not None:
        put(root, "/var/lib/nvpmodel/status", f"pmode:{mode_id:04d} fmode:fanNull")
    reboot(root, board_name)


def snapshot(root):
    """Every regular file's content under root (symlinks not followed)."""
    files = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                files[str(path.relative_to(root))] = path.read_bytes()
    return files


def cpu_max(root, policy):
    return int(get(root, f"/sys/devices/system/cpu/cpufreq/policy{policy}/scaling_max_freq"))


def online(root, cpu):
    return get(root, f"/sys/devices/system/cpu/cpu{cpu}/online")


@pytest.fixture
def tree(tmp_path):
    return tmp_path / "twin"


# ---------------------------------------------------------------------------
# Parser: the four NVIDIA confs
# ---------------------------------------------------------------------------

EXPECTED_MODES = {
    "nvpmodel_p3701_0000.conf": ([(0, "MAXN"), (1, "MODE_15W"), (2, "MODE_30W"), (3, "MODE_50W")], 2),
    "nvpmodel_p3767_0000.conf": ([(0, "MAXN"), (1, "10W"), (2, "15W"), (3, "25W")], 2),
    "nvpmodel_p3767_0000_super.conf": (
        [(0, "MAXN_SUPER"), (1, "10W"), (2, "15W"), (3, "25W"), (4, "40W")], 4),
    "nvpmodel_p3767_0003_super.conf": ([(0, "15W"), (1, "25W"), (2, "MAXN_SUPER")], 1),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_MODES))
def test_real_confs_give_nvidias_ids_names_and_default(name):
    text = (CONFS / name).read_text()
    conf = parse_conf(text)
    modes, default = EXPECTED_MODES[name]
    assert [(m.id, m.name) for m in conf.modes] == modes
    assert conf.default_id == default
    # NVIDIA's EMC header has no space after "<"; it must still define EMC.
    assert "<PARAM TYPE=CLOCK NAME=EMC >" in text
    assert conf.params["EMC"]["type"] == "CLOCK"
    assert "MAX_FREQ_KNEXT" in conf.params["EMC"]["args"]


def test_real_values_per_mode():
    agx = parse_conf((CONFS / "nvpmodel_p3701_0000.conf").read_text())
    assert agx.by_name("MODE_30W").value("CPU_A78_0", "MAX_FREQ") == "1728000"
    assert agx.by_name("MODE_30W").online_cpus() == list(range(8))
    assert agx.by_name("MODE_15W").online_cpus() == [0, 1, 2, 3]
    assert agx.by_name("MODE_15W").value("EMC", "MAX_FREQ") == "2133000000"
    assert agx.by_name("MAXN").value("GPU", "MAX_FREQ") == "-1"
    assert agx.by_name("MODE_50W").value("TPC_POWER_GATING", "TPC_PG_MASK") == "0"
    nx35 = parse_conf((CONFS / "nvpmodel_p3767_0000.conf").read_text())
    assert nx35.by_name("15W").value("CPU_A78_0", "MAX_FREQ") == "1651200"
    nx = parse_conf((CONFS / "nvpmodel_p3767_0000_super.conf").read_text())
    assert nx.by_name("40W").value("GPU", "MAX_FREQ") == "1173000000"
    assert nx.by_name("10W").value("CPU_A78_3", "MAX_FREQ") == "1190400"
    assert nx.by_name("10W").value("CPU_A78_4", "MAX_FREQ") is None  # offline cores get no cap
    nano = parse_conf((CONFS / "nvpmodel_p3767_0003_super.conf").read_text())
    assert nano.by_name("MAXN_SUPER").id == 2
    assert nano.by_name("25W").value("EMC", "MAX_FREQ") == "3199000000"
    for conf in (agx, nx35, nx, nano):
        for mode in conf.modes:
            assert all(v == "729600" for p, a, v in mode.settings if a == "MIN_FREQ" and p.startswith("CPU"))


CLEAN = """\
< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_0 /sys/devices/system/cpu/cpu0/online
CORE_1 /sys/devices/system/cpu/cpu1/online

< PARAM TYPE=CLOCK NAME=CPU_A78_0 >
MAX_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq

< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_0 1
CPU_ONLINE CORE_1 1
CPU_A78_0 MAX_FREQ -1

< POWER_MODEL ID=1 NAME=LOW >
CPU_ONLINE CORE_0 1
CPU_ONLINE CORE_1 0
CPU_A78_0 MAX_FREQ 1113600

< PM_CONFIG DEFAULT=1 >
"""


def shape(conf):
    return ([(m.id, m.name, m.settings) for m in conf.modes], conf.default_id, conf.params)


@pytest.mark.parametrize("variant", [
    CLEAN.replace("\n", "\r\n"),
    CLEAN.rstrip("\n"),
    CLEAN.replace(" ", "\t"),
    CLEAN.replace("< ", "<").replace(" >", ">"),
    "# leading comment\n" + CLEAN.replace("CPU_ONLINE CORE_1 0", "CPU_ONLINE CORE_1 0   # parked\n   # indented"),
    CLEAN.replace("< POWER_MODEL ID=1 NAME=LOW >", "<  POWER_MODEL   ID=1   NAME=LOW  >"),
], ids=["crlf", "no-final-newline", "tabs", "no-spaces-in-brackets", "comments", "extra-spaces"])
def test_parser_tolerates_layout_variants(variant):
    assert shape(parse_conf(variant)) == shape(parse_conf(CLEAN))


@pytest.mark.parametrize("text, message", [
    (CLEAN.split("< POWER_MODEL", 1)[0] + "< PM_CONFIG DEFAULT=0 >\n", "POWER_MODEL"),
    (CLEAN.replace("< PM_CONFIG DEFAULT=1 >\n", ""), "PM_CONFIG"),
    ("", "POWER_MODEL"),
    ("just some text\n", "outside"),
    (CLEAN.replace("DEFAULT=1", "DEFAULT=7"), "DEFAULT=7"),
    (CLEAN.replace("DEFAULT=1", "DEFAULT=x"), "PM_CONFIG"),
    (CLEAN.replace("ID=1 NAME=LOW", "ID=0 NAME=LOW"), "defined twice"),
    (CLEAN.replace("ID=1 NAME=LOW", "NAME=LOW"), "ID and NAME"),
    (CLEAN.replace("CPU_A78_0 MAX_FREQ 1113600", "CPU_A78_0 MAX_FREQ"), "PARAM ARG VALUE"),
    (CLEAN.replace("CPU_A78_0 MAX_FREQ 1113600", "GPU MAX_FREQ 1"), "not defined"),
    (CLEAN.replace("TYPE=CLOCK", "TYPE=WIRE"), "TYPE"),
    (CLEAN.replace("< PARAM TYPE=FILE", "< PARAMETER TYPE=FILE"), "header"),
], ids=["no-power-model", "no-pm-config", "empty", "no-section", "default-unknown", "default-nan",
        "duplicate-id", "no-id", "short-setting", "undefined-param", "bad-type", "unknown-header"])
def test_parser_refuses_malformed_files(text, message):
    with pytest.raises(ValueError, match=message):
        parse_conf(text)


# ---------------------------------------------------------------------------
# nvpmodel -q output
# ---------------------------------------------------------------------------

def test_query_output_plain_and_with_warnings():
    assert parse_query_output("NV Power Mode: MODE_30W\n2\n") == {"name": "MODE_30W", "id": 2, "params": []}
    text = "NVPM WARN: fan mode is not set!\r\nNV Power Mode: 25W\r\n3\r\n"
    assert parse_query_output(text)["name"] == "25W"
    assert parse_query_output(text)["id"] == 3
    assert parse_query_output("NVPM WARN: a\nNVPM WARN: b\nNV Power Mode: MAXN_SUPER\n\n2")["id"] == 2


def test_query_output_verbose_lines():
    # As printed by r36.4 (nvpmodel's output as jetson_stats parses it), shortened.
    text = "\n".join([
        "NVPM VERB: Config file: /etc/nvpmodel.conf",
        "NVPM VERB: parsing done for /etc/nvpmodel.conf",
        "NVPM VERB: Current mode: NV Power Mode: 40W",
        "4",
        "NVPM VERB: PARAM CPU_ONLINE: ARG CORE_7: PATH /sys/devices/system/cpu/cpu7/online: "
        "REAL_VAL: 1 CONF_VAL: 1",
        "NVPM VERB: PARAM TPC_POWER_GATING: ARG TPC_PG_MASK: PATH /sys/devices/platform/gpu.0/tpc_pg_mask: "
        "REAL_VAL: 252 CONF_VAL: 240",
        "NVPM VERB: PARAM EMC: ARG MAX_FREQ: PATH /sys/kernel/nvpmodel_clk_cap/emc: "
        "REAL_VAL: 3199000000 CONF_VAL: 9223372036854775807",
    ]) + "\n"
    result = parse_query_output(text)
    assert (result["name"], result["id"]) == ("40W", 4)
    assert [p["param"] for p in result["params"]] == ["CPU_ONLINE", "TPC_POWER_GATING", "EMC"]
    # Only boot-only settings count as pending; the EMC cap difference does not.
    assert [p["arg"] for p in pending_settings(result)] == ["TPC_PG_MASK"]


@pytest.mark.parametrize("text", ["", "NVPM ERROR: failed\n", "NV Power Mode: MAXN\n", "NV Power Mode: MAXN\nzero\n"])
def test_query_output_without_mode_or_id_is_refused(text):
    with pytest.raises(ValueError):
        parse_query_output(text)


def test_status_file_text():
    assert parse_status("pmode:0002 fmode:fanNull") == {"pmode": 2, "fmode": "fanNull"}
    assert parse_status("") == {"pmode": None, "fmode": None}
    assert status_with_mode("pmode:0002 fmode:quiet\n", 3) == "pmode:0003 fmode:quiet\n"
    assert status_with_mode("", 0) == "pmode:0000"
    assert status_with_mode("fmode:cool", 12) == "pmode:0012 fmode:cool"


def test_reboot_prediction_from_the_conf():
    agx = parse_conf((CONFS / "nvpmodel_p3701_0000.conf").read_text())
    now = {"name": "MODE_30W", "id": 2, "params": []}
    assert reboot_needed(agx, agx.by_name("MAXN"), now)
    assert reboot_needed(agx, agx.by_name("MODE_15W"), now)
    maxn = {"name": "MAXN", "id": 0, "params": []}
    # MAXN and MODE_50W share the GPU mask and the 12 online CPUs.
    assert not reboot_needed(agx, agx.by_name("MODE_50W"), maxn)


# ---------------------------------------------------------------------------
# The simulator on a temporary tree
# ---------------------------------------------------------------------------

def test_boot_applies_the_default_mode(tree):
    boot_in(tree, "agx_r35")
    assert get(tree, "/var/lib/nvpmodel/status") == "pmode:0002 fmode:fanNull"
    assert [online(tree, c) for c in range(12)] == ["1"] * 8 + ["0"] * 4
    assert get(tree, "/sys/devices/system/cpu/online") == "0-7"
    assert get(tree, "/sys/devices/system/cpu/offline") == "8-11"
    assert cpu_max(tree, 0) == cpu_max(tree, 4) == 1728000
    assert get(tree, "/sys/devices/system/cpu/cpufreq/policy0/scaling_min_freq") == "729600"
    gpu = "/sys/devices/17000000.ga10b/devfreq/17000000.ga10b"
    assert get(tree, gpu + "/max_freq") == "612000000"
    assert get(tree, gpu + "/min_freq") == "306000000"  # MIN_FREQ 0 rounds up to the lowest OPP
    assert get(tree, "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap") == "3199000000"  # 0 = no cap


def test_boot_applies_the_mode_in_the_status_file(tree):
    boot_in(tree, "agx_r35", mode_id=1)
    assert [online(tree, c) for c in range(12)] == ["1"] * 4 + ["0"] * 8
    assert cpu_max(tree, 0) == 1113600
    assert get(tree, "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap") == "2133000000"


def test_query_output_formats(tree):
    boot_in(tree, "agx_r35")
    plain = run_sim(tree, "-q")
    assert plain.returncode == 0
    assert plain.stdout == "NVPM WARN: fan mode is not set!\nNV Power Mode: MODE_30W\n2\n"
    verbose = run_sim(tree, "-q", "--verbose")
    parsed = parse_query_output(verbose.stdout)
    assert (parsed["name"], parsed["id"]) == ("MODE_30W", 2)
    assert verbose.stdout.splitlines()[:2] == ["NVPM VERB: Config file: /etc/nvpmodel.conf",
                                               "NVPM VERB: parsing done for /etc/nvpmodel.conf"]
    assert "NVPM VERB: Current mode: NV Power Mode: MODE_30W" in verbose.stdout
    assert pending_settings(parsed) == []
    by_arg = {(p["param"], p["arg"]): p for p in parsed["params"]}
    assert by_arg[("CPU_ONLINE", "CORE_8")]["real"] == "0"
    assert by_arg[("CPU_A78_0", "MAX_FREQ")]["path"] == "/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq"


def test_parse_listing_matches_jtops_regexes(tree):
    import re
    make_tree(tree, "nano_super_r36")
    out = run_sim(tree, "-p", "--verbose").stdout
    default = re.search(r"PM_CONFIG: DEFAULT=(?P<name>\w+)\((?P<id>\d+)\)", out)
    assert default.groupdict() == {"name": "25W", "id": "1"}
    modes = re.findall(r"POWER_MODEL: ID=(?P<id>\d+) NAME=(?P<name>\w+)", out)
    assert modes == [("0", "15W"), ("1", "25W"), ("2", "MAXN_SUPER")]
    assert "NVPM VERB: CPU_A78_0 MAX_FREQ 2147483647" in out  # -1 shown as INT_MAX


def test_unknown_id_and_missing_conf_are_nvpm_errors(tree):
    boot_in(tree, "agx_r35")
    before = snapshot(tree)
    bad = run_sim(tree, "-m", "9")
    assert bad.returncode != 0 and bad.stdout.startswith("NVPM ERROR:")
    missing = run_sim(tree, "-q", "-f", "/etc/nvpmodel/none.conf")
    assert missing.returncode != 0 and "NVPM ERROR:" in missing.stdout
    assert snapshot(tree) == before


def test_live_switch_between_modes_with_the_same_gpu_masks(tree):
    boot_in(tree, "nx_super_r36")  # DEFAULT=4, 40W
    done = run_sim(tree, "-m", "3")  # 25W: same masks, same online CPUs
    assert done.returncode == 0 and done.stdout == ""
    gpu = "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    assert get(tree, gpu + "/max_freq") == "408000000"
    assert cpu_max(tree, 0) == cpu_max(tree, 4) == 1497600
    assert get(tree, "/var/lib/nvpmodel/status") == "pmode:0003 fmode:fanNull"
    assert run_sim(tree, "-m", "0").returncode == 0  # MAXN_SUPER: -1 is the table's top
    assert cpu_max(tree, 0) == 1984000
    assert get(tree, gpu + "/max_freq") == "1173000000"
    assert get(tree, "/sys/kernel/nvpmodel_clk_cap/emc") == "3199000000"


REBOOT_PROMPT = [
    "NVPM WARN: Golden image context is already created",
    "NVPM WARN: Reboot required for changing to this power mode: 0",
    "NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:",
]


@pytest.mark.parametrize("answer, tail", [
    ("NO\n", ["NVPM ERROR: optMask is 1, no request for power mode"]),
    ("", ["NVPM ERROR: bad input!", "NVPM ERROR: optMask is 1, no request for power mode"]),
])
def test_declined_reboot_changes_nothing(tree, answer, tail):
    boot_in(tree, "agx_r35")  # MODE_30W, TPC mask 240
    before = snapshot(tree)
    done = run_sim(tree, "-m", "0", stdin=answer)  # MAXN: mask 0
    assert done.returncode != 0
    assert done.stdout.splitlines() == REBOOT_PROMPT + tail
    assert snapshot(tree) == before


def test_confirmed_reboot_records_the_mode_and_the_next_boot_applies_it(tree):
    boot_in(tree, "agx_r35")
    done = run_sim(tree, "-m", "0", stdin="yes\n")
    assert done.returncode == 0
    assert done.stdout.splitlines() == REBOOT_PROMPT + ["NVPM WARN: rebooting"]
    assert get(tree, "/var/lib/nvpmodel/status") == "pmode:0000 fmode:fanNull"
    assert (tree / "run/edgetune-twin/reboot-requested").exists()
    assert online(tree, 8) == "0"  # nothing applied before the reboot
    reboot(tree, "agx_r35")
    assert [online(tree, c) for c in range(12)] == ["1"] * 12
    assert cpu_max(tree, 8) == 2201600


def test_force_does_not_ask(tree):
    boot_in(tree, "agx_r35")
    done = run_sim(tree, "-m", "1", "--force")
    assert done.returncode == 0
    assert "DO YOU WANT TO REBOOT NOW" not in done.stdout
    assert get(tree, "/var/lib/nvpmodel/status").startswith("pmode:0001")


# ---------------------------------------------------------------------------
# The module against the simulator
# ---------------------------------------------------------------------------

@pytest.fixture
def nvp():
    """plugins/modules/edge_nvpmodel.py; it needs ansible-core (controller tests only)."""
    return pytest.importorskip("edge_nvpmodel")


def sim_runner(root, calls=None):
    """module.run_command's contract, running the simulator on ``root``."""
    def run_command(argv, data=None):
        if calls is not None:
            calls.append((list(argv), data))
        env = dict(os.environ, EDGETUNE_TWIN_ROOT=str(root))
        done = subprocess.run([sys.executable] + list(argv), env=env, capture_output=True, text=True,
                              input=None if data is None else data + "\n", timeout=60, check=False)
        return done.returncode, done.stdout, done.stderr
    return run_command


def never_run(argv, data=None):
    raise AssertionError(f"no command may run, got {argv}")


def module_params(root, mode, **extra):
    params = {"mode": mode, "conf": "/etc/nvpmodel.conf", "nvpmodel_path": str(SIM),
              "status_file": "/var/lib/nvpmodel/status"}
    params.update(extra)
    return params


def run_module(nvp, root, mode, check_mode=False, want_diff=False, calls=None, **extra):
    """The module on a twin tree.  Its files are the tree's: the simulator
    keeps paths that already lie inside EDGETUNE_TWIN_ROOT as they are."""
    extra.setdefault("conf", str(root / "etc/nvpmodel.conf"))
    extra.setdefault("status_file", str(root / "var/lib/nvpmodel/status"))
    return nvp.run_module(
        module_params(root, mode, **extra), check_mode=check_mode, want_diff=want_diff,
        run_command=sim_runner(root, calls), find_command=lambda *a, **k: None)


@pytest.mark.controller
def test_a_hung_nvpmodel_fails_the_module_in_one_line_naming_it(nvp, tree, tmp_path):
    # The module runs nvpmodel through edge_command.run (its limit shortened here): killed, not waited for.
    hung = tmp_path / "nvpmodel"
    hung.write_text("#!/bin/sh\nsleep 60\n")
    hung.chmod(0o755)
    boot_in(tree, "agx_r35", mode_id=0)
    params = module_params(tree, "MODE_50W", nvpmodel_path=str(hung), conf=str(tree / "etc/nvpmodel.conf"),
                           status_file=str(tree / "var/lib/nvpmodel/status"))
    with pytest.raises(EdgeError, match=r"^%s -q .*did not finish within 1 s and was killed" % hung):
        nvp.run_module(params, check_mode=False, want_diff=False,
                       run_command=functools.partial(edge_command.run, timeout=1), find_command=lambda *a, **k: None)
    assert get(tree, "/var/lib/nvpmodel/status") == "pmode:0000 fmode:fanNull"


@pytest.mark.controller
def test_module_live_switch_changes_sysfs_and_is_idempotent(nvp, tree):
    boot_in(tree, "agx_r35", mode_id=0)  # MAXN
    result = run_module(nvp, tree, "MODE_50W", want_diff=True)
    assert result["changed"] is True
    assert result["reboot_required"] is False
    assert (result["mode_name"], result["mode_id"]) == ("MODE_50W", 3)
    assert (result["previous_mode_name"], result["previous_mode_id"]) == ("MAXN", 0)
    assert result["diff"]["before"] == "MAXN (ID 0)\n"
    assert result["diff"]["after"] == "MODE_50W (ID 3)\n"
    assert [cpu_max(tree, p) for p in (0, 4, 8)] == [1497600] * 3
    assert [online(tree, c) for c in range(12)] == ["1"] * 12
    assert get(tree, "/var/lib/nvpmodel/status") == "pmode:0003 fmode:fanNull"
    again = run_module(nvp, tree, "MODE_50W")
    assert again["changed"] is False and again["reboot_required"] is False


@pytest.mark.controller
def test_module_check_mode_writes_nothing_and_predicts(nvp, tree):
    boot_in(tree, "agx_r35", mode_id=0)
    before = snapshot(tree)
    calls = []
    live = run_module(nvp, tree, "MODE_50W", check_mode=True, calls=calls)
    assert live["changed"] is True and live["reboot_required"] is False
    deferred = run_module(nvp, tree, "MODE_15W", check_mode=True, calls=calls)
    assert deferred["changed"] is True and deferred["reboot_required"] is True
    assert snapshot(tree) == before
    assert all("-m" not in argv for argv, _kwargs in calls)


@pytest.mark.controller
def test_module_unknown_name_lists_valid_names_and_runs_nothing(nvp, tree):
    make_tree(tree, "agx_r35")
    params = module_params(tree, "MAXN_SUPER", conf=str(tree / "etc/nvpmodel.conf"))
    with pytest.raises(EdgeError) as failure:
        nvp.run_module(params, check_mode=False, want_diff=False,
                       run_command=never_run, find_command=lambda *a, **k: None)
    assert "MAXN, MODE_15W, MODE_30W, MODE_50W" in str(failure.value)
    assert failure.value.details["valid_modes"] == ["MAXN", "MODE_15W", "MODE_30W", "MODE_50W"]


@pytest.mark.controller
def test_module_reboot_needed_path_is_pending_then_applied_at_boot(nvp, tree):
    boot_in(tree, "agx_r35")  # MODE_30W: cpu8-11 offline, TPC mask 240
    calls = []
    result = run_module(nvp, tree, "MAXN", calls=calls)
    assert result["changed"] is True and result["reboot_required"] is True
    assert "NVPM WARN: Reboot required for changing to this power mode: 0" in result["nvpmodel_output"]
    # nvpmodel was answered NO on stdin: it never waited and never rebooted.
    assert [(argv[1:3], data) for argv, data in calls if "-m" in argv] == [(["-m", "0"], "NO")]
    assert not (tree / "run/edgetune-twin/reboot-requested").exists()
    # Pending: recorded for the next boot, not running.
    assert get(tree, "/var/lib/nvpmodel/status") == "pmode:0000 fmode:fanNull"
    assert online(tree, 8) == "0" and cpu_max(tree, 0) == 1728000
    assert any("CPU_ONLINE CORE_8" in item for item in result["pending_settings"])
    again = run_module(nvp, tree, "MAXN")
    assert again["changed"] is False and again["reboot_required"] is True
    reboot(tree, "agx_r35")
    assert [online(tree, c) for c in range(12)] == ["1"] * 12
    assert [cpu_max(tree, p) for p in (0, 4, 8)] == [2201600] * 3
    settled = run_module(nvp, tree, "MAXN")
    assert settled["changed"] is False and settled["reboot_required"] is False
    assert settled["pending_settings"] == []


@pytest.mark.controller
def test_module_finds_ids_by_name_per_module(nvp, tree):
    boot_in(tree, "nano_super_r36")  # DEFAULT 25W (ID 1)
    result = run_module(nvp, tree, "MAXN_SUPER")
    assert result["mode_id"] == 2 and result["reboot_required"] is False
    assert cpu_max(tree, 0) == cpu_max(tree, 4) == 1728000
    assert get(tree, "/var/lib/nvpmodel/status").startswith("pmode:0002")


@pytest.mark.controller
def test_module_passes_non_default_conf_and_status_paths(nvp, tree):
    boot_in(tree, "nx_super_r36")
    calls = []
    run_module(nvp, tree, "25W", calls=calls)
    conf, status = str(tree / "etc/nvpmodel.conf"), str(tree / "var/lib/nvpmodel/status")
    assert all(argv[-4:] == ["-f", conf, "-u", status] for argv, _kwargs in calls)
    assert [argv[1:3] for argv, _kwargs in calls] == [["-q", "--verbose"], ["-m", "3"], ["-q", "--verbose"]]


def fake_runner(script):
    """Replies from a list of (rc, stdout) in call order."""
    replies = list(script)

    def run_command(argv, data=None):
        rc, out = replies.pop(0)
        return rc, out, ""
    return run_command


@pytest.mark.controller
@pytest.mark.parametrize("replies, message", [
    ([(0, "NV Power Mode: MAXN\n0\n"), (1, "NVPM ERROR: failed to write\n")], "failed with rc=1"),
    ([(0, "NV Power Mode: MAXN\n0\n"), (0, ""), (0, "NV Power Mode: MAXN\n0\n")], "reports mode MAXN"),
    ([(255, "")], "failed with rc=255"),
    ([(0, "garbage\n")], "cannot read the current mode"),
])
def test_module_failures_are_reported_not_raised(nvp, tree, replies, message):
    make_tree(tree, "agx_r35")
    params = module_params(tree, "MODE_50W", conf=str(tree / "etc/nvpmodel.conf"))
    with pytest.raises(EdgeError, match=message):
        nvp.run_module(params, check_mode=False, want_diff=False,
                       run_command=fake_runner(replies), find_command=lambda *a, **k: None)


@pytest.mark.controller
def test_module_bad_conf_fails_cleanly(nvp, tree):
    make_tree(tree, "agx_r35")
    (tree / "etc/nvpmodel.conf").write_text("< POWER_MODEL ID=0 NAME=X >\n")
    params = module_params(tree, "X", conf=str(tree / "etc/nvpmodel.conf"))
    with pytest.raises(EdgeError, match="PM_CONFIG"):
        nvp.run_module(params, False, False, never_run, lambda *a, **k: None)
    params["conf"] = str(tree / "etc/missing.conf")
    with pytest.raises(EdgeError, match="cannot read"):
        nvp.run_module(params, False, False, never_run, lambda *a, **k: None)


def run_main(nvp, args, capsys):
    from ansible.module_utils.testing import patch_module_args
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            nvp.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.controller
def test_main_fails_with_json_not_a_traceback(nvp, tree, capsys):
    make_tree(tree, "agx_r35")
    result = run_main(nvp, {"mode": "NOPE", "conf": str(tree / "etc/nvpmodel.conf"),
                            "nvpmodel_path": str(SIM)}, capsys)
    assert result["failed"] is True
    assert "unknown nvpmodel mode 'NOPE'" in result["msg"]
    assert result["valid_modes"] == ["MAXN", "MODE_15W", "MODE_30W", "MODE_50W"]  # EdgeError's details


@pytest.mark.controller
def test_main_check_mode_through_ansible(nvp, tree, capsys, monkeypatch):
    boot_in(tree, "agx_r35")
    monkeypatch.setenv("EDGETUNE_TWIN_ROOT", str(tree))
    before = snapshot(tree)
    result = run_main(nvp, {"mode": "MODE_15W", "conf": str(tree / "etc/nvpmodel.conf"),
                            "status_file": str(tree / "var/lib/nvpmodel/status"),
                            "nvpmodel_path": str(SIM), "_ansible_check_mode": True, "_ansible_diff": True},
                      capsys)
    assert result["changed"] is True and result["reboot_required"] is True
    assert result["diff"]["after"] == "MODE_15W (ID 1)\n"
    assert snapshot(tree) == before
