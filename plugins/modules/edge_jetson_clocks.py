#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_jetson_clocks: pin a Jetson's clocks with jetson_clocks, or restore them.

Also a command line for the boot-time unit, usable without Ansible:
``python3 edge_jetson_clocks.py --boot-pin --store-file FILE [--jetson-clocks PATH]``.
"""

DOCUMENTATION = r"""
---
module: edge_jetson_clocks
short_description: Pin a Jetson's CPU, GPU and EMC clocks with jetson_clocks, or restore them
description:
  - Reads the clocks with C(jetson_clocks --show). They count as pinned when every online CPU
    shows C(MinFreq) equal to C(MaxFreq), the GPU too, and the EMC C(FreqOverride=1) (when the
    release prints that field; newer r36 releases do not, and then the EMC is not judged).
    Offline CPUs are not judged (AGX Orin MODE_30W takes cpu8-11 offline).
  - With O(state=pinned) and the clocks not pinned, first saves the current values with
    C(jetson_clocks --store FILE) (O(store_file)), then runs C(jetson_clocks), which pins the
    clocks at the current nvpmodel mode's caps, never beyond them. The clocks are read back;
    still not pinned is an error.
  - With O(state=restored) and the clocks pinned, writes the saved values back with
    C(jetson_clocks --restore FILE) and reads back; still pinned is an error. Without a saved
    file the module fails and changes nothing, since the values from before pinning are unknown
    (a reboot, or an nvpmodel mode switch, resets them).
  - The store is taken only when the clocks are not pinned, so it never records pinned values
    as the originals; it is taken again at every pin, so it belongs to the current power mode.
    A power-mode switch while pinned leaves some clocks locked (nvpmodel resets the CPU and GPU
    minimums but not the EMC lock), so restore before switching modes, then pin again.
  - Not persistent by itself; the C(--boot-pin) command line (store when not pinned, then pin)
    is meant for a boot-time unit ordered after C(nvpmodel.service).
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  state:
    description:
      - V(pinned) runs C(jetson_clocks) (after saving the current values) unless the clocks are
        pinned already.
      - V(restored) writes the saved values back when the clocks are pinned.
    type: str
    choices: [pinned, restored]
    default: pinned
  store_file:
    description: Where the values from before pinning are saved (C(jetson_clocks --store) format).
    type: path
    default: /var/lib/edgetune/jetson_clocks.conf
  jetson_clocks_path:
    description: The jetson_clocks program. Defaults to C(jetson_clocks) on PATH, then in C(/usr/bin).
    type: path
notes:
  - Runs C(jetson_clocks) as it is; the fan (C(--fan)) is not touched.
  - Run it after any nvpmodel mode change; nvpmodel resets the minimum frequencies.
attributes:
  check_mode:
    description:
      - Runs only C(jetson_clocks --show) and reports whether the clocks would be stored and pinned, or restored.
    support: full
  diff_mode:
    description:
      - One line per online CPU, the GPU and the EMC with their minimum and maximum, before and after
        (in check mode, as pinning would leave them; for a restore in check mode, the store file it would restore from).
    support: full
  platform:
    description: Runs on a Jetson (L4T, with C(jetson_clocks)), Python 3.8 or later.
    support: full
    platforms: linux
"""

EXAMPLES = r"""
- name: Pin the clocks at the current power mode's maximum
  edge_jetson_clocks:
    state: pinned

- name: Give the clocks back to DVFS with the values from before pinning
  edge_jetson_clocks:
    state: restored
    store_file: /var/lib/edgetune/jetson_clocks.conf
"""

RETURN = r"""
pinned_before:
  description: Whether the clocks were pinned before the module ran.
  returned: always
  type: bool
pinned:
  description: Whether the clocks are pinned after the run (in check mode, the prediction).
  returned: always
  type: bool
stored:
  description: Whether the current values were saved to O(store_file) (would be, in check mode).
  returned: always
  type: bool
restored:
  description: Whether the saved values were written back (would be, in check mode).
  returned: always
  type: bool
store_file:
  description: The store file.
  returned: always
  type: str
  sample: /var/lib/edgetune/jetson_clocks.conf
not_pinned:
  description: Before the run, the clocks that were not pinned, one line each.
  returned: always
  type: list
  elements: str
  sample: ["cpu0: MinFreq=729600 MaxFreq=1728000", "EMC FreqOverride=0"]
saved_values:
  description:
    - The values in O(store_file) (sysfs path to value), which a restore writes back; lets a
      playbook predict in check mode what the restore changes.
  returned: when the clocks are (or would be) restored
  type: dict
  sample: {/sys/devices/system/cpu/cpufreq/policy4/scaling_governor: schedutil}
power_mode:
  description: The nvpmodel mode C(jetson_clocks --show) reports, when it does.
  returned: always
  type: str
  sample: MAXN
"""

# Ansible modules keep their imports after the documentation strings.
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:
    # Boot-time CLI on a board without Ansible.
    if "--boot-pin" not in sys.argv:
        raise
    AnsibleModule = None
# At boot the helper is installed beside this file in the collection's layout, and the script's
# own directory is first on sys.path.
from ansible_collections.edgetune.fleet.plugins.module_utils.edge_clocks import (  # noqa: E402
    find_program, not_pinned, parse_show, summary)

DEFAULT_STORE_FILE = "/var/lib/edgetune/jetson_clocks.conf"


class ClocksError(Exception):
    """Expected failure: one message, plus result keys."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


def _run(run_command, argv):
    rc, out, err = run_command(argv)
    if rc != 0:
        raise ClocksError("%s failed with rc=%d: %s" % (" ".join(argv), rc, (err or out).strip()[-300:]),
                          rc=rc, stdout=out, stderr=err)
    return out


def read_show(program, run_command):
    argv = [program, "--show"]
    out = _run(run_command, argv)
    try:
        return parse_show(out)
    except ValueError as exc:
        raise ClocksError("cannot read the clocks from %s: %s" % (" ".join(argv), exc), stdout=out) from None


def store(program, store_file, run_command):
    directory = os.path.dirname(store_file)
    if directory and not os.path.isdir(directory):
        try:
            os.makedirs(directory, 0o755)
        except OSError as exc:
            raise ClocksError("cannot create %s for the store file: %s" % (directory, exc.strerror or exc)) from None
    _run(run_command, [program, "--store", store_file])
    if not os.path.isfile(store_file) or os.path.getsize(store_file) == 0:
        raise ClocksError("%s --store %s left no saved values; nothing was pinned" % (program, store_file))


def read_store(store_file):
    """The store file's ``/sys/path:value`` lines as a dict."""
    try:
        with open(store_file) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ClocksError("cannot read %s: %s" % (store_file, exc.strerror or exc)) from None
    values = {}
    for line in lines:
        path, sep, value = line.strip().rpartition(":")
        if sep and path:
            values[path] = value
    return values


def run(params, check_mode, want_diff, run_command, find_command):
    """Read, decide, act unless in check mode, read back. Returns the result dict."""
    program = params.get("jetson_clocks_path") or find_command("jetson_clocks")
    if not program:
        raise ClocksError("jetson_clocks was not found on PATH nor in /usr/bin; it ships with L4T "
                          "(nvidia-l4t-tools): install it or set jetson_clocks_path")
    if params.get("jetson_clocks_path") and not os.access(program, os.X_OK):
        raise ClocksError("jetson_clocks_path %s is not an executable file" % program)
    store_file = params.get("store_file") or DEFAULT_STORE_FILE
    before = read_show(program, run_command)
    unpinned = not_pinned(before)
    result = {
        "changed": False, "pinned_before": not unpinned, "pinned": not unpinned,
        "stored": False, "restored": False, "store_file": store_file,
        "not_pinned": unpinned, "power_mode": before["power_mode"],
    }
    after_text = None
    if params["state"] == "pinned" and unpinned:
        result.update(changed=True, stored=True, pinned=True)
        if check_mode:
            after_text = summary(before, pinned_prediction=True)
        else:
            store(program, store_file, run_command)
            _run(run_command, [program])
            after = read_show(program, run_command)
            left = not_pinned(after)
            if left:
                raise ClocksError("jetson_clocks ran but these clocks are not pinned: %s" % "; ".join(left),
                                  stored=True, not_pinned=left)
            after_text = summary(after)
    elif params["state"] == "restored" and not unpinned:
        if not os.path.isfile(store_file):
            raise ClocksError(
                "the clocks are pinned but %s, with the values from before pinning, does not exist: "
                "nothing was changed; reboot (or switch the nvpmodel mode) to reset the clocks" % store_file)
        result.update(changed=True, restored=True, pinned=False, saved_values=read_store(store_file))
        if check_mode:
            after_text = "restored from %s\n" % store_file
        else:
            _run(run_command, [program, "--restore", store_file])
            after = read_show(program, run_command)
            if not not_pinned(after):
                raise ClocksError("jetson_clocks --restore %s left the clocks pinned: the file holds pinned "
                                  "values; reboot to reset the clocks" % store_file, restored=True)
            after_text = summary(after)
    if want_diff:
        before_text = summary(before)
        result["diff"] = {"before_header": "jetson_clocks", "after_header": "jetson_clocks",
                          "before": before_text, "after": before_text if after_text is None else after_text}
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["pinned", "restored"], "default": "pinned"},
            "store_file": {"type": "path", "default": DEFAULT_STORE_FILE},
            "jetson_clocks_path": {"type": "path"},
        },
        supports_check_mode=True,
    )

    def find(name):
        return module.get_bin_path(name, opt_dirs=["/usr/bin", "/usr/sbin"])

    try:
        result = run(module.params, module.check_mode, module._diff, module.run_command, find)
    except ClocksError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except Exception as exc:  # never a traceback: one line saying what went wrong
        module.fail_json(msg="edge_jetson_clocks: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


# --------------------------------------------------------------------------
# Boot-time pin (no Ansible)

def _subprocess_run(argv):
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    return done.returncode, done.stdout, done.stderr


def boot_pin(store_file, program=None, out=sys.stdout, err=sys.stderr, run_command=_subprocess_run):
    """Store (when not pinned) and pin; one line on ``out``, errors on ``err``. Returns 0/1."""
    params = {"state": "pinned", "store_file": store_file, "jetson_clocks_path": program}
    try:
        result = run(params, False, False, run_command, find_program)
    except ClocksError as exc:
        err.write("edge_jetson_clocks: error: %s\n" % exc)
        return 1
    except Exception as exc:  # never a traceback in the boot log
        err.write("edge_jetson_clocks: error: unexpected %s: %s\n" % (type(exc).__name__, exc))
        return 1
    mode = " (NV Power Mode: %s)" % result["power_mode"] if result["power_mode"] else ""
    if result["changed"]:
        out.write("edge_jetson_clocks: saved the clocks to %s and pinned them%s\n" % (store_file, mode))
    else:
        out.write("edge_jetson_clocks: clocks already pinned%s\n" % mode)
    return 0


def cli(argv):
    import argparse

    parser = argparse.ArgumentParser(
        prog="edge_jetson_clocks.py",
        description="Pin the Jetson clocks at boot: save them with jetson_clocks --store when they are "
                    "not pinned, then run jetson_clocks.")
    parser.add_argument("--boot-pin", action="store_true", required=True, help="store (when not pinned) and pin")
    parser.add_argument("--store-file", default=DEFAULT_STORE_FILE,
                        help="where the values from before pinning go (default %(default)s)")
    parser.add_argument("--jetson-clocks", default=None, help="the jetson_clocks program (default: found on PATH)")
    args = parser.parse_args(argv)
    return boot_pin(args.store_file, args.jetson_clocks)


if __name__ == "__main__":
    if "--boot-pin" in sys.argv:
        raise SystemExit(cli(sys.argv[1:]))
    main()
