"""Role edge_power's checks for the drift audit (plugins/module_utils/device/edge_dvfs.py audit_checks), from
the plan's power part and the edge_dvfs module's plan on the device: one value per managed governor
and limit at its sysfs attribute, a policy offline until a pending power mode's boot checked as it
will be, one the mode keeps offline unsupported, then jetson_clocks and the nvpmodel mode."""
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_dvfs import audit_checks

POWER = {"jetson_clocks_managed": True, "jetson_clocks": True, "nvpmodel_managed": True,
         "nvpmodel_mode": "MAXN_SUPER", "cpufreq": [{"policy": 4, "governor": "performance", "max_freq": 1984000}]}
CPUFREQ = {"policy4": {"path": "/sys/devices/system/cpu/cpufreq/policy4", "managed": ["governor", "max_freq"],
                       "after": {"governor": "performance", "max_freq": 1984000}}}
DEVFREQ = {"17000000.gpu": {"path": "/sys/class/devfreq/17000000.gpu", "managed": ["governor"],
                            "after": {"governor": "performance"}}}
DVFS = {"settings": {"cpufreq": CPUFREQ, "devfreq": DEVFREQ}, "left_out": []}
CLUSTERS = [{"policy": 0, "cpus": [0, 1, 2, 3]}, {"policy": 4, "cpus": [4, 5, 6, 7]}]


def test_each_managed_setting_at_its_attribute_then_the_clocks_and_the_mode():
    found = audit_checks(POWER, DVFS, CLUSTERS)
    assert [c["setting"] for c in found] == ["cpufreq policy4 governor", "cpufreq policy4 max_freq",
                                             "devfreq 17000000.gpu governor", "jetson_clocks", "nvpmodel mode"]
    assert found[0] == {"setting": "cpufreq policy4 governor", "role": "edge_power", "kind": "value",
                        "path": "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor", "desired": "performance"}
    assert found[1]["path"].endswith("/scaling_max_freq") and found[1]["desired"] == "1984000"
    assert found[2]["path"] == "/sys/class/devfreq/17000000.gpu/governor"
    assert found[3] == {"setting": "jetson_clocks", "role": "edge_power", "kind": "jetson_clocks", "desired": "pinned"}
    assert found[4]["mode"] == "MAXN_SUPER"
    unmanaged = audit_checks(dict(POWER, jetson_clocks_managed=False, nvpmodel_managed=False), DVFS, CLUSTERS)
    assert [c["kind"] for c in unmanaged] == ["value", "value", "value"]


def test_an_offline_policy_is_checked_as_after_the_pending_boot_or_said_unsupported():
    offline = dict(DVFS, settings={}, left_out=[{"kind": "cpufreq", "name": "policy4", "reason": "inactive",
                                                 "msg": "policy4: its CPUs 4-7 are offline"}])
    pending = audit_checks(POWER, offline, CLUSTERS, pending_boot=True)
    assert [(c["setting"], c["desired"]) for c in pending if c["kind"] == "value"] == [
        ("cpufreq policy4 governor", "performance"), ("cpufreq policy4 max_freq", "1984000")]
    assert pending[0]["path"] == "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor"
    kept = audit_checks(POWER, offline, CLUSTERS, pending_boot=False)
    assert kept[0] == {"setting": "cpufreq policy4", "role": "edge_power", "kind": "unsupported",
                       "reason": "policy4: its CPUs 4-7 are offline"}
    # An entry given by a CPU of the cluster counts as the policy's.
    by_cpu = dict(POWER, cpufreq=[{"cpus": 5, "governor": "powersave"}])
    assert audit_checks(by_cpu, offline, CLUSTERS, pending_boot=True)[0]["desired"] == "powersave"
