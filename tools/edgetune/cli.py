"""The `edgetune` command.

Exit codes: 0 clean, 1 findings (e.g. drift), 2 usage or environment error.
"""
import argparse
import importlib
import json
import sys
import time

from edgetune import __version__, ansible_setup, outputs
from edgetune.errors import UsageError
from edgetune.twin import manager

# Each tool module adds its own subcommand: add_parser(subparsers) registers
# it with set_defaults(func=...); the function returns the exit code and
# raises edgetune.errors.UsageError for one-line usage/environment errors.
TOOL_MODULES = ["edgetune.audit", "edgetune.pcie", "edgetune.bpf", "edgetune.bench", "edgetune.bench_llm",
                "edgetune.artifacts", "edgetune.vm.cli", "edgetune.verify", "edgetune.plan"]

DEFAULT_FLEET = "orin-nx-16gb-r36:1,agx-orin-64gb-r35:1,rock5b-rk3588:1"


def say(message):
    print("edgetune: " + message, file=sys.stderr, flush=True)


def write_twin_inventory(directory):
    """manager.write_inventory, a failed write one line (exit 2)."""
    try:
        return manager.write_inventory(directory)
    except OSError as exc:
        raise UsageError("--inventory-dir %s: the inventory was not written: %s"
                         % (directory, outputs.reason(exc))) from None


def cmd_twin_up(args):
    fleet = manager.parse_fleet(args.fleet)
    outputs.check(directories=[("--inventory-dir", args.inventory_dir)])  # before any twin starts
    started = time.time()
    names = manager.up(fleet, say, args.inventory_dir)
    path = write_twin_inventory(args.inventory_dir)
    say("%d twin(s) up in %.0f s; inventory %s" % (len(names), time.time() - started, path))
    return 0


def cmd_twin_create(args):
    manager.ensure_images([manager.board(args.board)["distro"]], say)
    manager.create(args.name, args.board, say)
    return 0


def cmd_twin_rm(args):
    for name in args.names:
        manager.remove(name)
    return 0


def cmd_twin_down(args):
    outputs.check(directories=[("--inventory-dir", args.inventory_dir)])  # before any twin is removed
    for twin in manager.twins(fleet_only=True, inventory_dir=args.inventory_dir):
        manager.remove(twin["name"])
    write_twin_inventory(args.inventory_dir)
    return 0


def cmd_twin_list(args):
    rows = manager.twins()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no twins; start some with `edgetune twin up`")
    for row in rows:
        spec = manager.board(row["board"])
        print("%-28s %-9s %-14s %s" % (row["name"], "running" if row["running"] else "stopped",
                                       manager.fleet_group(spec), spec["title"]))
    return 0


def cmd_twin_boards(args):
    for name, spec in manager.boards().items():
        print("%-20s %-13s %s" % (name, manager.fleet_group(spec), spec["title"]))
    return 0


def cmd_twin_engine(args):
    manager.ensure_engine(say)
    return 0


def cmd_twin_images(args):
    distros = sorted({spec["distro"] for spec in manager.boards().values()})
    for tag in manager.ensure_images(distros, say):
        print(tag)
    return 0


def version_text():
    collection = ansible_setup.collection_version()
    return "edgetune %s, collection edgetune.fleet %s" % (
        __version__, collection + " (galaxy.yml of %s)" % ansible_setup.REPO if collection else "not in a checkout")


class PrintVersion(argparse.Action):
    """--version printed as one line: argparse's own version action wraps it at the terminal's width."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the versions of edgetune and its collection")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def build_parser():
    parser = argparse.ArgumentParser(prog="edgetune", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", required=True)

    twin = sub.add_parser("twin", help="device twins (systemd containers that look like a board)")
    twin_sub = twin.add_subparsers(dest="twin_command", required=True)
    p = twin_sub.add_parser("up", help="create the twins of a fleet spec and write inventory/twin/")
    p.add_argument("--fleet", default=DEFAULT_FLEET, help="board[:count],... (default: %(default)s)")
    p.add_argument("--inventory-dir", default="inventory/twin")
    p.set_defaults(func=cmd_twin_up)
    p = twin_sub.add_parser("down", help="remove the twins `twin up` made for this inventory directory "
                                          "(not another directory's, not molecule's)")
    p.add_argument("--inventory-dir", default="inventory/twin")
    p.set_defaults(func=cmd_twin_down)
    p = twin_sub.add_parser("list", help="list twins")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_twin_list)
    p = twin_sub.add_parser("boards", help="list the boards a twin can be")
    p.set_defaults(func=cmd_twin_boards)
    p = twin_sub.add_parser("engine", help="make sure a Docker engine answers (starts dockerd on Debian as root)")
    p.set_defaults(func=cmd_twin_engine)
    p = twin_sub.add_parser("images", help="build the twin images (cached)")
    p.set_defaults(func=cmd_twin_images)
    p = twin_sub.add_parser("create", help="create one twin (used by molecule)")
    p.add_argument("name")
    p.add_argument("--board", required=True)
    p.set_defaults(func=cmd_twin_create)
    p = twin_sub.add_parser("rm", help="remove twins by name (used by molecule)")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_twin_rm)
    importlib.import_module("edgetune.twin.capture").add_parser(twin_sub)
    for name in TOOL_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (manager.TwinError, UsageError) as exc:
        print("edgetune: error: %s" % exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 2


if __name__ == "__main__":
    sys.exit(main())
