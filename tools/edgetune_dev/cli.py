"""edgetune-dev: the development harness of an edgetune checkout (twins, VM, benchmarks, packaging).

One command for the twins, the VM twin, the benchmarks, the packaging, the
role READMEs and the checkout's scripts.

`edgetune-dev twin` is defined here; the others by their modules (COMMANDS:
command, the modules that add it, its help; a module is imported only when its
command runs), by a module's own main (PASSED: its arguments are the module's)
or by a script of scripts/ (SCRIPTS), run in the checkout. Exit codes as
edgetune's: 0 done, 1 findings, 2 usage or environment.
"""
import argparse
import functools
import importlib
import json
import os
import subprocess
import sys
import time

from edgetune import outputs
from edgetune.errors import USAGE, UsageError
from edgetune_dev import CHECKOUT
from edgetune_dev.twin import manager

COMMANDS = [  # (command, the modules that add it, its help)
    ("bench", ["edgetune_dev.bench", "edgetune_dev.bench_llm"], "benchmarks (latency of a runtime, ...)"),
    ("runtime", ["edgetune_dev.artifacts"], "the reference inference runtime and its engine"),
    ("vm", ["edgetune_dev.vm.cli"], "the VM twin: real kernel and bootloader under qemu (emulated)"),
    ("ee", ["edgetune_dev.ee"], "the execution environment (extras/awx): build it, test it (make ee)"),
    ("faults", ["edgetune_dev.faults"], "an apply's write points, observed on a twin (fault campaign)"),
]
# Commands whose arguments are a module's own main(argv)'s: (command words, module, help).
PASSED = [
    (("bench", "audit"), "edgetune_dev.bench_audit",
     "the audit's cost and the no-change converge's on the demo's twins, against --check"),
    (("bench", "runtime"), "edgetune_dev.bench_runtime",
     "token latency of the deployed LLM quiet, under noise untuned and tuned"),
    (("bench", "netqos"), "edgetune_dev.bench_netqos", "the eBPF classifier's priority under bulk traffic "
                                                        "(runs with the system Python, which has bcc)"),
    (("bench", "pages"), "edgetune_dev.bench_pages",
     "the docs' benchmark pages from the committed raw results (make docs)"),
    (("faults", "trace"), "edgetune_dev.faults.writepoints",
     "run a playbook against a container twin under strace: every change it makes, grouped"),
    (("role-readme",), "edgetune_dev.role_readme", "render (or --check) every role's README.md"),
]
# The checkout's scripts (scripts/, run in the checkout with the arguments given): (command, file, help).
SCRIPTS = [
    ("demo", "demo", "bring up a twin fleet, converge it with site.yml, drift it and audit it (make demo)"),
    ("jobs", "jobs", "run make targets N at a time, the longest first (make test)"),
    ("sanity", "sanity", "ansible-test sanity on Python 3.8 and 3.11 on a fresh copy of the collection"),
    ("unit38", "unit38", "the modules' unit tests under Python 3.8 (VENV38 VENV)"),
    ("python38", "python38", "run a Python 3.8 interpreter (JetPack 5's Python)"),
    ("netqos-host", "netqos-host", "install bcc, pyroute2 and kernel headers for the eBPF tests (root)"),
    ("cached-venv", "cached-venv", "a venv of pinned tools kept by content hash outside the checkout, linked in"),
]
SCRIPTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
# The system Python, which has Debian's bcc and pyroute2 (the network benchmark's).
SYSTEM_PYTHON = "/usr/bin/python3"
TWIN_HELP = "device twins (systemd containers that look like a board)"
# Errors its commands raise that are reported in one line (exit 2), as UsageError.
ERRORS = (UsageError, manager.TwinError)

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
        print("no twins; start some with `edgetune-dev twin up`")
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




def add_twin(sub):
    """The `edgetune-dev twin` command and its subcommands."""
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
    importlib.import_module("edgetune_dev.twin.capture").add_parser(twin_sub)


def run_passed(module, arguments):
    """A module's own main with the arguments after the command's words."""
    if module == "edgetune_dev.bench_netqos":
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CHECKOUT / "tools"), str(CHECKOUT / "cli")]))
        return subprocess.run([SYSTEM_PYTHON, "-m", module] + arguments, env=env, check=False).returncode
    return importlib.import_module(module).main(arguments)


def run_script(name, arguments):
    return subprocess.run([os.path.join(SCRIPTS_DIR, name)] + arguments, cwd=str(CHECKOUT), check=False).returncode


def passed_on(argv):
    """(run, its arguments) where argv names a command whose arguments are not ours (PASSED, SCRIPTS)."""
    for words, module, _help in PASSED:
        if argv[:len(words)] == list(words):
            return functools.partial(run_passed, module), argv[len(words):]
    for command, script, _help in SCRIPTS:
        if argv[:1] == [command]:
            return functools.partial(run_script, script), argv[1:]
    return None, None


def build_parser(argv=None):
    """The parser of `edgetune-dev`; given argv, only the modules of the command it names are imported."""
    chosen = next((word for word in argv if not word.startswith("-")), None) if argv is not None else None
    parser = argparse.ArgumentParser(prog="edgetune-dev", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    groups = {}
    if argv is None or chosen == "twin":
        add_twin(sub)
    else:
        sub.add_parser("twin", help=TWIN_HELP, add_help=False)
    for command, modules, help_ in COMMANDS:
        if argv is None or chosen == command:
            for module in modules:
                importlib.import_module(module).add_parser(sub)
            groups[command] = sub.choices[command]
        else:
            sub.add_parser(command, help=help_, add_help=False)
    for words, _module, help_ in PASSED:
        if len(words) == 1:
            sub.add_parser(words[0], help=help_, add_help=False)
        elif words[0] in groups:
            groups[words[0]].edgetune_sub.add_parser(words[1], help=help_, add_help=False)
    for command, _script, help_ in SCRIPTS:
        sub.add_parser(command, help=help_, add_help=False)
    return parser  # the commands of PASSED and SCRIPTS are listed here, run by passed_on


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    run, arguments = passed_on(argv)
    try:
        if run is not None:
            return run(arguments)
        args = build_parser(argv).parse_args(argv)
        return args.func(args)
    except ERRORS as exc:
        print("edgetune-dev: error: %s" % exc, file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
