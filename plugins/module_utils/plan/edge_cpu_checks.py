# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role edge_cpu's checks for the drift audit (plugins/module_utils/device/edge_audit.py's schema), from the
plan's cpu and boot parts: the interrupt steering (kind ``irq_affinity``, judged on the device by
module_utils/device/edge_irq.py, the code edge_irq_affinity moves them with), each sysctl it sets
(running, /proc/sys) and their sysctl.d file (persisted; the boot-time re-apply is role edge_boot's).
Python 3.8+, stdlib only."""
import hashlib

NUMA_BALANCING = "kernel.numa_balancing"


def sysctl_file_content(settings):
    """The sysctl.d file as ansible.posix.sysctl leaves it for these settings, in their order."""
    return "".join("%s=%s\n" % (item["name"], item["value"]) for item in settings)


def audit_checks(plan, settings, irq_affinity=True, workqueue=True, keep_subsets=True, unmovable_names=(),
                 sysctl=True, sysctl_file="", numa_balancing_present=True):
    """The checks; ``settings``: the sysctls the role set (name, value), in the file's order."""
    cpu, boot = plan["cpu"], plan["boot"]
    checks = []
    if irq_affinity:
        steering = {"role": "edge_cpu", "kind": "irq_affinity", "cpus": cpu["housekeeping_list"],
                    "inference": cpu["inference_list"], "keep_subsets": bool(keep_subsets),
                    "unmovable_names": list(unmovable_names or []),
                    "state_file": boot["state_files"]["irq_affinity"]}
        targets = [("IRQ affinity", "irqs"), ("default IRQ affinity", "default_affinity")]
        if workqueue:
            targets.append(("unbound workqueue cpumask", "workqueue"))
        checks += [dict(steering, setting=setting, target=target) for setting, target in targets]
    if sysctl:
        checks += [{"setting": "sysctl %s" % item["name"], "role": "edge_cpu", "kind": "value",
                    "path": "/proc/sys/" + item["name"].replace(".", "/"), "desired": str(item["value"])}
                   for item in settings]
        if not numa_balancing_present:
            checks.append({"setting": "sysctl %s" % NUMA_BALANCING, "role": "edge_cpu", "kind": "unsupported",
                           "reason": "%s is not in this kernel (no CONFIG_NUMA_BALANCING)" % NUMA_BALANCING})
        checks.append({"setting": "sysctl file %s" % sysctl_file, "role": "edge_cpu", "kind": "file",
                       "path": sysctl_file,
                       "sha1": hashlib.sha1(sysctl_file_content(settings).encode()).hexdigest()})
    return checks
