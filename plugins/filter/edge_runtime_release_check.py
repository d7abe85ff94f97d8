# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's release check of role edge_runtime (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_audit

DOCUMENTATION = r"""
name: edge_runtime_release_check
short_description: The drift audit's check of the release the LLM runtime serves
description:
  - Turns what role edge_runtime deployed (the release, its artifacts, the unit, what the gates accepted of its
    threads) into the C(runtime) check it records for the drift audit; the logic is C(runtime_release_check) in
    plugins/module_utils/device/edge_audit.py, which also declares the check's schema.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, release, artifacts, service, expect
options:
  _input:
    description: The runtime's root directory (its C(releases/) and the C(current) link).
    type: str
    required: true
  release:
    description: The release the deploy serves (empty when nothing was deployed yet, in check mode).
    type: str
    required: true
  artifacts:
    description: The deployed artifacts, each with C(kind) and C(sha256).
    type: list
    elements: dict
    required: true
  service:
    description: The runtime's systemd unit.
    type: str
    required: true
  expect:
    description: What the gates accepted of the service's threads (policy, priority, CPUs); empty to check none.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Publish the runtime checks
  ansible.builtin.set_fact:
    edge_runtime_audit: >-
      {{ [edge_runtime_root | edgetune.fleet.edge_runtime_release_check('llama-0.5.0',
          [{'kind': 'runtime', 'sha256': 'ab'}], 'edgetune-runtime.service', {'policy': 'other'})] }}
"""

RETURN = r"""
_value:
  description: The C(runtime) check, as plugins/module_utils/device/edge_audit.py evaluates it.
  type: dict
"""


def edge_runtime_release_check(root, release, artifacts, service, expect):
    return edge_audit.runtime_release_check(root, release, artifacts, service, expect)


class FilterModule(object):
    def filters(self):
        return {"edge_runtime_release_check": edge_runtime_release_check}
