# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift audit's checks of the files a role writes (runs on the controller)."""
import posixpath

from ansible.errors import AnsibleError, AnsibleFilterError

from ansible_collections.edgetune.fleet.plugins.lookup.collection_file import collection_path
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import file_checks

DOCUMENTATION = r"""
name: edge_file_checks
short_description: The drift audit's checks of the files a role writes
description:
  - Turns the files a role writes (the text it renders, or a file of the collection it installs) into
    C(file) checks of the audit's schema (plugins/module_utils/device/edge_audit.py), each with the sha1 of that
    content. A file whose C(content) is null is not written in this configuration and has no check.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, role
options:
  _input:
    description: The files, each C(path) (or C(dest), relative to O(directory)), C(content) (the text) or
      C(src) (a file of the collection, relative to its root), and C(setting) (the audit's name for it).
    type: list
    elements: dict
    required: true
  role:
    description: The role that writes them.
    type: str
    required: true
  directory:
    description: The directory a relative C(dest) is under.
    type: str
  setting:
    description: For files with no C(setting) of their own, the audit's name is this, then the file's name.
    type: str
"""

EXAMPLES = r"""
- name: Publish the checks of the files the role writes
  ansible.builtin.set_fact:
    edge_boot_audit: >-
      {{ edge_boot_program_files | edgetune.fleet.edge_file_checks('edge_boot', directory=edge_boot_install_dir,
                                                                   setting='boot program') }}
"""

RETURN = r"""
_value:
  description: The checks (C(setting), C(role), C(kind) C(file), C(path), C(sha1)).
  type: list
  elements: dict
"""


def _content(item):
    if item.get("src") is None:
        return item.get("content")
    try:
        with open(collection_path(str(item["src"])), "rb") as handle:
            return handle.read()
    except (OSError, AnsibleError) as exc:
        reason = getattr(exc, "message", exc)
        raise AnsibleFilterError("edge_file_checks: cannot read %s: %s" % (item["src"], reason)) from None


def edge_file_checks(files, role, directory=None, setting=None):
    entries = []
    for item in files or []:
        path = str(item.get("path") or item.get("dest") or "")
        if path and not posixpath.isabs(path) and directory:
            path = posixpath.join(str(directory), path)
        name = item.get("setting") or ("%s %s" % (setting, posixpath.basename(path)) if setting else None)
        if not name or not posixpath.isabs(path):
            raise AnsibleFilterError("edge_file_checks: %r needs a setting and an absolute path (or a dest under "
                                     "directory)" % (item,))
        entries.append({"setting": name, "path": path, "content": _content(item)})
    return file_checks(role, entries)


class FilterModule(object):
    def filters(self):
        return {"edge_file_checks": edge_file_checks}
