"""`ruff check .` lints every Python file, whatever its name.

Ruff picks files by name (*.py), not by shebang: a script without the suffix
(runtime/edgetune-runtime, the twins' nvpmodel and jetson_clocks, ...) is linted
only when ruff.toml's extend-include names it. This test finds every file
with a python shebang and fails when ruff would leave one out.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".cache"}


def skipped_dir(name):
    return name in SKIP_DIRS or name.startswith(".venv")


def python_files():
    """Repository-relative paths of the *.py files and of the files with a python shebang."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not skipped_dir(d)]
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                continue
            if name.endswith(".py"):
                found.add(path.relative_to(ROOT).as_posix())
                continue
            with open(path, "rb") as f:
                first = f.readline(256)
            if first.startswith(b"#!") and b"python" in first:
                found.add(path.relative_to(ROOT).as_posix())
    return found - git_ignored(found)


def git_ignored(paths):
    """The paths .gitignore leaves out (ruff leaves them out too); none outside a git checkout."""
    if not paths or not (ROOT / ".git").exists() or not shutil.which("git"):
        return set()
    done = subprocess.run(["git", "check-ignore", "--stdin"], cwd=str(ROOT), input="\n".join(sorted(paths)) + "\n",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert done.returncode in (0, 1), done.stderr
    return set(done.stdout.split())


def ruff():
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.exists() else shutil.which("ruff")


def test_shebang_detection_sees_the_known_scripts():
    files = python_files()
    for known in ("tools/edgetune_dev/vm/guest/edgetune-vm-boot", "tools/edgetune_dev/twin/guest/jetson_clocks",
                  "runtime/edgetune-runtime"):
        assert known in files
    for shell in ("tools/edgetune_dev/scripts/demo", "tools/edgetune_dev/scripts/unit38",
                  "tools/edgetune_dev/scripts/python38"):
        assert shell not in files


@pytest.mark.controller
def test_ruff_checks_every_python_file():
    assert ruff(), "ruff is not installed (requirements.txt pins it)"
    done = subprocess.run([ruff(), "check", "--show-files", "."], cwd=str(ROOT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert done.returncode == 0, done.stderr
    linted = {(ROOT / line).resolve().relative_to(ROOT).as_posix() for line in done.stdout.splitlines() if line}
    missing = sorted(python_files() - linted)
    assert not missing, "ruff does not check these Python files; add them to extend-include in ruff.toml: %s" % missing
