# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that match a board to its curated profile (runs on the controller)."""

DOCUMENTATION = r"""
name: edge_board_profile
short_description: Pick the board profile for a device's edge facts
description:
  - Returns the first profile whose C(match) list contains one of the device's device-tree
    compatible strings, trying the device's strings most specific first; null when none matches.
  - Fields that differ by L4T release (mappings keyed by the major release) are resolved
    for the device's release.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, facts
options:
  _input:
    description: The board profiles (the role edge_facts' data files), each with a C(match) list of compatible strings.
    type: list
    elements: dict
    required: true
  facts:
    description: The C(edge) fact tree from the edge_facts module.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Pick the profile of this board
  ansible.builtin.set_fact:
    edge_facts_profile: "{{ profiles | edgetune.fleet.edge_board_profile(ansible_facts.edge) }}"
"""

RETURN = r"""
_value:
  description:
    - The first matching profile with C(devfreq) and C(cgroup_default) resolved for the device's L4T
      release and C(matched) set to the compatible string that matched; null when no profile matches.
  type: dict
"""


def resolve_release(value, major):
    """{"35": a, "36": b} -> the entry for this release; other values unchanged."""
    if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
        return value.get(str(major)) if major is not None else None
    return value


def edge_board_profile(profiles, facts):
    major = (facts.get("l4t") or {}).get("major")
    for compatible in facts.get("compatible") or []:
        for profile in profiles:
            if compatible in profile.get("match", []):
                resolved = dict(profile)
                resolved["devfreq"] = {role: resolve_release(node, major)
                                       for role, node in (profile.get("devfreq") or {}).items()}
                resolved["cgroup_default"] = resolve_release(profile.get("cgroup_default"), major)
                resolved["matched"] = compatible
                return resolved
    return None


class FilterModule(object):
    def filters(self):
        return {"edge_board_profile": edge_board_profile}
