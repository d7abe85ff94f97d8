"""plugins/module_utils by where the code runs: device/ (the boards, outside Ansible too, Python 3.8),
plan/ (the controller's intent, validation and plan), bench/ (latency measurement and autotune) and
common/ (CPU lists, errors, file writes, commands). Device and common code import nothing but their
own kind, the standard library and the board's bcc and pyroute2."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UTILS = ROOT / "plugins" / "module_utils"
PACKAGE = "ansible_collections.edgetune.fleet.plugins.module_utils"
KINDS = ("common", "device", "plan", "bench")
# What each kind may import of the collection's module utilities (the other kinds are refused).
ALLOWED = {"common": ("common",), "device": ("device", "common"),
           "bench": ("bench", "device", "common"), "plan": KINDS}
# On the boards, besides the standard library.
BOARD_PACKAGES = ("bcc", "pyroute2")


def imports(path):
    """(line, dotted name) of every import in the file, nested ones too."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, "%s:%d: a relative import" % (path, node.lineno)
            yield from ((node.lineno, "%s.%s" % (node.module, alias.name)) for alias in node.names)


def test_every_module_utility_is_in_the_subpackage_of_where_it_runs():
    assert not sorted(p.name for p in UTILS.glob("*.py")), "a module utility outside " + ", ".join(KINDS)
    assert sorted(p.name for p in UTILS.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(KINDS)
    for kind in KINDS:
        assert list((UTILS / kind).glob("*.py")), kind


def test_each_kind_imports_only_what_runs_where_it_runs():
    found = []
    for kind in KINDS:
        for path in sorted((UTILS / kind).glob("*.py")):
            for line, name in imports(path):
                where = "%s:%d %s" % (path.relative_to(ROOT), line, name)
                top = name.split(".")[0]
                if name.startswith(PACKAGE + "."):
                    if name[len(PACKAGE) + 1:].split(".")[0] not in ALLOWED[kind]:
                        found.append(where)
                elif kind in ("device", "common") and top not in sys.stdlib_module_names \
                        and top not in (BOARD_PACKAGES if kind == "device" else ()):
                    found.append(where)
                elif top == "ansible_collections" or (top == "ansible" and kind != "plan"):
                    found.append(where)
    assert not found, "imports outside what runs there:\n" + "\n".join(found)


def test_the_plan_imports_no_benchmark():
    """The plan's values come from the plan's own code; a benchmark measures, it derives nothing."""
    found = ["%s:%d %s" % (path.relative_to(ROOT), line, name)
             for path in sorted((UTILS / "plan").glob("*.py")) for line, name in imports(path)
             if name.startswith(PACKAGE + ".bench.edge_llm_bench")]
    assert not found, found
