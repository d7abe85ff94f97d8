"""`edgetune tune runtime -l HOST`: measure the runtime's candidate settings on each device and
deploy the best (the collection's deploy playbook with edge_runtime_autotune and
edge_runtime_autotune_again on), or with --forget remove the recorded choice and deploy the plan's
defaults again. The measurement runs on the device (module edge_runtime_autotune), under its own
load or the synthetic noise asked for, within the time bound; the previous release serves until the
choice is deployed and gated. `edgetune plan` shows the choice in force. Exit code: ansible-playbook's.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from edgetune.ansible_setup import collection_playbook, config_in_effect
from edgetune.errors import UsageError


def extra_vars(args):
    """The deploy's variables for this command, as one JSON -e (booleans stay booleans)."""
    if args.forget:
        return {"edge_runtime_autotune_forget": True}
    values = {"edge_runtime_autotune": True, "edge_runtime_autotune_again": True}
    if args.noise:
        values["edge_runtime_autotune_noise"] = args.noise
    if args.timeout:
        values["edge_runtime_autotune_timeout"] = args.timeout
    return values


def cmd_tune_runtime(args):
    if not args.limit:
        raise UsageError("tune runtime measures on the devices themselves: name them with -l HOST or GROUP")
    if args.forget and (args.noise or args.timeout):
        raise UsageError("--forget measures nothing: drop --noise and --timeout")
    config = config_in_effect()
    target, env = collection_playbook(config, "deploy")
    beside = Path(sys.executable).parent / "ansible-playbook"
    executable = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not executable:
        raise UsageError("ansible-playbook not found; install ansible-core beside edgetune")
    argv = [executable, "--limit", args.limit, "-e", json.dumps(extra_vars(args))]
    for inventory in args.inventory or ():
        argv += ["-i", inventory]
    for extra in args.extra_vars or ():
        argv += ["-e", extra]
    print("edgetune: %s on %s: %s" % ("forget the autotune choice and deploy the defaults" if args.forget
                                      else "measure the runtime's candidates and deploy the best",
                                      args.limit, " ".join(argv + [target])), file=sys.stderr, flush=True)
    return subprocess.run(argv + [target], env=dict(os.environ, **env), check=False).returncode


def add_parser(subparsers):
    tune = subparsers.add_parser("tune", help="tune on the devices themselves (the runtime's settings, measured)")
    sub = tune.add_subparsers(dest="what", required=True)
    p = sub.add_parser("runtime", help="measure the runtime's candidate settings on each device and deploy the best")
    p.add_argument("-i", "--inventory", action="append", help="inventory, repeatable (default: ansible.cfg's)")
    p.add_argument("-l", "--limit", help="the hosts or groups to tune (required)")
    p.add_argument("--noise", choices=("none", "cpu", "cpu+mem"),
                   help="synthetic noise on the housekeeping CPUs while measuring (default: the inventory's "
                        "edge_runtime_autotune_noise, none: the device's own load)")
    p.add_argument("--timeout", type=int, help="the time bound of the measurement in seconds "
                                               "(default: edge_runtime_autotune_timeout)")
    p.add_argument("--forget", action="store_true", help="remove the recorded choice and deploy the defaults")
    p.add_argument("-e", "--extra-vars", action="append", help="extra variables, as for ansible-playbook")
    p.set_defaults(func=cmd_tune_runtime)


if __name__ == "__main__":
    sys.exit("run it as `edgetune tune runtime`")
