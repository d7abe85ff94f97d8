"""A line a minute while one test runs long, so that no stage of `make test` (a slow integration
test, molecule's verifier) stays silent for minutes. Imported by the conftests.

The line goes to a copy of the terminal's file descriptor taken at start: pytest redirects the
descriptors themselves while a test runs, so a plain print would land in the test's captured output.
"""
import os
import threading
import time

INTERVAL_S = float(os.environ.get("EDGETUNE_HEARTBEAT_S", "60"))
_running = {"test": None, "since": 0.0, "done": 0, "start": time.monotonic(), "fd": None}
_stop = threading.Event()


def _beat():
    while not _stop.wait(INTERVAL_S):
        test, now = _running["test"], time.monotonic()
        if not test or now - _running["since"] < INTERVAL_S:
            continue
        line = "\n... %s: running for %d s (%d tests done, %d s since the start)\n" % (
            test, now - _running["since"], _running["done"], now - _running["start"])
        try:
            os.write(_running["fd"], line.encode("utf-8", "replace"))
        except OSError:
            return


def pytest_configure(config):
    if INTERVAL_S <= 0 or _running["fd"] is not None or getattr(config, "workerinput", None) is not None:
        return
    _running["fd"] = os.dup(1)
    threading.Thread(target=_beat, name="heartbeat", daemon=True).start()


def pytest_runtest_logstart(nodeid, location):
    _running["test"], _running["since"] = nodeid, time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
    _running["test"] = None
    _running["done"] += 1


def pytest_unconfigure(config):
    _stop.set()
