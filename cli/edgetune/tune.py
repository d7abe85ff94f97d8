"""`edgetune tune runtime -l HOST`: measure the runtime's candidate settings on each device and
deploy the best (the collection's deploy playbook with edge_runtime_autotune and
edge_runtime_autotune_again on), or with --forget remove the recorded choice and deploy the plan's
defaults again. The measurement runs on the device (module edge_runtime_autotune), under its own
load or the synthetic noise asked for, within the time bound; the previous release serves until the
choice is deployed and gated. `edgetune plan` shows the choice in force. Exit codes: edgetune's
(ansible-playbook's mapped: 0 done, 1 a device failed, 2 usage, 3 a device unreachable, 130 interrupted).
"""
import json
import os
import subprocess
import sys

from edgetune import ansible_options
from edgetune.ansible_setup import ansible_playbook, collection_playbook, config_in_effect
from edgetune.errors import CLEAN, FINDINGS, INTERRUPTED, UNREACHABLE, USAGE, Interrupted, UsageError

# ansible-playbook's exit codes (lib/ansible/executor/task_queue_manager.py: RUN_*) as edgetune's.
PLAYBOOK_CODES = {0: CLEAN, 1: FINDINGS, 2: FINDINGS, 4: UNREACHABLE, 5: USAGE, 99: INTERRUPTED, 250: USAGE}


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
    options = ansible_options.Options.from_args(args)
    config = config_in_effect()
    options.check(config.inventories)
    target, env = collection_playbook(config, "deploy")
    # The command's own variables first: the operator's -e may still override them.
    argv = options.playbook_argv(ansible_playbook(), target)
    argv[1:1] = ["-e", json.dumps(extra_vars(args))]
    print("edgetune: %s on %s: %s" % ("forget the autotune choice and deploy the defaults" if args.forget
                                      else "measure the runtime's candidates and deploy the best",
                                      args.limit, " ".join(argv)), file=sys.stderr, flush=True)
    try:
        code = subprocess.run(argv, env=dict(os.environ, **env), check=False).returncode
    except KeyboardInterrupt:
        raise Interrupted("tune interrupted: ansible-playbook stopped; the previous release still serves "
                          "until a deploy is gated") from None
    if code in (99, -2):
        raise Interrupted("tune interrupted: ansible-playbook stopped")
    return PLAYBOOK_CODES.get(code, FINDINGS)


def add_parser(subparsers):
    tune = subparsers.add_parser("tune", help="tune on the devices themselves (the runtime's settings, measured)")
    sub = tune.add_subparsers(dest="what", required=True)
    p = sub.add_parser("runtime", help="measure the runtime's candidate settings on each device and deploy the best")
    ansible_options.add_to(p)
    p.add_argument("--noise", choices=("none", "cpu", "cpu+mem"),
                   help="synthetic noise on the housekeeping CPUs while measuring (default: the inventory's "
                        "edge_runtime_autotune_noise, none: the device's own load)")
    p.add_argument("--timeout", type=ansible_options.positive_int, help="the time bound of the measurement in seconds "
                                               "(default: edge_runtime_autotune_timeout)")
    p.add_argument("--forget", action="store_true", help="remove the recorded choice and deploy the defaults")
    p.set_defaults(func=cmd_tune_runtime)


if __name__ == "__main__":
    sys.exit("run it as `edgetune tune runtime`")
