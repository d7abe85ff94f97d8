"""Errors the `edgetune` command reports as one line with exit code 2."""
import importlib


class UsageError(Exception):
    """A usage or environment error: one line saying what is wrong and what to do."""


def require_module(name, needed_for):
    """Import a controller dependency, or say in one line how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise UsageError("%s needs the Python package %s, which is not installed: run `make venv` "
                         "(or pip install -r requirements.txt) and use .venv/bin/edgetune"
                         % (needed_for, name)) from None
