# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_plan: validate the host's intent, then plan the device, on the controller.

The validation is edge_validate's (every role's variables, all problems at
once); the plan is plugins/module_utils/edge_plan.py's build(), from the
validated intent and the board (ansible_facts.edge, edge_facts_profile). The
plan is published as the fact ``edge_plan`` (``ansible_facts.edge_plan``),
which the roles apply and `edgetune plan` prints. Nothing runs on the device.
The documentation is plugins/modules/edge_plan.py.
"""
import hashlib
import os

from ansible.errors import AnsibleActionFail

from ansible_collections.edgetune.fleet.plugins.action.edge_validate import ActionModule as ValidateAction, load_specs
from ansible_collections.edgetune.fleet.plugins.lookup.collection_file import COLLECTION_ROOT
from ansible_collections.edgetune.fleet.plugins.module_utils import edge_plan

# What renders a role's desired state besides the inventory: its own files and
# the modules (which the roles also install on the device as boot commands).
SHARED_CODE = ("plugins/modules", "plugins/module_utils")


def _tree_digest(digest, root, relative):
    for directory, dirs, names in os.walk(os.path.join(root, relative)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name == "README.md" or name.endswith(".pyc"):
                continue
            path = os.path.join(directory, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(handle.read() + b"\0")


def code_digests(roles, root=COLLECTION_ROOT):
    """{role: sha1 of its role directory and the modules}: a new edgetune changes the recorded inputs."""
    shared = hashlib.sha1()
    for relative in SHARED_CODE:
        _tree_digest(shared, root, relative)
    found = {}
    for role in roles:
        digest = shared.copy()
        _tree_digest(digest, root, os.path.join("roles", role))
        found[role] = digest.hexdigest()
    return found


class ActionModule(ValidateAction):
    _VALID_ARGS = frozenset(("warn_unknown", "role"))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ValidateAction, self).run(tmp, task_vars)  # ActionBase.run: the common checks
        del tmp
        # Every role's variables, always: the plan is the whole device's. A
        # role that plans for itself (no preflight in the run) is named in
        # the refusal, since earlier roles of the run may have changed things;
        # the runtime's artifacts are then edge_runtime's own check (a
        # playbook of roles may not deploy at all).
        role = self._task.args.get("role")
        checked = self.check_intent(result, task_vars, refused_by=[role] if role else [], artifacts=not role)
        if result.get("failed"):
            return result
        if not result.get("board"):
            raise AnsibleActionFail("edge_plan needs the board: run role edgetune.fleet.edge_facts first "
                                    "(playbooks/preflight.yml does)")
        facts = self._templar.template((task_vars.get("ansible_facts") or {}).get("edge"))
        profile = self._templar.template(task_vars.get("edge_facts_profile"))
        try:
            role_options = dict((role, list(options)) for role, options in load_specs()[0].items())
            plan = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                                   role_options=role_options, code=code_digests(edge_plan.RECORDED_ROLES))
        except edge_plan.PlanError as exc:
            raise AnsibleActionFail("%s: cannot plan the device: %s"
                                    % (task_vars.get("inventory_hostname", "this host"), exc)) from None
        result.update(plan=plan, ansible_facts={"edge_plan": plan},
                      msg="planned: inference CPUs %s, housekeeping %s"
                          % (plan["cpu"]["inference_list"] or "none", plan["cpu"]["housekeeping_list"]))
        return result
