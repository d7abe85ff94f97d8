"""Shared fixtures and helpers for the unit tests."""
import http.server
import io
import shutil
import threading
from pathlib import Path

import pytest
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_package import program_files

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


class LocalServer(object):
    """An HTTP server on 127.0.0.1 in a thread, answering with a subclass of ``handler`` that has
    ``attrs`` as class attributes (a context manager; ``port`` and ``handler``)."""

    def __init__(self, handler, **attrs):
        self.handler = type(handler.__name__, (handler,), attrs)
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


@pytest.fixture
def local_server():
    """start(handler, **attrs) -> (port, handler class); every server is closed at the end of the test."""
    servers = []

    def start(handler, **attrs):
        servers.append(LocalServer(handler, **attrs))
        return servers[-1].port, servers[-1].handler

    yield start
    for server in servers:
        server.close()


def run_boot_program(state_dir, root="/"):
    """edge_boot.apply_dir as edgetune-boot.service runs it: (exit status, stdout lines, stderr lines)."""
    out, err = io.StringIO(), io.StringIO()
    status = edge_boot.apply_dir(str(state_dir), str(root), out, err)
    return status, out.getvalue().splitlines(), err.getvalue().splitlines()


def install_boot_program(target):
    """The boot program's files as role edge_package installs them (the manifest's, in the
    collection's package layout under ``target``), and nothing else; returns ``target``."""
    repo = Path(__file__).resolve().parents[2]
    for item in program_files("boot"):
        dest = Path(target) / item["dest"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(str(repo / item["src"]), str(dest))
    return Path(target)


def copy_module_util(name, package_root):
    """Copy the module utility NAME into ``package_root`` (a copy of plugins/module_utils) in its subpackage."""
    repo = Path(__file__).resolve().parents[2]
    source, = repo.glob("plugins/module_utils/*/%s.py" % name)
    dest = Path(package_root) / source.parent.name / source.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(str(source), str(dest))
