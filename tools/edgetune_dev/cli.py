"""The commands of the development harness, which `edgetune` adds where this package imports (a checkout).

`edgetune twin` is defined here; the others, like the product's, by their
modules (COMMANDS: command, the modules that add it, its help; a module is
imported only when its command runs).
"""
import json
import sys
import time

from edgetune import outputs
from edgetune.errors import UsageError
from edgetune_dev.twin import manager

COMMANDS = [  # (command, the modules that add it, its help), as edgetune.cli.COMMANDS
    ("bench", ["edgetune_dev.bench", "edgetune_dev.bench_llm"], "benchmarks (latency of a runtime, ...)"),
    ("runtime", ["edgetune_dev.artifacts"], "the reference inference runtime and its engine"),
    ("vm", ["edgetune_dev.vm.cli"], "the VM twin: real kernel and bootloader under qemu (emulated)"),
]
TWIN_HELP = "device twins (systemd containers that look like a board)"
# Errors its commands raise that edgetune reports in one line (exit 2), as UsageError.
ERRORS = (manager.TwinError,)

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




def add_twin(sub, add_command):
    """The `edgetune twin` command and its subcommands (add_command: edgetune.cli's, for a module's own)."""
    twin = sub.add_parser("twin", help=TWIN_HELP)
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
    add_command(twin_sub, "capture", ["edgetune_dev.twin.capture"],
                "read a real board over SSH (read-only) and write a twin board of it")
