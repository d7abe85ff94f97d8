"""The product apart from the harness: the CLI's package (cli/edgetune) imports no module of the
development harness (edgetune_dev, tools/), edits no sys.path and makes no link when imported or run;
the harness has its own package and entry point, and tools/ holds no loose script."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "cli" / "edgetune"


def cli_files():
    files = sorted(CLI.rglob("*.py"))
    assert len(files) >= 15, files  # the package is where this test looks
    return files


def imported(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_the_cli_imports_no_harness_module():
    found = {(str(path.relative_to(ROOT)), name) for path in cli_files()
             for name in imported(ast.parse(path.read_text(), str(path)))
             if name.split(".")[0] in ("edgetune_dev", "edgetune_runtime") or name.startswith("ansible_collections")}
    assert not found, "the CLI imports the harness (or the collection by sys.path): %s" % sorted(found)


def is_sys_path(node):
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def test_the_cli_edits_no_sys_path_and_makes_no_link():
    found = []
    for path in cli_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = "%s:%d" % (path.relative_to(ROOT), getattr(node, "lineno", 0))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value) \
                    and node.func.attr in ("insert", "append", "extend", "remove", "clear"):
                found.append("%s: sys.path.%s" % (where, node.func.attr))
            if isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                    is_sys_path(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                found.append("%s: sys.path assigned" % where)
            if isinstance(node, ast.Attribute) and node.attr in ("symlink", "symlink_to"):
                found.append("%s: makes a link" % where)
    assert not found, found


def test_each_package_has_its_own_project_and_entry_point():
    cli = (ROOT / "cli" / "pyproject.toml").read_text()
    harness = (ROOT / "tools" / "pyproject.toml").read_text()
    assert 'name = "edgetune"' in cli and 'edgetune = "edgetune.cli:main"' in cli
    assert '"ansible>=' in cli  # installs whole: ansible-playbook, ansible-galaxy, ansible.posix
    assert 'name = "edgetune-dev"' in harness and 'edgetune-dev = "edgetune_dev.cli:main"' in harness
    assert not (ROOT / "tools" / "edgetune").exists()


def test_tools_holds_no_loose_script():
    loose = sorted(p.name for p in (ROOT / "tools").iterdir() if p.is_file() and p.name != "pyproject.toml")
    assert not loose, "scripts belong to a package's commands (edgetune-dev): %s" % loose
