# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_package: installs the device package (plugins/module_utils/plan/edge_package.py) with
one execution of the module edge_files, and returns the drift audit's checks of its files. The
documentation is plugins/modules/edge_package.py."""
import base64
import posixpath

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.edgetune.fleet.plugins.action.edge_files import module_files
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_package


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("directory", "remove_earlier"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        directory = self._task.args.get("directory")
        if not isinstance(directory, str) or not posixpath.isabs(directory):
            raise AnsibleActionFail("edge_package: directory must be an absolute path on the device, not %r"
                                    % (directory,))
        why = edge_package.refused_directory(directory)
        if why:
            raise AnsibleActionFail("edge_package: cannot install in %s: %s" % (directory, why))
        remove_earlier = boolean(self._task.args.get("remove_earlier", True), strict=False)
        files = module_files(edge_package.files(), directory)
        earlier = list(edge_package.EARLIER_DIRS) + edge_package.earlier_files(directory)
        result.update(self._execute_module(
            module_name="edgetune.fleet.edge_files", task_vars=task_vars,
            module_args={"files": files, "absent": earlier if remove_earlier else []}))
        if not result.get("failed"):
            result["checks"] = edge_package.checks(
                [{"dest": item["dest"], "data": base64.b64decode(item["content_b64"])} for item in files], directory)
        return result
