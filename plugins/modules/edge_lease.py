#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# -*- coding: utf-8 -*-
"""Ansible module edge_lease: give back, or take again, the device's apply lease."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: edge_lease
short_description: Give back or renew the apply lease that keeps two applies off one device
description:
  - Every apply (C(site.yml), C(tune.yml), C(deploy.yml), tagged or not) takes the device's apply lease in its
    first device execution (P(edgetune.fleet.edge_facts#module) with its O(edgetune.fleet.edge_facts#module:lease)
    option) and gives it back at its end with this module (O(state=released)). A second apply waits for it
    and then fails with one line naming the holder (controller, user, playbook, since when); an expired
    lease, one taken in an earlier boot, or one of a run of the same controller that has ended is taken over.
  - O(state=taken) takes the lease again for this run (after the run's own reboot, whose new boot would
    otherwise let another run take it over), waiting like the first take.
  - O(state=rebooting), right before this run reboots the device, keeps its lease through the reboot; a copy
    that outlives the boot (C(/var/lib/edgetune/apply.lease.reboot), beside O(path) where that is elsewhere)
    holds the device for this run for O(ttl) seconds, until O(state=taken) in the new boot takes the lease
    again and removes the copy. A run that waits for the device meanwhile keeps waiting.
  - The lease is a JSON file (C(/run/edgetune/apply.lease)); a lock file serializes every change.
  - The action plugin fills in O(holder) with this run of ansible-playbook.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  state:
    description:
      - C(released) removes the lease when this run holds it; C(taken) takes or renews it; C(rebooting) keeps
        it through the reboot this run is about to make.
    type: str
    choices: [released, taken, rebooting]
    default: released
  ttl:
    description: With O(state=taken), seconds the lease is valid; with O(state=rebooting), seconds the kept
      lease holds the device while it reboots.
    type: int
    default: 3600
  wait:
    description: With O(state=taken), seconds to wait while another run holds the lease.
    type: int
    default: 600
  holder:
    description: The run (C(run_id), C(controller), C(user), C(playbook)); filled in by the action plugin.
    type: dict
    required: true
  path:
    description: The lease file.
    type: path
    default: /run/edgetune/apply.lease
attributes:
  check_mode:
    description: Changes nothing in check mode (an apply in check mode never took the lease).
    support: full
  diff_mode:
    description: The lease is bookkeeping of a run, not a setting; there is no difference to show.
    support: none
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Keep this run's lease through the reboot it makes next
  edgetune.fleet.edge_lease:
    state: rebooting
    ttl: 900

- name: Give the device's apply lease back
  edgetune.fleet.edge_lease:
    state: released
"""

RETURN = r"""
released:
  description: With O(state=released), whether this run held the lease and removed it.
  returned: always
  type: bool
kept:
  description: With O(state=rebooting), whether this run held the lease and kept it through the reboot.
  returned: always
  type: bool
took_over:
  description: With O(state=taken), the ended, expired or earlier boot's lease taken over, described.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_lease
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError


def main():
    module = AnsibleModule(
        argument_spec={"state": {"type": "str", "choices": ["released", "taken", "rebooting"],
                                 "default": "released"},
                       "ttl": {"type": "int", "default": 3600}, "wait": {"type": "int", "default": 600},
                       "holder": {"type": "dict", "required": True},
                       "path": {"type": "path", "default": edge_lease.LEASE_FILE}},
        supports_check_mode=True)
    params = module.params
    if module.check_mode:
        module.exit_json(changed=False, released=False, kept=False, took_over=None)
    try:
        if params["state"] == "released":
            released = edge_lease.give_back(params["holder"].get("run_id"), params["path"])
            module.exit_json(changed=False, released=released, kept=False, took_over=None)
        if params["state"] == "rebooting":
            kept = edge_lease.keep_through_reboot(params["holder"].get("run_id"), params["ttl"], params["path"])
            module.exit_json(changed=False, released=False, kept=kept, took_over=None)
        found = edge_lease.take(params["holder"], params["ttl"], params["wait"], params["path"])
    except (EdgeError, OSError) as exc:
        module.fail_json(msg=str(exc))
    # Bookkeeping of the run, not a setting: never reported as a change.
    module.exit_json(changed=False, released=False, kept=False, took_over=found["took_over"])


if __name__ == "__main__":
    main()
