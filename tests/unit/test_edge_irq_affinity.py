"""edge_irq_affinity on fixture /proc/irq trees built like the boards' (GIC PPIs, SPIs, managed queues).

The fixture interrupts are the kinds a board has: GIC PPIs that are per-CPU
(arch_timer, arm-pmu), device SPIs and MSIs that move, and managed NVMe I/O
queue vectors that the kernel spreads itself. The kernel refuses an affinity
write to per-CPU and managed interrupts with EIO; FakeKernel does the same, and
one test uses the immutable flag (EPERM) the way the device twin does.

The writes are in plugins/module_utils/device/edge_irq.py, shared by the module and the
boot program (edge_boot.apply_dir, kind irq_affinity); FakeKernel replaces
edge_irq.write_value.
"""
import errno
import fcntl
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import edge_irq_affinity as irqmod
import pytest
from conftest import copy_module_util
import yaml

from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_cpulist

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot, edge_irq
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"

# (irq, chip, hwirq, trigger, name, kind, cpus) -- kind: movable, percpu, managed.
RK3588_IRQS = [
    (11, "GICv3", 26, "Level", "arch_timer", "percpu", None),
    (13, "GICv3", 23, "Level", "arm-pmu", "percpu", None),
    (25, "GICv3", 365, "Level", "debug", "movable", None),
    (40, "GICv3", 252, "Level", "xhci-hcd:usb1", "movable", None),
    (46, "GICv3", 125, "Level", "fb000000.gpu", "movable", None),
    (47, "GICv3", 142, "Level", "fdab0000.npu", "movable", None),
    (80, "ITS-MSI", 0, "Edge", "PCIe PME, aerdrv", "movable", None),
    (81, "ITS-MSI", 524288, "Edge", "nvme0q0", "movable", None),
    (82, "ITS-MSI", 524289, "Edge", "nvme0q1", "managed", [0, 1]),
    (83, "ITS-MSI", 524290, "Edge", "nvme0q2", "managed", [2, 3]),
    (84, "ITS-MSI", 524291, "Edge", "nvme0q3", "managed", [4, 5]),
    (85, "ITS-MSI", 524292, "Edge", "nvme0q4", "managed", [6, 7]),
    (90, "ITS-MSI", 1048576, "Edge", "enP4p65s0", "movable", None),
]
AGX_IRQS = [
    (11, "GICv3", 30, "Level", "arch_timer", "percpu", None),
    (13, "GICv3", 23, "Level", "arm-pmu", "percpu", None),
    (16, "GICv3", 144, "Level", "3100000.serial", "movable", None),
    (45, "GICv3", 102, "Level", "gk20a_stall", "movable", None),
    (60, "PCI-MSI", 0, "Edge", "PCIe PME, aerdrv", "movable", None),
    (62, "PCI-MSI", 524289, "Edge", "nvme0q1", "managed", [0]),
    (66, "PCI-MSI", 524293, "Edge", "nvme0q5", "managed", [4, 5, 6, 7]),
    (67, "PCI-MSI", 524294, "Edge", "nvme0q6", "managed", [8, 9, 10, 11]),
    (70, "GICv3", 416, "Level", "eth0", "movable", None),
]
BOARDS = {"rk3588": (8, RK3588_IRQS), "agx-orin-64gb": (12, AGX_IRQS)}


def interrupts_text(ncpus, irqs):
    """/proc/interrupts as an arm64 kernel prints it (show_interrupts: %*d: counts, %8s chip, hwirq, trigger, name)."""
    lines = [" " * 11 + "".join("CPU%-8d" % c for c in range(ncpus)).rstrip()]
    for irq, chip, hwirq, trigger, name, _kind, cpus in irqs:
        counts = "".join("%10d " % (7 if cpus is None or c in cpus else 0) for c in range(ncpus))
        lines.append("%4d: %s %8s %3d %-8s %s" % (irq, counts, chip, hwirq, trigger, name))
    lines.append(" IPI0: " + "".join("%10d " % 5 for _cpu in range(ncpus)) + "      Rescheduling interrupts")
    lines.append("Err:          0")
    return "\n".join(lines) + "\n"


def build(root, board, workqueue=True, mask_only=()):
    """A freshly booted board: every IRQ on all CPUs except the managed ones the kernel spread."""
    ncpus, irqs = BOARDS[board]
    all_cpus = list(range(ncpus))
    width = ncpus
    for irq, _chip, _hwirq, _trigger, _name, _kind, cpus in irqs:
        directory = root / "proc/irq" / str(irq)
        directory.mkdir(parents=True)
        cpus = cpus or all_cpus
        if irq not in mask_only:
            (directory / "smp_affinity_list").write_text(edge_cpulist.format_cpulist(cpus) + "\n")
        (directory / "smp_affinity").write_text(edge_cpulist.format_cpumask(cpus, width) + "\n")
        (directory / "node").write_text("0\n")
    (root / "proc/irq/default_smp_affinity").write_text(edge_cpulist.format_cpumask(all_cpus, width) + "\n")
    (root / "proc/interrupts").write_text(interrupts_text(ncpus, irqs))
    cpu = root / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-%d\n" % (ncpus - 1))
    if workqueue:
        wq = root / "sys/devices/virtual/workqueue"
        wq.mkdir(parents=True)
        (wq / "cpumask").write_text(edge_cpulist.format_cpumask(all_cpus, width) + "\n")
    return root


@pytest.fixture
def rk(tmp_path):
    return build(tmp_path / "rk", "rk3588")


@pytest.fixture
def agx(tmp_path):
    return build(tmp_path / "agx", "agx-orin-64gb")


class FakeKernel:
    """write_value with the kernel's answers: EIO for per-CPU and managed IRQs, both files kept in step."""

    def __init__(self, board, refuse_errno=errno.EIO, fail=None):
        self.ncpus, irqs = BOARDS[board]
        self.unmovable = {irq for irq, *_rest, kind, _cpus in irqs if kind != "movable"}
        self.refuse_errno = refuse_errno
        self.fail = fail or {}
        self.log = []

    def __call__(self, path, value):
        self.log.append((path, value))
        parts = path.split(os.sep)
        if path in self.fail:
            raise OSError(self.fail[path], os.strerror(self.fail[path]))
        if "irq" in parts and parts[-1].startswith("smp_affinity") and int(parts[-2]) in self.unmovable:
            raise OSError(self.refuse_errno, os.strerror(self.refuse_errno))
        if parts[-1] == "smp_affinity_list":
            cpus = edge_cpulist.parse_cpulist(value)
        elif parts[-1] in ("smp_affinity", "default_smp_affinity", "cpumask"):
            cpus = edge_cpulist.parse_cpumask(value)
        else:
            raise AssertionError("unexpected write to %s" % path)
        with open(path, "w") as handle:
            handle.write("%s\n" % value)
        if parts[-1].startswith("smp_affinity"):
            directory = os.path.dirname(path)
            other = "smp_affinity" if parts[-1] == "smp_affinity_list" else "smp_affinity_list"
            if os.path.exists(os.path.join(directory, other)):
                text = edge_cpulist.format_cpumask(cpus, self.ncpus) if other == "smp_affinity" \
                    else edge_cpulist.format_cpulist(cpus)
                with open(os.path.join(directory, other), "w") as handle:
                    handle.write(text + "\n")


def affinity(root, irq):
    return (root / "proc/irq" / str(irq) / "smp_affinity_list").read_text().strip()


def snapshot(root):
    found = {}
    for directory, _dirs, names in os.walk(str(root)):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                found[path] = handle.read()
    return found


def run_module(args, capsys, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            irqmod.main()
    return json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------
# /proc/interrupts and the hints

def test_parses_arm64_rows_with_names_containing_spaces():
    parsed = edge_irq.parse_interrupts(interrupts_text(8, RK3588_IRQS))
    assert sorted(parsed) == [irq for irq, *_rest in RK3588_IRQS]
    assert parsed[11] == {"chip": "GICv3", "hwirq": 26, "trigger": "Level", "name": "arch_timer"}
    assert parsed[80]["name"] == "PCIe PME, aerdrv"
    assert parsed[84] == {"chip": "ITS-MSI", "hwirq": 524291, "trigger": "Edge", "name": "nvme0q3"}


def test_parses_x86_rows_and_skips_rows_without_a_number():
    text = ("            CPU0       CPU1\n"
            "   0:         10          0   IO-APIC   2-edge      timer\n"
            "  36:          0     392434 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n"
            " 124:          0          0  IR-PCI-MSI 524288-edge      nvme0q0\n"
            "  24:          1          0  IO-APIC   5-fasteoi\n"
            " NMI:          0          0   Non-maskable interrupts\n"
            " LOC:     123456     654321   Local timer interrupts\n")
    parsed = edge_irq.parse_interrupts(text)
    assert sorted(parsed) == [0, 24, 36, 124]
    assert parsed[36] == {"chip": "PCI-MSIX-0000:00:02.0", "hwirq": 1, "trigger": "edge", "name": "virtio1-req.0"}
    assert parsed[124]["name"] == "nvme0q0" and parsed[124]["hwirq"] == 524288
    assert parsed[24]["name"] == "" and parsed[24]["trigger"] == "fasteoi"


def test_parses_a_row_of_unknown_shape_without_failing():
    parsed = edge_irq.parse_interrupts("      CPU0\n  5:   3   dummy-chip  some name here\n")
    assert parsed[5]["chip"] == "dummy-chip" and parsed[5]["name"] == "some name here"
    assert edge_irq.parse_interrupts("") == {}


@pytest.mark.parametrize("info, expected", [
    ({"chip": "GICv3", "hwirq": 26, "name": "whatever"}, "per-CPU interrupt (GIC PPI 26)"),
    ({"chip": "GICv2", "hwirq": 16, "name": "x"}, "per-CPU interrupt (GIC PPI 16)"),
    ({"chip": "GICv3", "hwirq": 32, "name": "x"}, None),  # first SPI
    ({"chip": "GICv3", "hwirq": 15, "name": "x"}, None),  # SGI, not in /proc/irq on a real board
    ({"chip": "IO-APIC", "hwirq": 26, "name": "arch_timer"}, "per-CPU interrupt (arch_timer)"),
    ({"chip": "ITS-MSI", "hwirq": 1, "name": "nvme0q1"}, "managed interrupt (multi-queue device: nvme0q1)"),
    ({"chip": "ITS-MSI", "hwirq": 1, "name": "nvme1q12"}, "managed interrupt (multi-queue device: nvme1q12)"),
    ({"chip": "ITS-MSI", "hwirq": 0, "name": "nvme0q0"}, None),  # the admin queue moves
    ({"chip": "PCI-MSIX", "hwirq": 1, "name": "virtio1-req.0"},
     "managed interrupt (multi-queue device: virtio1-req.0)"),
    ({"chip": "PCI-MSIX", "hwirq": 1, "name": "virtio2-input.0"}, None),
])
def test_hints(info, expected):
    assert edge_irq.hint(info, []) == expected


def test_extra_patterns_label_an_interrupt():
    import re
    reason = edge_irq.hint({"chip": "GICv3", "hwirq": 99, "name": "tegra-hsp"}, [re.compile("^tegra-hsp$")])
    assert reason == "named unmovable by unmovable_names (^tegra-hsp$)"


# --------------------------------------------------------------------------
# Moving, refusing, read-back

def test_moves_movable_irqs_and_reports_the_refusals(rk, monkeypatch):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    plan = edge_irq.run(str(rk), "0-3")
    assert not plan.errors
    moved = {m["irq"]: (m["before"], m["after"]) for m in plan.moved}
    assert moved == {irq: ("0-7", "0-3") for irq in (25, 40, 46, 47, 80, 81, 90)}
    for irq in moved:
        assert affinity(rk, irq) == "0-3"
        assert (rk / "proc/irq" / str(irq) / "smp_affinity").read_text().strip() == "0f"
    unmovable = {u["irq"]: u for u in plan.unmovable}
    assert sorted(unmovable) == [11, 13, 84, 85]
    assert unmovable[11]["reason"] == "refused (EIO): per-CPU interrupt (GIC PPI 26)"
    assert unmovable[84]["reason"] == "refused (EIO): managed interrupt (multi-queue device: nvme0q3)"
    assert unmovable[84]["affinity"] == "4-5" and unmovable[84]["outside"] is True
    # Unmovable ones are left exactly as they were.
    assert [affinity(rk, irq) for irq in (11, 13, 84, 85)] == ["0-7", "0-7", "4-5", "6-7"]
    # Managed vectors already inside the housekeeping set are kept, not even tried.
    assert {k["irq"] for k in plan.kept} == {82, 83}
    assert not [p for p, _v in kernel.log if "/82/" in p or "/83/" in p]
    assert plan.default_affinity == {"path": str(rk / "proc/irq/default_smp_affinity"), "before": "0-7",
                                     "after": "0-3", "changed": True}
    assert (rk / "proc/irq/default_smp_affinity").read_text().strip() == "0f"
    assert plan.workqueue["after"] == "0-3"
    assert (rk / "sys/devices/virtual/workqueue/cpumask").read_text().strip() == "0f"
    assert "11 arch_timer" in irqmod.summary(plan, "0-3") and "4 unmovable" in irqmod.summary(plan, "0-3")


def test_second_run_changes_nothing(rk, monkeypatch):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    edge_irq.run(str(rk), "0-3")
    before = snapshot(rk)
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    plan = edge_irq.run(str(rk), "0-3")
    assert plan.moved == [] and not plan.default_affinity["changed"] and not plan.workqueue["changed"]
    assert len(plan.unmovable) == 4  # still reported: the kernel still refuses them
    assert snapshot(rk) == before
    assert all("/11/" in p or "/13/" in p or "/84/" in p or "/85/" in p for p, _v in kernel.log)


def test_without_keep_subsets_every_movable_irq_gets_exactly_the_set(agx, monkeypatch):
    (agx / "proc/irq/16/smp_affinity_list").write_text("1\n")
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("agx-orin-64gb"))
    kept = edge_irq.run(str(agx), "0-3")
    assert affinity(agx, 16) == "1" and {k["irq"] for k in kept.kept} == {16, 62}
    plan = edge_irq.run(str(agx), "0-3", keep_subsets=False)
    assert affinity(agx, 16) == "0-3"
    assert {u["irq"] for u in plan.unmovable} == {11, 13, 62, 66, 67}


def test_eperm_from_a_locked_file_counts_as_unmovable(agx, monkeypatch):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("agx-orin-64gb", refuse_errno=errno.EPERM))
    plan = edge_irq.run(str(agx), "0-3")
    assert not plan.errors
    assert {u["irq"]: u["reason"].split(":")[0] for u in plan.unmovable} == {
        11: "refused (EPERM)", 13: "refused (EPERM)", 66: "refused (EPERM)", 67: "refused (EPERM)"}


def test_a_refusal_without_a_hint_is_still_unmovable(rk, monkeypatch):
    kernel = FakeKernel("rk3588")
    kernel.unmovable.add(25)  # "debug": no name or chip hint
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    plan = edge_irq.run(str(rk), "0-3")
    entry = next(u for u in plan.unmovable if u["irq"] == 25)
    assert entry["reason"] == "refused (EIO): not movable (per-CPU or managed)"
    assert affinity(rk, 25) == "0-7"


def test_other_write_errors_fail_and_name_the_file(rk, monkeypatch):
    path = str(rk / "proc/irq/40/smp_affinity_list")
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588", fail={path: errno.EINVAL}))
    plan = edge_irq.run(str(rk), "0-3")
    assert plan.errors == ["writing 0-3 to %s failed: Invalid argument" % path]
    assert affinity(rk, 40) == "0-7"
    assert affinity(rk, 46) == "0-3"  # the others were still done


def test_a_value_that_does_not_stick_is_an_error(rk, monkeypatch):
    def stubborn(path, value):
        if path.endswith("/46/smp_affinity_list"):
            return  # accepted, but nothing changes
        FakeKernel("rk3588")(path, value)
    monkeypatch.setattr(edge_irq, "write_value", stubborn)
    plan = edge_irq.run(str(rk), "0-3")
    assert plan.errors == ["%s reads 0-7 after writing 0-3" % (rk / "proc/irq/46/smp_affinity_list")]
    assert 46 not in {m["irq"] for m in plan.moved}


def test_older_kernels_with_only_smp_affinity_masks(tmp_path, monkeypatch):
    root = build(tmp_path / "old", "agx-orin-64gb", mask_only={16, 45})
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("agx-orin-64gb"))
    plan = edge_irq.run(str(root), "0-3")
    assert (root / "proc/irq/16/smp_affinity").read_text().strip() == "00f"
    assert {16, 45} <= {m["irq"] for m in plan.moved}


def test_kernel_without_workqueue_cpumask_is_reported_not_an_error(tmp_path, monkeypatch):
    root = build(tmp_path / "nowq", "rk3588", workqueue=False)
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    plan = edge_irq.run(str(root), "0-3")
    assert not plan.errors
    assert plan.workqueue["absent"] is True
    assert "no unbound workqueue cpumask" in irqmod.summary(plan, "0-3")


def test_workqueue_and_default_affinity_can_be_left_alone(rk, monkeypatch):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    plan = edge_irq.run(str(rk), "0-3", default_affinity=False, workqueue=False)
    assert plan.default_affinity is None and plan.workqueue is None
    assert (rk / "proc/irq/default_smp_affinity").read_text().strip() == "ff"
    assert (rk / "sys/devices/virtual/workqueue/cpumask").read_text().strip() == "ff"


@pytest.mark.parametrize("cpus, message", [
    ("0-3,x", "cpus: invalid CPU list item 'x' in '0-3,x'"),
    ("", "cpus is empty: give the housekeeping CPUs, for example 0-3"),
    ("0-3,9", "housekeeping CPUs 9 are not online (online: 0-7); nothing was changed"),
])
def test_bad_cpus_fail_and_nothing_is_written(rk, monkeypatch, cpus, message):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    before = snapshot(rk)
    with pytest.raises(EdgeError) as info:
        edge_irq.run(str(rk), cpus)
    assert info.value.errors == [message]
    assert kernel.log == [] and snapshot(rk) == before


def test_bad_unmovable_pattern_fails_before_writing(rk, monkeypatch):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    with pytest.raises(EdgeError, match="bad regular expression"):
        edge_irq.run(str(rk), "0-3", unmovable_names=["nvme(["])
    assert kernel.log == []


def test_missing_proc_irq_is_a_clear_error(tmp_path):
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-7\n")
    with pytest.raises(EdgeError, match="cannot read .*proc/irq"):
        edge_irq.run(str(tmp_path), "0-3")


# --------------------------------------------------------------------------
# Check mode

def test_check_mode_writes_nothing_and_predicts(rk, monkeypatch):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    before = snapshot(rk)
    plan = edge_irq.run(str(rk), "0-3", check_mode=True)
    assert kernel.log == [] and snapshot(rk) == before
    assert {m["irq"] for m in plan.moved} == {25, 40, 46, 47, 80, 81, 90}
    assert {u["irq"]: u["reason"] for u in plan.unmovable} == {
        11: "predicted: per-CPU interrupt (GIC PPI 26)", 13: "predicted: per-CPU interrupt (GIC PPI 23)",
        84: "predicted: managed interrupt (multi-queue device: nvme0q3)",
        85: "predicted: managed interrupt (multi-queue device: nvme0q4)"}
    assert plan.default_affinity["after"] == "0-3" and plan.default_affinity["changed"]
    # The plan is what a real run then does.
    real = edge_irq.run(str(rk), "0-3")
    assert [m["irq"] for m in real.moved] == [m["irq"] for m in plan.moved]
    assert [u["irq"] for u in real.unmovable] == [u["irq"] for u in plan.unmovable]


def test_check_mode_learns_refusals_without_hints_from_the_state_file(rk, monkeypatch):
    kernel = FakeKernel("rk3588")
    kernel.unmovable.add(25)
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    edge_irq.run(str(rk), "0-3")
    blind = edge_irq.run(str(rk), "0-3", check_mode=True)
    assert [m["irq"] for m in blind.moved] == [25]  # no hint: predicted to move
    told = edge_irq.run(str(rk), "0-3", known_refused={"25 debug"}, check_mode=True)
    assert told.moved == []
    assert next(u for u in told.unmovable if u["irq"] == 25)["reason"] == \
        "predicted: refused on an earlier run (state file)"


# --------------------------------------------------------------------------
# The module: diff, state file, check mode

def test_module_moves_writes_the_state_file_and_shows_the_diff(rk, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    state = tmp_path / "etc/edgetune/cpu-affinity.json"
    args = {"cpus": "0-3", "root": str(rk), "state_file": str(state)}
    result = run_module(args, capsys, diff=True)
    assert result["changed"] is True and result["state_file_changed"] is True
    assert result["unmovable_count"] == 4
    assert [u["name"] for u in result["unmovable"]] == ["arch_timer", "arm-pmu", "nvme0q3", "nvme0q4"]
    assert result["msg"].startswith("moved 7 IRQ(s) to CPUs 0-3; 4 unmovable left as they are")
    irq_diff = result["diff"][0]
    assert "%s: 0-7\n" % (rk / "proc/irq/40/smp_affinity_list") in irq_diff["before"]
    assert "%s: 0-3\n" % (rk / "proc/irq/40/smp_affinity_list") in irq_diff["after"]
    assert "%s: 0-7\n" % (rk / "proc/irq/11/smp_affinity_list") in irq_diff["after"]  # unmovable, unchanged
    doc = json.loads(state.read_text())
    assert (doc["format"], doc["kind"], doc["generated_by"]) == (1, "irq_affinity", "edge_irq_affinity")
    assert doc["settings"] == {"cpus": "0-3", "keep_subsets": True, "default_affinity": True, "workqueue": True,
                               "unmovable_names": [], "refused": doc["settings"]["refused"]}
    assert doc["settings"]["refused"] == [{"irq": 11, "name": "arch_timer"}, {"irq": 13, "name": "arm-pmu"},
                                          {"irq": 84, "name": "nvme0q3"}, {"irq": 85, "name": "nvme0q4"}]
    assert result["diff"][1]["after"] == state.read_text()

    again = run_module(args, capsys)
    assert again["changed"] is False and again["state_file_changed"] is False
    check = run_module(args, capsys, check=True, diff=True)
    assert check["changed"] is False
    assert check["diff"][0]["before"] == check["diff"][0]["after"]


def test_a_refused_irq_the_kernel_later_placed_stays_remembered(rk, tmp_path, monkeypatch, capsys):
    """After a reboot with irqaffinity=, the kernel itself starts a refused IRQ on the
    housekeeping CPUs: the state file must not change (check mode stays clean)."""
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    state = tmp_path / "etc/edgetune/cpu-affinity.json"
    args = {"cpus": "0-3", "root": str(rk), "state_file": str(state)}
    run_module(args, capsys)
    recorded = state.read_text()
    (rk / "proc/irq/11/smp_affinity_list").write_text("0-3\n")
    check = run_module(args, capsys, check=True)
    assert check["changed"] is False and check["state_file_changed"] is False
    assert run_module(args, capsys)["changed"] is False
    assert state.read_text() == recorded


def test_module_check_mode_writes_neither_sysfs_nor_state(rk, tmp_path, monkeypatch, capsys):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    state = tmp_path / "state.json"
    before = snapshot(rk)
    result = run_module({"cpus": "0-3", "root": str(rk), "state_file": str(state)}, capsys, check=True)
    assert result["changed"] is True and result["state_file_changed"] is True
    assert kernel.log == [] and snapshot(rk) == before and not state.exists()


def test_module_failure_is_one_clear_message(rk, capsys, monkeypatch):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    result = run_module({"cpus": "0-3,12", "root": str(rk)}, capsys)
    assert result["failed"] is True
    assert result["msg"] == "housekeeping CPUs 12 are not online (online: 0-7); nothing was changed"


def test_module_failed_write_reports_what_was_done(rk, capsys, monkeypatch, tmp_path):
    path = str(rk / "proc/irq/90/smp_affinity_list")
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588", fail={path: errno.EBUSY}))
    state = tmp_path / "state.json"
    result = run_module({"cpus": "0-3", "root": str(rk), "state_file": str(state)}, capsys)
    assert result["failed"] is True and "Device or resource busy" in result["msg"]
    assert result["changed"] is True and {m["irq"] for m in result["moved"]} >= {25, 40}
    assert not state.exists()


def test_module_check_mode_learns_refusals_from_its_state_file(rk, tmp_path, monkeypatch, capsys):
    """A refusal /proc/interrupts gives no hint for is predicted from the state file's record."""
    kernel = FakeKernel("rk3588")
    kernel.unmovable.add(25)
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    state = edge_boot.state_path("irq_affinity", str(tmp_path / "boot.d"))
    args = {"cpus": "0-3", "root": str(rk), "state_file": state}
    run_module(args, capsys)
    assert {"irq": 25, "name": "debug"} in edge_irq.read_state(state)[1]["refused"]
    check = run_module(args, capsys, check=True)
    assert check["changed"] is False and check["moved"] == []
    assert next(u for u in check["unmovable"] if u["irq"] == 25)["reason"] == \
        "predicted: refused on an earlier run (state file)"
    # Without the record, check mode predicts a move the kernel would refuse.
    assert [m["irq"] for m in run_module({"cpus": "0-3", "root": str(rk)}, capsys, check=True)["moved"]] == [25]


def test_module_replaces_a_state_file_of_the_old_format(rk, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    state = tmp_path / "cpu-affinity.json"
    state.write_text(json.dumps({"format": 1, "generated_by": "edge_irq_affinity", "cpus": "0-3", "refused": []}))
    assert edge_irq.read_state(str(state)) == (state.read_text(), None)
    result = run_module({"cpus": "0-3", "root": str(rk), "state_file": str(state)}, capsys)
    assert result["state_file_changed"] is True
    assert edge_boot.read(str(state), "irq_affinity")[1]["cpus"] == "0-3"


def test_read_state_gives_the_settings_the_audit_reads(tmp_path):
    state = tmp_path / "irq-affinity.json"
    assert edge_irq.read_state(str(state)) == (None, None)
    settings = {"cpus": "0-3", "keep_subsets": True, "default_affinity": True, "workqueue": True,
                "unmovable_names": [], "refused": [{"irq": 11, "name": "arch_timer"}, {"irq": 95, "name": ""}]}
    state.write_text(edge_boot.document("irq_affinity", settings, "edge_irq_affinity"))
    text, read = edge_irq.read_state(str(state))
    assert text == state.read_text() and read == settings
    assert edge_irq.known_refusals(read) == {"11 arch_timer", "95 "}
    # Another kind's state is not this module's record.
    state.write_text(edge_boot.document("dvfs", settings, "edge_dvfs"))
    assert edge_irq.read_state(str(state))[1] is None
    assert edge_irq.known_refusals(None) == set() and edge_irq.known_refusals({"refused": 3}) == set()


# --------------------------------------------------------------------------
# The boot-time re-apply: edge_boot.apply_dir runs edge_irq.boot_apply

def _reboot(root, board):
    shutil.rmtree(str(root / "proc"))
    shutil.rmtree(str(root / "sys"))
    build(root, board)


def _interpreters():
    found = [sys.executable]
    if os.path.exists(PY38):
        found.append(PY38)
    return found


def _immutable(path):
    """Make a file refuse writes like the twin's per-CPU IRQ files (EPERM); False when unsupported."""
    flags_get, flags_set, immutable = 0x80086601, 0x40086602, 0x10
    try:
        with open(path, "rb") as handle:
            flags = struct.unpack("l", fcntl.ioctl(handle, flags_get, struct.pack("l", 0)))[0]
            fcntl.ioctl(handle, flags_set, struct.pack("l", flags | immutable))
        return True
    except OSError:
        return False


def _mutable(path):
    flags_get, flags_set, immutable = 0x80086601, 0x40086602, 0x10
    with open(path, "rb") as handle:
        flags = struct.unpack("l", fcntl.ioctl(handle, flags_get, struct.pack("l", 0)))[0]
        fcntl.ioctl(handle, flags_set, struct.pack("l", flags & ~immutable))


# What the boot program needs on the device for this kind: edge_boot and the module utilities
# edge_irq imports, in the collection's package layout (what the role edge_boot installs).
BOOT_FILES = ("edge_boot", "edge_error", "edge_fileio", "edge_cpulist", "edge_irq")


def _install_boot(install):
    package = install / "ansible_collections/edgetune/fleet/plugins/module_utils"
    package.mkdir(parents=True)
    for name in BOOT_FILES:
        copy_module_util(name, package)
    return install


def _boot(python, install, state_dir, root):
    """The boot unit's command, from the installed layout, with no Ansible and no PYTHONPATH."""
    return subprocess.run([python, "-m", edge_boot.PACKAGE + ".edge_boot", "--state-dir", str(state_dir),
                           "--root", str(root)], cwd=str(install), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, PYTHONPATH=""), check=False)


def _state(state_dir, **settings):
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "irq-affinity.json"
    path.write_text(edge_boot.document("irq_affinity", dict({"cpus": "0-3"}, **settings), "edge_irq_affinity"))
    return path


def test_the_boot_program_installs_what_edge_irq_imports():
    assert set(BOOT_FILES) <= set(boot_program_names())
    assert edge_boot.UTILS["irq_affinity"] == "edge_irq"


@pytest.mark.parametrize("python", _interpreters())
def test_boot_reapplies_after_reboot_with_really_refusing_files(rk, tmp_path, python):
    locked = [rk / "proc/irq" / str(irq) / name for irq in (11, 13, 84, 85)
              for name in ("smp_affinity_list", "smp_affinity")]
    state_dir = tmp_path / "boot.d"
    _state(state_dir, keep_subsets=True, default_affinity=True, workqueue=True, unmovable_names=[], refused=[])
    install = _install_boot(tmp_path / "usr/local/lib/edgetune")
    if not all(_immutable(str(path)) for path in locked):
        for path in locked:
            try:
                _mutable(str(path))
            except OSError:
                pass
        pytest.skip("this filesystem or user cannot set the immutable flag")
    try:
        done = _boot(python, install, state_dir, rk)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        lines = done.stdout.splitlines()
        assert "edgetune-boot: irq_affinity: irq 40 (xhci-hcd:usb1): 0-7 -> 0-3" in lines
        assert "edgetune-boot: irq_affinity: %s: 0-7 -> 0-3" % (rk / "sys/devices/virtual/workqueue/cpumask") in lines
        assert lines[-1] == ("edgetune-boot: irq_affinity: 4 unmovable IRQ(s) left as they are: "
                             "11 arch_timer, 13 arm-pmu, 84 nvme0q3, 85 nvme0q4")
        assert affinity(rk, 40) == "0-3" and affinity(rk, 11) == "0-7" and affinity(rk, 84) == "4-5"
        assert (rk / "sys/devices/virtual/workqueue/cpumask").read_text().strip() == "0f"
    finally:
        for path in locked:
            _mutable(str(path))


def test_boot_reapplies_the_modules_state_file_without_ansible(rk, tmp_path, monkeypatch, capsys):
    """What the module saved is what the installed boot program applies after a reboot (Python 3.8 when there)."""
    python = PY38 if os.path.exists(PY38) else sys.executable
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    state_dir = tmp_path / "etc/edgetune/boot.d"
    run_module({"cpus": "0-3", "root": str(rk), "state_file": edge_boot.state_path("irq_affinity", str(state_dir))},
               capsys)
    _reboot(rk, "rk3588")
    # Plain files and no FakeKernel in the subprocess: nothing refuses, every IRQ moves.
    done = _boot(python, _install_boot(tmp_path / "usr/local/lib/edgetune"), state_dir, rk)
    assert done.returncode == 0, done.stderr
    assert "edgetune-boot: irq_affinity: irq 90 (enP4p65s0): 0-7 -> 0-3" in done.stdout.splitlines()
    assert affinity(rk, 90) == "0-3" and affinity(rk, 84) == "0-3"
    assert (rk / "proc/irq/default_smp_affinity").read_text().strip() == "0f"


def test_apply_dir_reapplies_with_the_kernels_refusals(rk, tmp_path, monkeypatch):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    state_dir = tmp_path / "boot.d"
    _state(state_dir)
    out, err = io.StringIO(), io.StringIO()
    assert edge_boot.apply_dir(str(state_dir), str(rk), out, err) == 0
    assert err.getvalue() == ""
    assert out.getvalue().splitlines() == [
        "edgetune-boot: irq_affinity: irq %d (%s): 0-7 -> 0-3" % (irq, name) for irq, name in (
            (25, "debug"), (40, "xhci-hcd:usb1"), (46, "fb000000.gpu"), (47, "fdab0000.npu"),
            (80, "PCIe PME, aerdrv"), (81, "nvme0q0"), (90, "enP4p65s0"))] + [
        "edgetune-boot: irq_affinity: %s: 0-7 -> 0-3" % (rk / "proc/irq/default_smp_affinity"),
        "edgetune-boot: irq_affinity: %s: 0-7 -> 0-3" % (rk / "sys/devices/virtual/workqueue/cpumask"),
        "edgetune-boot: irq_affinity: 4 unmovable IRQ(s) left as they are: "
        "11 arch_timer, 13 arm-pmu, 84 nvme0q3, 85 nvme0q4"]
    assert affinity(rk, 25) == "0-3" and affinity(rk, 84) == "4-5"
    assert (rk / "proc/irq/default_smp_affinity").read_text().strip() == "0f"
    # Applied again (the unit restarted): nothing moves, the refusals are reported again.
    out = io.StringIO()
    before = snapshot(rk)
    assert edge_boot.apply_dir(str(state_dir), str(rk), out, io.StringIO()) == 0
    assert out.getvalue() == ("edgetune-boot: irq_affinity: 4 unmovable IRQ(s) left as they are: "
                              "11 arch_timer, 13 arm-pmu, 84 nvme0q3, 85 nvme0q4\n")
    assert snapshot(rk) == before


def test_apply_dir_follows_the_saved_options(tmp_path, monkeypatch):
    root = build(tmp_path / "agx", "agx-orin-64gb")
    (root / "proc/irq/16/smp_affinity_list").write_text("1\n")
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("agx-orin-64gb"))
    state_dir = tmp_path / "boot.d"
    _state(state_dir, keep_subsets=False, default_affinity=False, workqueue=False, unmovable_names=["^eth0$"])
    out = io.StringIO()
    assert edge_boot.apply_dir(str(state_dir), str(root), out, io.StringIO()) == 0
    assert affinity(root, 16) == "0-3"  # not kept: keep_subsets false
    assert "edgetune-boot: irq_affinity: irq 16 (3100000.serial): 1 -> 0-3" in out.getvalue().splitlines()
    assert (root / "proc/irq/default_smp_affinity").read_text().strip() == "fff"
    assert (root / "sys/devices/virtual/workqueue/cpumask").read_text().strip() == "fff"


@pytest.mark.parametrize("content, message", [
    ("{not json", "edgetune-boot: error: state file %s is not JSON"),
    (json.dumps({"format": 1, "cpus": "0-3"}), "edgetune-boot: error: state file %s is not an edgetune boot-time"),
    (json.dumps([1]), "edgetune-boot: error: state file %s is not an edgetune boot-time"),
    (edge_boot.document("irq_affinity", {"cpus": 3}, "test"),
     "edgetune-boot: irq_affinity: error: irq_affinity setting cpus must be a CPU list string"),
    (edge_boot.document("irq_affinity", {"cpus": "0-3,x"}, "test"),
     "edgetune-boot: irq_affinity: error: cpus: invalid CPU list item 'x'"),
])
def test_apply_dir_rejects_a_bad_state_file_and_writes_nothing(rk, tmp_path, content, message, monkeypatch):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    state_dir = tmp_path / "boot.d"
    state_dir.mkdir()
    state = state_dir / "irq-affinity.json"
    state.write_text(content)
    before = snapshot(rk)
    out, err = io.StringIO(), io.StringIO()
    assert edge_boot.apply_dir(str(state_dir), str(rk), out, err) == 1
    assert len(err.getvalue().splitlines()) == 1
    assert err.getvalue().startswith(message.replace("%s", str(state))), err.getvalue()
    assert out.getvalue() == "" and kernel.log == [] and snapshot(rk) == before


def test_apply_dir_without_a_state_file_does_nothing(rk, tmp_path, monkeypatch):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    out, err = io.StringIO(), io.StringIO()
    assert edge_boot.apply_dir(str(tmp_path / "absent"), str(rk), out, err) == 0
    assert out.getvalue() == err.getvalue() == "" and kernel.log == []


def test_apply_dir_reports_a_failed_write_and_exits_1(rk, tmp_path, monkeypatch):
    path = str(rk / "proc/irq/40/smp_affinity_list")
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588", fail={path: errno.EINVAL}))
    state_dir = tmp_path / "boot.d"
    _state(state_dir)
    out, err = io.StringIO(), io.StringIO()
    assert edge_boot.apply_dir(str(state_dir), str(rk), out, err) == 1
    assert err.getvalue() == "edgetune-boot: irq_affinity: error: writing 0-3 to %s failed: Invalid argument\n" % path
    assert "edgetune-boot: irq_affinity: irq 46 (fb000000.gpu): 0-7 -> 0-3" in out.getvalue().splitlines()
    assert affinity(rk, 40) == "0-7" and affinity(rk, 46) == "0-3"  # the others were still done
    assert (rk / "sys/devices/virtual/workqueue/cpumask").read_text().strip() == "0f"


def test_boot_apply_offline_cpus_write_nothing(rk, monkeypatch):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    with pytest.raises(EdgeError) as info:
        edge_irq.boot_apply({"cpus": "0-3,9"}, str(rk))
    assert info.value.errors == ["housekeeping CPUs 9 are not online (online: 0-7); nothing was changed"]
    assert kernel.log == []


@pytest.mark.parametrize("settings, messages", [
    (["0-3"], ["irq_affinity settings must be a mapping of cpus, default_affinity, keep_subsets, refused, "
               "unmovable_names, workqueue, not list"]),
    ({}, ['irq_affinity setting cpus is missing: give the housekeeping CPUs as a CPU list string, for example "0-3"']),
    ({"cpus": ["0-3"]}, ["irq_affinity setting cpus must be a CPU list string such as \"0-3\", not ['0-3']"]),
    ({"cpus": "0-3", "keep_subsets": "yes"}, ["irq_affinity setting keep_subsets must be true or false, not 'yes'"]),
    ({"cpus": "0-3", "default_affinity": 1}, ["irq_affinity setting default_affinity must be true or false, not 1"]),
    ({"cpus": "0-3", "workqueue": None}, ["irq_affinity setting workqueue must be true or false, not None"]),
    ({"cpus": "0-3", "unmovable_names": "nvme"},
     ["irq_affinity setting unmovable_names must be a list of regular expressions (strings), not 'nvme'"]),
    ({"cpus": "0-3", "unmovable_names": [1]},
     ["irq_affinity setting unmovable_names must be a list of regular expressions (strings), not [1]"]),
    ({"cpus": "0-3", "refused": {}}, ["irq_affinity setting refused must be a list of {irq, name}, not {}"]),
    ({"cpus": "0-3", "cpu": "0-3", "workqueue": "no"},
     ["unknown irq_affinity setting(s) cpu (allowed: cpus, default_affinity, keep_subsets, refused, "
      "unmovable_names, workqueue)", "irq_affinity setting workqueue must be true or false, not 'no'"]),
    ({"cpus": "0-3", "unmovable_names": ["nvme(["]}, None),
])
def test_boot_apply_refuses_malformed_settings_and_writes_nothing(rk, monkeypatch, settings, messages):
    kernel = FakeKernel("rk3588")
    monkeypatch.setattr(edge_irq, "write_value", kernel)
    before = snapshot(rk)
    with pytest.raises(EdgeError) as info:
        edge_irq.boot_apply(settings, str(rk))
    if messages is None:
        assert info.value.errors[0].startswith("unmovable_names: bad regular expression")
    else:
        assert info.value.errors == messages
    assert kernel.log == [] and snapshot(rk) == before


def test_boot_apply_defaults_to_what_the_module_defaults_to(rk, monkeypatch):
    monkeypatch.setattr(edge_irq, "write_value", FakeKernel("rk3588"))
    changes, errors = edge_irq.boot_apply({"cpus": "0-3"}, str(rk))
    assert errors == []
    assert "%s: 0-7 -> 0-3" % (rk / "proc/irq/default_smp_affinity") in changes
    assert "%s: 0-7 -> 0-3" % (rk / "sys/devices/virtual/workqueue/cpumask") in changes
    assert len([c for c in changes if c.startswith("irq ")]) == 7


# --------------------------------------------------------------------------
# Documentation matches the argument spec

def test_documentation_matches_argument_spec(monkeypatch):
    captured = {}

    class Stop(Exception):
        pass

    def fake_module(**kwargs):
        captured.update(kwargs)
        raise Stop()

    monkeypatch.setattr(irqmod, "AnsibleModule", fake_module)
    with pytest.raises(Stop):
        irqmod.main()
    doc = yaml.safe_load(irqmod.DOCUMENTATION)
    yaml.safe_load(irqmod.EXAMPLES)
    yaml.safe_load(irqmod.RETURN)
    spec = captured["argument_spec"]
    assert set(doc["options"]) == set(spec)
    for name, option in spec.items():
        assert doc["options"][name]["type"] == option.get("type", "str"), name
        assert doc["options"][name].get("default") == option.get("default"), name
        assert doc["options"][name].get("required", False) == option.get("required", False), name
    assert captured["supports_check_mode"] is True
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert doc["attributes"]["diff_mode"]["support"] == "full"


def boot_program_names():
    """The module names of the files role edge_boot installs for the boot program (the plan's)."""
    from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_package import program_files
    return [f["src"].rsplit("/", 1)[-1][:-len(".py")] for f in program_files("boot")]
