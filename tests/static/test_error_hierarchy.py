"""One error hierarchy: every error class of the collection's Python derives from EdgeError (BadInput
for refused input), and nothing raises a bare built-in error with a message for a caller to read
(OSError stays what a short read or write of the kernel's files is)."""
import ast
import importlib
import inspect
from pathlib import Path

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, EdgeError

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
BUILTIN = {"ValueError", "RuntimeError", "Exception", "TypeError", "KeyError"}


def sources():
    return [p for p in sorted(PLUGINS.rglob("*.py")) if "__pycache__" not in p.parts]


def test_no_bare_builtin_error_carries_a_message():
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id in BUILTIN:
                    found.append("%s:%d raise %s(...)" % (path.relative_to(PLUGINS), node.lineno, func.id))
    assert not found, "raise an EdgeError (BadInput for refused input) instead:\n" + "\n".join(found)


def test_every_error_class_of_the_module_utilities_is_an_edge_error():
    outside = []
    for path in sorted((PLUGINS / "module_utils").glob("*/*.py")):
        module = importlib.import_module("ansible_collections.edgetune.fleet.plugins.module_utils.%s.%s"
                                         % (path.parent.name, path.stem))
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__
                    and not name.startswith("_") and not issubclass(value, EdgeError)):
                outside.append("%s.%s" % (path.stem, name))
    assert not outside, "derive these from EdgeError or BadInput: %s" % ", ".join(outside)


def test_refused_input_is_still_a_value_error_for_validating_callers():
    assert issubclass(BadInput, ValueError) and issubclass(BadInput, EdgeError)
    error = BadInput("invalid CPU list item 'x' in 'x'")
    assert str(error) == "invalid CPU list item 'x' in 'x'" and error.errors == ["invalid CPU list item 'x' in 'x'"]
