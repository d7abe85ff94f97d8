"""CPU partitioning and the inference slice on a converged twin, read back from /proc, sysfs and cgroups.

Expectations: the CPU sets from the boards' clusters (the SoCs' cpufreq policies), the
twin's own hardware model for which IRQs cannot move (its board file and
/run/edgetune-twin/unmovable-irqs), and the roles' documented defaults
(CPUWeight 1000, CPUQuota 100% per inference CPU, MemoryMax 90%, RT budget
800000 us, sysctls). Everything is checked again after a reboot of the twin.
"""
import json
import re

import pytest
from conftest import EXPECTED, converged_check_run, format_cpulist, hand_written, reboot_twin, recap, run_site

SLICE = "ai-infer.slice"
SLICE_CGROUP = "/ai.slice/ai-infer.slice"
SETS = {
    "orin-nx-16gb-r36": {"inference": [4, 5, 6, 7], "housekeeping": [0, 1, 2, 3]},
    "agx-orin-64gb-r35": {"inference": list(range(4, 12)), "housekeeping": [0, 1, 2, 3]},
    "rock5b-rk3588": {"inference": [4, 5, 6, 7], "housekeeping": [0, 1, 2, 3]},
}
SYSCTLS = {"kernel/sched_rt_runtime_us": "950000", "kernel/timer_migration": "0", "vm/stat_interval": "10"}
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


@pytest.fixture
def sets(request, plan):
    return plan["sets"] if plan is not None else hand_written(request, SETS)


@pytest.fixture
def sysctls(plan):
    """sysctl (path below /proc/sys) -> value."""
    if plan is None:
        return SYSCTLS
    if plan["sysctls"] is None:
        pytest.skip("edge_cpu is not enabled for this device")
    return plan["sysctls"]


@pytest.fixture
def slice_spec(plan, sets):
    """The slice as the roles' documented defaults make it (molecule), or as the inventory asks (verify)."""
    if plan is None:
        return {"name": SLICE, "quota_cpus": len(sets["inference"]), "weight": 1000,
                "memory_max": {"fraction": 0.9}, "confine_system": True, "probe": True, "probe_priority": 10}
    if plan["slice"] is None:
        pytest.skip("edge_cgroups is not enabled for this device")
    return plan["slice"]


def slice_cgroup(name):
    """ai-infer.slice -> /ai.slice/ai-infer.slice (systemd nests a-b.slice in a.slice)."""
    parts = name[:-len(".slice")].split("-")
    return "".join("/%s.slice" % "-".join(parts[:i + 1]) for i in range(len(parts)))


@pytest.fixture
def kernel_cpus(host):
    """The CPUs the running (host) kernel schedules on; a twin's sysfs shows the board's."""
    return [int(n) for n in re.findall(r"^cpu(\d+) ", host.file("/proc/stat").content_string, re.M)]


@pytest.fixture
def unified(host):
    return host.check_output("stat -fc %T /sys/fs/cgroup") == "cgroup2fs"


def cpu_dir(host, cgroup):
    """The v1 cpu controller's directory of a cgroup (cpu,cpuacct on a board, cpu on this test bed)."""
    for mount in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
        if host.file(mount + cgroup + "/cpu.shares").exists:
            return mount + cgroup
    raise AssertionError("no v1 cpu cgroup directory for %s" % cgroup)


def read(host, path):
    return host.file(path).content_string.strip()


# --------------------------------------------------------------------------
# IRQs, workqueues, kernel settings

def power_on_affinity(host, twin_board, ncpus):
    board = json.loads(host.file("/usr/lib/edgetune-twin/boards/%s.json" % twin_board).content_string)
    return {irq["irq"]: irq.get("cpus", list(range(ncpus))) for irq in board["irqs"]}


def check_irqs(host, twin_board, sets):
    housekeeping = sets["housekeeping"]
    ncpus = len(sets["housekeeping"]) + len(sets["inference"])
    unmovable = {int(n) for n in read(host, "/run/edgetune-twin/unmovable-irqs").split()}
    power_on = power_on_affinity(host, twin_board, ncpus)
    assert unmovable and set(power_on) - unmovable
    for irq, before in power_on.items():
        now = cpus(read(host, "/proc/irq/%d/smp_affinity_list" % irq))
        if irq in unmovable:
            assert now == before, "unmovable IRQ %d changed" % irq
        else:
            assert now == housekeeping, "movable IRQ %d is on %s" % (irq, now)
    assert mask(read(host, "/proc/irq/default_smp_affinity")) == housekeeping
    assert mask(read(host, "/sys/devices/virtual/workqueue/cpumask")) == housekeeping
    return unmovable, power_on


def test_movable_irqs_on_housekeeping_and_unmovable_ones_untouched(host, twin_board, sets):
    check_irqs(host, twin_board, sets)


def test_refused_irqs_are_recorded_for_the_boot_unit(host, twin_board, sets):
    unmovable, power_on = check_irqs(host, twin_board, sets)
    state = json.loads(host.file("/etc/edgetune/boot.d/irq-affinity.json").content_string)["settings"]
    # Unmovable IRQs already inside the housekeeping set are left alone, never refused.
    reaching_out = {irq for irq in unmovable if not set(power_on[irq]) <= set(sets["housekeeping"])}
    assert {entry["irq"] for entry in state["refused"]} == reaching_out
    assert state["cpus"] == "0-3"
    assert host.service("edgetune-boot.service").is_enabled


@pytest.mark.device
def test_kernel_settings_running_and_persisted(host, sysctls, plan):
    for key, value in sysctls.items():
        assert read(host, "/proc/sys/" + key) == value, key
    conf = host.file(plan["sysctl_file"] if plan else "/etc/sysctl.d/60-edgetune-cpu.conf").content_string
    for key, value in sysctls.items():
        assert re.search(r"^%s\s*=\s*%s$" % (re.escape(key.replace("/", ".")), value), conf, re.M), key
    if "kernel/numa_balancing" not in sysctls and host.file("/proc/sys/kernel/numa_balancing").exists:
        assert read(host, "/proc/sys/kernel/numa_balancing") == "0"


def test_twin_fakes_the_kernel_settings_it_does_not_own(host):
    """The values above live in the twin's own mount namespace, not in the host's /proc/sys."""
    mounts = host.file("/proc/self/mountinfo").content_string
    for key in SYSCTLS:
        assert " /proc/sys/%s " % key in mounts, key


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


# --------------------------------------------------------------------------
# What a run reports, bad input, and a reboot

@pytest.fixture(scope="module")
def check_run(host, expected):
    return converged_check_run(host, expected["bootloader"])[0]


def test_check_mode_is_clean_and_reports_unmovable_irqs_and_rt(host, twin_board, check_run):
    stats = recap(check_run.stdout, host.backend.host)
    assert stats["failed"] == 0 and stats["changed"] == 0, check_run.stdout[-3000:]
    unmovable = {int(n) for n in read(host, "/run/edgetune-twin/unmovable-irqs").split()}
    report = re.search(r"IRQ affinity: (?:would move|moved) 0 IRQ\(s\) to CPUs 0-3; (\d+) unmovable left as they are"
                       r" \(per-CPU or managed\): ([^;.]*)", " ".join(check_run.stdout.split()))
    assert report, check_run.stdout[-3000:]
    named = {int(item.split()[0]) for item in report.group(2).split(", ")}
    assert int(report.group(1)) == len(named) and named <= unmovable
    assert "arch_timer" in report.group(2)
    assert "SCHED_FIFO in ai-infer.slice: " in check_run.stdout


def test_hybrid_host_says_which_settings_it_cannot_enforce(host, unified, check_run):
    """Once, where a person reads it (the apply's record, which the audit reports as a note per fleet),
    not a paragraph per device in every apply."""
    if unified:
        pytest.skip("cgroup v2 enforces every slice setting")
    record = json.loads(host.file("/etc/edgetune/applied/edge_cgroups.json").content_string)
    [unsupported] = [c for c in record["checks"] if c["kind"] == "unsupported"]
    assert unsupported["setting"].startswith(SLICE + " AllowedCPUs")
    assert "are cgroup-v2 settings and are NOT enforced" in unsupported["reason"]
    assert "systemd.unified_cgroup_hierarchy=1" in unsupported["reason"]
    assert "are cgroup-v2 settings and are NOT enforced" not in check_run.stdout


def test_impossible_limits_fail_clearly_and_change_nothing(host, sets):
    before = host.file("/etc/systemd/system/" + SLICE).content_string
    result = run_site(host, "--tags", "edge_facts,edge_bootargs,edge_cpu,edge_cgroups",
                      "-e", "edge_cgroups_cpu_quota=%d%%" % (100 * len(sets["inference"]) + 100),
                      "-e", "edge_cgroups_memory_max=64T")
    assert recap(result.stdout, host.backend.host)["failed"] == 1, result.stdout[-3000:]
    text = " ".join(result.stdout.split())
    # Refused by the preflight's validation, before any change on any device.
    assert "refused before any change on any device (nothing was changed)" in text
    assert "is more than the %d CPU(s) of the slice" % len(sets["inference"]) in text
    assert 'edge_cgroups_memory_max = "64T"' in text and "is more than the RAM" in text
    assert host.file("/etc/systemd/system/" + SLICE).content_string == before


def test_everything_is_back_after_a_reboot(host, twin_board, sets, unified, kernel_cpus):
    reboot_twin(host)
    check_irqs(host, twin_board, sets)
    for key, value in SYSCTLS.items():
        assert read(host, "/proc/sys/" + key) == value, key
    check_slice(host, sets, unified, {"name": SLICE, "quota_cpus": len(sets["inference"]), "weight": 1000,
                                      "memory_max": {"fraction": 0.9}, "confine_system": True})
    check_probe(host, sets, unified, kernel_cpus)
    assert host.service("edgetune-probe.service").is_running
    assert EXPECTED[twin_board]["isolated"] == read(host, "/sys/devices/system/cpu/isolated")
