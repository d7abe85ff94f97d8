"""Shared fixtures for the unit tests."""
import pytest

try:
    from ansible.module_utils import _internal as module_internal
except ImportError:  # the Python 3.8 run has no ansible-core 2.19 internals
    module_internal = None


@pytest.fixture(autouse=True)
def run_modules_as_on_the_device(monkeypatch):
    """Importing controller code (the filter plugins' tests do) flips ansible-core's
    process-wide `is_controller` flag, after which module warnings go to the
    controller's display instead of the module's result. Modules run on the device,
    so every test sees them as they run there."""
    if module_internal is not None and hasattr(module_internal, "is_controller"):
        monkeypatch.setattr(module_internal, "is_controller", False)
