"""An intent variable whose value the plan carries is read from the plan: the roles and playbooks read the
plan's value (validated and derived once, on the controller), never the inventory's variable again."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Intent variable -> where the plan carries it.
PLAN_CARRIED = {
    "edge_cgroups_slice": "ansible_facts.edge_plan.slice.name",
    "edge_runtime_slice": "ansible_facts.edge_plan.runtime.slice",
    "edge_netqos_cgroup": "the plan's slice",
}
# Where a role reads variables: what it runs and renders (defaults, meta and READMEs only declare them).
READ_IN = ("tasks", "handlers", "templates", "vars")
_JINJA = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
_CONDITION = re.compile(r"^\s*-?\s*(?:when|that|until|changed_when|failed_when):?\s*(.*)$")


def expressions(path):
    """The Jinja expressions of a file and, in YAML, its bare conditions (``when:`` and list items under it)."""
    text = path.read_text()
    found = [a or b for a, b in _JINJA.findall(text)]
    if path.suffix in (".yml", ".yaml"):
        in_condition = False
        for line in text.splitlines():
            match = _CONDITION.match(line)
            if match:
                in_condition, rest = True, match.group(1)
                found.append(rest)
            elif in_condition and re.match(r"^\s*-\s", line):
                found.append(line)
            else:
                in_condition = False
    return found


def scanned():
    files = sorted(p for sub in READ_IN for p in (ROOT / "roles").glob("*/%s/**/*" % sub) if p.is_file())
    files += sorted((ROOT / "playbooks").rglob("*.yml"))
    assert len(files) > 50, files
    return files


def test_no_role_or_playbook_reads_an_intent_variable_the_plan_carries():
    found = []
    for path in scanned():
        for expression in expressions(path):
            for name, carried in PLAN_CARRIED.items():
                if re.search(r"(?<![\w.])%s(?!\w)" % name, re.sub(r"#.*", "", expression)):
                    found.append("%s: %s (read %s)" % (path.relative_to(ROOT), name, carried))
    assert not found, "\n".join(sorted(set(found)))


def test_the_check_finds_a_read(tmp_path):
    task, template = tmp_path / "task.yml", tmp_path / "unit.j2"
    task.write_text("- name: x\n  when:\n    - edge_cgroups_slice != ''\n")
    template.write_text("Slice={{ edge_cgroups_slice }}\n# edge_cgroups_slice in a comment is no read\n")
    assert any("edge_cgroups_slice" in e for e in expressions(task))
    assert [e for e in expressions(template) if "edge_cgroups_slice" in e] == [" edge_cgroups_slice "]
