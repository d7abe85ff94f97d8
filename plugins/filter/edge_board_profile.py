"""Filters that match a board to its curated profile (runs on the controller)."""

DOCUMENTATION = r"""
name: edge_board_profile
short_description: Pick the board profile for a device's edge facts
description:
  - Returns the first profile whose C(match) list contains one of the device's device-tree
    compatible strings, trying the device's strings most specific first; null when none matches.
  - Fields that differ by L4T release (mappings keyed by the major release) are resolved
    for the device's release.
positional: _input, facts
options:
  _input: {description: List of profiles (the data files), type: list, required: true}
  facts: {description: The C(edge) fact tree from edge_facts, type: dict, required: true}
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
