"""The write points of an apply are observed, not listed: a task added to a role shows up in the trace.

A copy of the checkout whose edge_power role gains an ansible.builtin.copy task and a `shell` task writing a
sysfs value; `site.yml --tags edge_facts,edge_power` runs on a fresh Orin NX twin under the tracer
(edgetune_dev.faults.writepoints). Both new tasks' changes are in the grouped list, at the paths a user would
look at; every file edgetune's own modules replace is fsynced before its rename and its directory after, and
the builtin copy's rename, which is not, is reported as such (the judge can fail).
"""
import shutil
import subprocess

import pytest
import yaml

from edgetune_dev import CHECKOUT
from edgetune_dev.faults import writepoints
from edgetune_dev.twin import manager

pytestmark = pytest.mark.controller

TWIN = "it-trace-orin"
COPIED = "/etc/edgetune-trace-test.conf"
GOVERNOR = "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor"
ADDED_TASKS = [
    {"name": "Trace test: a file copied", "tags": ["edge_power"],
     "ansible.builtin.copy": {"dest": COPIED, "content": "traced\n", "mode": "0644"}},
    {"name": "Trace test: a sysfs value written by a shell", "tags": ["edge_power"], "changed_when": True,
     "ansible.builtin.shell": "echo performance > " + GOVERNOR},
]


def checkout_copy(target):
    """The checkout's tracked files (and its collections/ link) in ``target``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=str(CHECKOUT), stdout=subprocess.PIPE, check=True)
    for name in listed.stdout.decode().split("\0"):
        source = CHECKOUT / name
        if not name or not (source.is_file() or source.is_symlink()):
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(str(source), str(target / name), follow_symlinks=False)
    return target


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    work = tmp_path_factory.mktemp("trace")
    copy = checkout_copy(work / "checkout")
    tasks = copy / "roles" / "edge_power" / "tasks" / "main.yml"
    tasks.write_text(tasks.read_text() + "\n" + yaml.safe_dump(ADDED_TASKS, sort_keys=False))
    inventory = manager.write_group_inventory(work / "inventory", "orin-fleet", [TWIN],
                                              copy / "inventory" / "twin" / "group_vars")
    manager.ensure_images(["bookworm"])
    manager.remove(TWIN)
    manager.create(TWIN, "orin-nx-16gb-r36")
    try:
        yield writepoints.trace_apply(TWIN, inventory, "site.yml", cwd=copy, out_dir=work / "out",
                                      ansible_args=["--tags", "edge_facts,edge_power",
                                                    "-e", '{"edge_reboot_policy": "never"}'])
    finally:
        manager.remove(TWIN)


def test_the_added_copy_and_shell_write_appear_with_no_list_edited(traced):
    assert traced["rc"] == 0, traced["output_tail"]
    found = {(g["module"], g["kind"], g["pattern"]): g for g in traced["groups"]}
    assert ("copy", "rename", COPIED) in found, sorted(found)
    shell = found[("command", "write", writepoints.path_pattern(GOVERNOR))]
    assert shell["via"] == ["sh"] and shell["first"]["path"] == GOVERNOR
    # The role's own write points are there too: nvpmodel's, the governors edge_dvfs sets, the lease.
    assert any(module == "edge_dvfs" and kind == "write" for module, kind, _pattern in found)
    assert ("edge_facts", "rename", "/run/edgetune/apply.lease") in found


def test_every_file_edgetunes_modules_replace_is_fsynced_and_so_is_its_directory(traced):
    # Made by the module's own Python (not a board tool it runs, such as nvpmodel).
    ours = [r for r in traced["renames"] if r["module"].startswith("edge_") and r["via"] == "python3"]
    assert ours, traced["renames"]
    for rename in ours:
        assert rename["file_fsync"] is not False and rename["directory_fsync"], rename
    assert ("copy", COPIED, "file fsync and directory fsync") in traced["unsynced"]
