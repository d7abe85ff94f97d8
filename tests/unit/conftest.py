"""Shared fixtures for the unit tests."""
import http.server
import threading

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
