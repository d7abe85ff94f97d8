#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_jetson_clocks: pin a Jetson's clocks with jetson_clocks, or restore them.

The work is in plugins/module_utils/device/edge_clocks.py, which the boot program (edge_boot) also runs.
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
  - Not persistent by itself. With O(state_file) and O(state=pinned) the module saves what the boot
    needs (O(store_file) and O(jetson_clocks_path)) in edgetune's boot-time state format
    (plugins/module_utils/device/edge_boot.py), re-applied at every boot by C(edgetune-boot.service) (role
    edge_boot), which stores the clocks when they are not pinned, then pins them. With
    O(state=restored) it removes that file, so the clocks stay restored after a reboot.
version_added: "0.1.0"
requirements:
  - C(jetson_clocks) (L4T)
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
  state_file:
    description:
      - The boot-time state file, in edgetune's boot-time state format (plugins/module_utils/device/edge_boot.py),
        re-applied at every boot by C(edgetune-boot.service) (role edge_boot), for example
        C(/etc/edgetune/boot.d/jetson-clocks.json).
      - With O(state=pinned) it is written (atomically, only when its content changes) with O(store_file)
        and O(jetson_clocks_path), which must then be absolute paths; with O(state=restored) it is removed.
      - Not written nor removed in check mode.
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
      - The state file's content, when it changes (the diff is then a list of the two).
    support: full
extends_documentation_fragment: edgetune.fleet.edge.jetson
"""

EXAMPLES = r"""
- name: Pin the clocks at the current power mode's maximum
  edge_jetson_clocks:
    state: pinned

- name: Pin them, and again at every boot
  edge_jetson_clocks:
    state: pinned
    state_file: /etc/edgetune/boot.d/jetson-clocks.json

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
state_file_changed:
  description: Whether O(state_file) was written or removed (would be, in check mode).
  returned: when O(state_file) is given
  type: bool
"""

# Ansible modules keep their imports after the documentation strings.
import errno  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_clocks import (  # noqa: E402
    DEFAULT_STORE_FILE, boot_settings, run, subprocess_run)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError  # noqa: E402


def remove_state_file(path, check_mode):
    """Remove the boot-time state file; returns (before, after) texts (after ""; before None when absent)."""
    before = edge_boot.read(path, "jetson_clocks")[0]
    if before is not None and not check_mode:
        try:
            os.remove(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise EdgeError("removing state file %s failed: %s" % (path, exc.strerror or exc)) from None
    return before, "" if before is not None else None


def sync_state_file(params, result, check_mode, want_diff):
    """Write (pinned) or remove (restored) the state file; updates ``result``."""
    path = params["state_file"]
    if params["state"] == "pinned":
        settings = boot_settings(result["store_file"], params["jetson_clocks_path"])
        before, after = edge_boot.sync(path, "jetson_clocks", settings, "edge_jetson_clocks", check_mode)
    else:
        before, after = remove_state_file(path, check_mode)
    result["state_file_changed"] = before != after
    if before != after:
        result["changed"] = True
        if want_diff:
            result["diff"] = [result["diff"], {"before_header": path, "after_header": path,
                                               "before": before or "", "after": after}]


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["pinned", "restored"], "default": "pinned"},
            "store_file": {"type": "path", "default": DEFAULT_STORE_FILE},
            "jetson_clocks_path": {"type": "path"},
            "state_file": {"type": "path"},
        },
        supports_check_mode=True,
    )

    def find(name):
        return module.get_bin_path(name, opt_dirs=["/usr/bin", "/usr/sbin"])

    params = module.params
    try:
        if params["state_file"] and params["state"] == "pinned":
            # Refused before anything is pinned: the boot program needs absolute paths.
            boot_settings(params["store_file"] or DEFAULT_STORE_FILE, params["jetson_clocks_path"])
        result = run(params, module.check_mode, module._diff, subprocess_run, find)
        if params["state_file"]:
            sync_state_file(params, result, module.check_mode, module._diff)
    except EdgeError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except Exception as exc:  # never a traceback: one line saying what went wrong
        module.fail_json(msg="edge_jetson_clocks: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
