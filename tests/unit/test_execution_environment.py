"""The AWX / Automation Platform execution environment (extras/awx): `ansible-builder
create` on the example definition, with the collection built by `ansible-galaxy
collection build`, yields a build context that installs every controller-side
Python import of the collection (plugins/action, filter, lookup, callback and
the module_utils they import) and of the edgetune CLI (cli/edgetune).

No image is built here: `make ee` builds it on a local Debian base and runs
site.yml and `edgetune audit` from it (tools/edgetune_dev/ee, tests/ee).
"""
import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

# ansible-builder and ansible-galaxy: the controller's (not part of the Python 3.8 run).
pytestmark = pytest.mark.controller

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AWX = REPO / "extras" / "awx"
CONTROLLER_DIRS = ["plugins/action", "plugins/filter", "plugins/lookup", "plugins/callback"]
COLLECTION_PREFIX = "ansible_collections.edgetune.fleet."
# Imports that an EE does not install, and why. Each must still be imported somewhere
# (test_exclusions_are_current), so the list cannot go stale silently.
NOT_IN_EE = {
    # module_utils/device/edge_netqos_loader.py (imported by edge_intent on the controller) imports
    # them inside the functions that run on the devices, which get Debian's python3-bpfcc
    # and python3-pyroute2 from the edge_netqos role.
    "bcc": "the eBPF loader's, on the devices (and `edgetune bpf` on its own host, through the "
           "system Python); bcc is not on PyPI and a job template does not need it",
    "pyroute2": "only with bcc (the loader, on the devices)",
}
# The development harness of a checkout (twins, VM, benchmarks, packaging): not in the wheel, and the
# CLI never imports it (test_cli_never_imports_the_harness), so it needs no exclusion here.
HARNESS = "edgetune_dev"


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(line):
    line = line.split("#", 1)[0].strip()
    return _norm(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line).group(0)) if line else None


def _req_names(text):
    return {n for n in map(_req_name, text.splitlines()) if n}


def _top_imports(path):
    """Absolute imports of one file: {top-level name or collection module path}."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update("%s.%s" % (node.module, a.name) for a in node.names)
    return names


def _collection_file(module):
    rel = Path(*module[len(COLLECTION_PREFIX):].split("."))
    for cand in (REPO / rel.with_suffix(".py"), REPO / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _third_party(files):
    """{top-level import: [importing files]} beyond the stdlib, Ansible, the collection
    itself (followed into the module_utils it imports) and modules next to the importer."""
    found, seen, todo = {}, set(), list(files)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _top_imports(path):
            top = name.split(".")[0]
            if name.startswith(COLLECTION_PREFIX):
                target = _collection_file(name)
                if target:
                    todo.append(target)
            elif top in sys.stdlib_module_names or top in ("ansible", "ansible_collections", "edgetune", "__future__"):
                continue
            elif (path.parent / (top + ".py")).is_file():
                continue  # a sibling module
            else:
                found.setdefault(top, []).append(str(path.relative_to(REPO)))
    return found


def _distribution(import_name):
    dists = importlib.metadata.packages_distributions().get(import_name)
    assert dists, "%s is imported but no installed distribution provides it: add it to the map" % import_name
    return _norm(dists[0])


def collection_imports():
    files = [p for d in CONTROLLER_DIRS for p in sorted((REPO / d).glob("*.py"))]
    assert files
    return _third_party(files)


def cli_imports():
    """The CLI's wheel: the package edgetune (the harness, edgetune_dev, is not in it)."""
    return _third_party(sorted((REPO / "cli" / "edgetune").rglob("*.py")))


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    """ansible-builder create on a copy of extras/awx, with the collection tarball and a
    stand-in CLI wheel (a real one needs setuptools' build isolation, i.e. an index)."""
    tmp = tmp_path_factory.mktemp("ee")
    awx = tmp / "awx"
    shutil.copytree(AWX, awx, ignore=shutil.ignore_patterns("context", "*.tar.gz", "*.whl"))
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path",
                    str(awx / "collections"), str(REPO)], check=True, capture_output=True, text=True)
    (awx / "wheels" / "edgetune-0.0.0-py3-none-any.whl").write_bytes(b"stand-in")
    done = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", str(awx / "execution-environment.yml"),
                           "-c", str(tmp / "context")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ctx = tmp / "context"
    tarballs = sorted((ctx / "_build" / "collections").glob("edgetune-fleet-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    # The collection as ansible-builder's galaxy stage leaves it, to run its introspect on.
    colls = tmp / "usr-share-ansible"
    # --force and cwd: not "already installed" through the checkout's ansible.cfg.
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "--force", "-p", str(colls),
                    str(tarballs[0])], check=True, capture_output=True, text=True, cwd=str(tmp))
    assert (colls / "ansible_collections" / "edgetune" / "fleet" / "MANIFEST.json").is_file()
    files = [p for p in (ctx / "Containerfile", ctx / "Dockerfile") if p.is_file()]
    assert len(files) == 1, files
    return {"dir": ctx, "tarball": tarballs[0], "collections": colls, "containerfile": files[0].read_text()}


def test_collection_ships_its_ee_metadata(context):
    with tarfile.open(context["tarball"]) as tar:
        names = set(tar.getnames())
        meta = yaml.safe_load(tar.extractfile("meta/execution-environment.yml"))
    deps = meta["dependencies"]
    assert {deps["python"], deps["system"]} <= names, "build_ignore dropped the EE requirement files"


def test_collection_requirements_cover_controller_imports():
    reqs = _req_names((REPO / "meta" / "ee-requirements.txt").read_text())
    imports = collection_imports()
    assert "yaml" in imports  # the scan sees imports at all
    missing = {name: files for name, files in imports.items()
               if name not in NOT_IN_EE and _distribution(name) not in reqs}
    assert not missing, "controller-side imports missing from meta/ee-requirements.txt: %s" % missing


def test_collection_bindep_has_systemd_analyze():
    uses = any("systemd-analyze" in p.read_text() for d in CONTROLLER_DIRS for p in (REPO / d).glob("*.py"))
    bindep = _req_names((REPO / "meta" / "ee-bindep.txt").read_text())
    assert not uses or "systemd" in bindep


def test_context_installs_every_controller_import(context):
    ctx = context["dir"]
    containerfile = context["containerfile"]
    # What the build pip-installs: the base stage's ANSIBLE_INSTALL_REFS, with
    # ansible-core's own requirements, and the builder stage's introspect output
    # (the collections' EE requirements plus the definition's python requirements).
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]*)"', containerfile, re.M).group(1).split()
    installed = {_req_name(r) for r in refs}
    assert {"ansible-core", "ansible-runner"} <= installed
    installed |= {_req_name(r) for r in importlib.metadata.requires("ansible-core") or [] if "extra ==" not in r}
    out = ctx.parent / "introspected.txt"
    subprocess.run([sys.executable, str(ctx / "_build" / "scripts" / "introspect.py"), "introspect",
                    str(context["collections"]), "--user-pip", str(ctx / "_build" / "requirements.txt"),
                    "--write-pip", str(out), "--write-bindep", str(ctx.parent / "bindep.txt")],
                   check=True, capture_output=True, text=True)
    installed |= _req_names(out.read_text())
    assert "systemd" in _req_names((ctx.parent / "bindep.txt").read_text())

    imports = {**collection_imports()}
    for name, files in cli_imports().items():
        imports.setdefault(name, []).extend(files)
    missing = {name: files for name, files in imports.items()
               if name not in NOT_IN_EE and _distribution(name) not in installed}
    assert not missing, "imports the execution environment would not install: %s" % missing


def test_cli_dependencies_listed():
    pyproject = (REPO / "cli" / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)\]", pyproject, re.M | re.S).group(1)
    wanted = {_req_name(d) for d in re.findall(r'"([^"]+)"', deps)}
    assert wanted <= _req_names((AWX / "requirements.txt").read_text())


def test_cli_never_imports_the_harness():
    imports = cli_imports()
    assert "yaml" in imports  # the scan sees the CLI's imports at all
    assert HARNESS not in imports, imports.get(HARNESS)


def test_exclusions_are_current():
    assert set(NOT_IN_EE) <= set(cli_imports()) | set(collection_imports())


def test_context_carries_collection_and_wheel(context):
    ctx = context["dir"]
    assert (ctx / "_build" / "wheels" / "edgetune-0.0.0-py3-none-any.whl").is_file()
    containerfile = context["containerfile"]
    assert "/build/collections/edgetune-fleet-*.tar.gz" in containerfile
    assert "COPY _build/wheels/ /tmp/edgetune-wheels/" in containerfile
    assert 'ARG EE_BASE_IMAGE="localhost/edgetune-ee-base:latest"' in containerfile


def test_no_collection_from_galaxy(context):
    """ansible.posix comes from the ansible package, edgetune.fleet from its tarball: Galaxy is never asked."""
    assert yaml.safe_load((AWX / "requirements.yml").read_text()) == {"collections": []}
    assert "ansible" in _req_names((AWX / "requirements.txt").read_text())
    install = [line for line in context["containerfile"].splitlines() if "/build/collections/edgetune-fleet-" in line]
    assert install and all("--no-deps" in line for line in install), install


def test_cli_wheel_recipes_build_from_a_path():
    """`pip wheel ... tools` once resolved an unrelated package named tools on the index: every recipe
    builds the CLI's wheel from a path (./cli, ../../cli), offline."""
    recipes = [line for path in (REPO / "README.md", AWX / "execution-environment.yml", AWX / "wheels" / "README.md")
               for line in path.read_text().splitlines() if "pip wheel" in line]
    assert recipes
    for line in recipes:
        text = line.strip().lstrip("#").strip()  # a YAML comment's recipe
        command = text.split(" #")[0].strip("`").split("`")[0].split()
        assert "--no-index" in command and command[-1].endswith("/cli"), line


def test_every_pip_stage_can_build_offline(context):
    """With --build-arg PIP_NO_INDEX=1 (make ee) no pip run may need an index: each stage that runs pip
    declares the ARGs that make wheelhouse/ its find-links before its first pip run, except the builder
    stage's own `pip install bindep pyyaml packaging` (before its prepend steps), which the base stage
    has already satisfied."""
    stages = re.split(r"^FROM ", context["containerfile"], flags=re.M)[1:]
    own = "RUN $PYCMD -m pip install --no-cache-dir bindep pyyaml packaging"
    for stage in stages:
        lines = stage.splitlines()
        name = lines[0]
        runs_pip = [i for i, line in enumerate(lines)
                    if line.startswith("RUN") and re.search(r"pip install|scripts/assemble|install-from-bindep", line)
                    and not (line == own and "AS builder" in name)]
        if not runs_pip:
            continue
        args = [i for i, line in enumerate(lines) if line.startswith("ARG PIP_FIND_LINKS=/tmp/edgetune-wheelhouse")]
        assert args and args[0] < runs_pip[0], name
        assert any(line == "ARG PIP_NO_INDEX" for line in lines[:runs_pip[0]]), name
        if "AS base" in name:
            assert own in lines, "the base stage installs the builder stage's own tools"
