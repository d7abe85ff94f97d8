#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_nvpmodel: select a Jetson nvpmodel power mode by name."""

DOCUMENTATION = r"""
---
module: edge_nvpmodel
short_description: Select a Jetson nvpmodel power mode by its name, never rebooting by itself
description:
  - Looks the mode NAME up in the board's nvpmodel configuration to find its ID (IDs differ
    between modules, for example MAXN is ID 0 on AGX Orin and Orin NX but MAXN_SUPER is ID 2 on
    Orin Nano), reads the current mode with C(nvpmodel -q --verbose) and, when it differs, runs
    C(nvpmodel -m ID) with its standard input answered C(NO), so nvpmodel never waits on its
    reboot prompt and never reboots.
  - A switch that changes the GPU power-gating masks (on Orin confs, also the set of online CPUs)
    can only take effect at boot. nvpmodel then asks whether to reboot; declining cancels the
    switch and records nothing. The module then records the mode in nvpmodel's status file
    (O(status_file), C(pmode:000N)), which C(nvpmodel -f) applies at the next boot, and returns
    RV(reboot_required=true). The reboot itself is left to the playbook.
  - A mode that is recorded but not running yet (the live CPU_ONLINE or GPU power-gating values
    differ from the mode's, in C(nvpmodel -q --verbose)) is reported with
    RV(reboot_required=true) and C(changed=false).
  - After a switch the mode is read back with C(nvpmodel -q); a mode that did not stick is an
    error.
  - An unknown mode name fails before any command runs, listing the names the configuration
    defines.
version_added: "0.1.0"
requirements:
  - C(nvpmodel) (L4T)
author:
  - edgetune contributors (!UNKNOWN)
options:
  mode:
    description:
      - The power mode NAME as written in the configuration's C(POWER_MODEL NAME=), for example
        C(MAXN), C(MAXN_SUPER), C(MODE_30W), C(25W). Case-sensitive.
    type: str
    required: true
  conf:
    description:
      - The nvpmodel configuration file. Passed to nvpmodel with C(-f) when it is not the default.
    type: path
    default: /etc/nvpmodel.conf
  nvpmodel_path:
    description:
      - The nvpmodel program. Defaults to C(nvpmodel) found on PATH, then in C(/usr/sbin).
    type: path
  status_file:
    description:
      - nvpmodel's status file, where a mode waiting for a reboot is recorded. Passed to nvpmodel
        with C(-u) when it is not the default.
    type: path
    default: /var/lib/nvpmodel/status
notes:
  - Run C(jetson_clocks) again after a mode change if the clocks were pinned; nvpmodel resets the
    CPU and GPU minimum frequencies.
seealso:
  - name: NVIDIA Jetson Linux Developer Guide, Power Management
    description: Supported power modes per Jetson module.
    link: "https://docs.nvidia.com/jetson/archives/r36.4.3/DeveloperGuide/SD/PlatformPowerAndPerformance/\
      JetsonOrinNanoSeriesJetsonOrinNxSeriesAndJetsonAgxOrinSeries.html"
attributes:
  check_mode:
    description:
      - Resolves the name, queries the current mode and predicts whether a reboot is needed;
        never runs C(nvpmodel -m) and never writes the status file.
    support: full
  diff_mode:
    description: Shows the mode name before and after.
    support: full
extends_documentation_fragment: edgetune.fleet.edge.jetson
"""

EXAMPLES = r"""
- name: Select MAXN on an AGX Orin (ID 0 there, found by name)
  edge_nvpmodel:
    mode: MAXN
  register: nvp

- name: Reboot when the new mode can only start at boot
  ansible.builtin.reboot:
  when: nvp.reboot_required

- name: Select the 25W mode from a vendor's conf
  edge_nvpmodel:
    mode: 25W
    conf: /etc/nvpmodel/nvpmodel_p3767_0000_super.conf
"""

RETURN = r"""
mode_name:
  description: The requested mode's name.
  returned: always
  type: str
  sample: MODE_30W
mode_id:
  description: The requested mode's ID in this configuration.
  returned: always
  type: int
  sample: 2
previous_mode_name:
  description: The mode C(nvpmodel -q) reported before the module ran.
  returned: always
  type: str
  sample: MAXN
previous_mode_id:
  description: Its ID.
  returned: always
  type: int
  sample: 0
reboot_required:
  description:
    - True when the requested mode is recorded but only takes effect at the next boot.
    - In check mode, the prediction for the switch.
  returned: always
  type: bool
  sample: true
pending_settings:
  description: The boot-only settings (CPU_ONLINE, GPU power-gating masks) whose live value still
    differs from the requested mode's, after the run.
  returned: always
  type: list
  elements: str
  sample: ["CPU_ONLINE CORE_8: live 1, mode 0"]
nvpmodel_output:
  description: Output of C(nvpmodel -m), when it ran.
  returned: when nvpmodel -m ran
  type: list
  elements: str
valid_modes:
  description: The mode names the configuration defines.
  returned: always
  type: list
  elements: str
  sample: [MAXN, MODE_15W, MODE_30W, MODE_50W]
"""

# Ansible modules keep DOCUMENTATION first, so the imports follow it.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_command  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import atomic_write, read_text  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_nvpmodel import (  # noqa: E402
    DEFAULT_CONF,
    DEFAULT_STATUS_FILE,
    REBOOT_REQUIRED_TEXT,
    parse_conf,
    parse_query_output,
    pending_settings,
    reboot_needed,
    status_with_mode,
)

# The answer given to nvpmodel's "DO YOU WANT TO REBOOT NOW?": never YES.
DECLINE_REBOOT = "NO"


def load_conf(path):
    try:
        text = read_text(path)
    except OSError as exc:
        raise EdgeError(f"cannot read the nvpmodel configuration {path}: {exc.strerror or exc}") from exc
    try:
        return parse_conf(text)
    except ValueError as exc:
        raise EdgeError(f"{path}: {exc}") from exc


def common_args(params):
    """-f/-u when the module was pointed at non-default files."""
    args = []
    if params["conf"] != DEFAULT_CONF:
        args += ["-f", params["conf"]]
    if params["status_file"] != DEFAULT_STATUS_FILE:
        args += ["-u", params["status_file"]]
    return args


def query(nvpmodel, params, run_command):
    argv = [nvpmodel, "-q", "--verbose"] + common_args(params)
    rc, out, err = run_command(argv)
    if rc != 0:
        raise EdgeError(f"{' '.join(argv)} failed with rc={rc}", rc=rc, stdout=out, stderr=err)
    try:
        return parse_query_output(out + "\n" + err)
    except ValueError as exc:
        raise EdgeError(f"cannot read the current mode: {exc}", stdout=out, stderr=err) from exc


def describe_pending(query_result):
    return [
        "{} {}: live {}, mode {}".format(p["param"], p["arg"], p["real"], p["conf"])
        for p in pending_settings(query_result)
    ]


def record_pending(status_file, mode_id):
    """Record the mode in nvpmodel's status file for "nvpmodel -f" at the next boot."""
    try:
        old = read_text(status_file)
    except FileNotFoundError:
        old = ""
    new = status_with_mode(old, mode_id)
    if new != old:
        os.makedirs(os.path.dirname(status_file) or ".", exist_ok=True)
        atomic_write(status_file, new, backup=False)


def run_module(params, check_mode, want_diff, run_command, find_command):
    conf = load_conf(params["conf"])
    target = conf.by_name(params["mode"])
    if target is None:
        raise EdgeError(
            "unknown nvpmodel mode {!r}: {} defines {}".format(
                params["mode"], params["conf"], ", ".join(conf.names())),
            valid_modes=conf.names())

    nvpmodel = params["nvpmodel_path"] or find_command("nvpmodel", opt_dirs=["/usr/sbin", "/sbin"])
    if not nvpmodel:
        raise EdgeError("nvpmodel was not found on PATH nor in /usr/sbin", valid_modes=conf.names())

    before = query(nvpmodel, params, run_command)
    result = {
        "changed": False,
        "mode_name": target.name,
        "mode_id": target.id,
        "previous_mode_name": before["name"],
        "previous_mode_id": before["id"],
        "reboot_required": False,
        "pending_settings": [],
        "valid_modes": conf.names(),
    }
    if before["id"] == target.id:
        # Already selected; it may still be waiting for a reboot.
        result["pending_settings"] = describe_pending(before)
        result["reboot_required"] = bool(result["pending_settings"])
        return result

    result["changed"] = True
    if want_diff:
        result["diff"] = {
            "before_header": "nvpmodel mode", "after_header": "nvpmodel mode",
            "before": "{} (ID {})\n".format(before["name"], before["id"]),
            "after": f"{target.name} (ID {target.id})\n",
        }
    if check_mode:
        result["reboot_required"] = reboot_needed(conf, target, before)
        return result

    argv = [nvpmodel, "-m", str(target.id)] + common_args(params)
    rc, out, err = run_command(argv, data=DECLINE_REBOOT)
    output = out + ("\n" + err if err else "")
    result["nvpmodel_output"] = output.splitlines()
    deferred = REBOOT_REQUIRED_TEXT in output
    if deferred:
        # nvpmodel cancelled the switch when we declined its reboot: keep the
        # mode for the next boot ourselves.
        record_pending(params["status_file"], target.id)
    elif rc != 0 or "NVPM ERROR" in output:
        raise EdgeError(f"{' '.join(argv)} failed with rc={rc}", rc=rc, stdout=out, stderr=err)

    after = query(nvpmodel, params, run_command)
    if after["id"] != target.id:
        raise EdgeError(
            "nvpmodel reports mode {} (ID {}) after selecting {} (ID {})".format(
                after["name"], after["id"], target.name, target.id),
            nvpmodel_output=result["nvpmodel_output"])
    result["pending_settings"] = describe_pending(after)
    result["reboot_required"] = deferred or bool(result["pending_settings"])
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "required": True},
            "conf": {"type": "path", "default": DEFAULT_CONF},
            "nvpmodel_path": {"type": "path"},
            "status_file": {"type": "path", "default": DEFAULT_STATUS_FILE},
        },
        supports_check_mode=True,
    )
    try:
        result = run_module(
            module.params,
            check_mode=module.check_mode,
            want_diff=module._diff,
            run_command=edge_command.run,  # nvpmodel killed if it hangs
            find_command=module.get_bin_path,
        )
    except EdgeError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (ValueError, TypeError, OSError) as exc:
        module.fail_json(msg=f"{type(exc).__name__}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
