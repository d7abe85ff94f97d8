# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation the collection's modules share (extends_documentation_fragment)."""


class ModuleDocFragment(object):
    # edgetune.fleet.edge: a module that runs on the board.
    DOCUMENTATION = r"""
options: {}
attributes:
  platform:
    description: Runs on the board (Linux, Python 3.8 or later).
    support: full
    platforms: linux
"""

    # edgetune.fleet.edge.planner: an action of the controller's planning (edge_validate, edge_plan).
    PLANNER = r"""
options: {}
attributes:
  check_mode:
    description: Only reads and computes, so check mode validates and plans the same.
    support: full
  action:
    description: Runs on the controller as an action plugin.
    support: full
  diff_mode:
    description: Changes nothing, so there is no difference to show.
    support: none
  platform:
    description:
      - Runs on the controller; the calendar check may run C(systemd-analyze calendar) on the device, read-only.
    support: full
    platforms: posix
"""

    # edgetune.fleet.edge.reads_only: a module that changes nothing (with edgetune.fleet.edge on the board).
    READS_ONLY = r"""
options: {}
attributes:
  diff_mode:
    description: Changes nothing, so there is no difference to show.
    support: none
"""

    # edgetune.fleet.edge.jetson: a module that drives an NVIDIA Jetson tool (L4T).
    JETSON = r"""
options: {}
attributes:
  platform:
    description: Runs on a Jetson (L4T, with the tool named in the requirements), Python 3.8 or later.
    support: full
    platforms: linux
"""
