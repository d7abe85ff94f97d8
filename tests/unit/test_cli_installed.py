"""`edgetune` installed from its wheel beside the collection installed by ansible-galaxy, outside any checkout.

The wheel (built from a copy of cli/) goes into a --target directory; the
collection into collections paths of its own. The CLI then runs from an
empty directory with a Python that cannot see this checkout: ``python -S``
skips site-packages and their .pth files, so the venv's editable installs of
cli/ and tools/ (.pth files and their finders) are not loaded; PYTHONPATH
gives the installed wheel first, then the venv's site-packages for the
dependencies (ansible-core, PyYAML), which hold no edgetune. The subprocess
checks where edgetune was imported from. The wheel holds the product only:
no module of the development harness (edgetune_dev), whose commands an
installed edgetune does not offer. A fresh virtualenv with the wheel and its
dependencies is tests/integration/test_consumer.py's.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.controller

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(argv, **kwargs):
    done = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False, **kwargs)
    assert done.returncode == 0, "%s: %s%s" % (argv, done.stdout, done.stderr)
    return done


def galaxy_install(tarball, path):
    run([BIN / "ansible-galaxy", "collection", "install", "--no-deps", "--force", "-p", path, tarball],
        env=dict(clean_env(path.parent), ANSIBLE_COLLECTIONS_PATH=str(path)))


def clean_env(tmp_path):
    """No ANSIBLE_* (make exports ANSIBLE_CONFIG), no PYTHONPATH of the caller, a HOME without ~/.ansible.cfg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env["HOME"] = str(tmp_path / "home")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("installed")
    (tmp / "home").mkdir()
    dist = tmp / "dist"
    # The wheel from a copy of cli/ (a build writes build/ and *.egg-info next to pyproject.toml).
    source = tmp / "src"
    shutil.copytree(ROOT / "cli", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "-w", dist, source], env=clean_env(tmp))
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", dist, "--force", ROOT],
        env=clean_env(tmp))
    (wheel,) = dist.glob("edgetune-*.whl")
    (tarball,) = dist.glob("edgetune-fleet-*.tar.gz")
    galaxy_install(tarball, tmp / "collections")
    site = tmp / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
         "--target", site, wheel], env=clean_env(tmp))
    empty = tmp / "empty"
    empty.mkdir()
    return tmp


def edgetune(tmp, *args, cwd=None, collections=None):
    """`edgetune ARGS` as its console script, run by a Python that sees the wheel and the venv's
    dependencies only."""
    env = clean_env(tmp)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "site"), sysconfig.get_paths()["purelib"]])
    if collections:
        env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(str(c) for c in collections)
    return subprocess.run([sys.executable, "-S", str(tmp / "site" / "bin" / "edgetune")] + list(args),
                          cwd=str(cwd or tmp / "empty"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)


def test_the_python_sees_the_wheel_not_the_checkout(installed):
    env = clean_env(installed)
    env["PYTHONPATH"] = os.pathsep.join([str(installed / "site"), sysconfig.get_paths()["purelib"]])
    done = run([sys.executable, "-S", "-c", "import json, sys, edgetune; print(edgetune.__file__); "
                "print(json.dumps(sys.path))"], cwd=str(installed / "empty"), env=env)
    where, path = done.stdout.splitlines()
    assert where == str(installed / "site" / "edgetune" / "__init__.py")
    checkout = [p for p in json.loads(path) if p and Path(p).resolve().is_relative_to(ROOT)]
    assert checkout == [sysconfig.get_paths()["purelib"]]  # the venv's dependencies; not tools/ nor .cache/


def core_version():
    from ansible.release import __version__
    return __version__


def test_version_names_the_cli_ansible_core_and_the_collection_path(installed):
    from edgetune import COLLECTION_VERSION, __version__
    done = edgetune(installed, "--version", collections=[installed / "collections"])
    assert done.returncode == 0, done.stderr
    found = installed / "collections" / "ansible_collections" / "edgetune" / "fleet"
    assert done.stdout == "edgetune %s, ansible-core %s, collection edgetune.fleet %s (MANIFEST.json of %s)\n" % (
        __version__, core_version(), COLLECTION_VERSION, found)


def test_the_wheel_holds_the_product_and_no_harness(installed):
    """edgetune, its device checks and verify's playbook; nothing of edgetune_dev (twins, VM, benchmarks,
    packaging), and the harness's commands are not offered."""
    (wheel,) = (installed / "dist").glob("edgetune-*.whl")
    with zipfile.ZipFile(str(wheel)) as archive:
        names = archive.namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"edgetune"}, packages
    for wanted in ("edgetune/cli.py", "edgetune/verify.py", "edgetune/verify_plan.yml", "edgetune/checks/plugin.py",
                   "edgetune/checks/bootargs.py", "edgetune/checks/runtime.py"):
        assert wanted in names, wanted
    assert not [n for n in names if "twin" in n or "/vm/" in n or "bench" in n or "artifacts" in n], names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(str(wheel)) as archive:
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    assert not [r for r in requires if "matplotlib" in r] and [r for r in requires if "pytest-testinfra" in r]
    # Ansible itself (ansible-playbook, ansible-galaxy, ansible.posix) comes with the CLI.
    assert [r for r in requires if r.startswith("Requires-Dist: ansible") and "<13" in r], requires
    assert not (installed / "site" / "edgetune_dev").exists()
    done = edgetune(installed, "--help", collections=[installed / "collections"])
    choices = re.search(r"\{([a-z,]+)\}", done.stdout).group(1).split(",")
    assert sorted(choices) == ["audit", "bpf", "pcie", "plan", "tune", "verify"], done.stdout
    done = edgetune(installed, "twin", "up", collections=[installed / "collections"])
    assert done.returncode == 2 and "invalid choice: 'twin'" in done.stderr


def test_verify_names_a_device_it_cannot_plan_and_reports_it(installed):
    """verify --help, and a run with the wheel's playbook (no checkout): a device that cannot be planned is
    named in one line, not checked, and an error in the JUnit report (exit 1)."""
    done = edgetune(installed, "verify", "--help", collections=[installed / "collections"])
    assert done.returncode == 0 and "--limit" in done.stdout, done.stderr
    work = installed / "verify-work"
    work.mkdir(exist_ok=True)
    (work / "ansible.cfg").write_text("[defaults]\ninventory = hosts.yml\ncollections_path = %s\n"
                                      % (installed / "collections"))
    (work / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"ghost": {
        "ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"}}}}))
    done = edgetune(installed, "verify", "-l", "ghost", "--junit", "v.xml", cwd=work)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("edgetune: ghost")]
    assert len(said) == 1 and said[0].startswith("edgetune: ghost: cannot be verified: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    report = (work / "v.xml").read_text()
    assert 'name="ghost"' in report and 'errors="1"' in report, report[:500]


@pytest.mark.parametrize("command", ["--help", "plan --help", "audit --help", "verify --help", "tune runtime --help",
                                     "pcie show --help", "bpf --help"])
@pytest.mark.parametrize("where", ["collections", "nowhere"])
def test_help_works_installed_with_or_without_the_collection(installed, command, where):
    done = edgetune(installed, *command.split(), collections=[installed / where])
    assert done.returncode == 0 and done.stdout.startswith("usage: edgetune"), done.stderr
    assert done.stderr == ""


def test_what_an_installation_lacks_is_one_line_and_exit_2(installed):
    # verify without pytest and testinfra for this Python (the wheel installed with --no-deps beside them).
    bare = installed / "bare"
    if not bare.exists():
        bare.mkdir()
        shutil.copytree(installed / "site" / "edgetune", bare / "edgetune")
        shutil.copytree(installed / "site" / "bin", bare / "bin")
    env = clean_env(installed)
    env.update(PYTHONPATH=os.pathsep.join([str(bare), str(installed / "deps")]),
               ANSIBLE_COLLECTIONS_PATH=str(installed / "collections"))
    deps = installed / "deps"
    if not deps.exists():  # the venv's dependencies but pytest's and testinfra's
        deps.mkdir()
        purelib = Path(sysconfig.get_paths()["purelib"])
        for entry in purelib.iterdir():
            if not entry.name.startswith(("pytest", "_pytest", "testinfra", "pytest_testinfra", "edgetune",
                                          "__editable__")) and not entry.name.endswith(".pth"):
                (deps / entry.name).symlink_to(entry)
    done = subprocess.run([sys.executable, "-S", str(bare / "bin" / "edgetune"), "verify", "-l", "orin-fleet"],
                          cwd=str(installed / "empty"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "`edgetune verify` runs the device checks with pytest and pytest-testinfra, which are not installed" \
        in done.stderr, done.stderr
    # Without the collection, a command that needs its code says so (also one line, exit 2).
    done = edgetune(installed, "bpf", "status", collections=[installed / "nowhere"])
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "the collection edgetune.fleet is not installed where" in done.stderr
    done = edgetune(installed, "--version", collections=[installed / "nowhere"])
    assert done.returncode == 0 and "collection edgetune.fleet not found (looked in %s" % (
        installed / "nowhere") in done.stdout
    assert "ansible-galaxy collection install edgetune-fleet-" in done.stdout


def test_plan_outside_a_checkout_without_the_collection_says_so(installed):
    """No checkout to fall back to: the preflight playbook can only be an installed collection's (by FQCN)."""
    (installed / "empty2").mkdir(exist_ok=True)
    (installed / "empty2" / "hosts.yml").write_text(json.dumps({"all": {"hosts": {}}}))
    done = edgetune(installed, "plan", "-i", "hosts.yml", cwd=installed / "empty2", collections=[installed / "nowhere"])
    assert done.returncode == 2
    assert "the collection edgetune.fleet is not installed where" in done.stderr, done.stderr


def test_nothing_is_written_next_to_the_package_or_in_the_working_directory(installed):
    edgetune(installed, "--version", collections=[installed / "collections"])
    edgetune(installed, "plan", "--help")
    assert not (installed / ".cache").exists() and not (installed / ".cache").is_symlink()
    assert not (installed / "site" / ".cache").exists()
    assert list((installed / "empty").iterdir()) == []


@pytest.fixture(scope="module")
def other_version(installed):
    """The collection at another version (a minimal one), installed by ansible-galaxy in a second path."""
    source = installed / "src-0.1.99"
    (source / "meta").mkdir(parents=True)
    (source / "galaxy.yml").write_text("namespace: edgetune\nname: fleet\nversion: 0.1.99\nreadme: README.md\n"
                                       "authors: [test]\n")
    (source / "README.md").write_text("an older edgetune.fleet\n")
    (source / "meta" / "runtime.yml").write_text("requires_ansible: '>=2.15.0'\n")
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", installed / "dist-0.1.99", source],
        env=clean_env(installed))
    (tarball,) = (installed / "dist-0.1.99").glob("*.tar.gz")
    galaxy_install(tarball, installed / "collections2")
    return installed / "collections2" / "ansible_collections" / "edgetune" / "fleet"


def test_version_names_the_collection_ansible_finds_first(installed, other_version):
    from edgetune import COLLECTION_VERSION, __version__
    expected = "edgetune %s, ansible-core %s, collection edgetune.fleet 0.1.99 (MANIFEST.json of %s); edgetune %s " \
               "expects collection %s\n" % (__version__, core_version(), other_version, __version__, COLLECTION_VERSION)
    done = edgetune(installed, "--version", collections=[installed / "collections2", installed / "collections"])
    assert done.stdout == expected, done.stderr
    # The operator's ansible.cfg in the working directory, as Ansible reads it (relative to the file).
    ops = installed / "ops"
    ops.mkdir(exist_ok=True)
    (ops / "ansible.cfg").write_text("[defaults]\ncollections_path = ../collections2:../collections\n")
    done = edgetune(installed, "--version", cwd=ops)
    assert done.stdout == expected, done.stderr
    (ops / "ansible.cfg").write_text("[defaults]\ncollections_path = ../collections\n")
    done = edgetune(installed, "--version", cwd=ops)
    assert done.stdout.startswith("edgetune %s, ansible-core %s, collection edgetune.fleet %s (MANIFEST.json of %s)\n"
                                  % (__version__, core_version(), COLLECTION_VERSION,
                                     installed / "collections" / "ansible_collections" / "edgetune" / "fleet"))


def test_the_listing_imports_no_tool_module_and_gives_each_modules_own_help():
    done = run([sys.executable, "-c", "import json, sys; from edgetune import cli; cli.build_parser([]); "
                "print(json.dumps([m for _c, m, _h in cli.COMMANDS if m in sys.modules]))"])
    assert json.loads(done.stdout) == []
    from edgetune import cli

    def helps(parser):
        (action,) = [a for a in parser._actions if a.dest == "command"]
        return {choice.dest: choice.help for choice in action._choices_actions}
    assert helps(cli.build_parser([])) == helps(cli.build_parser())  # the table's help is the modules' own
