"""CPU partitioning and the inference slice, read back from /proc, sysfs and cgroups: the kernel
settings, the slice's cgroup values, the rest of the system on the housekeeping CPUs, the RT probe."""
import json
import re

import pytest

from edgetune.checks import format_cpulist

SLICE = "ai-infer.slice"
SCHED_OTHER, SCHED_FIFO = 0, 1


def cpus(text):
    out = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return sorted(out)


def mask(text):
    value = int(text.strip().replace(",", ""), 16)
    return [bit for bit in range(value.bit_length()) if value >> bit & 1]


def slice_cgroup(name):
    """ai-infer.slice -> /ai.slice/ai-infer.slice (systemd nests a-b.slice in a.slice)."""
    parts = name[:-len(".slice")].split("-")
    return "".join("/%s.slice" % "-".join(parts[:i + 1]) for i in range(len(parts)))


def cpu_dir(host, cgroup):
    """The v1 cpu controller's directory of a cgroup (cpu,cpuacct on a board, cpu on this test bed)."""
    for mount in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
        if host.file(mount + cgroup + "/cpu.shares").exists:
            return mount + cgroup
    raise AssertionError("no v1 cpu cgroup directory for %s" % cgroup)


def read(host, path):
    return host.file(path).content_string.strip()


# --------------------------------------------------------------------------
# Kernel settings

@pytest.mark.device
def test_kernel_settings_running_and_persisted(host, sysctls, plan):
    for key, value in sysctls.items():
        assert read(host, "/proc/sys/" + key) == value, key
    conf = host.file(plan["sysctl_file"] if plan else "/etc/sysctl.d/60-edgetune-cpu.conf").content_string
    for key, value in sysctls.items():
        assert re.search(r"^%s\s*=\s*%s$" % (re.escape(key.replace("/", ".")), value), conf, re.M), key
    if "kernel/numa_balancing" not in sysctls and host.file("/proc/sys/kernel/numa_balancing").exists:
        assert read(host, "/proc/sys/kernel/numa_balancing") == "0"


# --------------------------------------------------------------------------
# The slice, the rest of the system, the probe

def check_slice(host, sets, unified, spec):
    memtotal = int(re.search(r"^MemTotal:\s+(\d+) kB", host.file("/proc/meminfo").content_string, re.M).group(1))
    cgroup = host.check_output("systemctl show -p ControlGroup --value %s" % spec["name"])
    assert cgroup.endswith(slice_cgroup(spec["name"]))
    quota = spec["quota_cpus"]
    if unified:
        base = "/sys/fs/cgroup" + cgroup
        assert read(host, base + "/cpu.max") == ("%d 100000" % round(100000 * quota) if quota else "max 100000")
        assert read(host, base + "/cpu.weight") == str(spec["weight"])
        assert cpus(read(host, base + "/cpuset.cpus")) == sets["inference"]
        if spec["confine_system"]:
            assert cpus(read(host, "/sys/fs/cgroup/system.slice/cpuset.cpus")) == sets["housekeeping"]
        limit = read(host, base + "/memory.max")
    else:
        cpu = cpu_dir(host, cgroup)
        period = int(read(host, cpu + "/cpu.cfs_period_us"))
        assert int(read(host, cpu + "/cpu.cfs_quota_us")) == (round(quota * period) if quota else -1)
        # CPUWeight=1000 -> 1024 * 1000 / 100
        assert read(host, cpu + "/cpu.shares") == str(max(2, min(262144, spec["weight"] * 1024 // 100)))
        limit = read(host, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes" % cgroup)
    wanted = spec["memory_max"]
    if wanted and "fraction" in wanted:
        assert abs(int(limit) - memtotal * 1024 * wanted["fraction"]) < memtotal * 1024 * 0.001, limit
    elif wanted:
        assert abs(int(limit) - wanted["bytes"]) < 8192, limit
    return cgroup


@pytest.mark.device
def test_slice_values_in_the_cgroup_files(host, sets, unified, slice_spec):
    check_slice(host, sets, unified, slice_spec)
    unit = host.file("/etc/systemd/system/" + slice_spec["name"]).content_string
    assert "AllowedCPUs=%s\n" % format_cpulist(sets["inference"]) in unit


@pytest.mark.device
def test_rest_of_the_system_on_housekeeping_cpus(host, sets, unified, kernel_cpus, slice_spec):
    if not slice_spec["confine_system"]:
        pytest.skip("edge_cgroups_confine_system is off for this device")
    housekeeping = format_cpulist(sets["housekeeping"])
    for unit, section in (("system.slice", "Slice"), ("user.slice", "Slice"), ("init.scope", "Scope")):
        text = host.file("/etc/systemd/system/%s.d/50-edgetune-cpus.conf" % unit).content_string
        assert "[%s]\nAllowedCPUs=%s\n" % (section, housekeeping) in text
    affinity = host.file("/etc/systemd/system.conf.d/50-edgetune-cpus.conf")
    if unified:
        assert not affinity.exists
        return
    assert "[Manager]\nCPUAffinity=%s\n" % housekeeping in affinity.content_string
    expected = sorted(set(sets["housekeeping"]) & set(kernel_cpus))
    status = host.file("/proc/1/status").content_string
    assert cpus(re.search(r"^Cpus_allowed_list:\s+(\S+)", status, re.M).group(1)) == expected
    journald = host.check_output("systemctl show -p MainPID --value systemd-journald")
    status = host.file("/proc/%s/status" % journald).content_string
    assert cpus(re.search(r"^Cpus_allowed_list:\s+(\S+)", status, re.M).group(1)) == expected


def rt_root_budget(host, unified):
    """RT time systemd's root cpu cgroup holds (the twin's container cgroup); None on cgroup v2."""
    if unified:
        return None
    text = host.file("/proc/1/cgroup").content_string
    root = re.search(r"^\d+:name=systemd:(\S+)$", text, re.M).group(1)
    root = root[:-len("/init.scope")] if root.endswith("/init.scope") else root
    return int(read(host, cpu_dir(host, root.rstrip("/")) + "/cpu.rt_runtime_us"))


def probe_threads(host):
    pid = host.check_output("systemctl show -p MainPID --value edgetune-probe.service")
    assert pid not in ("", "0"), "edgetune-probe is not running"
    tids = host.check_output("ls /proc/%s/task" % pid).split()
    assert len(tids) == 3  # the main thread and the two workers
    threads = []
    for tid in tids:
        status = host.file("/proc/%s/task/%s/status" % (pid, tid)).content_string
        stat = host.file("/proc/%s/task/%s/stat" % (pid, tid)).content_string
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 is fields[0]
        threads.append({"cpus": cpus(re.search(r"^Cpus_allowed_list:\s+(\S+)", status, re.M).group(1)),
                        "rt_priority": int(fields[40 - 3]), "policy": int(fields[41 - 3])})
    return pid, threads


def check_probe(host, sets, unified, kernel_cpus, spec=None):
    spec = spec or {"name": SLICE, "probe": True, "probe_priority": 10}
    if not spec["probe"]:
        pytest.skip("edge_cgroups_probe is off for this device")
    pid, threads = probe_threads(host)
    cgroups = host.file("/proc/%s/cgroup" % pid).content_string
    group = slice_cgroup(spec["name"])
    if unified:
        assert re.search(r"^0::\S*%s/edgetune-probe.service$" % re.escape(group), cgroups, re.M)
    else:
        # On v1 the probe stays in the slice's cpu cgroup, where its RT budget is.
        assert re.search(r"^\d+:[\w,]*\bcpu\b[\w,]*:\S*%s$" % re.escape(group), cgroups, re.M), cgroups
        assert re.search(r"^\d+:memory:\S*%s/edgetune-probe.service$" % re.escape(group), cgroups, re.M)
    root_budget = rt_root_budget(host, unified)
    state = host.file("/etc/edgetune/boot.d/rt-budget.json")
    in_slice = host.file("/etc/systemd/system/edgetune-boot.service.d/50-edgetune-rt-budget.conf")
    if root_budget == 0:
        # The container has no RT time (Docker's cgroup has cpu.rt_runtime_us=0): the role
        # says so and runs the probe as SCHED_OTHER rather than failing it.
        assert all(t["policy"] == SCHED_OTHER for t in threads), threads
        assert not in_slice.exists and not state.exists
    elif root_budget and state.exists:
        # The slice got its budget (recorded for the boot unit): the probe really runs SCHED_FIFO.
        budget = json.loads(state.content_string)["settings"]["runtime_us"]
        slice_cpu = cpu_dir(host, host.check_output("systemctl show -p ControlGroup --value %s" % spec["name"]))
        assert 0 < budget <= root_budget
        assert int(read(host, slice_cpu + "/cpu.rt_runtime_us")) == budget
        assert all(t["policy"] == SCHED_FIFO and t["rt_priority"] == spec["probe_priority"] for t in threads), threads
        # The boot program runs in the slice, where the budget lives, before the probe.
        assert host.check_output("systemctl show -p Slice --value edgetune-boot.service") == spec["name"]
        assert host.service("edgetune-boot.service").is_enabled
    elif root_budget:
        # RT time there, but less than the slice's budget: reported, probe falls back.
        assert all(t["policy"] == SCHED_OTHER for t in threads), threads
    return threads


@pytest.mark.device
def test_probe_in_the_slice_with_the_policy_rt_allows(host, sets, unified, kernel_cpus, slice_spec):
    check_probe(host, sets, unified, kernel_cpus, slice_spec)


@pytest.mark.device
def test_probe_threads_run_on_the_inference_cpus(host, sets, unified, kernel_cpus, slice_spec):
    threads = check_probe(host, sets, unified, kernel_cpus, slice_spec)
    pinned = sorted(set(sets["inference"]) & set(kernel_cpus))
    if not pinned:
        pytest.skip("the host kernel schedules on CPUs %s only; none of the board's inference CPUs %s exist "
                    "in it, so no thread can be pinned there (a twin on a smaller host)"
                    % (kernel_cpus, sets["inference"]))
    assert all(t["cpus"] == pinned for t in threads), threads
