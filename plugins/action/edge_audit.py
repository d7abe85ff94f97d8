# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_audit: where the task gives the records as the run's first device execution already
evaluated them (``evaluated``, ansible_facts.edge_applied), judges them against today's plan on the
controller, so that the audit costs the device one execution; otherwise runs the module on the device.
The documentation is plugins/modules/edge_audit.py."""
from ansible.plugins.action import ActionBase

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_audit


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        # The device is read only where something is left to read there: explicit checks, a textfile to
        # write on the device, a fixture tree, or records nobody evaluated in this run.
        on_device = (args.get("evaluated") is None or args.get("records") is None or args.get("checks")
                     or args.get("prometheus_file") or args.get("root", "/") != "/")
        if on_device:
            module_args = dict(args)
            module_args.pop("evaluated", None)
            result.update(self._execute_module(module_name="edgetune.fleet.edge_audit", module_args=module_args,
                                               task_vars=task_vars))
            return result
        results, summary = edge_audit.task_results(
            {"records": args["records"], "evaluated": args["evaluated"]})
        result.update(changed=False, results=results, summary=summary, msg=edge_audit.findings_line(results),
                      judged_on="controller")
        return result
