"""Every plugin and role of the collection renders in ``ansible-doc --json``.

The plugins are found in the tree (each plugins/<type>/ directory ansible-doc
documents, each role under roles/), not listed here, so a new module, filter,
lookup, callback or role is checked without touching this file. ansible-doc
runs as a user runs it, from the checkout with its ansible.cfg, which finds
the collection through the link committed in collections/; one call per plugin
type covers every name of that type (about half a second each).

Checked: the documentation parses and comes from this checkout; every option
(and suboption) has a description and a type; modules, lookups and filters
have EXAMPLES and RETURN values that are not null, each with a description
and a type (modules: and when it is returned); modules document the
check_mode, diff_mode and platform attributes; every entry point of every role
documents its options.
"""
import ast
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "edgetune.fleet"
# plugins/<directory> -> ansible-doc's plugin type (ansible.constants.DOCUMENTABLE_PLUGINS).
DOC_TYPES = {
    "become": "become", "cache": "cache", "callback": "callback", "cliconf": "cliconf",
    "connection": "connection", "filter": "filter", "httpapi": "httpapi", "inventory": "inventory",
    "lookup": "lookup", "modules": "module", "netconf": "netconf", "shell": "shell",
    "strategy": "strategy", "test": "test", "vars": "vars",
}
# Jinja2 plugin files may hold several plugins: their names are the keys of this method's dict.
MULTI = {"filter": "filters", "test": "tests"}
WITH_EXAMPLES_AND_RETURN = ("module", "lookup", "filter", "test")
ATTRIBUTES = ("check_mode", "diff_mode", "platform")


def _jinja_plugin_names(path, method):
    """The keys of the dict that ``method`` of the file's plugin class returns, else the file's stem."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef) and node.name == method:
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    names += [k.value for k in ret.value.keys if isinstance(k, ast.Constant)]
    return names or [path.stem]


def discover():
    """[(ansible-doc type, short name)] of every plugin and role in the tree."""
    found = []
    for directory in sorted(p for p in (ROOT / "plugins").iterdir() if p.name in DOC_TYPES):
        doc_type = DOC_TYPES[directory.name]
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            if directory.name in MULTI:
                found += [(doc_type, name) for name in _jinja_plugin_names(path, MULTI[directory.name])]
            else:
                found.append((doc_type, path.stem))
    found += [("role", p.name) for p in sorted((ROOT / "roles").iterdir()) if (p / "tasks").is_dir()]
    return found


PLUGINS = discover()


def _ansible_doc():
    beside = Path(sys.executable).parent / "ansible-doc"
    return str(beside) if beside.exists() else shutil.which("ansible-doc")


def _run(doc_type, names):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([_ansible_doc(), "-t", doc_type, "--json"] + ["%s.%s" % (COLLECTION, n) for n in names],
                          cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300, check=False)


# A Python warning that a third-party package raises while ansible-doc imports it (a newer
# cryptography under ansible-core): its "path:line: XWarning: text" line and the source line after.
THIRD_PARTY_WARNING = re.compile(r"^\S+/site-packages/\S+:\d+: \w*Warning: .*\n(?:[ \t]+.*\n?)?", re.MULTILINE)


def own_errors(stderr):
    """ansible-doc's stderr less the warnings of the packages it imports."""
    return THIRD_PARTY_WARNING.sub("", stderr).strip()


@functools.lru_cache(maxsize=None)
def rendered(doc_type):
    """{full name: ansible-doc's JSON, or the error text} for every discovered plugin of this type."""
    names = [name for kind, name in PLUGINS if kind == doc_type]
    done = _run(doc_type, names)
    if done.returncode == 0 and not own_errors(done.stderr):
        return json.loads(done.stdout)
    # One plugin's error fails the whole call: ask for each one alone, so that each test says its own.
    results = {}
    for name in names:
        one = _run(doc_type, [name])
        full = "%s.%s" % (COLLECTION, name)
        if one.returncode == 0 and not own_errors(one.stderr):
            results[full] = json.loads(one.stdout).get(full)
        else:
            results[full] = "ansible-doc exit %d: %s" % (one.returncode, own_errors(one.stderr) or one.stdout.strip())
    return results


def option_problems(options, where):
    problems = []
    for name, option in (options or {}).items():
        path = "%s.%s" % (where, name)
        if not isinstance(option, dict):
            problems.append("%s renders as %r" % (path, option))
            continue
        if not option.get("description"):
            problems.append("%s has no description" % path)
        if not option.get("type"):
            problems.append("%s has no type" % path)
        problems += option_problems(option.get("suboptions") or option.get("options"), path)
    return problems


def return_problems(values, where, need_returned):
    problems = []
    for name, value in (values or {}).items():
        path = "%s.%s" % (where, name)
        if not isinstance(value, dict):
            problems.append("%s renders as %r" % (path, value))
            continue
        for key in ("description", "type") + (("returned",) if need_returned else ()):
            if not value.get(key):
                problems.append("%s has no %s" % (path, key))
        # A flow mapping whose text has a comma renders extra keys with null values.
        nulls = sorted(key for key, item in value.items() if item is None and key != "sample")
        if nulls:
            problems.append("%s renders null keys %s" % (path, nulls))
        problems += return_problems(value.get("contains"), path, need_returned)
    return problems


@pytest.mark.controller
def test_the_tree_has_plugins_of_each_kind():
    kinds = {kind for kind, _name in PLUGINS}
    assert {"module", "filter", "lookup", "callback", "role"} <= kinds, sorted(kinds)


@pytest.mark.controller
@pytest.mark.parametrize("doc_type, name", PLUGINS, ids=["%s:%s" % p for p in PLUGINS])
def test_ansible_doc_renders(doc_type, name):
    assert _ansible_doc(), "ansible-doc is not installed (requirements.txt has ansible-core)"
    full = "%s.%s" % (COLLECTION, name)
    result = rendered(doc_type).get(full)
    assert result is not None, "ansible-doc -t %s returned nothing for %s" % (doc_type, full)
    assert not isinstance(result, str), result

    if doc_type == "role":
        path = result.get("path") or ""
        assert Path(path).resolve() == ROOT, \
            "ansible-doc read %s from %s, not from this checkout (make collection links it)" % (full, path)
        entry_points = result.get("entry_points") or {}
        assert entry_points, "%s documents no entry point (meta/argument_specs.yml)" % full
        problems = []
        for entry, spec in entry_points.items():
            if not spec.get("short_description"):
                problems.append("entry point %s has no short_description" % entry)
            if not spec.get("options"):
                problems.append("entry point %s documents no options" % entry)
            problems += option_problems(spec.get("options"), entry)
        assert not problems, "%s: %s" % (full, "; ".join(problems))
        return

    doc = result.get("doc")
    assert isinstance(doc, dict), "%s has no documentation: %r" % (full, result)
    filename = doc.get("filename") or ""
    assert str(Path(filename).resolve()).startswith(str(ROOT) + os.sep), \
        "ansible-doc read %s from %s, not from this checkout (make collection links it)" % (full, filename)
    problems = []
    if not doc.get("short_description"):
        problems.append("no short_description")
    if not doc.get("description"):
        problems.append("no description")
    problems += option_problems(doc.get("options"), "options")
    if doc_type == "module":
        if not doc.get("options"):
            problems.append("documents no options")
        attributes = doc.get("attributes") or {}
        for attribute in ATTRIBUTES:
            entry = attributes.get(attribute)
            if not isinstance(entry, dict) or not entry.get("description") or not entry.get("support"):
                problems.append("attribute %s is not documented with a description and its support" % attribute)
    if doc_type in WITH_EXAMPLES_AND_RETURN:
        if not (result.get("examples") or "").strip():
            problems.append("no EXAMPLES")
        if not result.get("return"):
            problems.append("no RETURN")
        problems += return_problems(result.get("return"), "RETURN", need_returned=doc_type == "module")
    assert not problems, "%s: %s" % (full, "; ".join(problems))
