# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The apply records role edge_record writes, one file per role (runs on the controller)."""
from ansible.errors import AnsibleFilterError
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import RECORD_VERSION, validate_checks
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

DOCUMENTATION = r"""
name: edge_record_files
short_description: The apply records of the roles that ran, as files for edge_files
description:
  - One record per role, C(<record_dir>/<role>.json) (mode 0600), with the role's checks as it published them
    (C(edge_<role>_audit)) and its inputs from the plan's audit part. The drift audit and a converge read them.
  - Every check is validated against the audit's declared schema (plugins/module_utils/device/edge_audit.py,
    C(CHECK_SCHEMA)) first; a malformed one fails the task with one line naming the role and the check, and
    nothing is written.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, roles, checks
options:
  _input:
    description: The device's plan (C(ansible_facts.edge_plan)).
    type: dict
    required: true
  roles:
    description: The roles to record.
    type: list
    elements: str
    required: true
  checks:
    description: Each role's checks, in the order of O(roles).
    type: list
    elements: list
    required: true
"""

EXAMPLES = r"""
- name: Record each role's checks and inputs
  edgetune.fleet.edge_files:
    files: >-
      {{ ansible_facts.edge_plan | edgetune.fleet.edge_record_files(roles, query('ansible.builtin.vars', *names)) }}
"""

RETURN = r"""
_value:
  description: The files (C(dest), C(content), C(mode)) for the module edge_files.
  type: list
  elements: dict
"""


def edge_record_files(plan, roles, checks):
    audit = plan["audit"]
    if len(roles) != len(checks):
        raise AnsibleFilterError("edge_record_files: %d roles but %d lists of checks" % (len(roles), len(checks)))
    files = []
    for role, role_checks in zip(roles, checks):
        try:
            validate_checks(role_checks, role + "_audit")
        except EdgeError as exc:
            raise AnsibleFilterError("cannot record the apply: %s" % exc) from None
        record = {"version": RECORD_VERSION, "role": role, "inputs": audit["roles"][role]["inputs"],
                  "checks": role_checks}
        files.append({"dest": "%s/%s.json" % (audit["record_dir"], role),
                      "content": to_nice_json(record, sort_keys=True), "mode": "0600"})
    return files


class FilterModule(object):
    def filters(self):
        return {"edge_record_files": edge_record_files}
