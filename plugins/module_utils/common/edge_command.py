# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Device commands with a time limit. Python 3.8+, stdlib only.

The modules and the boot program run board tools (nvpmodel, jetson_clocks, the
bootloader's update command) and systemd's (systemctl, journalctl). One that
hangs (a tool waiting on a lock, systemctl on a wedged bus) held the whole run:
AnsibleModule.run_command waits forever. Here it is killed with its process
group after the limit and its task fails in one line naming the command.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import subprocess

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

# Board tools answer in seconds (nvpmodel's mode switch, the slowest seen, in about ten).
COMMAND_TIMEOUT_S = 120


def run(argv, data=None, timeout=COMMAND_TIMEOUT_S):
    """(rc, stdout, stderr) of ``argv`` (a list), ``data`` on its stdin (a newline added, as
    AnsibleModule.run_command does). EdgeError naming the command when it cannot start, or when it runs
    past ``timeout`` seconds (then it and its children are killed)."""
    if data is not None and not data.endswith("\n"):
        data += "\n"
    try:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                                   start_new_session=True)
    except OSError as exc:
        raise EdgeError("cannot run %s: %s" % (argv[0], exc.strerror or exc)) from None
    try:
        out, err = process.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            process.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a child that left the group still holds the pipes
            pass
        raise EdgeError("%s did not finish within %d s and was killed (hung?)" % (" ".join(argv), timeout),
                        rc=-9) from None
    return process.returncode, out, err
