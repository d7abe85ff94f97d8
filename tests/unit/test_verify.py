"""`edgetune verify`: the expectations it derives for a device from the roles' plan and the intent."""
from pathlib import Path
import pytest
from test_edge_plan import plan_for

from edgetune import verify
from test_edge_intent import board

pytestmark = pytest.mark.controller

CHECKOUT = Path(__file__).resolve().parents[2]
DEFAULTS = verify.role_defaults(CHECKOUT)  # the checkout is the collection


def plan(name="orin-nx", **intent):
    """What verify_plan.yml reports for a device: facts, profile, the plan (edge_plan's) and the intent."""
    facts, profile = board(name)
    facts = dict(facts, model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
                 bootloader={"name": "extlinux", "path": "/boot/extlinux/extlinux.conf"})
    return {"facts": facts, "profile": profile, "plan": plan_for(name, intent), "intent": intent}


def test_defaults_give_molecules_expectations_for_the_orin_nx():
    got = verify.expectations(plan(), DEFAULTS)
    assert got["bootargs"][0] == "isolcpus=managed_irq,domain,4-7" and got["isolated"] == "4-7"
    assert got["bootloader"] == "/boot/extlinux/extlinux.conf" and got["bootloader_name"] == "extlinux"
    assert got["sets"] == {"inference": [4, 5, 6, 7], "housekeeping": [0, 1, 2, 3]}
    assert got["sysctls"] == {"kernel/sched_rt_runtime_us": "950000", "kernel/timer_migration": "0",
                              "vm/stat_interval": "10"}
    assert got["slice"] == {"name": "ai-infer.slice", "quota_cpus": 4, "weight": 1000,
                            "memory_max": {"fraction": 0.9}, "confine_system": True,
                            "probe": True, "probe_priority": 10}
    assert got["power"]["inference"] == [4] and got["power"]["devfreq"] == ["17000000.gpu"]
    assert got["power"]["mode"] == "MAXN_SUPER" and got["power"]["pinned"] is True
    assert got["runtime"] == {"port": 8470, "policy": "other", "priority": 40, "require_fifo": True,
                              "http_threads": 4, "infer_threads": 1, "cpus": "4-7"}
    assert got["netqos_interfaces"] == []


def test_the_inventory_intent_wins_over_the_defaults():
    got = verify.expectations(plan(edge_cgroups_cpu_quota="250%", edge_cgroups_memory_max="2G",
                                   edge_cgroups_memory_high="1G", edge_cgroups_cpu_weight=500,
                                   edge_power_nvpmodel_mode="15W", edge_power_jetson_clocks=False,
                                   edge_runtime_port=9000, edge_runtime_require_fifo=False,
                                   edge_netqos_interfaces=["eth0", {"name": "wlan0"}], edge_netqos_rate="100mbit",
                                   edge_bootargs_isolcpus_flags=["nohz"]), DEFAULTS)
    assert got["slice"]["quota_cpus"] == 2.5 and got["slice"]["memory_max"] == {"bytes": 2 << 30}
    assert got["slice"]["weight"] == 500
    assert got["power"]["mode"] == "15W" and got["power"]["pinned"] is False
    assert got["runtime"]["port"] == 9000 and got["runtime"]["require_fifo"] is False
    assert got["netqos_interfaces"] == ["eth0", "wlan0"]
    assert got["isolated"] == ""   # isolcpus=nohz,... isolates no scheduler domain


def test_disabled_roles_have_no_expectations():
    got = verify.expectations(plan(edge_power_enabled=False, edge_cgroups_enabled=False,
                                   edge_bootargs_enabled=False), DEFAULTS)
    assert got["power"] is None and got["slice"] is None
    assert got["bootargs"] is None and got["isolated"] is None


def test_a_rockchip_board_has_no_power_mode():
    got = verify.expectations(plan("rock5b"), DEFAULTS)
    assert got["power"]["mode"] is None and got["power"]["jetson"] is False and got["power"]["pinned"] is False


def test_verify_refuses_without_a_limit(capsys):
    from edgetune import cli
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["verify"])
    assert exit_info.value.code == 2
