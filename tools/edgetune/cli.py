"""The `edgetune` command.

Exit codes: 0 clean, 1 findings (e.g. drift), 2 usage or environment error.
"""
import argparse
import functools
import importlib
import json
import os
import sys
import time

from edgetune import COLLECTION_VERSION, __version__, ansible_setup, outputs
from edgetune.errors import UsageError
from edgetune.twin import manager

# Each tool module adds its own subcommand: add_parser(subparsers) registers
# it with set_defaults(func=...); the function returns the exit code and
# raises edgetune.errors.UsageError for one-line usage/environment errors.
# A module is imported only when its command runs (`edgetune --help` lists
# them by this help, which must be the one the module gives): some need what
# an installed edgetune may lack (the collection, a checkout's runtime/).
COMMANDS = [  # (command, the modules that add it, its help)
    ("audit", ["edgetune.audit"], "drift audit of the fleet (desired vs persisted vs running)"),
    ("pcie", ["edgetune.pcie"], "PCIe virtual channels (TC/VC mapping) of devices"),
    ("bpf", ["edgetune.bpf"], "inference traffic priority: eBPF classifier + HTB"),
    ("bench", ["edgetune.bench", "edgetune.bench_llm"], "benchmarks (latency of a runtime, ...)"),
    ("runtime", ["edgetune.artifacts"], "the reference inference runtime and its engine"),
    ("vm", ["edgetune.vm.cli"], "the VM twin: real kernel and bootloader under qemu (emulated)"),
    ("verify", ["edgetune.verify"], "run the device checks of the twins' tests against devices "
                                    "(expected values from the inventory's intent and the boards' facts)"),
    ("plan", ["edgetune.plan"], "print each device's plan (the validated desired state), reading only the facts"),
    ("tune", ["edgetune.tune"], "tune on the devices themselves (the runtime's settings, measured)"),
]
TOOL_MODULES = [module for _, modules, _ in COMMANDS for module in modules]
TWIN_HELP = "device twins (systemd containers that look like a board)"
# What a module that fails to import lacks, by the missing module's name.
MISSING = [
    ("ansible_collections", "the collection edgetune.fleet, which Ansible does not find from here: install it "
                            "with `ansible-galaxy collection install` where ansible.cfg's collections_path "
                            "or ANSIBLE_COLLECTIONS_PATH points"),
    ("edgetune_runtime", "the reference runtime (runtime/ of an edgetune checkout), which an installed "
                         "edgetune does not include: run it from a checkout"),
]

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
    """edgetune's version and that of the collection Ansible finds from here, with its path (one line)."""
    path, searched = ansible_setup.locate_collection()
    if path is None:
        return "edgetune %s, collection edgetune.fleet not found (looked in %s); edgetune %s expects %s" % (
            __version__, os.pathsep.join(searched) or "no collections path", __version__, COLLECTION_VERSION)
    version, source = ansible_setup.collection_version(path)
    text = "edgetune %s, collection edgetune.fleet %s (%s of %s)" % (
        __version__, version or "of unknown version", source or "no galaxy.yml or MANIFEST.json", path.resolve())
    if version != COLLECTION_VERSION:
        text += "; edgetune %s expects collection %s" % (__version__, COLLECTION_VERSION)
    return text


class PrintVersion(argparse.Action):
    """--version printed as one line: argparse's own version action wraps it at the terminal's width."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the versions of edgetune and its collection")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def chosen_command(argv):
    """The command argv names (its first word that is not an option), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def cmd_unavailable(command, error, args):
    missing = getattr(error, "name", None) or ""
    lacks = next((what for prefix, what in MISSING if missing.split(".")[0] == prefix),
                 "the Python module %s, which is not installed (%s)" % (missing or "?", error))
    raise UsageError("`edgetune %s` needs %s" % (command, lacks))


def add_unavailable(sub, command, help_, error):
    """A command whose modules do not import here: it says so in one line (exit 2), whatever its arguments."""
    p = sub.add_parser(command, help=help_, add_help=False)
    p.set_defaults(func=functools.partial(cmd_unavailable, command, error), any_arguments=True)


def add_command(sub, command, modules, help_):
    try:
        loaded = [importlib.import_module(name) for name in modules]
    except ImportError as error:
        add_unavailable(sub, command, help_, error)
        return
    for module in loaded:
        module.add_parser(sub)


def add_twin(sub):
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
    add_command(twin_sub, "capture", ["edgetune.twin.capture"],
                "read a real board over SSH (read-only) and write a twin board of it")


def build_parser(argv=None):
    """The parser of `edgetune`. Given argv, only the modules of the command it names are imported
    (the others are listed by name and help); without, every command's."""
    chosen = chosen_command(argv) if argv is not None else None
    parser = argparse.ArgumentParser(prog="edgetune", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", required=True)
    if argv is None or chosen == "twin":
        add_twin(sub)
    else:
        sub.add_parser("twin", help=TWIN_HELP, add_help=False)
    for command, modules, help_ in COMMANDS:
        if argv is None or chosen == command:
            add_command(sub, command, modules, help_)
        else:
            sub.add_parser(command, help=help_, add_help=False)  # listed in --help; never parsed
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)  # parse_args, but an unavailable command takes any arguments
    if unknown and not getattr(args, "any_arguments", False):
        parser.error("unrecognized arguments: %s" % " ".join(unknown))
    try:
        return args.func(args)
    except (manager.TwinError, UsageError) as exc:
        print("edgetune: error: %s" % exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 2


if __name__ == "__main__":
    sys.exit(main())
