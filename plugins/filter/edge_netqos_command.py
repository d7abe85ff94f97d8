# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The edgetune-netqos command that role edge_netqos installs (runs on the controller)."""

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader

DOCUMENTATION = r"""
name: edge_netqos_command
short_description: The edgetune-netqos command, for edge_files
description:
  - The command that runs the network priority loader (C(launcher) in plugins/module_utils/device/edge_netqos_loader.py)
    from the device package's directory, where role edge_package installs the loader with what it imports (the
    device program C(netqos) of C(DEVICE_PROGRAMS) in plugins/module_utils/plan/edge_plan.py).
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
positional: _input, install_dir, command
options:
  _input:
    description: The device's Python that has python3-bpfcc and python3-pyroute2.
    type: str
    required: true
  install_dir:
    description: The device package's directory on the device (edge_package_install_dir).
    type: str
    required: true
  command:
    description: The path of the edgetune-netqos command on the device.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Install the edgetune-netqos command
  edgetune.fleet.edge_files:
    files: >-
      {{ '/usr/bin/python3' | edgetune.fleet.edge_netqos_command('/usr/local/lib/edgetune/package',
                                                                 '/usr/local/sbin/edgetune-netqos') }}
"""

RETURN = r"""
_value:
  description: The command's file, as edge_files takes it (C(dest), C(content) and C(mode)).
  type: list
  elements: dict
"""


def edge_netqos_command(python, install_dir, command):
    return [{"dest": command, "content": edge_netqos_loader.launcher(python, install_dir), "mode": "0755"}]


class FilterModule(object):
    def filters(self):
        return {"edge_netqos_command": edge_netqos_command}
