"""`make docs` builds the docs site with no warning, and the reference has a page for every plugin and role.

The test runs `make docs` as a user runs it (it installs requirements-docs.txt into the venv on first
use; warm, the build takes seconds): antsibull-docs generates the collection reference
(--fail-on-error: a plugin or role whose documentation does not validate fails the build instead of
getting an error page), then Sphinx builds the HTML with -W -n --keep-going, so any warning fails it.
Then, in the HTML in .cache/docs/html:

* every module, role, filter (each name a filter file exports), lookup and callback of the tree has
  its page, found from the tree (plugins/<type>/, roles/), not from a list kept here; modules,
  filters and lookups with their examples, roles with every option of every entry point;
* the user guide's pages are there;
* nothing is loaded from the network (no script, style sheet or image from a URL) and every link out
  of the site is one the collection's own documentation names: a plugin of another collection, or a
  page of Ansible's docs site, stays plain text.
"""
import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / ".cache" / "docs" / "html"
REFERENCE = HTML / "reference"
# plugins/<directory> -> the page suffix antsibull-docs gives its plugin type.
PLUGIN_TYPES = {
    "become": "become", "cache": "cache", "callback": "callback", "cliconf": "cliconf",
    "connection": "connection", "filter": "filter", "httpapi": "httpapi", "inventory": "inventory",
    "lookup": "lookup", "modules": "module", "netconf": "netconf", "shell": "shell",
    "strategy": "strategy", "test": "test", "vars": "vars",
}
# Jinja2 plugin files may hold several plugins: their names are the keys of this method's dict.
MULTI = {"filter": "filters", "test": "tests"}
WITH_EXAMPLES = ("module", "filter", "lookup", "test")
GUIDE = ("installation", "intent", "plan", "applying", "audit", "awx", "twins", "troubleshooting", "upgrading")


def jinja_plugin_names(path, method):
    """The keys of the dict that ``method`` of the file's plugin class returns, else the file's stem."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef) and node.name == method:
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    names += [k.value for k in ret.value.keys if isinstance(k, ast.Constant)]
    return names or [path.stem]


def documented():
    """[(page type, name)] of every plugin and role in the tree."""
    found = []
    for directory in sorted(p for p in (ROOT / "plugins").iterdir() if p.name in PLUGIN_TYPES):
        kind = PLUGIN_TYPES[directory.name]
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            if directory.name in MULTI:
                found += [(kind, name) for name in jinja_plugin_names(path, MULTI[directory.name])]
            else:
                found.append((kind, path.stem))
    found += [("role", p.name) for p in sorted((ROOT / "roles").iterdir()) if (p / "tasks").is_dir()]
    return found


PAGES = documented()


@pytest.fixture(scope="module")
def build():
    """`make docs`, once for the module: its output (the build fails on any warning)."""
    if not shutil.which("make"):
        pytest.fail("make is not installed: `make docs` builds the site")
    done = subprocess.run(["make", "--no-print-directory", "docs"], cwd=str(ROOT), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=900)
    assert done.returncode == 0, "make docs failed:\n" + done.stdout[-6000:]
    return done.stdout


def test_the_build_has_no_warning(build):
    problems = [line for line in build.splitlines() if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)]
    assert not problems, "\n".join(problems)


def test_the_tree_has_the_kinds_the_reference_must_cover():
    kinds = {kind for kind, _ in PAGES}
    assert {"module", "role", "filter", "lookup", "callback"} <= kinds, kinds


@pytest.mark.parametrize("kind,name", PAGES, ids=["%s-%s" % page for page in PAGES])
def test_every_plugin_and_role_has_its_page(build, kind, name):
    page = REFERENCE / ("%s_%s.html" % (name, kind))
    assert page.is_file(), "no reference page for %s %s (%s)" % (kind, name, page.relative_to(ROOT))
    text = page.read_text()
    assert "edgetune.fleet.%s" % name in text
    assert "was malformed" not in text, "%s: antsibull-docs wrote an error page" % page.name
    if kind in WITH_EXAMPLES:
        assert 'id="examples"' in text, "%s: no examples" % page.name
    if kind == "role":
        specs = yaml.safe_load((ROOT / "roles" / name / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        words = re.sub(r"<[^>]+>", "", text)
        for entry_point, spec in specs.items():
            assert "Entry point %s" % entry_point in words, "%s: no entry point %s" % (page.name, entry_point)
            missing = [option for option in spec.get("options") or {} if option not in words]
            assert not missing, "%s: entry point %s lacks options %s" % (page.name, entry_point, missing)


def test_the_collection_index_lists_every_page(build):
    index = (REFERENCE / "index.html").read_text()
    missing = ["%s_%s.html" % (name, kind) for kind, name in PAGES if 'href="%s_%s.html' % (name, kind) not in index]
    assert not missing, missing


def test_the_user_guide_is_there(build):
    index = (HTML / "index.html").read_text()
    for page in GUIDE:
        assert (HTML / "guide" / ("%s.html" % page)).is_file(), page
        assert 'href="guide/%s.html"' % page in index, page


def own_sources():
    """The text of the collection's own documentation (plugins, roles' argument specs, docs/), with
    YAML's escaped line breaks joined (a long URL in a double-quoted string)."""
    parts = []
    for pattern in ("plugins/**/*.py", "roles/*/meta/*.yml", "docs/**/*.md", "galaxy.yml"):
        parts += [path.read_text(errors="replace") for path in ROOT.glob(pattern)]
    return re.sub(r"\\\n\s*", "", "\n".join(parts))


def test_nothing_comes_from_the_network_and_links_out_are_our_own(build):
    sources = own_sources()
    loaded, foreign = set(), set()
    for page in HTML.rglob("*.html"):
        text = page.read_text()
        loaded.update(re.findall(r'<(?:script|img|iframe)\b[^>]*\bsrc="((?:https?:)?//[^"]+)"', text))
        loaded.update(re.findall(r'<link\b[^>]*\bhref="((?:https?:)?//[^"]+)"', text))
        for url in re.findall(r'<a\b[^>]*\bhref="((?:https?:)?//[^"#]+)', text):
            if url not in sources:
                foreign.add("%s: %s" % (page.relative_to(HTML), url))
    assert not loaded, sorted(loaded)
    assert not foreign, sorted(foreign)
