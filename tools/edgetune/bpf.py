"""`edgetune bpf ...`: the network priority loader (edgetune-netqos) run from the controller.

The loader itself is the collection's plugins/module_utils/edge_netqos_loader.py,
the program the edge_netqos role installs on the devices.
"""
import os
import subprocess
import sys

from edgetune.errors import UsageError

from ansible_collections.edgetune.fleet.plugins.module_utils import edge_netqos_loader as loader

SYSTEM_PYTHON = "/usr/bin/python3"


def _deps_importable():
    try:
        import pyroute2  # noqa: F401
        import bcc  # noqa: F401
    except ImportError:
        return False
    return True


def _cli_wrap(func):
    """`edgetune bpf ...`: run here when bcc and pyroute2 import; otherwise
    (the controller's virtualenv) hand over to the system Python, which has
    the distribution's python3-bpfcc and python3-pyroute2."""
    def call(args):
        if not _deps_importable() and os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) \
                and os.path.exists(SYSTEM_PYTHON) and "bpf" in sys.argv[1:]:
            rest = sys.argv[sys.argv.index("bpf", 1) + 1:]
            return subprocess.run(loader.command(SYSTEM_PYTHON, loader.collections_root()) + rest,
                                  check=False).returncode
        try:
            return func(args)
        except loader.NetQosError as exc:
            raise UsageError(str(exc)) from None
    return call


def add_parser(subparsers):
    parser = subparsers.add_parser("bpf", help="inference traffic priority: eBPF classifier + HTB",
                                   description=loader.__doc__.splitlines()[0])
    return loader.build_parser(parser, _cli_wrap)
