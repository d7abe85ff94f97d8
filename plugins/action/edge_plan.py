# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_plan: validate the host's intent, then plan the device, on the controller.

The validation is edge_validate's (every role's variables, all problems at
once); the plan is plugins/module_utils/plan/edge_plan.py's build(), from the
validated intent and the board (ansible_facts.edge, edge_facts_profile). The
plan is published as the fact ``edge_plan`` (``ansible_facts.edge_plan``),
which the roles apply and `edgetune plan` prints. Nothing runs on the device,
except on a refusal in a run that took the apply lease: it is given back, since
a refused run changes nothing. The documentation is plugins/modules/edge_plan.py.
"""
from ansible.errors import AnsibleActionFail

from ansible_collections.edgetune.fleet.plugins.action.edge_lease import this_run
from ansible_collections.edgetune.fleet.plugins.action.edge_validate import (
    ActionModule as ValidateAction, role_option_names)
from ansible_collections.edgetune.fleet.plugins.lookup.collection_file import COLLECTION_ROOT
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_plan


def code_digests(roles, root=COLLECTION_ROOT):
    """{role: sha1 of the role's own code}: its role files, the modules and plugins its tasks
    name and the module utilities they import (plugins/module_utils/plan/edge_code.py), so that a
    new edgetune changes the recorded inputs of the roles whose code changed, and only those.
    edge_boot and edge_audit_timer install the device programs' files the plan names. Once per process,
    and kept on disk while the collection's files are unchanged."""
    digests = edge_plan.collection_code(root)["digests"]
    return dict((role, digests[role]) for role in roles)


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
            self.give_lease_back(task_vars)
            return result
        if not result.get("board"):
            raise AnsibleActionFail("edge_plan needs the board: run role edgetune.fleet.edge_facts first "
                                    "(playbooks/preflight.yml does)")
        facts = self._templar.template((task_vars.get("ansible_facts") or {}).get("edge"))
        profile = self._templar.template(task_vars.get("edge_facts_profile"))
        try:
            role_options = role_option_names()
            # An apply's first device execution read the records (ansible_facts.edge_applied): roles whose
            # last apply is current and holds are skipped; --tags full (or edge_converge_full) runs them all.
            applied = (task_vars.get("ansible_facts") or {}).get("edge_applied")
            if applied is not None:
                # What the plan decides from (the results themselves are the audit's).
                applied = dict((role, dict((k, v) for k, v in entry.items() if k != "results"))
                               for role, entry in applied.items())
            if self._templar.template(task_vars.get("edge_mode", "apply")) == "audit":
                applied = None                                          # the audit applies nothing
            plan = edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                                   role_options=role_options, code=code_digests(edge_plan.RECORDED_ROLES),
                                   applied=self._templar.template(applied) if applied is not None else None,
                                   full="full" in (task_vars.get("ansible_run_tags") or []),
                                   artifacts=checked["artifacts"], numa=checked["numa"],
                                   autotune=self._templar.template(
                                       (task_vars.get("ansible_facts") or {}).get("edge_autotune")))
        except edge_plan.PlanError as exc:
            self.give_lease_back(task_vars)
            raise AnsibleActionFail("%s: cannot plan the device: %s"
                                    % (task_vars.get("inventory_hostname", "this host"), exc)) from None
        skipped = sorted(plan["converge"]["skip"])
        # The board and its release are also the fleet summary's (edge_summary), one line per device.
        release = ("L4T %s" % facts["l4t"]["version"]) if facts.get("l4t") else "%s %s" % (
            (facts.get("bsp") or {}).get("name"), (facts.get("bsp") or {}).get("version"))
        result.update(plan=plan, ansible_facts={"edge_plan": plan},
                      msg="%s (%s), bootloader %s, cgroup %s: planned: inference CPUs %s, housekeeping %s%s"
                          % (profile.get("title"), release, plan["board"]["bootloader"], plan["board"]["cgroup"],
                             plan["cpu"]["inference_list"] or "none", plan["cpu"]["housekeeping_list"],
                             "; current, skipped: %s" % ", ".join(skipped) if skipped else ""))
        return result

    def give_lease_back(self, task_vars):
        """A refused run changes nothing: the apply lease its first execution took goes back."""
        read = task_vars.get("__edge_facts_read") or {}
        if not (read.get("lease") or {}).get("taken") or self._play_context.check_mode:
            return
        holder, _controller = this_run(task_vars)
        self._execute_module(module_name="edgetune.fleet.edge_lease",
                             module_args={"state": "released", "holder": holder}, task_vars=task_vars)
