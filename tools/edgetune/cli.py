"""The `edgetune` command.

Exit codes: 0 clean, 1 findings (e.g. drift), 2 usage or environment error.
"""
import argparse
import functools
import importlib
import os
import sys

from edgetune import COLLECTION_VERSION, __version__, ansible_setup
from edgetune.errors import UsageError

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
    ("verify", ["edgetune.verify"], "run the device checks of the twins' tests against devices "
                                    "(expected values from the inventory's intent and the boards' facts)"),
    ("plan", ["edgetune.plan"], "print each device's plan (the validated desired state), reading only the facts"),
    ("tune", ["edgetune.tune"], "tune on the devices themselves (the runtime's settings, measured)"),
]
# The development harness (twins, VM, benchmarks, packaging): the package edgetune_dev of a checkout's
# tools/, which the wheel does not include. Where it imports, its commands are added to these.
try:
    from edgetune_dev import cli as harness
except ImportError as error:
    if not (error.name or "").startswith("edgetune_dev"):
        raise
    harness = None
if harness is not None:
    COMMANDS += harness.COMMANDS
# What a command raises for a one-line error (exit 2).
ERRORS = (UsageError,) + (harness.ERRORS if harness is not None else ())
TOOL_MODULES = [module for _, modules, _ in COMMANDS for module in modules]
# What a module that fails to import lacks, by the missing module's name.
MISSING = [
    ("ansible_collections", "the collection edgetune.fleet, which Ansible does not find from here: install it "
                            "with `ansible-galaxy collection install` where ansible.cfg's collections_path "
                            "or ANSIBLE_COLLECTIONS_PATH points"),
    ("edgetune_runtime", "the reference runtime (runtime/ of an edgetune checkout): run it from a checkout"),
]

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


def build_parser(argv=None):
    """The parser of `edgetune`. Given argv, only the modules of the command it names are imported
    (the others are listed by name and help); without, every command's."""
    chosen = chosen_command(argv) if argv is not None else None
    parser = argparse.ArgumentParser(prog="edgetune", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", required=True)
    if harness is not None:
        if argv is None or chosen == "twin":
            harness.add_twin(sub, add_command)
        else:
            sub.add_parser("twin", help=harness.TWIN_HELP, add_help=False)
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
    except ERRORS as exc:
        print("edgetune: error: %s" % exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 2


if __name__ == "__main__":
    sys.exit(main())
