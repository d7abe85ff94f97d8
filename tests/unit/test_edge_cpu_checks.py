"""Role edge_cpu's checks for the drift audit (plugins/module_utils/plan/edge_cpu_checks.py): the interrupt
steering, each sysctl and the sysctl.d file by the sha1 of what ansible.posix.sysctl writes."""
import hashlib

from test_edge_plan import plan_for

from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_cpu_checks import audit_checks

SETTINGS = [{"name": "kernel.timer_migration", "value": 0}, {"name": "vm.stat_interval", "value": 10}]
FILE = "/etc/sysctl.d/60-edgetune-cpu.conf"


def test_steering_sysctls_and_their_file():
    plan = plan_for("orin-nx")
    found = audit_checks(plan, SETTINGS, unmovable_names=["^nvgpu"], sysctl_file=FILE)
    assert [c["setting"] for c in found] == [
        "IRQ affinity", "default IRQ affinity", "unbound workqueue cpumask", "sysctl kernel.timer_migration",
        "sysctl vm.stat_interval", "sysctl file " + FILE]
    assert found[0] == {"setting": "IRQ affinity", "role": "edge_cpu", "kind": "irq_affinity", "target": "irqs",
                        "cpus": "0-3", "inference": "4-7", "keep_subsets": True, "unmovable_names": ["^nvgpu"],
                        "state_file": plan["boot"]["state_files"]["irq_affinity"]}
    assert found[3] == {"setting": "sysctl kernel.timer_migration", "role": "edge_cpu", "kind": "value",
                        "path": "/proc/sys/kernel/timer_migration", "desired": "0"}
    assert found[-1]["sha1"] == hashlib.sha1(b"kernel.timer_migration=0\nvm.stat_interval=10\n").hexdigest()


def test_switched_off_parts_and_a_kernel_without_numa_balancing():
    plan = plan_for("orin-nx")
    assert [c["target"] for c in audit_checks(plan, SETTINGS, workqueue=False, sysctl=False)] == \
        ["irqs", "default_affinity"]
    found = audit_checks(plan, SETTINGS, irq_affinity=False, sysctl_file=FILE, numa_balancing_present=False)
    assert found[2] == {"setting": "sysctl kernel.numa_balancing", "role": "edge_cpu", "kind": "unsupported",
                        "reason": "kernel.numa_balancing is not in this kernel (no CONFIG_NUMA_BALANCING)"}
    assert audit_checks(plan, [], irq_affinity=False, sysctl=False) == []
