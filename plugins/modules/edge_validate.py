#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_validate: the documentation of the action plugin plugins/action/edge_validate.py."""

DOCUMENTATION = r"""
---
module: edge_validate
short_description: Validate a host's edgetune intent before any change, every role at once
description:
  - Runs on the controller (an action plugin). Gathers the host's C(edge_*) variables, templated,
    and the board that role C(edge_facts) read (C(ansible_facts.edge) and C(edge_facts_profile)),
    and checks every option of the roles against each role's C(meta/argument_specs.yml) and the board.
  - Types are strict where a spec says C(bool) or C(list) (a string such as V(yes), V(false) or
    V(maybe) is not a boolean, and V(1,2) is not a list), numbers are range-checked, and the values
    are checked against the board, CPUs (the present and online lists), the profile's nvpmodel
    mode names, the cpufreq policies' and devfreq nodes' governors and frequencies, RAM, RT
    throttling, slice names, ports, rates, PCIe traffic classes, paths on the device, timeouts.
  - A systemd calendar (C(edge_audit_timer_calendar)) is checked with C(systemd-analyze calendar)
    on the controller when it has one, else on the device (read-only); RV(calendar_checked_on) says where.
  - The runtime's artifacts (source C(controller), in apply mode, when role C(edge_runtime) runs)
    are checked on the controller before anything is copied, presence, sha256 (given or from the
    C(.manifest.json) beside the tarball), the manifest and every file's checksum, compatibility
    with the board's SoC and L4T or BSP release, and the runtime against the engine's format.
  - Every problem of every variable is reported at once, one message per bad variable naming
    it, its value and what is allowed. The task fails when there is one; it never changes anything.
  - Unknown C(edge_*) variables in the host's variables are warned about, naming the nearest
    known one (when O(roles) is empty, or with O(warn_unknown)).
  - The rules live in C(plugins/module_utils/plan/edge_intent.py); the filters C(edge_cpu_partition)
    and C(edge_cgroups_plan) use the same code.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  roles:
    description:
      - The roles whose variables to check (for a role's own start-of-role check); empty checks
        every role of the collection and the playbooks' own variables (C(edge_reboot_policy), ...).
    type: list
    elements: str
    default: []
  warn_unknown:
    description: Warn about C(edge_*) variables no role or playbook knows; defaults to true when O(roles) is empty.
    type: bool
extends_documentation_fragment: edgetune.fleet.edge.planner
"""

EXAMPLES = r"""
- name: Validate the intent of every role before the first change
  edgetune.fleet.edge_validate:
  any_errors_fatal: true

- name: Validate this role's variables (a role's own check)
  edgetune.fleet.edge_validate:
    roles: [edge_runtime]
"""

RETURN = r"""
problems:
  description:
    - One entry per bad variable, with C(variable), C(value) and C(message) (which names both and what
      is allowed).
  returned: always
  type: list
  elements: dict
  sample:
    - variable: edge_runtime_health_timeout
      value: -5
      message: "edge_runtime_health_timeout = -5: allowed: a number above 0 and at most 3600 (seconds)"
warnings_unknown:
  description: The warnings about unknown C(edge_*) variables.
  returned: always
  type: list
  elements: str
  sample:
    - >-
      edge_bootarg_isolate is not a variable of any edgetune role or playbook and is ignored
      (did you mean edge_bootargs_isolate?)
roles:
  description: The roles whose variables were checked.
  returned: always
  type: list
  elements: str
  sample: [edge_bootargs, edge_runtime]
board:
  description: Whether the board's facts and profile were there (false checks types and ranges only).
  returned: always
  type: bool
  sample: true
artifacts:
  description:
    - The runtime's artifacts on the controller, each with C(kind), C(path) and C(sha256), once every
      check passed (source C(controller), apply mode).
  returned: when the artifacts were checked on the controller
  type: list
  elements: dict
  sample: [{kind: runtime, path: /srv/artifacts/edgetune-runtime-0.1.2.tar.gz, sha256: b722...}]
calendar_checked_on:
  description: Where the systemd calendar was checked (controller, device, or not checked).
  returned: when role edge_audit_timer is checked
  type: str
  sample: controller (systemd 252)
"""
