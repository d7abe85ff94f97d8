"""Errors the `edgetune` command reports as one line with exit code 2."""


class UsageError(Exception):
    """A usage or environment error: one line saying what is wrong and what to do."""
