"""Exit codes and the errors `edgetune` reports in one line.

The exit codes, the same in every subcommand:
  0  clean: every device planned, audited clean or verified
  1  findings: drift, a failed check, a device that could not be planned or tuned
  2  usage, bad input, a missing inventory or collection, output that cannot be written
  3  unreachable devices (before findings: a fleet not fully seen is not clean)
  130 interrupted (Ctrl-C)
"""
import importlib

CLEAN, FINDINGS, USAGE, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(Exception):
    """A usage or environment error: one line saying what is wrong and what to do (exit 2)."""


class Interrupted(Exception):
    """The operator interrupted the run (exit 130); the message says what was left undone."""


def require_module(name, needed_for):
    """Import a controller dependency, or say in one line how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise UsageError("%s needs the Python package %s, which is not installed for this Python: install "
                         "edgetune with its dependencies" % (needed_for, name)) from None
