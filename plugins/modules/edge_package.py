#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_package: the documentation of the action plugin plugins/action/edge_package.py."""

DOCUMENTATION = r"""
---
module: edge_package
short_description: Install the device package, the programs that run on the device outside Ansible
description:
  - An action plugin. Lists the device package's files on the controller from one manifest, C(DEVICE_PROGRAMS)
    in plugins/module_utils/plan/edge_package.py. They are the boot program, the on-device audit command and the
    network priority loader, each with every collection file it imports, transitively, in the collection's
    package layout under O(directory), modules at the top.
  - Installs them with one execution of M(edgetune.fleet.edge_files), which also removes the directories in which
    earlier releases kept each program (C(EARLIER_DIRS) there) unless O(remove_earlier) is false.
  - Returns the drift audit's C(file) check (sha1) of every file, for role edge_package's record.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  directory:
    description: The package's directory on the device (not one of the earlier program directories).
    type: path
    required: true
  remove_earlier:
    description: >-
      Remove the program directories of earlier releases (C(/usr/local/lib/edgetune/boot), C(audit) and
      C(netqos)).
    type: bool
    default: true
attributes:
  check_mode:
    description: Reports what a real run would write or remove, and changes nothing.
    support: full
  diff_mode:
    description: The before and after text of each file it writes, and each directory it removes.
    support: full
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Install the device package
  edgetune.fleet.edge_package:
    directory: /usr/local/lib/edgetune/package
  register: installed
"""

RETURN = r"""
written:
  description: The files written (or, in check mode, that a real run writes).
  returned: always
  type: list
  elements: path
directories:
  description: The directories created (or, in check mode, that a real run creates).
  returned: always
  type: list
  elements: path
removed:
  description: The earlier program directories removed (or, in check mode, that a real run removes).
  returned: always
  type: list
  elements: path
checks:
  description: The drift audit's C(file) checks of the package's files (C(setting), C(role), C(kind), C(path),
    C(sha1)), as plugins/module_utils/device/edge_audit.py evaluates them.
  returned: success
  type: list
  elements: dict
"""
