# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the deploy finds the runtime's artifacts on the device (runs on the controller)."""
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_artifact import device_paths

DOCUMENTATION = r"""
name: edge_device_artifacts
short_description: Where the deploy finds the runtime's artifacts on the device, and the cache's directories
description:
  - For each artifact (runtime, engine), its path on the device and its sha256, by where the artifacts come
    from; and the artifact cache with its parents, deepest first (a refused deploy removes the ones it
    created). The logic is plugins/module_utils/device/edge_artifact.py (C(device_paths)).
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, cache_dir, checked, runtime, engine
options:
  _input:
    description: Where the artifacts come from (C(edge_runtime_artifact_source)).
    type: str
    choices: [controller, url, device]
    required: true
  cache_dir:
    description: The artifact cache on the device (C(edge_runtime_cache_dir)).
    type: str
    required: true
  checked:
    description: For C(controller), the artifacts the controller checked (C(kind), C(path), C(sha256)).
    type: list
    elements: dict
  runtime:
    description: For C(url) and C(device), the runtime's source and sha256.
    type: list
    elements: str
  engine:
    description: For C(url) and C(device), the engine's source and sha256.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Note the artifacts on the device
  ansible.builtin.set_fact:
    artifacts: >-
      {{ (edge_runtime_artifact_source
          | edgetune.fleet.edge_device_artifacts(edge_runtime_cache_dir, validated.artifacts,
                                                 [edge_runtime_runtime_src, edge_runtime_runtime_sha256],
                                                 [edge_runtime_engine_src, edge_runtime_engine_sha256])).artifacts }}
"""

RETURN = r"""
_value:
  description: C(artifacts) (C(kind), C(path), C(sha256)) and C(cache_dirs) (deepest first).
  type: dict
"""


def edge_device_artifacts(source, cache_dir, checked=None, runtime=None, engine=None):
    return device_paths(source, cache_dir, checked or [], runtime=tuple(runtime or ("", "")),
                        engine=tuple(engine or ("", "")))


class FilterModule(object):
    def filters(self):
        return {"edge_device_artifacts": edge_device_artifacts}
