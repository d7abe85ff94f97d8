# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The DVFS settings a jetson_clocks restore would write back over (runs on the controller)."""
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_dvfs import overridden_by_restore

DOCUMENTATION = r"""
name: edge_dvfs_overridden
short_description: The DVFS attribute files a jetson_clocks restore writes back with other values
description:
  - In check mode a C(jetson_clocks) restore earlier in the run (before a power mode switch, or
    C(edge_power_jetson_clocks=false)) did not write; a real run writes the values it saved back, and the
    module edge_dvfs then sets its own again. This filter lists the files where the two differ, so that
    check mode reports that change (plugins/module_utils/device/edge_dvfs.py, C(overridden_by_restore)).
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, restores
options:
  _input:
    description: The result of the module edge_dvfs (its C(settings)).
    type: dict
    required: true
  restores:
    description: The results of the module edge_jetson_clocks that restored the clocks (each with C(saved_values)).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Set the cpufreq and devfreq governors and limits
  edgetune.fleet.edge_dvfs:
    cpufreq: "{{ cpufreq }}"
  register: dvfs
  changed_when: >-
    dvfs.changed or (ansible_check_mode and dvfs | edgetune.fleet.edge_dvfs_overridden(restores) | length > 0)
"""

RETURN = r"""
_value:
  description: The attribute files, sorted.
  type: list
  elements: str
"""


def edge_dvfs_overridden(result, restores):
    saved = {}
    for restore in restores or []:
        saved.update(restore.get("saved_values") or {})
    return overridden_by_restore((result or {}).get("settings"), saved)


class FilterModule(object):
    def filters(self):
        return {"edge_dvfs_overridden": edge_dvfs_overridden}
