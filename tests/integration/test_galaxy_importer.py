"""Galaxy would take the collection: the built tarball passes galaxy-importer.

What `make galaxy-import` does: the tarball built with `ansible-galaxy collection build`, then
galaxy-importer (the release tools' venv, requirements-release.txt) with tests/galaxy-importer.cfg:
Galaxy's checks of the metadata, the files' checksums, every plugin's and role's documentation
through ansible-doc, the changelog and ansible-lint (production profile), without its ansible-test
sanity (a container image from a registry; `make sanity` runs ansible-test sanity here). ansible-doc
and ansible-lint are .venv's (the same pinned versions, with ansible.posix, galaxy.yml's dependency),
outside the checkout's ansible.cfg. The import passes with no error and no warning, and finds every
module, plugin, role and playbook of the tree. Here without the importer's ansible-lint pass, which
`make lint` runs with the same profile (`make galaxy-import` runs it too): about 13 CPU-s.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.controller

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RELEASE_PYTHON = REPO / ".cache" / "galaxy-importer-venv" / "bin" / "python"
CONFIG = REPO / "tests" / "galaxy-importer.cfg"
VERSION = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
# plugins/<directory> -> the importer's content type.
CONTENT_TYPES = {"modules": "module", "filter": "filter", "lookup": "lookup", "callback": "callback",
                 "action": "action", "module_utils": "module_utils"}


def expected_contents():
    """{(content type, name)} of every plugin, role and playbook in the tree."""
    found = set()
    for directory, content_type in CONTENT_TYPES.items():
        for path in (REPO / "plugins" / directory).glob("*.py"):
            if not path.name.startswith("_"):
                found.add((content_type, path.stem))
    found |= {("role", path.parent.name) for path in (REPO / "roles").glob("*/tasks")}
    found |= {("playbook", path.name) for path in (REPO / "playbooks").glob("*.yml")}
    return found


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    if not RELEASE_PYTHON.exists():
        pytest.fail("galaxy-importer is missing: `make galaxy-import` makes its venv (%s) from "
                    "requirements-release.txt" % RELEASE_PYTHON.parents[1].relative_to(REPO))
    out = tmp_path_factory.mktemp("galaxy-import")
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out),
                            str(REPO)], capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    tarball = out / ("edgetune-fleet-%s.tar.gz" % VERSION)
    assert tarball.is_file(), build.stdout
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(GALAXY_IMPORTER_CONFIG=str(CONFIG), PATH="%s:%s" % (BIN, os.environ["PATH"]), NO_COLOR="1",
               # ansible-lint's production profile runs in `make lint` (50 of the import's 60 CPU-s);
               # `make galaxy-import` runs the importer's own pass of it too.
               GALAXY_IMPORTER_RUN_ANSIBLE_LINT="False")
    done = subprocess.run([str(RELEASE_PYTHON), "-m", "galaxy_importer.main", "--print-result", str(tarball)],
                          cwd=str(out), env=env, capture_output=True, text=True, timeout=600, check=False)
    return done


def test_import_passes(imported):
    log = imported.stdout + imported.stderr
    assert imported.returncode == 0, log
    assert "Importer processing completed successfully" in log, log
    reported = [line for line in log.splitlines() if line.startswith(("ERROR", "WARNING"))]
    assert not reported, "\n".join(reported)


def test_import_finds_every_content(imported):
    assert imported.returncode == 0, "the import failed: test_import_passes says why"
    # --print-result: the JSON follows the log, from its first line that is "{".
    text = "\n" + imported.stdout
    result = json.loads(text[text.index("\n{\n") + 1:])
    found = {(item["content_type"], item["name"]) for item in result["contents"]}
    missing = sorted(expected_contents() - found)
    assert not missing, "not in the imported collection: %s" % missing
    assert result["metadata"]["version"] == VERSION
