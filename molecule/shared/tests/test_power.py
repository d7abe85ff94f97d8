"""Power and DVFS end state on a converged twin: read back from sysfs, kept across a reboot.
Expectations come from the boards' documented hardware (L4T and mainline sysfs, NVIDIA's nvpmodel confs: cpufreq
policies per cluster, devfreq node names, nvpmodel mode names and caps), not from the role's
profiles, so a wrong profile or role fails them. The device checks are edgetune.checks.power's,
collected here with the fixture below (`edgetune verify` runs them with expectations from each plan).
"""
import json
import subprocess
import time

import pytest
from conftest import hand_written, recap, run_site

from edgetune.checks.power import (  # noqa: F401  (the device checks, collected here)
    CPUFREQ, assert_tuned, read, sysfs_state, test_boot_unit_is_enabled_and_ran,
    test_governors_and_limits_read_back, test_power_mode_and_pinned_clocks_on_jetson,
    test_rockchip_skips_the_jetson_tools)

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
def power(request):
    """The board's documented power setup (housekeeping clusters keep schedutil, jetson_clocks pins
    at the table's top); edgetune.checks.plugin has verify's, from the plan."""
    spec = dict(hand_written(request, POWER))
    spec.update(jetson=spec["mode"] is not None, pinned=spec["mode"] is not None,
                housekeeping_governor="schedutil", persist=True)
    return spec


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
