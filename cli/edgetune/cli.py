"""edgetune: plan, audit, verify and tune fleets of edge AI devices with the collection edgetune.fleet.

Exit codes, the same in every subcommand (edgetune.errors): 0 clean, 1 findings,
2 usage, bad input or output that cannot be written, 3 unreachable devices,
130 interrupted.
"""
import argparse
import errno
import importlib
import os
import sys

from edgetune import COLLECTION_VERSION, __version__, ansible_setup
from edgetune.errors import INTERRUPTED, USAGE, Interrupted, UsageError

# Each command's module adds its subcommand: add_parser(subparsers) registers it with
# set_defaults(func=...); the function returns the exit code and raises UsageError for one-line
# errors. A module is imported only when its command runs (`edgetune --help` lists them by this help,
# which must be the one the module gives). No module needs the collection or ansible-core to build
# its parser: every --help works before the collection is installed.
COMMANDS = [  # (command, its module, its help)
    ("audit", "edgetune.audit", "drift audit of the fleet (desired vs persisted vs running)"),
    ("plan", "edgetune.plan", "print each device's plan (the validated desired state), reading only the facts"),
    ("verify", "edgetune.verify", "run the device checks of the twins' tests against devices "
                                  "(expected values from the inventory's intent and the boards' facts)"),
    ("tune", "edgetune.tune", "tune on the devices themselves (the runtime's settings, measured)"),
    ("pcie", "edgetune.pcie", "PCIe virtual channels (TC/VC mapping) of devices"),
    ("bpf", "edgetune.bpf", "inference traffic priority: eBPF classifier + HTB"),
]
EPILOG = ("exit codes: 0 clean, 1 findings (drift, a failed check, a device not planned), 2 usage, bad input "
          "or output that cannot be written, 3 unreachable devices, 130 interrupted")


def ansible_core_version():
    try:
        from ansible.release import __version__ as version
    except ImportError:
        return None
    return version


def version_text():
    """edgetune's version, ansible-core's, and the collection Ansible finds from here (one line)."""
    core = ansible_core_version()
    text = "edgetune %s, ansible-core %s" % (__version__, core or "not installed")
    path, searched = ansible_setup.locate_collection()
    if path is None:
        return text + ", collection edgetune.fleet not found (looked in %s): %s" % (
            os.pathsep.join(searched) or "no collections path", ansible_setup.INSTALL_HINT.replace(
                "VERSION", COLLECTION_VERSION))
    version, source = ansible_setup.collection_version(path)
    text += ", collection edgetune.fleet %s (%s of %s)" % (
        version or "of unknown version", source or "no galaxy.yml or MANIFEST.json", path.resolve())
    if version != COLLECTION_VERSION:
        text += "; edgetune %s expects collection %s" % (__version__, COLLECTION_VERSION)
    return text


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors in one line (which command, what is wrong, where help is)."""

    def error(self, message):
        self.exit(USAGE, "%s: error: %s (see %s --help)\n" % (self.prog, message, self.prog))

    def _print_message(self, message, file=None):
        # argparse's own drops a failed write (help to a full disk would exit 0): let it be said.
        if message:
            (file or sys.stderr).write(message)


class PrintVersion(argparse.Action):
    """--version printed as one line: argparse's own version action wraps it at the terminal's width."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0,
                         help="print the versions of edgetune, ansible-core and the collection")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def chosen_command(argv):
    """The command argv names (its first word that is not an option), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv=None):
    """The parser of `edgetune`. Given argv, only the module of the command it names is imported
    (the others are listed by name and help); without, every command's."""
    chosen = chosen_command(argv) if argv is not None else None
    parser = Parser(prog="edgetune", description=__doc__.splitlines()[0], epilog=EPILOG)
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", required=True)
    for command, module, help_ in COMMANDS:
        if argv is None or chosen == command:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(command, help=help_, add_help=False)  # listed in --help; never parsed
    return parser


def error(message):
    print("edgetune: error: %s" % message, file=sys.stderr, flush=True)


def stdout_lost(exc):
    """stdout cannot take the output (a full disk, a pipe closed early): one line, and no second
    complaint from Python's own flush at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    why = "the reader closed it early" if isinstance(exc, BrokenPipeError) else (exc.strerror or str(exc))
    error("the output was not written to standard output: %s" % why)
    return USAGE


def flushed():
    """Flush stdout now: a full disk or a closed pipe is said here in one line (then exit 2), not by
    Python at exit. True when the output was written."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        stdout_lost(exc)
        return False
    return True


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            args = build_parser(argv).parse_args(argv)
        except SystemExit:  # --help, --version or a usage error: printed already
            if not flushed():
                raise SystemExit(USAGE) from None
            raise
        code = args.func(args)
        return code if flushed() else USAGE
    except UsageError as exc:
        error(exc)
        return USAGE
    except (Interrupted, KeyboardInterrupt) as exc:
        error(str(exc) or "interrupted")
        return INTERRUPTED
    except OSError as exc:
        # A print that met a full disk or a closed pipe before the final flush.
        if exc.errno in (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT):
            return stdout_lost(exc)
        raise


if __name__ == "__main__":
    sys.exit(main())
