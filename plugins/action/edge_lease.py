# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_lease: names the holder (this run of ansible-playbook on this controller) and
runs the module edge_lease. The documentation is plugins/modules/edge_lease.py."""
import getpass
import os
import socket

from ansible.plugins.action import ActionBase

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_lease

MODULE = "edgetune.fleet.edge_lease"


def this_run(task_vars):
    """(holder, controller): this run of ansible-playbook, the parent of the worker process that runs
    the task (Ansible forks its workers from the main process)."""
    controller = socket.gethostname()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return edge_lease.run_identity(controller, user, os.getppid(),
                                   fallback_playbook=(task_vars or {}).get("ansible_play_name") or "?"), controller


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        holder, _controller = this_run(task_vars)
        args = dict(self._task.args, holder=holder)
        result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        return result
