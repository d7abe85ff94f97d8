"""`edgetune-dev vm`: the VM twin (a real kernel and bootloader under qemu)."""
import json
import sys
import time

from edgetune import outputs
from edgetune_dev.vm import image, runner


def say(message):
    print("edgetune: " + message, file=sys.stderr, flush=True)


def cmd_build(args):
    started = time.time()
    reused = image.cached() is not None and not args.force
    path = image.build(say, force=args.force)
    say("%s VM image %s in %.0f s" % ("reused" if reused else "built", path, time.time() - started))
    print(path)
    return 0


def cmd_up(args):
    outputs.check(directories=[("--inventory-dir", args.inventory_dir)])  # before the VM boots
    started = time.time()
    st, path = runner.up(args.inventory_dir, timeout=args.timeout, port=args.port, say=say)
    say("VM %s up in %.0f s (ssh 127.0.0.1:%d); inventory %s" % (runner.NAME, time.time() - started, st["port"], path))
    if args.json:
        print(json.dumps(status_dict(st)))
    return 0


def cmd_down(args):
    if runner.down(args.inventory_dir):
        say("VM %s stopped" % runner.NAME)
    return 0


def status_dict(st):
    if st is None:
        return {"name": runner.NAME, "running": False, "image": str(image.cached() or "")}
    return {"name": runner.NAME, "running": True, "pid": st["pid"], "port": st["port"],
            "forwards": st.get("forwards", {}),
            "address": "127.0.0.1", "user": "root", "image": st["image"],
            "identity_file": st["image"] + "/id_ed25519", "known_hosts": str(runner.RUN / "known_hosts"),
            "host_key_alias": image.HOST_KEY_ALIAS, "serial_log": str(runner.RUN / "serial.log")}


def cmd_status(args):
    st = runner.state()
    data = status_dict(st)
    if st is not None:
        data["ssh"] = runner.ssh_answers(st)
    if args.json:
        print(json.dumps(data, indent=2))
    elif st is None:
        print("%s: stopped (image %s)" % (runner.NAME, data["image"] or "not built"))
    else:
        print("%s: running, pid %d, ssh 127.0.0.1:%d (%s), serial log %s"
              % (runner.NAME, st["pid"], st["port"], "answers" if data["ssh"] else "not answering",
                 data["serial_log"]))
    return 0 if st is not None else 1


def cmd_console(args):
    if args.boot_label:
        runner.boot_label(args.boot_label, reset=args.reset, timeout=args.timeout, say=say)
        return 0
    runner.interactive_console()
    return 0


# The subcommands: (name, function, help, [(option, add_argument's keywords)]).
COMMANDS = (
    ("build", cmd_build, "build the VM image (cached in ~/.cache/edgetune/vm/, needs root)",
     [("--force", {"action": "store_true", "help": "rebuild even if cached"})]),
    ("up", cmd_up, "boot the VM (overlay on the cached image), wait for SSH, write inventory/twin/vm.yml",
     [("--inventory-dir", {"default": "inventory/twin"}),
      ("--timeout", {"type": int, "default": runner.BOOT_TIMEOUT, "help": "seconds to wait for SSH"}),
      ("--port", {"type": int, "help": "SSH port on 127.0.0.1 (default: a free one)"}),
      ("--json", {"action": "store_true", "help": "print the connection details as JSON"})]),
    ("down", cmd_down, "stop the VM and remove inventory/twin/vm.yml",
     [("--inventory-dir", {"default": "inventory/twin"})]),
    ("status", cmd_status, "is the VM running, its port and serial log (exit 1: stopped)",
     [("--json", {"action": "store_true"})]),
    ("console", cmd_console, "attach to the serial console (Ctrl-] detaches)",
     [("--boot-label", {"help": "type this label at the syslinux boot: prompt, then detach"}),
      ("--reset", {"action": "store_true", "help": "with --boot-label: press reset first"}),
      ("--timeout", {"type": int, "default": 120, "help": "seconds to wait for the boot: prompt"})]),
)


def add_parser(subparsers):
    vm = subparsers.add_parser("vm", help="the VM twin: real kernel and bootloader under qemu (emulated)")
    sub = vm.add_subparsers(dest="vm_command", required=True)
    for name, func, text, arguments in COMMANDS:
        command = sub.add_parser(name, help=text)
        for option, keywords in arguments:
            command.add_argument(option, **keywords)
        command.set_defaults(func=func)
