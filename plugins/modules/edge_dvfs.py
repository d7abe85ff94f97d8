#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_dvfs: CPU (cpufreq) and GPU/NPU/memory (devfreq) governors and limits.

The work is done in module_utils/device/edge_dvfs.py, shared with the boot program
(module_utils/device/edge_boot.py, kind ``dvfs``) that re-applies the saved settings.
"""

DOCUMENTATION = r"""
---
module: edge_dvfs
short_description: Set cpufreq and devfreq governors and frequency limits, with read-back
description:
  - Sets the governor and the min/max frequency of cpufreq policies
    (C(/sys/devices/system/cpu/cpufreq/policyN)) and devfreq nodes (C(/sys/class/devfreq/<node>)),
    for example the Jetson Orin GPU (C(17000000.gpu) on L4T r36, C(17000000.ga10b) on r35) or the
    RK3588 GPU, NPU and memory (C(fb000000.gpu), C(fdab0000.npu), C(dmc)).
  - Everything is read and validated first. Any invalid item (a governor the node does not
    offer, a frequency outside its range or between its steps with O(snap=exact), min above max,
    a policy or node the board does not have) fails the task with one message and nothing is
    written.
  - Writes go governor first (a governor change resets the limits on some drivers; the limits
    are read again after it), then the limits in an order that never puts min above max
    (max first when raising, min first when lowering). Every managed attribute is then read
    back; a value that did not stick (for example clamped by an nvpmodel or thermal cap) is an
    error naming the file, the expected and the actual value.
  - With O(state_file), the resolved settings are also saved in edgetune's boot-time state format
    (plugins/module_utils/device/edge_boot.py, kind C(dvfs)), re-applied at every boot by
    C(edgetune-boot.service) (role edge_boot; no Ansible needed on the board). Runtime sysfs
    settings do not survive a reboot by themselves.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  cpufreq:
    description: cpufreq policies to manage.
    type: list
    elements: dict
    default: []
    suboptions:
      policy:
        description:
          - Policy number, the first CPU of the cluster (C(policy4) is V(4)).
          - Exactly one of O(cpufreq[].policy) and O(cpufreq[].cpus) is required.
        type: int
      cpus:
        description:
          - A CPU number; the policy that governs this CPU is meant (found through the
            C(cpuN/cpufreq) link, or the policies' C(related_cpus)).
        type: int
      governor:
        description: Governor name; must be listed in C(scaling_available_governors).
        type: str
      min_freq:
        description:
          - Lowest frequency in kHz, or V(min) / V(max) for the lowest / highest step of
            C(scaling_available_frequencies) (C(cpuinfo_min_freq) / C(cpuinfo_max_freq) when the
            driver has no table). Must lie within C(cpuinfo_min_freq)..C(cpuinfo_max_freq).
        type: raw
      max_freq:
        description: Highest frequency in kHz, or V(min) / V(max); as O(cpufreq[].min_freq).
        type: raw
  devfreq:
    description: devfreq nodes to manage.
    type: list
    elements: dict
    default: []
    suboptions:
      node:
        description: Node name under C(/sys/class/devfreq), for example V(17000000.gpu) or V(dmc).
        type: str
        required: true
      governor:
        description: Governor name; must be listed in C(available_governors).
        type: str
      min_freq:
        description:
          - Lowest frequency in Hz, or V(min) / V(max) for the lowest / highest step of
            C(available_frequencies).
        type: raw
      max_freq:
        description: Highest frequency in Hz, or V(min) / V(max).
        type: raw
  snap:
    description:
      - What to do with a frequency that is not a step of the node's table.
      - V(exact) rejects it and names the nearest steps; V(down) takes the highest step at or
        below it, V(up) the lowest step at or above it, V(nearest) the closest step (the lower
        one on a tie). A frequency outside the range is always an error.
    type: str
    choices: [exact, down, up, nearest]
    default: exact
  sysfs_root:
    description: Prefix for every sysfs path (for tests and fake trees).
    type: path
    default: /
  state_file:
    description:
      - Also save the resolved settings (policy numbers, frequencies after snapping) to this file,
        atomically and only when its content changes, in edgetune's boot-time state format
        (plugins/module_utils/device/edge_boot.py, kind C(dvfs)), re-applied at every boot by
        C(edgetune-boot.service) (role edge_boot), which reads the state files in
        C(/etc/edgetune/boot.d) (this module's is V(/etc/edgetune/boot.d/dvfs.json)).
      - Written after the settings were applied and read back successfully; not written in
        check mode. Policies and nodes missing from the board are not saved. A policy skipped as
        inactive (all its CPUs offline, with O(fail_on_missing=false)) is saved with its values as
        given (frequencies not yet snapped, with the O(snap) rule when it is not V(exact)), so
        that the boot-time re-apply sets it when a power mode brings its CPUs online (AGX Orin
        MODE_30W to MAXN takes effect at the next boot).
    type: path
  fail_on_missing:
    description:
      - Fail when a policy, CPU or node is not on this board (the message lists the ones it
        has), or when a policy is inactive because all its CPUs are offline (AGX Orin MODE_30W
        takes cpu8-11 offline). With V(false) such items are left out and listed in RV(left_out)
        (inactive policies still go into O(state_file)).
    type: bool
    default: true
attributes:
  check_mode:
    description: Reads and validates everything and reports exactly which writes would be made; writes nothing.
    support: full
  diff_mode:
    description:
      - "One C(path: value) line per managed attribute, before and after; and the state file's
        content when it changes."
    support: full
notes:
  - Settings made here last until the next reboot, nvpmodel mode change or C(jetson_clocks) run.
    Use O(state_file) to have C(edgetune-boot.service) (role edge_boot), which runs after
    C(nvpmodel.service), re-apply them at every boot.
  - On Jetson, nvpmodel caps the maximum frequencies of the current power mode; a higher
    O(cpufreq[].max_freq) does not stick and fails the read-back.
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Pin the RK3588 big cores and the NPU at their top frequencies
  edge_dvfs:
    cpufreq:
      - policy: 4
        governor: performance
        min_freq: max
        max_freq: max
      - cpus: 6
        governor: performance
    devfreq:
      - node: fdab0000.npu
        governor: performance
    state_file: /etc/edgetune/boot.d/dvfs.json

- name: Cap the Orin NX GPU at about 900 MHz, rounding down to a table step
  edge_dvfs:
    devfreq:
      - node: 17000000.gpu
        max_freq: 900000000
    snap: down

- name: Set the AGX Orin third cluster if this module has it
  edge_dvfs:
    cpufreq:
      - policy: 8
        min_freq: 729600
        max_freq: max
    fail_on_missing: false
"""

RETURN = r"""
settings:
  description:
    - Per kind (C(cpufreq), C(devfreq)) and name (C(policy4), C(dmc)) the directory, the
      attributes the task manages (C(managed)), the C(before) and C(after) values of
      C(governor), C(min_freq) and C(max_freq), and the writes made (check mode, the writes that
      would be made) in order.
    - C(after) is read back from sysfs, or in check mode the planned values.
  returned: success, and on a write or read-back failure for what was done
  type: dict
  sample:
    cpufreq:
      policy4:
        path: /sys/devices/system/cpu/cpufreq/policy4
        managed: [governor, min_freq]
        before: {governor: schedutil, min_freq: 408000, max_freq: 2400000}
        after: {governor: performance, min_freq: 2400000, max_freq: 2400000}
        writes:
          - {file: scaling_governor, old: schedutil, new: performance}
          - {file: scaling_min_freq, old: 408000, new: 2400000}
    devfreq: {}
left_out:
  description:
    - Items left out because O(fail_on_missing=false), with C(reason) V(missing) (not on this
      board) or V(inactive) (a policy whose CPUs are all offline).
    - Not called C(skipped), a key Ansible reads as "the task was skipped".
  returned: always
  type: list
  elements: dict
  sample: [{kind: cpufreq, name: policy8, reason: missing,
            msg: "policy8 not found; present: policy0 (cpus 0-3), policy4 (cpus 4-7)"}]
state_file:
  description: The state file path, when O(state_file) was given.
  returned: when O(state_file) is given
  type: str
  sample: /etc/edgetune/boot.d/dvfs.json
state_file_changed:
  description: Whether the state file's content changed (or would change in check mode).
  returned: when O(state_file) is given
  type: bool
errors:
  description: Every error message, one per item (the same text as C(msg), split).
  returned: failure
  type: list
  elements: str
diff:
  description:
    - "Before and after text, one C(path: value) line per managed attribute."
    - The state file's content, when it changes.
  returned: diff mode
  type: list
  elements: dict
"""

# Ansible modules keep their imports after the documentation strings.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_dvfs as dvfs  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import exit_module  # noqa: E402

KIND = "dvfs"


def main():
    freq = dict(type="raw")
    module = AnsibleModule(
        argument_spec=dict(
            cpufreq=dict(type="list", elements="dict", default=[], options=dict(
                policy=dict(type="int"), cpus=dict(type="int"), governor=dict(type="str"),
                min_freq=freq, max_freq=freq,
            ), mutually_exclusive=[("policy", "cpus")], required_one_of=[("policy", "cpus")]),
            devfreq=dict(type="list", elements="dict", default=[], options=dict(
                node=dict(type="str", required=True), governor=dict(type="str"),
                min_freq=freq, max_freq=freq,
            )),
            snap=dict(type="str", default="exact", choices=list(dvfs.SNAPS)),
            sysfs_root=dict(type="path", default="/"),
            state_file=dict(type="path"),
            fail_on_missing=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params

    def work():
        result, targets = dvfs.run(params["sysfs_root"], params["cpufreq"], params["devfreq"],
                                   params["snap"], params["fail_on_missing"], module.check_mode)
        applied = [t for t in targets if not t.inactive]
        diff = [{"before_header": "sysfs", "after_header": "sysfs",
                 "before": "".join(line + "\n" for t in applied for line in t.lines(t.current)),
                 "after": "".join(line + "\n" for t in applied for line in t.lines(t.after))}]
        if params["state_file"]:
            result["state_file"] = params["state_file"]
            edge_boot.sync_into(result, diff, params["state_file"], KIND, dvfs.state_settings(targets, params["snap"]),
                                "edge_dvfs", module.check_mode)
        return result, diff

    exit_module(module, "edge_dvfs", work)


if __name__ == "__main__":
    main()
