"""The Jinja in roles/ and playbooks/ only shrinks: what is derived belongs to the plan.

The plan (plugins/module_utils/plan/edge_plan.py, computed once per device on the
controller) is where values are derived; the roles and playbooks should look
them up. This test lists every Jinja expression in roles/ and playbooks/
(``{{ ... }}`` and ``{% ... %}`` in YAML and templates) that is more than a
lookup: a statement (``{% ... %}``), a filter not in ALLOWED_FILTERS, or a
method call (``x.split('/')``). Lookups of the plan (``ansible_facts.edge_plan...``),
of facts, of role variables, ``item``, registered results, tests (``is defined``)
and conditionals pass. The set is compared with jinja_derivations.txt (one
``path: normalized expression`` per line): a new derivation fails (move it
into the plan, or add it to the file with a reason in the review), and so does
an entry that no longer exists (remove it from the file: the list only
shrinks). Regenerate the file's entries with ``python tests/static/test_jinja_derivations.py``
and review the diff.

The number of lines with ``{%`` must not grow either (MAX_STATEMENT_LINES).

Decisions count too: every ``{{ a if b else c }}`` in roles/ and playbooks/ is
listed in DECISIONS with the reason it stays in Jinja (at most MAX_DECISIONS).
A value the plan, a module's result or a filter can decide is decided there
(plugins/module_utils/plan/edge_plan.py, plugins/module_utils/plan/edge_settle.py)
and the roles read it; a new decision fails this test, and so does a listed
one that is gone (remove it: the list only shrinks).
"""
import re
import sys
from pathlib import Path

import jinja2
import pytest
from jinja2 import nodes

ROOT = Path(__file__).resolve().parents[2]
ALLOWLIST = Path(__file__).with_name("jinja_derivations.txt")
# Filters that format or type a looked-up value rather than derive one.
ALLOWED_FILTERS = frozenset((
    "bool", "int", "float", "string", "list", "to_json", "to_nice_json", "default", "d", "mandatory", "quote",
    "comment", "join", "length", "count", "upper", "lower", "trim", "dict2items", "items2dict",
))
# The lines with "{%" in the files scanned when this test was written: the number may only go down.
MAX_STATEMENT_LINES = 39
SUFFIXES = (".yml", ".yaml", ".j2")
# The {{ a if b else c }} decisions left in roles/ and playbooks/, each with why it stays in Jinja.
MAX_DECISIONS = 10
DECISIONS = {
    "roles/edge_cgroups/tasks/probe.yml: {{ 'restarted' if (__edge_cgroups_probe_unit is changed or "
    "__edge_cgroups_probe_program is changed) else 'started' }}":
        "which systemd action follows from this run's own changes (registered in the same role), not a value",
    "roles/edge_cpu/tasks/irqbalance.yml: {{ 'absent' if __edge_cpu_version is version('1.8', '>=') else "
    "'present' }}":
        "the irqbalance version is read on the device in this role, after the plan was made",
    "roles/edge_facts/tasks/main.yml: {{ {'ttl': edge_lease_ttl | default(3600), 'wait': edge_lease_wait | "
    "default(600)} if __edge_lease_take | default(false) else omit }}":
        "the facts are the plan's input: no plan exists yet to decide whether this run takes the lease",
    "roles/edge_facts/tasks/main.yml: {{ __edge_facts_record_dir if __edge_lease_take | default(false) or "
    "edge_mode | default('apply') == 'audit' else omit }}":
        "the facts are the plan's input: no plan exists yet to decide whether the records are read",
    "roles/edge_netqos/templates/edgetune-netqos@.service.j2: {{ ' --replace-root' if edge_netqos_replace_root "
    "| bool else '' }}":
        "a flag of the loader's command line written from a boolean of the inventory (formatting)",
    "roles/edge_netqos/templates/edgetune-netqos@.service.j2: {{ 'sys-subsystem-net-devices-%i.device' if "
    "ansible_facts.edge.device_units else 'multi-user.target' }}":
        "role edge_netqos runs without a plan on hosts no board profile knows; the fact is read as is",
    "roles/edge_runtime/tasks/deploy.yml: {{ ['health', 'threads'] + ((__edge_runtime_llm | "
    "ternary(['stream', 'golden'], ['latency'])) if __edge_runtime_restart is not skipped else []) }}":
        "the latency gates judge a change: whether this run restarted the runtime is known only here",
    "roles/edge_runtime/tasks/deploy.yml: {{ __edge_runtime_manifests.engine.golden | default(omit) if "
    "__edge_runtime_llm else omit }}":
        "the engine's manifest is read on the device after the plan; only llama-server engines carry tokens",
    "roles/edge_runtime/templates/edgetune-runtime.service.j2: {{ 'yes' if edge_runtime_private_devices | "
    "bool else 'no' }}":
        "a boolean of the inventory written in systemd's words (formatting)",
    "roles/edge_runtime/templates/runtime.env.j2: {{ 'mmap+mlock' if edge_runtime_mlock | bool else 'mmap' }}":
        "a boolean of the inventory written as llama-server's load mode (formatting)",
}
_EXPRESSION = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
_COMMENT = re.compile(r"\{#.*?#\}", re.S)
_ENV = jinja2.Environment()


def scanned_files():
    """The YAML files and templates of roles/ and playbooks/ (not the roles' files/: data, not Jinja)."""
    out = []
    for top in ("roles", "playbooks"):
        for path in sorted((ROOT / top).rglob("*")):
            relative = path.relative_to(ROOT)
            if path.is_file() and path.suffix in SUFFIXES and "files" not in relative.parts[2:3]:
                out.append(path)
    return out


def normalize(text):
    return " ".join(text.strip("-+ \t\r\n").split())


def why_derived(expression):
    """Why ``{{ expression }}`` is more than a lookup (a filter, a method call), or None."""
    try:
        tree = _ENV.parse("{{ %s }}" % expression)
    except jinja2.TemplateSyntaxError as exc:
        return "unparsed: %s" % exc.message
    filters = sorted({f.name for f in tree.find_all(nodes.Filter)} - ALLOWED_FILTERS)
    if filters:
        return "filter " + ", ".join(filters)
    if any(isinstance(call.node, nodes.Getattr) for call in tree.find_all(nodes.Call)):
        return "method call"
    return None


def derivations():
    """{"path: normalized expression"} of every derivation, and the number of lines with "{%"."""
    found, statement_lines = set(), 0
    for path in scanned_files():
        text = path.read_text()
        statement_lines += sum(1 for line in text.splitlines() if "{%" in line)
        relative = path.relative_to(ROOT).as_posix()
        for match in _EXPRESSION.finditer(_COMMENT.sub("", text)):
            expression, statement = match.group(1), match.group(2)
            if statement is not None:
                found.add("%s: {%% %s %%}" % (relative, normalize(statement)))
            elif why_derived(normalize(expression)):
                found.add("%s: {{ %s }}" % (relative, normalize(expression)))
    return found, statement_lines


def decisions():
    """{"path: {{ normalized expression }}"} of every {{ a if b else c }} in roles/ and playbooks/."""
    found = set()
    for path in scanned_files():
        relative = path.relative_to(ROOT).as_posix()
        for match in _EXPRESSION.finditer(_COMMENT.sub("", path.read_text())):
            if match.group(1) is None:
                continue
            expression = normalize(match.group(1))
            try:
                tree = _ENV.parse("{{ %s }}" % expression)
            except jinja2.TemplateSyntaxError:
                continue  # reported by the derivations' test
            if any(True for _ in tree.find_all(nodes.CondExpr)):
                found.add("%s: {{ %s }}" % (relative, expression))
    return found


def allowlisted():
    lines = ALLOWLIST.read_text().splitlines() if ALLOWLIST.exists() else []
    return {line for line in lines if line.strip() and not line.startswith("#")}


@pytest.mark.controller
def test_jinja_derivations_only_shrink():
    found, statement_lines = derivations()
    listed = allowlisted()
    new, gone = sorted(found - listed), sorted(listed - found)
    message = []
    if new:
        message.append("%d new Jinja derivation(s) (compute them in the plan, plugins/module_utils/plan/edge_plan.py, "
                       "or add them to %s):\n%s" % (len(new), ALLOWLIST.name, "\n".join("  " + n for n in new)))
    if gone:
        message.append("%d entr(y/ies) of %s no longer exist (remove them: the list only shrinks):\n%s"
                       % (len(gone), ALLOWLIST.name, "\n".join("  " + g for g in gone)))
    message.append("lines with {%% in roles/ and playbooks/: %d (at most %d)" % (statement_lines, MAX_STATEMENT_LINES))
    assert not new and not gone, "\n".join(message)
    assert statement_lines <= MAX_STATEMENT_LINES, "\n".join(message)


@pytest.mark.controller
def test_jinja_decisions_are_few_and_each_has_a_reason():
    found = decisions()
    new, gone = sorted(found - set(DECISIONS)), sorted(set(DECISIONS) - found)
    assert not new, ("%d new {{ a if b else c }} decision(s) in roles/ or playbooks/: decide them in the plan, a "
                     "module's result or a filter (plugins/module_utils/plan/edge_settle.py), or list them in "
                     "DECISIONS with a reason:\n%s" % (len(new), "\n".join("  " + n for n in new)))
    assert not gone, "listed decisions no longer there (remove them from DECISIONS):\n%s" % "\n".join(gone)
    assert len(DECISIONS) <= MAX_DECISIONS and all(reason.strip() for reason in DECISIONS.values())


@pytest.mark.controller
@pytest.mark.parametrize("expression, derived", [
    ("ansible_facts.edge_plan.runtime.slice", False),
    ("edge_netqos_rate or omit", False),
    ("ansible_managed | comment", False),
    ("item.name | quote", False),
    ("__edge_runtime_probe.fifo.reason if x is not none else 'no'", False),
    ("edge_netqos_interfaces | select('string') | list", True),
    ("edge_netqos_cgroup.split('/') | last", True),
    ("lookup('ansible.builtin.template', 'x.j2') | hash('sha1')", True),
])
def test_what_counts_as_a_derivation(expression, derived):
    assert bool(why_derived(expression)) is derived


if __name__ == "__main__":
    entries, count = derivations()
    header = [line for line in (ALLOWLIST.read_text().splitlines() if ALLOWLIST.exists() else [])
              if line.startswith("#")]
    ALLOWLIST.write_text("\n".join(header + sorted(entries)) + "\n")
    sys.stdout.write("%d derivations, %d lines with {%%\n" % (len(entries), count))
