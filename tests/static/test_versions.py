"""The collection's versions agree, and its changelog is the one antsibull-changelog generates.

- galaxy.yml's version is at least every ``version_added`` of the collection: the plugins'
  DOCUMENTATION (the plugin's own and its options', at any depth; sidecar YAML docs too) and the
  roles' ``meta/argument_specs.yml`` (entry points and options), and at least the newest release in
  changelogs/changelog.yaml.
- Every ``version_added`` is a release in changelogs/changelog.yaml (no plugin claims a version that
  was never released, or one ahead of galaxy.yml).
- The CLI's version (cli/edgetune/__init__.py, ``__version__``) is galaxy.yml's.
- CHANGELOG.md is current: ``antsibull-changelog generate`` in a copy of galaxy.yml and changelogs/
  writes the same file, and ``antsibull-changelog lint`` and ``lint-changelog-yaml`` find nothing.

antsibull-changelog comes from the release tools' venv (requirements-release.txt, made by
``make galaxy-import``), else from PATH; its three commands run in one interpreter. About 4 CPU-s.
"""
import ast
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RELEASE_VENV = ROOT / ".cache" / "galaxy-importer-venv"
DOC_VARIABLES = ("DOCUMENTATION",)
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(text):
    return yaml.load(text, Loader=LOADER)  # noqa: S506 (a safe loader)


def _version(text, where):
    match = VERSION.match(str(text))
    assert match, "%s: %r is not a version MAJOR.MINOR.PATCH" % (where, text)
    return tuple(int(part) for part in match.groups())


def _galaxy_version():
    return _load((ROOT / "galaxy.yml").read_text())["version"]


@functools.lru_cache(maxsize=None)
def _releases():
    changelog = _load((ROOT / "changelogs" / "changelog.yaml").read_text())
    return changelog.get("releases") or {}


def _walk(data, where):
    """(where, version) of every version_added in a loaded document, at any depth."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "version_added":
                yield where, str(value)
            else:
                yield from _walk(value, "%s/%s" % (where, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _walk(value, "%s[%d]" % (where, index))


def _python_docs(path):
    """The plugin file's DOCUMENTATION, loaded (None where it has none)."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                isinstance(target, ast.Name) and target.id in DOC_VARIABLES for target in node.targets):
            return _load(node.value.value)
    return None


def versions_added():
    """[(where, version)] of every version_added in the plugins' and the roles' documentation."""
    found = []
    for path in sorted((ROOT / "plugins").glob("*/*")):
        if path.parent.name in ("module_utils", "action") or path.name.startswith("_"):
            continue
        rel = path.relative_to(ROOT)
        if path.suffix == ".py":
            found += _walk(_python_docs(path), str(rel))
        elif path.suffix in (".yml", ".yaml"):
            found += _walk(_load(path.read_text()), str(rel))
    for path in sorted(ROOT.glob("roles/*/meta/argument_specs.y*ml")):
        found += _walk(_load(path.read_text()), str(path.relative_to(ROOT)))
    return found


VERSIONS_ADDED = versions_added()


def test_version_added_found():
    # The walk finds them (a plugin DOCUMENTATION moved elsewhere would silently check nothing).
    assert len(VERSIONS_ADDED) >= 30, VERSIONS_ADDED


def test_galaxy_version_not_below_any_version_added():
    galaxy = _galaxy_version()
    ahead = ["%s: version_added %s is newer than galaxy.yml's version %s" % (where, added, galaxy)
             for where, added in VERSIONS_ADDED
             if _version(added, where) > _version(galaxy, "galaxy.yml")]
    assert not ahead, "\n".join(ahead)


def test_galaxy_version_not_below_a_release():
    galaxy = _galaxy_version()
    newer = [release for release in _releases()
             if _version(release, "changelog.yaml") > _version(galaxy, "galaxy.yml")]
    assert not newer, "changelogs/changelog.yaml has releases newer than galaxy.yml's version %s: %s" % (
        galaxy, ", ".join(newer))


def test_every_version_added_is_a_release():
    releases = _releases()
    missing = ["%s: version_added %s is no release in changelogs/changelog.yaml (releases: %s)" % (
        where, added, ", ".join(releases)) for where, added in VERSIONS_ADDED if added not in releases]
    assert not missing, "\n".join(missing)


def test_every_release_has_a_date_and_changes():
    problems = []
    for version, release in _releases().items():
        _version(version, "changelogs/changelog.yaml")
        if not re.match(r"^\d{4}-\d{2}-\d{2}$", str(release.get("release_date", ""))):
            problems.append("release %s has no release_date" % version)
        if not (release.get("changes") or release.get("modules") or release.get("plugins")):
            problems.append("release %s lists no change" % version)
    assert not problems, "\n".join(problems)


def test_cli_version_is_galaxy_version():
    tree = ast.parse((ROOT / "cli" / "edgetune" / "__init__.py").read_text())
    versions = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)]
    assert versions == [_galaxy_version()], \
        "cli/edgetune/__init__.py __version__ %s, galaxy.yml version %s" % (versions, _galaxy_version())


# antsibull-changelog's commands, run once in one interpreter of its venv (each command started
# apart costs a second of start-up): {command: [exit code, output]}.
ANTSIBULL = """
import contextlib, io, json, os, sys
from antsibull_changelog.cli import run
root, copy = sys.argv[1:3]
results = {}
for name, cwd, argv in (
        ("lint", root, ["lint"]),
        ("lint-changelog-yaml", root, ["lint-changelog-yaml", "--strict", "changelogs/changelog.yaml"]),
        ("generate", copy, ["generate"])):
    os.chdir(cwd)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = run(["antsibull-changelog"] + argv)
        except SystemExit as exit:
            rc = exit.code
    results[name] = [rc, out.getvalue().strip()]
print(json.dumps(results))
"""


def _release_python():
    beside = RELEASE_VENV / "bin" / "python"
    if beside.exists():
        return str(beside)
    tool = shutil.which("antsibull-changelog")
    if tool:  # a venv of one's own: its python is beside the command
        return str(Path(tool).parent / "python")
    pytest.fail("antsibull-changelog is missing: `make galaxy-import` makes its venv (%s) from "
                "requirements-release.txt" % RELEASE_VENV.relative_to(ROOT))


@pytest.fixture(scope="module")
def antsibull(tmp_path_factory):
    """The results of lint, lint-changelog-yaml and generate (in a copy of galaxy.yml and changelogs/)."""
    copy = tmp_path_factory.mktemp("changelog")
    shutil.copy2(ROOT / "galaxy.yml", copy / "galaxy.yml")
    shutil.copytree(ROOT / "changelogs", copy / "changelogs", ignore=shutil.ignore_patterns(".plugin-cache.yaml"))
    done = subprocess.run([_release_python(), "-c", ANTSIBULL, str(ROOT), str(copy)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, NO_COLOR="1"), check=False)
    assert done.returncode == 0, "antsibull-changelog: %s" % (done.stdout + done.stderr).strip()
    results = json.loads(done.stdout.strip().splitlines()[-1])
    results["copy"] = copy
    return results


@pytest.mark.parametrize("command", ["lint", "lint-changelog-yaml"])
def test_changelog_lints(antsibull, command):
    rc, out = antsibull[command]
    assert rc == 0 and not out, "antsibull-changelog %s: %s" % (command, out)


def test_changelog_md_is_generated(antsibull):
    rc, out = antsibull["generate"]
    assert rc == 0, "antsibull-changelog generate: %s" % out
    generated = (antsibull["copy"] / "CHANGELOG.md").read_text()
    assert (ROOT / "CHANGELOG.md").read_text() == generated, (
        "CHANGELOG.md is not what antsibull-changelog generates from changelogs/: it is generated, "
        "never edited (a change is a fragment in changelogs/fragments/); run `antsibull-changelog "
        "generate` (or `release`)")
