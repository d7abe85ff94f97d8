"""plugins/module_utils/plan/edge_code.py: one digest per role of the role's own code.

A fake collection in tmp_path (two roles, their modules, an action plugin, a
filter, module utilities importing each other) shows which changes mark which
role; the real collection shows every role its own digest and every module its
tasks call present.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_code, edge_package, edge_plan

ROOT = Path(__file__).resolve().parents[2]
PKG = "ansible_collections.edgetune.fleet.plugins"

FAKE = {
    "roles/role_a/tasks/main.yml": """---
- name: Plan (the planner's code is recorded as the plan parts)
  edgetune.fleet.edge_plan:
    role: role_a
- name: Apply A
  edgetune.fleet.mod_a:
    value: 1
- name: Ship the program
  ansible.builtin.copy:
    src: "{{ lookup('edgetune.fleet.collection_file', 'bpf/') }}"
    dest: /x
""",
    "roles/role_a/README.md": "documentation\n",
    "roles/role_a/meta/readme.yml": "description: calls edgetune.fleet.mod_unused (documentation)\n",
    "roles/role_b/tasks/main.yml": """---
- name: Apply B
  block:
    - name: B's module
      edgetune.fleet.mod_b:
        content: "{{ lookup('ansible.builtin.template', 'b.conf.j2') }}"
""",
    "roles/role_b/templates/b.conf.j2": "value={{ __role_b_value }}\n",
    "roles/role_b/vars/main.yml": "__role_b_value: \"{{ 1 | edgetune.fleet.filt_b }}\"\n",
    "plugins/modules/edge_plan.py": "DOCUMENTATION = ''\n",
    "plugins/action/edge_plan.py": "from %s.module_utils import util_planner\n" % PKG,
    "plugins/module_utils/util_planner.py": "PLAN = 1\n",
    "plugins/modules/mod_a.py": """try:
    from %s.module_utils.util_a import A  # noqa
    from %s.module_utils.util_shared import S  # noqa
except ImportError:
    pass
""" % (PKG, PKG),
    "plugins/module_utils/util_a.py": "from %s.module_utils import util_deep\nA = 1\n" % PKG,
    "plugins/module_utils/util_deep.py": "def f():\n    from .util_deeper import D\n    return D\n",
    "plugins/module_utils/util_deeper.py": "D = 1\n",
    "plugins/module_utils/util_shared.py": "import json\nS = 1\n",
    "plugins/module_utils/util_unused.py": "U = 1\n",
    "plugins/modules/mod_b.py": "import %s.module_utils.util_shared\nimport %s.module_utils.util_b\n" % (PKG, PKG),
    "plugins/action/mod_b.py": "ACTION = 1\n",
    "plugins/module_utils/util_b.py": "B = 1\n",
    "plugins/filter/filt_b.py": "FILTER = 1\n",
    "plugins/lookup/collection_file.py": "LOOKUP = 1\n",
    "plugins/modules/mod_unused.py": "U = 1\n",
    "bpf/prog.c": "int x;\n",
    "bpf/README.md": "how it is built\n",
}
ROLES = ["role_a", "role_b"]


@pytest.fixture
def fake(tmp_path):
    for relative, text in FAKE.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    return tmp_path


def digests(root):
    return edge_code.role_code_digests(ROLES, str(root))


def changed(root, relative, text="changed = 1\n"):
    """Which roles' digests a change of root/relative changes."""
    before = digests(root)
    (root / relative).write_text(text)
    after = digests(root)
    return sorted(role for role in ROLES if before[role] != after[role])


def test_what_each_role_s_code_is(fake):
    files, unresolved = edge_code.role_code_files("role_a", str(fake))
    assert unresolved == []
    assert files == ["bpf/prog.c", "plugins/lookup/collection_file.py", "plugins/module_utils/util_a.py",
                     "plugins/module_utils/util_deep.py",
                     "plugins/module_utils/util_deeper.py", "plugins/module_utils/util_shared.py",
                     "plugins/modules/mod_a.py", "roles/role_a/meta/readme.yml", "roles/role_a/tasks/main.yml"]
    files, unresolved = edge_code.role_code_files("role_b", str(fake))
    assert files == ["plugins/action/mod_b.py", "plugins/filter/filt_b.py", "plugins/module_utils/util_b.py",
                     "plugins/module_utils/util_shared.py", "plugins/modules/mod_b.py",
                     "roles/role_b/tasks/main.yml", "roles/role_b/templates/b.conf.j2", "roles/role_b/vars/main.yml"]


def test_a_module_utility_of_one_role_marks_that_role_only(fake):
    assert changed(fake, "plugins/module_utils/util_a.py") == ["role_a"]
    assert changed(fake, "plugins/module_utils/util_b.py") == ["role_b"]
    assert changed(fake, "plugins/modules/mod_a.py", "import json\n") == ["role_a"]
    assert changed(fake, "plugins/action/mod_b.py") == ["role_b"]  # the action plugin in front of mod_b


def test_a_utility_imported_transitively_marks_the_role(fake):
    assert changed(fake, "plugins/module_utils/util_deep.py", "def f():\n    return 2\n") == ["role_a"]
    # util_deeper no longer imported: it changes nothing now
    assert changed(fake, "plugins/module_utils/util_deeper.py") == []


def test_a_role_s_own_files_mark_that_role_only(fake):
    assert changed(fake, "roles/role_b/templates/b.conf.j2", "value=2\n") == ["role_b"]
    assert changed(fake, "roles/role_a/tasks/main.yml", FAKE["roles/role_a/tasks/main.yml"] + "# new\n") == ["role_a"]
    assert changed(fake, "plugins/filter/filt_b.py") == ["role_b"]
    assert changed(fake, "bpf/prog.c", "int y;\n") == ["role_a"]  # shipped by a literal collection_file path


def test_shared_code_marks_both_and_unrelated_code_neither(fake):
    assert changed(fake, "plugins/module_utils/util_shared.py") == ["role_a", "role_b"]
    assert changed(fake, "plugins/module_utils/util_unused.py") == []
    assert changed(fake, "plugins/modules/mod_unused.py") == []  # named in meta/ (documentation) only
    # the planner: its result is recorded as the role's variables and plan parts
    assert changed(fake, "plugins/module_utils/util_planner.py") == []
    assert changed(fake, "plugins/action/edge_plan.py") == []
    assert changed(fake, "roles/role_a/README.md") == []
    assert changed(fake, "bpf/README.md") == []


def test_files_a_caller_says_a_role_ships(fake):
    before = edge_code.role_code_digests(ROLES, str(fake), {"role_b": ["plugins/module_utils/util_unused.py"]})
    (fake / "plugins/module_utils/util_unused.py").write_text("U = 2\n")
    after = edge_code.role_code_digests(ROLES, str(fake), {"role_b": ["plugins/module_utils/util_unused.py"]})
    assert before["role_a"] == after["role_a"] and before["role_b"] != after["role_b"]


def test_a_new_role_file_and_a_renamed_file_count(fake):
    assert changed(fake, "roles/role_a/tasks/main.yml", FAKE["roles/role_a/tasks/main.yml"]) == []
    before = digests(fake)
    (fake / "roles/role_b/handlers").mkdir()
    (fake / "roles/role_b/handlers/main.yml").write_text("---\n")
    assert digests(fake)["role_b"] != before["role_b"]
    (fake / "roles/role_b/handlers/main.yml").rename(fake / "roles/role_b/handlers/other.yml")
    assert len({before["role_b"], digests(fake)["role_b"]}) == 2


def test_a_module_that_does_not_parse_still_counts(fake):
    assert changed(fake, "plugins/modules/mod_a.py", "def (:\n") == ["role_a"]


PROGRAMS = {"prog": ["plugins/modules/mod_a.py"]}
INSTALLED_BY = {"prog": "role_b"}


def test_code_facts_are_the_programs_and_the_digests_with_what_each_role_installs(fake):
    facts = edge_code.code_facts(ROLES, str(fake), PROGRAMS, INSTALLED_BY)
    assert facts["programs"]["prog"] == edge_code.imported_closure(PROGRAMS["prog"], str(fake))
    assert facts["digests"] == edge_code.role_code_digests(ROLES, str(fake), {"role_b": facts["programs"]["prog"]})


def test_kept_on_disk_by_the_state_of_the_files(fake, tmp_path, monkeypatch):
    """Each host's planner runs in a worker process of its own: the programs and digests are kept on
    the controller's disk, found again while no file of roles/ or plugins/ changed, computed anew after."""
    cache = tmp_path / "cache"
    first = edge_code.cached_code_facts(ROLES, str(fake), PROGRAMS, INSTALLED_BY, cache_dir=str(cache))
    assert len(list(cache.iterdir())) == 1

    def computed(*_args):
        raise AssertionError("computed again")
    monkeypatch.setattr(edge_code, "code_facts", computed)
    assert edge_code.cached_code_facts(ROLES, str(fake), PROGRAMS, INSTALLED_BY, cache_dir=str(cache)) == first
    (fake / "roles/role_b/templates/b.conf.j2").write_text("value=2\n")
    with pytest.raises(AssertionError, match="computed again"):
        edge_code.cached_code_facts(ROLES, str(fake), PROGRAMS, INSTALLED_BY, cache_dir=str(cache))
    with pytest.raises(AssertionError, match="computed again"):  # no cache directory: no cache
        edge_code.cached_code_facts(ROLES, str(fake), PROGRAMS, INSTALLED_BY, cache_dir="")


def test_the_planner_reads_the_collection_code_once_per_process():
    assert edge_plan.collection_code() is edge_plan.collection_code()


def _task_modules(tasks):
    """The edgetune.fleet.NAME keys of the tasks (blocks, rescue, always included)."""
    for task in tasks or ():
        if not isinstance(task, dict):
            continue
        for key in task:
            if key.startswith("edgetune.fleet."):
                yield key[len("edgetune.fleet."):]
        for nested in ("block", "rescue", "always"):
            yield from _task_modules(task.get(nested))


def test_the_real_collection_every_role_its_own_digest():
    shipped = edge_plan.shipped_files()
    found = edge_code.role_code_digests(sorted(edge_plan.RECORDED_ROLES), str(ROOT), shipped)
    assert sorted(found) == sorted(edge_plan.RECORDED_ROLES)
    assert len(set(found.values())) == len(found), found
    files = dict((role, edge_code.role_code_files(role, str(ROOT), shipped.get(role) or ())[0]) for role in found)
    # each role's modules, not the others'
    assert "plugins/modules/edge_dvfs.py" in files["edge_power"]
    assert "plugins/modules/edge_dvfs.py" not in files["edge_cpu"]
    assert "plugins/modules/edge_kernel_cmdline.py" in files["edge_bootargs"]
    assert "plugins/module_utils/device/edge_irq.py" in files["edge_cpu"]  # through edge_irq_affinity
    assert "plugins/module_utils/common/edge_cpulist.py" in files["edge_cpu"]  # through edge_irq, transitively
    # The device package's code is its role's, not that of the roles that run its programs.
    assert "plugins/module_utils/device/edge_netqos_loader.py" in files["edge_package"]
    assert "plugins/modules/edge_audit.py" in files["edge_package"]
    assert "plugins/modules/edge_audit.py" not in files["edge_audit_timer"]
    for program in shipped["edge_package"]:
        assert program in files["edge_package"]
    for role in found:
        assert not any(f.startswith("roles/") and not f.startswith("roles/%s/" % role) for f in files[role])
        assert "plugins/module_utils/plan/edge_plan.py" not in files[role]


def test_the_real_collection_every_module_a_role_calls_exists():
    called = {}
    for path in sorted((ROOT / "roles").glob("*/*/*.yml")):
        if path.parent.name not in ("tasks", "handlers"):
            continue
        for name in _task_modules(yaml.safe_load(path.read_text())):
            called.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert "edge_dvfs" in called and "edge_files" in called
    missing = dict((name, where) for name, where in called.items()
                   if not (ROOT / "plugins/modules" / (name + ".py")).is_file()
                   and not (ROOT / "plugins/action" / (name + ".py")).is_file())
    assert missing == {}
    for role in sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir()):
        assert edge_code.role_code_files(role, str(ROOT))[1] == [], role  # every edgetune.fleet name is a plugin


def test_the_device_programs_are_their_entries_and_everything_they_import():
    """One manifest (edge_package.DEVICE_PROGRAMS): the files follow the imports, none kept by hand."""
    audit = [f["src"] for f in edge_package.program_files("audit")]
    assert "plugins/modules/edge_audit.py" in audit
    for src in audit:
        for imported in edge_code.python_imports(src, str(ROOT)):
            assert imported in audit, (src, imported)
    boot = [f["src"] for f in edge_package.program_files("boot")]
    for name in edge_boot.UTILS.values():  # imported by name at boot
        assert "plugins/module_utils/device/%s.py" % name in boot
    assert {f["dest"] for f in edge_package.program_files("audit")} >= {
        "edge_audit.py", "ansible_collections/edgetune/fleet/plugins/module_utils/device/edge_audit.py"}
    netqos = [f["src"] for f in edge_package.program_files("netqos")]
    assert netqos == ["plugins/module_utils/common/edge_error.py", "plugins/module_utils/common/edge_slice.py",
                      "plugins/module_utils/device/edge_netqos_loader.py"]
    # One package, one role: every program's files once.
    package = edge_package.files()
    assert sorted(f["src"] for f in package) == sorted(set(audit + boot + netqos))
    assert len({f["dest"] for f in package}) == len(package)
    assert edge_plan.shipped_files() == {"edge_package": [f["src"] for f in package]}


def test_the_netqos_loader_runs_from_the_device_package_alone(tmp_path):
    """The device package (role edge_package, as edge_files lays it out) and the edgetune-netqos command
    (role edge_netqos, the filter edge_netqos_command): the command runs the loader from the package's
    directory, with nothing else of the collection."""
    from ansible_collections.edgetune.fleet.plugins.filter.edge_netqos_command import edge_netqos_command
    install = tmp_path / "lib"
    command = tmp_path / "sbin" / "edgetune-netqos"
    files = edge_package.files() + edge_netqos_command(sys.executable, str(install), str(command))
    for item in files:
        dest = Path(item["dest"]) if item["dest"].startswith("/") else install / item["dest"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(item["content"] if "content" in item else (ROOT / item["src"]).read_text())
        if item.get("mode") == "0755":
            dest.chmod(0o755)
    assert command.read_text().startswith("#!%s\n" % sys.executable)
    done = subprocess.run([str(command), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, cwd=str(tmp_path), env={"PATH": os.environ["PATH"]}, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: edgetune-netqos"), done.stderr
