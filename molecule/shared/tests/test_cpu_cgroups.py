"""CPU partitioning and the inference slice on a converged twin, read back from /proc, sysfs and cgroups.
Expectations: the CPU sets from the boards' clusters (the SoCs' cpufreq policies), the
twin's own hardware model for which IRQs cannot move (its board file and
/run/edgetune-twin/unmovable-irqs), and the roles' documented defaults
(CPUWeight 1000, CPUQuota 100% per inference CPU, MemoryMax 90%, RT budget
800000 us, sysctls). Everything is checked again after a reboot of the twin.

The device checks (and their helpers) are edgetune.checks.cpu_cgroups's, collected here with
the fixtures below; `edgetune verify` runs them on devices with expectations from their plans.
"""
import json
import re

import pytest
from conftest import EXPECTED, converged_check_run, hand_written, reboot_twin, recap, run_site

from edgetune.checks.cpu_cgroups import (  # noqa: F401  (the device checks, collected here)
    SLICE, check_probe, check_slice, cpus, mask, read, rt_root_budget, test_kernel_settings_running_and_persisted,
    test_probe_in_the_slice_with_the_policy_rt_allows, test_probe_threads_run_on_the_inference_cpus,
    test_rest_of_the_system_on_housekeeping_cpus, test_slice_values_in_the_cgroup_files)

SLICE_CGROUP = "/ai.slice/ai-infer.slice"
SETS = {
    "orin-nx-16gb-r36": {"inference": [4, 5, 6, 7], "housekeeping": [0, 1, 2, 3]},
    "agx-orin-64gb-r35": {"inference": list(range(4, 12)), "housekeeping": [0, 1, 2, 3]},
    "rock5b-rk3588": {"inference": [4, 5, 6, 7], "housekeeping": [0, 1, 2, 3]},
}
SYSCTLS = {"kernel/sched_rt_runtime_us": "950000", "kernel/timer_migration": "0", "vm/stat_interval": "10"}


# The checks' expectations on the twins (edgetune.checks.plugin has verify's, from the plan).
@pytest.fixture
def sets(request):
    return hand_written(request, SETS)


@pytest.fixture
def sysctls():
    """sysctl (path below /proc/sys) -> value."""
    return SYSCTLS


@pytest.fixture
def slice_spec(sets):
    """The slice as the roles' documented defaults make it."""
    return {"name": SLICE, "quota_cpus": len(sets["inference"]), "weight": 1000,
            "memory_max": {"fraction": 0.9}, "confine_system": True, "probe": True, "probe_priority": 10}


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


def test_twin_fakes_the_kernel_settings_it_does_not_own(host):
    """The values above live in the twin's own mount namespace, not in the host's /proc/sys."""
    mounts = host.file("/proc/self/mountinfo").content_string
    for key in SYSCTLS:
        assert " /proc/sys/%s " % key in mounts, key


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


def test_the_twin_has_an_rt_budget_and_the_probe_runs_fifo_in_the_slice(host, unified):
    """`edgetune-dev twin` gives each container RT time (Docker's --cpu-rt-runtime) while the engine has
    some: the slice gets its budget (the twins' edge_cgroups_rt_runtime_us) and FIFO really runs."""
    root_budget = rt_root_budget(host, unified)
    if root_budget is None:
        pytest.skip("cgroup v2: no RT budget file")
    if root_budget == 0:
        pytest.skip("the engine had no RT time left for this twin (`edgetune-dev twin` said so when it made it)")
    assert root_budget == 50000
    threads = check_probe(host, None, unified, None)
    assert {(t["policy"], t["rt_priority"]) for t in threads} == {(1, 10)}, threads


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
