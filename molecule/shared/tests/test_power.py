"""Power and DVFS end state on a converged twin: read back from sysfs, kept across a reboot.

Expectations come from the boards' documented hardware (L4T and mainline sysfs, NVIDIA's nvpmodel confs: cpufreq
policies per cluster, devfreq node names, nvpmodel mode names and caps), not from the role's
profiles, so a wrong profile or role fails them.
"""
import json
import re
import subprocess
import time

import pytest
from conftest import hand_written, recap, run_site

CPUFREQ = "/sys/devices/system/cpu/cpufreq/policy%d"
DEVFREQ = "/sys/class/devfreq/%s"
EMC_LOCK = "/sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked"

POWER = {
    # Orin NX 16GB, JetPack 6.2 "super" conf: MAXN_SUPER is the no-cap mode; 2 clusters, the
    # second one runs inference; GPU devfreq node 17000000.gpu on r36; CPU top 1984000 kHz.
    "orin-nx-16gb-r36": {"mode": "MAXN_SUPER", "inference": [4], "housekeeping": [0],
                         "devfreq": ["17000000.gpu"], "cpu_top": 1984000},
    # AGX Orin 64GB, r35: MAXN brings cpu8-11 online (MODE_30W, the default, has them offline);
    # GPU node 17000000.ga10b on r35; CPU top 2201600 kHz.
    "agx-orin-64gb-r35": {"mode": "MAXN", "inference": [4, 8], "housekeeping": [0],
                          "devfreq": ["17000000.ga10b"], "cpu_top": 2201600},
    # RK3588: policy0 = A55, policy4/policy6 = the A76 pairs; GPU, NPU and DDR devfreq nodes.
    "rock5b-rk3588": {"mode": None, "inference": [4, 6], "housekeeping": [0],
                      "devfreq": ["fb000000.gpu", "fdab0000.npu", "dmc"], "cpu_top": None},
}


@pytest.fixture
def power(request, plan):
    """molecule: the board's documented power setup (housekeeping clusters keep schedutil, jetson_clocks pins
    at the table's top). verify: what the inventory asks on this board (the housekeeping governors and the
    mode's top frequency are then not known, and not checked)."""
    if plan is None:
        spec = dict(hand_written(request, POWER))
        spec.update(jetson=spec["mode"] is not None, pinned=spec["mode"] is not None,
                    housekeeping_governor="schedutil", persist=True)
        return spec
    if plan["power"] is None:
        pytest.skip("edge_power is not enabled for this device")
    return plan["power"]


@pytest.fixture
def jetson(power):
    if power["mode"] is None:
        pytest.skip("nvpmodel and jetson_clocks exist on Jetson boards only")
    return power


def mode_id(host, name):
    """The nvpmodel ID of a mode: the documented ones, else as the device's /etc/nvpmodel.conf names it."""
    known = {"MAXN": "0000", "MAXN_SUPER": "0000"}
    if name in known:
        return known[name]
    conf = host.file("/etc/nvpmodel.conf").content_string
    match = re.search(r"<\s*POWER_MODEL\s+ID\s*=\s*(\d+)\s+NAME\s*=\s*%s\s*>" % re.escape(name), conf)
    assert match, "mode %s is not in /etc/nvpmodel.conf" % name
    return "%04d" % int(match.group(1))


def read(host, path):
    return host.file(path).content_string.strip()


def sysfs_state(host, power):
    """Every value the role manages or pins, as the board shows it."""
    paths = []
    for policy in power["inference"] + power["housekeeping"]:
        paths += [CPUFREQ % policy + "/" + leaf
                  for leaf in ("scaling_governor", "scaling_min_freq", "scaling_max_freq")]
    for node in power["devfreq"]:
        paths += [DEVFREQ % node + "/" + leaf for leaf in ("governor", "min_freq", "max_freq")]
    if power["mode"]:
        paths += [EMC_LOCK, "/var/lib/nvpmodel/status"]
    out = host.check_output("for f in %s; do printf '%%s=%%s\\n' \"$f\" \"$(cat $f)\"; done" % " ".join(paths))
    return dict(line.split("=", 1) for line in out.splitlines())


def assert_tuned(host, power):
    state = sysfs_state(host, power)
    for policy in power["inference"]:
        governor = CPUFREQ % policy + "/scaling_governor"
        assert state[governor] == "performance", governor
    for policy in power["housekeeping"]:
        # Housekeeping clusters keep the board's default governor.
        governor = CPUFREQ % policy + "/scaling_governor"
        assert state[governor] == power["housekeeping_governor"], governor
    for node in power["devfreq"]:
        governor = DEVFREQ % node + "/governor"
        assert state[governor] == "performance", governor
    if power["mode"]:
        mode = host.check_output("nvpmodel -q | grep -A1 'NV Power Mode:'").splitlines()
        assert mode[0] == "NV Power Mode: %s" % power["mode"] and int(mode[1]) == int(mode_id(host, power["mode"]))
    if power["mode"] and power["pinned"]:
        # jetson_clocks: every online cluster and the GPU pinned at the mode's top, EMC locked.
        for policy in power["inference"] + power["housekeeping"]:
            low = state[CPUFREQ % policy + "/scaling_min_freq"]
            assert low == state[CPUFREQ % policy + "/scaling_max_freq"], policy
            if power["cpu_top"] is not None:
                assert low == str(power["cpu_top"]), policy
        for node in power["devfreq"]:
            if not power["jetson"]:
                continue
            top = max(int(f) for f in read(host, DEVFREQ % node + "/available_frequencies").split())
            assert state[DEVFREQ % node + "/min_freq"] == state[DEVFREQ % node + "/max_freq"] == str(top), node
        assert state[EMC_LOCK] == "1"
    return state


@pytest.mark.device
def test_governors_and_limits_read_back(host, power):
    assert_tuned(host, power)


@pytest.mark.device
def test_power_mode_and_pinned_clocks_on_jetson(host, jetson):
    # nvpmodel records the mode it applies at boot (nvpmodel.service runs nvpmodel -f).
    assert read(host, "/var/lib/nvpmodel/status").startswith("pmode:%s" % mode_id(host, jetson["mode"]))
    if not jetson["pinned"]:
        pytest.skip("edge_power_jetson_clocks does not pin this device's clocks")
    assert "MaxFreq" in host.check_output("jetson_clocks --show")
    assert host.file("/var/lib/edgetune/jetson_clocks.conf").is_file


@pytest.mark.device
def test_rockchip_skips_the_jetson_tools(host, power):
    if power["jetson"]:
        pytest.skip("a Jetson board")
    assert not host.exists("nvpmodel")
    assert not host.file("/etc/edgetune/boot.d/jetson-clocks.json").exists


@pytest.mark.device
def test_boot_unit_is_enabled_and_ran(host, power):
    if not power["persist"]:
        pytest.skip("edge_power_persist is off for this device")
    unit = host.service("edgetune-boot.service")
    assert unit.is_enabled
    assert host.check_output("systemctl is-active edgetune-boot.service") == "active"
    # After the power mode (nvpmodel.service, where the board has it) is applied.
    unit_file = host.file("/etc/systemd/system/edgetune-boot.service").content_string
    assert re.search(r"^After=.*\bnvpmodel\.service\b", unit_file, re.M)
    doc = json.loads(host.file("/etc/edgetune/boot.d/dvfs.json").content_string)
    assert (doc["kind"], doc["generated_by"]) == ("dvfs", "edge_dvfs")
    assert sorted(e["policy"] for e in doc["settings"]["cpufreq"]) == power["inference"]
    assert sorted(e["node"] for e in doc["settings"]["devfreq"]) == sorted(power["devfreq"])
    pin = host.file("/etc/edgetune/boot.d/jetson-clocks.json")
    assert pin.exists == bool(power["jetson"] and power["pinned"])


def _docker(*argv):
    return subprocess.run(["docker"] + list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, check=False)


def reboot_twin(name, timeout=240):
    """Reboot as a board reboots; wait for a new boot id and for systemd to finish booting."""
    before = _docker("exec", name, "cat", "/proc/sys/kernel/random/boot_id").stdout.strip()
    assert before
    _docker("exec", name, "systemctl", "reboot")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _docker("exec", name, "cat", "/proc/sys/kernel/random/boot_id").stdout.strip()
        if now and now != before:
            state = _docker("exec", name, "systemctl", "is-system-running", "--wait").stdout.strip()
            if state in ("running", "degraded"):
                return state
        time.sleep(2)
    raise AssertionError("%s did not come back from the reboot within %d s" % (name, timeout))


def test_reboot_restores_the_tuning_without_ansible(host, power):
    name = host.backend.host
    # The twin powers on with untuned sysfs: the boot unit alone must bring the tuning back.
    reboot_twin(name)
    assert host.check_output("systemctl is-active edgetune-boot.service") == "active"
    # This boot's run of the unit (journald's -b follows the host kernel's boot id in a container).
    invocation = host.check_output("systemctl show -p InvocationID --value edgetune-boot.service")
    log = host.check_output("journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=%s" % invocation)
    for policy in power["inference"]:
        assert "edgetune-boot: dvfs: policy%d scaling_governor:" % policy in log
    assert_tuned(host, power)


# The roles these checks are about, and the CPU partition edge_power takes from edge_bootargs.
POWER_TAGS = "edge_facts,edge_bootargs,edge_power"


def test_hand_changed_governor_is_reported_by_check_mode(host, power):
    path = CPUFREQ % power["inference"][0] + "/scaling_governor"
    host.run_expect([0], "echo schedutil > %s" % path)
    try:
        result = run_site(host, "--check", "--tags", POWER_TAGS)
        stats = recap(result.stdout, host.backend.host)
        assert stats["failed"] == 0, result.stdout[-3000:]
        assert stats["changed"] > 0, result.stdout[-3000:]
        assert "edge_power : Set the cpufreq and devfreq governors and limits" in result.stdout
        assert read(host, path) == "schedutil"  # check mode wrote nothing
    finally:
        host.run_expect([0], "echo performance > %s" % path)
    assert_tuned(host, power)


def test_bad_input_fails_once_and_changes_nothing(host, power):
    before = sysfs_state(host, power)
    bad = {"edge_power_cpufreq": [{"policy": power["inference"][0], "governor": "turbo"}],
           "edge_power_devfreq": [{"node": power["devfreq"][0], "governor": "powersave"}]}
    result = run_site(host, "--tags", POWER_TAGS, "-e", json.dumps(bad))
    stats = recap(result.stdout, host.backend.host)
    assert stats["failed"] == 1, result.stdout[-3000:]
    assert "governor 'turbo' not available on policy%d; available:" % power["inference"][0] in result.stdout
    assert sysfs_state(host, power) == before
