# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Paths of files shipped in this collection (device-side programs, eBPF sources, data)."""
DOCUMENTATION = r"""
name: collection_file
author:
  - edgetune contributors (!UNKNOWN)
version_added: "0.2.0"
short_description: Absolute paths of files shipped in the edgetune.fleet collection
description:
  - Returns, for each term, the absolute path on the controller of a file inside this
    collection, such as C(plugins/modules/edge_dvfs.py) or C(bpf/edge_classifier.c).
  - Roles use it to install the collection's own device-side programs (boot-time re-apply,
    the on-device audit, the eBPF loader) wherever the collection is installed, instead of
    paths relative to C(role_path).
options:
  _terms:
    description: Paths relative to the collection's root.
    type: list
    elements: str
    required: true
  missing:
    description:
      - What to do when a path does not exist. C(error) fails; C(ok) returns the path anyway
        (for directories a later step creates, such as a build cache).
    type: str
    default: error
    choices: [error, ok]
"""

EXAMPLES = r"""
- name: Install the boot-time DVFS program
  ansible.builtin.copy:
    src: "{{ lookup('edgetune.fleet.collection_file', 'plugins/modules/edge_dvfs.py') }}"
    dest: /usr/local/lib/edgetune/edge_dvfs.py
    mode: "0755"
"""

RETURN = r"""
_raw:
  description: One absolute path per term.
  type: list
  elements: path
"""

import os  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

# plugins/lookup/collection_file.py -> the collection's root, two levels up.
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collection_path(relative, must_exist=True):
    """The absolute path of ``relative`` inside the collection; refuses paths that leave it."""
    path = os.path.normpath(os.path.join(COLLECTION_ROOT, relative))
    if os.path.isabs(relative) or not (path + os.sep).startswith(COLLECTION_ROOT + os.sep):
        raise AnsibleLookupError("collection_file: %r is not a path inside the collection" % relative)
    if must_exist and not os.path.exists(path):
        raise AnsibleLookupError("collection_file: %s is not in the collection at %s (an incomplete install?)"
                                 % (relative, COLLECTION_ROOT))
    return path


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        must_exist = self.get_option("missing") == "error"
        return [collection_path(str(term), must_exist) for term in terms]
