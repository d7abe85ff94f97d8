# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_facts: runs the module edge_facts; with ``lease``, names the holder (this run of
ansible-playbook on this controller) and takes over the lease of a run of this controller that has
ended. Uncontended, that is one module execution, as without a lease. With ``profiles_dirs``, it
matches the board to its profile on the controller in the same task (the role's one task for what
were five). The documentation is plugins/modules/edge_facts.py."""
import glob
import json
import os
import time

import yaml
from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.edgetune.fleet.plugins.action.edge_lease import this_run
from ansible_collections.edgetune.fleet.plugins.filter.edge_board_profile import edge_board_profile
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_lease

MODULE = "edgetune.fleet.edge_facts"
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CONTROLLER_ARGS = ("profiles_dirs", "strict_topology")
# How a module ends when its device goes away under it: killed (SIGTERM, SIGKILL, directly or as the shell's
# 128 + N) or its connection dropped (ssh's 255).
GONE_RCS = (-15, -9, 143, 137, 255)
BACK_POLL_S = 5


def load_profiles(directories):
    """The board profiles of ``directories`` (their *.yml, each directory sorted), in that order."""
    profiles = []
    for directory in directories:
        for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*.yml"))):
            with open(path) as handle:
                profiles.append(yaml.load(handle, Loader=YAML_LOADER))
    return profiles


def profile_problem(profile, facts, host, strict):
    """Why the device cannot go on with ``profile`` (None: no profile matched), or None."""
    if profile is None:
        return ("Unknown board: model %s, compatible %s. Add a board profile (a YAML file like "
                "roles/edge_facts/files/board_profiles/jetson-orin-nx-16gb.yml whose 'match' lists one of "
                "these compatible strings) in edge_facts_profiles_dir; see the README, \"Adding a board\"."
                % (json_text(facts.get("model") or "none"), json_text(facts.get("compatible") or [])))
    clusters = [cluster.get("cpus") for cluster in (facts.get("cpu") or {}).get("clusters") or []]
    if strict and clusters != profile.get("clusters"):
        return ("%s is matched to profile %s (clusters %s) but its cpufreq policies show %s: fix the profile "
                "or set edge_facts_strict_topology=false." % (host, profile.get("name"),
                                                              json_text(profile.get("clusters")),
                                                              json_text(clusters)))
    return None


def json_text(value):
    return json.dumps(value)


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        controller = dict((key, args.pop(key)) for key in CONTROLLER_ARGS if key in args)
        result.update(self._read(args, task_vars))
        took_over = (result.get("lease") or {}).get("took_over")
        if took_over is not None:
            result.setdefault("warnings", []).append("Took over the apply lease: %s" % took_over)
        if result.get("failed") or controller.get("profiles_dirs") is None:
            return result
        facts = (result.get("ansible_facts") or {}).get("edge")
        if facts is None:  # another run holds the lease and this one did not wait: no facts
            return result
        host = task_vars.get("inventory_hostname", "this host")
        try:
            profile = edge_board_profile(load_profiles([d for d in controller["profiles_dirs"] if d]), facts)
        except (OSError, yaml.YAMLError) as exc:
            profile, problem = None, "cannot read the board profiles: %s" % exc
        else:
            problem = profile_problem(profile, facts, host, controller.get("strict_topology", True))
        if problem:
            self._give_lease_back(result, task_vars, (args.get("lease") or {}).get("path"))
            result.update(failed=True, msg=problem)
        else:
            result["profile"] = profile
        return result

    def _give_lease_back(self, result, task_vars, path=None):
        """A run that stops here changes nothing: the lease its read took goes back."""
        if (result.get("lease") or {}).get("taken") and not self._play_context.check_mode:
            holder, _controller = this_run(task_vars)
            args = {"state": "released", "holder": holder}
            if path:
                args["path"] = path
            self._execute_module(module_name="edgetune.fleet.edge_lease", module_args=args, task_vars=task_vars)

    def _read(self, args, task_vars):
        """The module's result, the lease taken (waiting for another run as asked) where it is asked for."""
        lease = args.get("lease")
        if not lease:
            return self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        holder, controller = this_run(task_vars)
        lease = dict(lease, holder=holder)
        if self._play_context.check_mode:
            return self._execute_module(module_name=MODULE, module_args=dict(args, lease=lease), task_vars=task_vars)
        # First without waiting: where another run holds the device, see whether it is a run of this
        # controller that has ended (its lease is then taken over at once), else wait for it there.
        first = self._execute_module(module_name=MODULE, module_args=dict(args, lease=dict(lease, wait=0)),
                                     task_vars=task_vars)
        held_by = (first.get("lease") or {}).get("held_by") if not first.get("failed") else None
        if not held_by:
            return first
        if edge_lease.run_has_ended(held_by.get("run_id"), controller):
            lease["ended_run"] = held_by["run_id"]
        self._display.display("%s: %s; %s" % (
            task_vars.get("inventory_hostname"), "another apply holds this device: %s" % edge_lease.describe(held_by),
            "it has ended, taking its lease over" if lease.get("ended_run") else
            "waiting up to %s s for it" % lease.get("wait", 600)))
        return self._wait(args, lease, held_by, task_vars)

    def _wait(self, args, lease, held_by, task_vars):
        """The take that waits (on the device, up to the lease's wait). Where the device goes away meanwhile
        (the run that holds it rebooted it), wait for it to come back and go on waiting, to the same end."""
        began = time.time()
        deadline = began + int(lease.get("wait", 600))
        host = task_vars.get("inventory_hostname")
        while True:
            left = dict(lease, wait=max(0, int(round(deadline - time.time()))))
            try:
                result = self._execute_module(module_name=MODULE, module_args=dict(args, lease=left),
                                              task_vars=task_vars)
                if not (result.get("unreachable") or (result.get("failed") and result.get("rc") in GONE_RCS)):
                    if isinstance(result.get("lease"), dict) and result["lease"].get("taken"):
                        result["lease"]["waited_s"] = round(time.time() - began, 1)  # over every try
                    return result
                why = result.get("msg") or "rc %s" % result.get("rc")
            except AnsibleConnectionFailure as exc:
                why = str(exc)
            if time.time() >= deadline:
                first_line = (why.strip().splitlines() or ["?"])[0]
                return {"failed": True, "msg": "another apply holds this device: %s; the device went away while "
                        "this run waited for it and was not free within %s s (edge_lease_wait): %s" % (
                            edge_lease.describe(held_by), lease.get("wait", 600), first_line)}
            self._display.display("%s: the device went away while this run waited for its lease (rebooted by "
                                  "the run that holds it?); waiting for it to come back" % host)
            self._connection.reset()
            time.sleep(BACK_POLL_S)
