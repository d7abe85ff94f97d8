# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_files: reads each file's content on the controller (a file of the collection,
or the text given) and installs them all with one execution of the module edge_files. The
documentation is plugins/modules/edge_files.py."""
import base64
import posixpath

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes
from ansible.plugins.action import ActionBase

from ansible_collections.edgetune.fleet.plugins.lookup.collection_file import collection_path

FILE_KEYS = frozenset(("dest", "src", "content", "content_b64", "mode", "unit"))
# Where a file's content comes from: exactly one of them (content_b64 puts back what the module returned
# in ``previous``).
CONTENT_KEYS = ("src", "content", "content_b64")


def module_files(files, directory=None):
    """The task's files -> the module's (content in base64, dest absolute: a relative one is under
    ``directory``); AnsibleActionFail names a bad entry."""
    if not isinstance(files, list) or not files:
        raise AnsibleActionFail("edge_files: files must be a non-empty list of {dest, src or content, mode}")
    if directory is not None and not posixpath.isabs(str(directory)):
        raise AnsibleActionFail("edge_files: directory %r is not an absolute path" % directory)
    result = []
    for index, item in enumerate(files):
        if not isinstance(item, dict) or not item.get("dest"):
            raise AnsibleActionFail("edge_files: files[%d] has no dest: %r" % (index, item))
        unknown = sorted(set(item) - FILE_KEYS)
        if unknown:
            raise AnsibleActionFail("edge_files: files[%d] (%s): unknown key %s (keys: %s)"
                                    % (index, item["dest"], ", ".join(unknown), ", ".join(sorted(FILE_KEYS))))
        if sum(key in item for key in CONTENT_KEYS) != 1:
            raise AnsibleActionFail("edge_files: files[%d] (%s) needs exactly one of src, content and content_b64"
                                    % (index, item["dest"]))
        if "src" in item:
            try:
                with open(collection_path(str(item["src"])), "rb") as handle:
                    data = handle.read()
            except (OSError, AnsibleError) as exc:  # unreadable, or not in the collection
                reason = getattr(exc, "message", exc)
                raise AnsibleActionFail("edge_files: cannot read %s: %s" % (item["src"], reason)) from None
        elif "content" in item:
            data = to_bytes(item["content"], errors="surrogate_or_strict")
        else:
            try:
                data = base64.b64decode(str(item["content_b64"]), validate=True)
            except ValueError:
                raise AnsibleActionFail("edge_files: files[%d] (%s): content_b64 is not base64"
                                        % (index, item["dest"])) from None
        dest = str(item["dest"])
        if not posixpath.isabs(dest):
            if directory is None:
                raise AnsibleActionFail("edge_files: files[%d]: dest %r is relative and the task gives no directory"
                                        % (index, dest))
            dest = posixpath.join(str(directory), dest)
        entry = {"dest": dest, "content_b64": base64.b64encode(data).decode("ascii")}
        if item.get("mode") is not None:
            entry["mode"] = str(item["mode"])
        if item.get("unit") is not None:
            entry["unit"] = item["unit"]
        result.append(entry)
    return result


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("files", "directory", "owner", "group", "directory_mode", "absent", "previous"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        args["files"] = module_files(args.get("files"), args.pop("directory", None))
        result.update(self._execute_module(module_name="edgetune.fleet.edge_files", module_args=args,
                                           task_vars=task_vars))
        return result
