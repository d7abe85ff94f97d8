"""Power and DVFS end state, read back from sysfs: governors and limits, the power mode and pinned
clocks on Jetson boards, the boot unit that re-applies them."""
import json
import re

import pytest

CPUFREQ = "/sys/devices/system/cpu/cpufreq/policy%d"
DEVFREQ = "/sys/class/devfreq/%s"
EMC_LOCK = "/sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked"


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
