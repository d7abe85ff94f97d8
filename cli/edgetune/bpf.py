"""`edgetune bpf ...`: the network priority loader (edgetune-netqos) run from the controller.

The loader itself is the collection's plugins/module_utils/device/edge_netqos_loader.py,
the program the edge_netqos role installs on the devices; its subcommands are
its own. Without the collection, `edgetune bpf --help` says where to get it.
"""
import argparse
import os
import subprocess
import sys

from edgetune import ansible_setup
from edgetune.errors import UsageError

SYSTEM_PYTHON = "/usr/bin/python3"
HELP = "inference traffic priority: eBPF classifier + HTB"


def _deps_importable():
    try:
        import pyroute2  # noqa: F401
        import bcc  # noqa: F401
    except ImportError:
        return False
    return True


def _cli_wrap(loader):
    """`edgetune bpf ...`: run here when bcc and pyroute2 import; otherwise (the controller's
    virtualenv) hand over to the system Python, which has the distribution's python3-bpfcc and
    python3-pyroute2."""
    def wrap(func):
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
    return wrap


def add_unavailable(subparsers, missing):
    """`edgetune bpf` without the collection: its help says where the loader comes from; a run says so."""
    parser = subparsers.add_parser("bpf", help=HELP, description=HELP, epilog=(
        "Its subcommands (apply, status, check, detach) are the network loader's, which comes with the "
        "collection edgetune.fleet: %s" % missing))
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the loader's subcommand and options")

    def unavailable(args):
        raise missing
    parser.set_defaults(func=unavailable)
    return parser


def add_parser(subparsers):
    try:
        loader = ansible_setup.module_utils("device.edge_netqos_loader")
    except UsageError as missing:
        return add_unavailable(subparsers, missing)
    parser = subparsers.add_parser("bpf", help=HELP, description=loader.__doc__.splitlines()[0])
    return loader.build_parser(parser, _cli_wrap(loader))
