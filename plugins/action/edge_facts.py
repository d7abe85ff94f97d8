# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_facts: runs the module edge_facts; with ``lease``, names the holder (this run of
ansible-playbook on this controller) and takes over the lease of a run of this controller that has
ended. Uncontended, that is one module execution, as without a lease; the documentation is
plugins/modules/edge_facts.py."""
from ansible.plugins.action import ActionBase

from ansible_collections.edgetune.fleet.plugins.module_utils import edge_lease
from ansible_collections.edgetune.fleet.plugins.action.edge_lease import this_run

MODULE = "edgetune.fleet.edge_facts"


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        lease = args.get("lease")
        if not lease:
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            return result
        holder, controller = this_run(task_vars)
        lease = dict(lease, holder=holder)
        if self._play_context.check_mode:
            result.update(self._execute_module(module_name=MODULE, module_args=dict(args, lease=lease),
                                               task_vars=task_vars))
            return result
        # First without waiting: where another run holds the device, see whether it is a run of this
        # controller that has ended (its lease is then taken over at once), else wait for it there.
        first = self._execute_module(module_name=MODULE, module_args=dict(args, lease=dict(lease, wait=0)),
                                     task_vars=task_vars)
        held_by = (first.get("lease") or {}).get("held_by") if not first.get("failed") else None
        if not held_by:
            result.update(first)
            return result
        if edge_lease.run_has_ended(held_by.get("run_id"), controller):
            lease["ended_run"] = held_by["run_id"]
        self._display.display("%s: %s; %s" % (
            task_vars.get("inventory_hostname"), "another apply holds this device: %s" % edge_lease.describe(held_by),
            "it has ended, taking its lease over" if lease.get("ended_run") else
            "waiting up to %s s for it" % lease.get("wait", 600)))
        result.update(self._execute_module(module_name=MODULE, module_args=dict(args, lease=lease),
                                           task_vars=task_vars))
        return result
