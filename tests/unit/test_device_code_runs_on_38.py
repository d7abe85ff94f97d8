"""The code that runs on the boards (plugins/module_utils/device and common) compiles and imports under
the Python running this test: make unit38 runs it under Python 3.8, JetPack 5's."""
import importlib
from pathlib import Path

import pytest

UTILS = Path(__file__).resolve().parents[2] / "plugins" / "module_utils"
DEVICE_FILES = sorted(UTILS.glob("device/*.py")) + sorted(UTILS.glob("common/*.py"))


def test_the_device_code_is_where_this_test_looks():
    assert len(DEVICE_FILES) >= 20 and (UTILS / "device" / "edge_boot.py") in DEVICE_FILES


@pytest.mark.parametrize("path", DEVICE_FILES, ids=lambda p: "%s/%s" % (p.parent.name, p.stem))
def test_compiles_and_imports(path):
    compile(path.read_text(), str(path), "exec", dont_inherit=True)
    importlib.import_module("ansible_collections.edgetune.fleet.plugins.module_utils.%s.%s"
                            % (path.parent.name, path.stem))
