"""The boot program (module_utils/device/edge_boot.py): one state format, every file on its own, in the boot's order.

The kinds' own appliers are tested with their modules (test_edge_irq_affinity, test_edge_dvfs,
test_edge_pcie, test_edge_cgroup_rt, test_edge_jetson_clocks); here the format, the order and
the isolation of failures, with stand-in appliers that record what they were given, and the
program as the unit runs it: installed alone in the collection's package layout, no Ansible.
"""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import install_boot_program, run_boot_program as run

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_plan import boot_part

REPO = Path(__file__).resolve().parents[2]
PY38 = REPO / ".venv38" / "bin" / "python"


@pytest.fixture
def applied(monkeypatch):
    """Each kind's applier replaced by one that records the call and answers from the settings."""
    calls = []
    for kind, util in edge_boot.KINDS:
        fake = types.ModuleType("fake_" + util)

        def boot_apply(settings, root, kind=kind):
            calls.append((kind, settings, root))
            if settings.get("raise"):
                raise EdgeError(settings["raise"])
            if settings.get("crash"):
                raise KeyError(settings["crash"])
            return list(settings.get("changes", [])), list(settings.get("errors", []))

        fake.boot_apply = boot_apply
        monkeypatch.setitem(sys.modules, edge_boot.PACKAGE + "." + util, fake)
    return calls


def save(state_dir, kind, settings):
    path = Path(edge_boot.state_path(kind, str(state_dir)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(edge_boot.document(kind, settings, "test"))
    return path


def test_the_state_file_is_one_format_for_every_kind():
    text = edge_boot.document("dvfs", {"cpufreq": [{"policy": 4, "governor": "performance"}], "devfreq": []},
                              "edge_dvfs")
    assert text.endswith("}\n")
    assert json.loads(text) == {"format": 1, "kind": "dvfs", "generated_by": "edge_dvfs",
                                "settings": {"cpufreq": [{"policy": 4, "governor": "performance"}], "devfreq": []}}
    assert edge_boot.parse(text, "x.json") == ("dvfs", json.loads(text)["settings"])
    assert [os.path.basename(edge_boot.state_path(k)) for k, u in edge_boot.KINDS] == [
        "irq-affinity.json", "jetson-clocks.json", "dvfs.json", "pcie-vc.json", "rt-budget.json"]
    with pytest.raises(EdgeError, match=r"unknown kind of boot-time state 'fan' \(known: irq_affinity, "):
        edge_boot.document("fan", {}, "x")


def test_every_file_is_applied_in_the_boots_order_whatever_its_name(tmp_path, applied):
    state = tmp_path / "boot.d"
    for kind in ("rt_budget", "pcie_vc", "dvfs", "jetson_clocks", "irq_affinity"):
        save(state, kind, {"changes": ["%s done" % kind]})
    (state / "notes.txt").write_text("not a state file")
    (state / ".dvfs.json.swp").write_text("an editor's")
    status, out, err = run(state, "/twin")
    assert status == 0 and err == []
    assert [c[0] for c in applied] == ["irq_affinity", "jetson_clocks", "dvfs", "pcie_vc", "rt_budget"]
    assert {c[2] for c in applied} == {"/twin"}
    assert out == ["edgetune-boot: %s: %s done" % (k, k) for k, u in edge_boot.KINDS]


def test_one_failure_does_not_keep_the_others_from_being_applied(tmp_path, applied):
    state = tmp_path / "boot.d"
    save(state, "irq_affinity", {"changes": ["irq 45 (eth0): 0-7 -> 0-3"], "errors": ["irq 12: EIO"]})
    save(state, "jetson_clocks", {"raise": "jetson_clocks not found: install nvidia-l4t-tools"})
    save(state, "dvfs", {"crash": "policy4"})
    save(state, "pcie_vc", {"changes": ["mapped"]})
    (state / "rt-budget.json").write_text('{"format": 1, "kind": "rt_budget", "settings": ')
    status, out, err = run(state)
    assert status == 1
    assert [c[0] for c in applied] == ["irq_affinity", "jetson_clocks", "dvfs", "pcie_vc"]
    assert out == ["edgetune-boot: irq_affinity: irq 45 (eth0): 0-7 -> 0-3", "edgetune-boot: pcie_vc: mapped"]
    assert err[0].startswith("edgetune-boot: error: state file %s/rt-budget.json is not JSON (" % state)
    assert err[0].endswith("): run the role that wrote it again")
    assert err[1:] == ["edgetune-boot: irq_affinity: error: irq 12: EIO",
                       "edgetune-boot: jetson_clocks: error: jetson_clocks not found: install nvidia-l4t-tools",
                       "edgetune-boot: dvfs: error: unexpected KeyError: 'policy4'"]


NOT_THE_FORMAT = (" is not an edgetune boot-time state of format 1 (format, kind, settings): run the role that "
                  "wrote it again, or remove the file")


@pytest.mark.parametrize("text, message", [
    ('{"format": 2, "kind": "dvfs", "settings": {}}', NOT_THE_FORMAT),
    ('{"format": 1, "kind": "dvfs", "settings": []}', NOT_THE_FORMAT),
    ('{"format": 1, "cpus": "0-3"}', NOT_THE_FORMAT),   # edgetune 0.2's IRQ state
    ('{"format": 1, "kind": "fan", "settings": {}}', ": unknown kind 'fan' (known: irq_affinity, jetson_clocks, dvfs, "
                                                     "pcie_vc, rt_budget)"),
])
def test_a_file_it_cannot_read_is_named_with_what_to_do(tmp_path, applied, text, message):
    (tmp_path / "x.json").write_text(text)
    status, out, err = run(tmp_path)
    assert (status, out, applied) == (1, [], [])
    assert err == ["edgetune-boot: error: state file %s/x.json%s" % (tmp_path, message)]


def test_no_state_directory_is_nothing_to_do(tmp_path, applied):
    assert run(tmp_path / "absent") == (0, [], [])


def test_sync_writes_only_a_change_and_check_mode_writes_nothing(tmp_path):
    path = str(tmp_path / "boot.d" / "rt-budget.json")
    settings = {"slice": "ai-infer.slice", "runtime_us": 950000}
    before, after = edge_boot.sync(path, "rt_budget", settings, "edge_cgroup_rt", True)
    assert before is None and not os.path.exists(path)
    assert edge_boot.sync(path, "rt_budget", settings, "edge_cgroup_rt", False) == (None, after)
    assert Path(path).read_text() == after
    assert edge_boot.sync(path, "rt_budget", settings, "edge_cgroup_rt", False) == (after, after)
    assert edge_boot.read(path, "rt_budget") == (after, settings)
    assert edge_boot.read(path, "dvfs") == (after, None)      # another kind's file: written anew
    Path(path).write_text('{"format": 1, "slice": "ai-infer.slice", "runtime_us": 950000}\n')   # edgetune 0.2's
    assert edge_boot.read(path, "rt_budget")[1] is None
    assert edge_boot.read(str(tmp_path / "none.json"), "rt_budget") == (None, None)


def cgroup_v1_root(root):
    """A cgroup v1 cpu hierarchy with RT group scheduling, the slice's cgroup at its boot value 0."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/1").mkdir(parents=True)
    (root / "proc/1/cgroup").write_text("1:name=systemd:/init.scope\n2:cpu,cpuacct:/init.scope\n")
    (root / "proc/self/mountinfo").write_text(
        "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n")
    top = root / "sys/fs/cgroup/cpu,cpuacct"
    for directory, runtime in ((top, 950000), (top / "ai.slice", 0), (top / "ai.slice/ai-infer.slice", 0)):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.rt_runtime_us").write_text("%d\n" % runtime)
        (directory / "cpu.rt_period_us").write_text("1000000\n")
    return top / "ai.slice/ai-infer.slice"


@pytest.mark.parametrize("python", ["controller", "3.8"])
def test_the_unit_runs_the_installed_program_without_ansible(tmp_path, python):
    interpreter = sys.executable if python == "controller" else str(PY38)
    if python == "3.8" and not PY38.exists():
        pytest.skip("no Python 3.8 venv (make venv38)")
    lib = install_boot_program(tmp_path / "lib")
    state = tmp_path / "boot.d"
    slice_dir = cgroup_v1_root(tmp_path / "root")
    save(state, "rt_budget", {"slice": "ai-infer.slice", "runtime_us": 100000})
    env = dict((k, v) for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_COLLECTIONS_PATH"))
    done = subprocess.run([interpreter, "-m", boot_part()["module"], "--state-dir", str(state),
                           "--root", str(tmp_path / "root")],
                          cwd=str(lib), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (slice_dir / "cpu.rt_runtime_us").read_text().strip() == "100000"
    assert (slice_dir.parent / "cpu.rt_runtime_us").read_text().strip() == "100000"
    assert "edgetune-boot: rt_budget: " in done.stdout
