"""The project's device-side code (module_utils/, runtime/), loaded by path.

The controller tools use the very code that runs on the devices: one
implementation, not a copy. Ansible does not put custom module_utils on the
controller's import path, so they are loaded from the checkout by file name.
"""
import importlib.util
import sys
from pathlib import Path

from edgetune.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
MODULE_UTILS = REPO / "module_utils"


def load_file(name, path):
    """Import the Python file ``path`` as module ``name`` (once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    path = Path(path)
    if not path.is_file():
        raise UsageError("cannot find %s; run edgetune from the edgetune checkout (pip install -e tools)" % path)
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def module_util(name):
    """module_utils/<name>.py (stdlib-only files; the ones that import other module_utils need Ansible)."""
    return load_file("edgetune_device_" + name, MODULE_UTILS / (name + ".py"))
