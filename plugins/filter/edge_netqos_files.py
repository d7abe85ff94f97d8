# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files of the network priority loader that role edge_netqos installs (runs on the controller)."""

import os

from ansible_collections.edgetune.fleet.plugins.module_utils import edge_code, edge_netqos_loader

# The collection this filter belongs to (plugins/filter/edge_netqos_files.py).
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DOCUMENTATION = r"""
name: edge_netqos_files
short_description: The files of the network priority loader, for edge_files
description:
  - The loader (plugins/module_utils/edge_netqos_loader.py, the device program C(netqos) of C(DEVICE_PROGRAMS) in
    plugins/module_utils/edge_plan.py) and every collection file it imports, in the collection's package layout
    under the install directory (C(install_layout) and C(imported_closure) in plugins/module_utils/edge_code.py,
    as for the other device programs), and the edgetune-netqos command that runs it (C(launcher) of the loader).
version_added: "0.7.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, install_dir, command
options:
  _input:
    description: The device's Python that has python3-bpfcc and python3-pyroute2.
    type: str
    required: true
  install_dir:
    description: The directory on the device that holds the loader's package layout.
    type: str
    required: true
  command:
    description: The path of the edgetune-netqos command on the device.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Install the loader
  edgetune.fleet.edge_files:
    directory: /usr/local/lib/edgetune/netqos
    files: >-
      {{ '/usr/bin/python3' | edgetune.fleet.edge_netqos_files('/usr/local/lib/edgetune/netqos',
                                                             '/usr/local/sbin/edgetune-netqos') }}
"""

RETURN = r"""
_value:
  description: The files, as edge_files takes them (C(src) and C(dest), or C(dest), C(content) and C(mode)).
  type: list
  elements: dict
"""


def edge_netqos_files(python, install_dir, command, root=COLLECTION):
    """The loader's files and its command, as edge_files takes them. Not through the plan: the role also
    installs the loader on a host that has no plan (no board facts), and its code is not the planner's."""
    files = edge_code.install_layout(edge_code.imported_closure([edge_netqos_loader.PROGRAM], root))
    return files + [{"dest": command, "content": edge_netqos_loader.launcher(python, install_dir), "mode": "0755"}]


class FilterModule(object):
    def filters(self):
        return {"edge_netqos_files": edge_netqos_files}
