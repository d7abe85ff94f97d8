# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin edge_validate: the host's intent checked on the controller before any change.

Gathers the host's edge_* variables (templated) and the board (ansible_facts.edge,
edge_facts_profile), loads every role's meta/argument_specs.yml from the
collection (found the way the collection_file lookup finds the collection's
files), and runs plugins/module_utils/plan/edge_intent.py's validate(). The
documentation is plugins/modules/edge_validate.py.
"""
import copy
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess

import yaml
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template
from ansible.utils.display import Display

from ansible_collections.edgetune.fleet.plugins.lookup.collection_file import COLLECTION_ROOT
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_intent, edge_plan
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import cached_json, controller_cache_dir

display = Display()


# libyaml's loader where PyYAML has it: the pure-Python one took most of the planner's time.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_specs(root=COLLECTION_ROOT):
    """{role: main options} of every role's meta/argument_specs.yml, and the names the roles export
    (the caller gets its own copy)."""
    data = _collection_data(root)
    return copy.deepcopy(data["specs"]), list(data["exports"])


def role_option_names(root=COLLECTION_ROOT):
    """{role: the names of its main options}."""
    return dict((role, list(options)) for role, options in _collection_data(root)["specs"].items())


def tensorrt_table(root=COLLECTION_ROOT):
    """Which TensorRT each L4T release ships (role edge_runtime's table)."""
    return copy.deepcopy(_collection_data(root)["tensorrt_by_l4t"])


@functools.lru_cache(maxsize=None)
def _collection_data(root):
    """What the intent is checked against, read from the collection's YAML once per process and kept on
    the controller's disk while the collection's files are unchanged (each host's check runs in a
    worker process of its own; parsing the YAML took most of it)."""
    cache = controller_cache_dir("specs")
    entry = None
    if cache:
        key = json.dumps([edge_plan.collection_state(root), os.path.realpath(root)])
        entry = os.path.join(cache, hashlib.sha1(key.encode()).hexdigest() + ".json")
    return cached_json(entry, lambda: _read_collection_data(root))


def _read_collection_data(root):
    specs, exports = {}, set()
    roles_dir = os.path.join(root, "roles")
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.isfile(path):
            continue
        with open(path) as handle:
            doc = yaml.load(handle, Loader=YAML_LOADER) or {}
        specs[role] = ((doc.get("argument_specs") or {}).get("main") or {}).get("options") or {}
        readme = os.path.join(roles_dir, role, "meta", "readme.yml")
        if os.path.isfile(readme):
            with open(readme) as handle:
                exports.update((yaml.load(handle, Loader=YAML_LOADER) or {}).get("exports") or {})
        # Every role publishes its drift checks as edge_<role>_audit.
        exports.add(role + "_audit")
    try:
        with open(os.path.join(roles_dir, "edge_runtime", "vars", "main.yml")) as handle:
            table = (yaml.load(handle, Loader=YAML_LOADER) or {}).get("__edge_runtime_tensorrt_by_l4t") or []
    except OSError:
        table = []
    return {"specs": specs, "exports": sorted(e for e in exports if e.startswith("edge_")), "tensorrt_by_l4t": table}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("roles", "warn_unknown"))

    def __init__(self, *args, **kwargs):
        super(ActionModule, self).__init__(*args, **kwargs)
        self._supports_check_mode = True
        self._calendar_where = None

    # ------------------------------------------------------------ calendars
    def _calendar_checker(self):
        """A callable: None when systemd accepts the calendar, else systemd's complaint.

        systemd-analyze on the controller when it has one; else on the device
        (read-only: `systemd-analyze calendar` only parses); else not checked.
        """
        local = shutil.which("systemd-analyze")
        if local:
            # A fleet's hosts share their calendars: each verdict is kept on the controller's disk for
            # this systemd-analyze (a worker process per host would run it again for each).
            def cached(argv, compute):
                cache = controller_cache_dir("calendar")
                info = os.stat(local)
                key = json.dumps([os.path.realpath(local), info.st_size, info.st_mtime_ns, argv])
                entry = os.path.join(cache, hashlib.sha1(key.encode()).hexdigest() + ".json") if cache else None
                return cached_json(entry, lambda: compute(subprocess.run(
                    [local] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)))

            version = cached(["--version"], lambda done: done.stdout.split("\n", 1)[0].split(" (")[0])
            self._calendar_where = "controller (%s)" % (version or "systemd-analyze")

            def check(value):
                return cached(["calendar", value],
                              lambda done: None if done.returncode == 0 else _last_line(done.stderr, done.stdout))
            return check

        def on_device(value):
            done = self._low_level_execute_command("systemd-analyze calendar %s" % shlex.quote(value), sudoable=False)
            if done.get("rc") == 127 or "not found" in (done.get("stderr") or ""):
                self._calendar_where = "not checked (no systemd-analyze on the controller or the device)"
                return None
            self._calendar_where = "device (read-only systemd-analyze calendar)"
            return None if done.get("rc") == 0 else _last_line(done.get("stderr"), done.get("stdout"))
        return on_device

    # ------------------------------------------------------------ run
    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        self.check_intent(result, task_vars)
        return result

    def check_intent(self, result, task_vars, refused_by=None, artifacts=True):
        """Validate the host's intent into ``result`` (failed with one message when bad).

        ``refused_by``: the roles the refusal message names (default: the
        roles checked; none for the preflight's "before any change on any
        device"). ``artifacts``: check the runtime's artifacts on the
        controller when role edge_runtime runs in this run. Returns edge_intent.validate()'s answer, for the planner
        (action edge_plan).
        """
        specs, exports = load_specs()
        specs[edge_intent.PLAYBOOKS] = edge_intent.PLAYBOOK_OPTIONS
        wanted = self._task.args.get("roles") or []
        if isinstance(wanted, str):
            wanted = [wanted]
        unknown_roles = sorted(set(wanted) - set(specs))
        if unknown_roles:
            raise AnsibleActionFail("edge_validate: no role %s in %s (roles: %s)"
                                    % (", ".join(unknown_roles), COLLECTION_ROOT, ", ".join(sorted(specs))))
        roles = list(wanted) or sorted(specs)
        warn_unknown = self._task.args.get("warn_unknown", not wanted)

        values, problems = {}, []
        # The roles' own options, the CPU split that the CPU roles use, and the
        # deprecated names the host still sets (edge_intent reads them).
        wanted_options = [(name, spec) for role in roles for name, spec in specs[role].items()]
        wanted_options += [(name, specs.get("edge_cpu", {}).get(name, {})) for name in edge_intent.CPU_OPTIONS]
        if set(roles) & set(edge_intent.SLICE_ALIASES.values()):
            # The slice's one name, which the runtime and the classifier use.
            slice_spec = specs.get("edge_cgroups", {}).get(edge_intent.SLICE_OPTION, {})
            wanted_options.append((edge_intent.SLICE_OPTION, slice_spec))
        wanted_options += [(name, {}) for name in edge_intent.DEPRECATED if name in task_vars]
        for name, spec in wanted_options:
            try:
                if name in task_vars:
                    values[name] = self._templar.template(task_vars[name])
                elif isinstance(spec.get("default"), str) and "{{" in spec["default"]:
                    values[name] = self._templar.template(trust_as_template(spec["default"]))
            except Exception as exc:  # pylint: disable=broad-except
                values.pop(name, None)
                text = _last_line(str(exc))
                if "undefined" in text.lower() or "is not defined" in text:
                    # Built from a fact a role sets later in the run: checked by that role's own check.
                    display.warning("%s: %s is not checked before the run: %s"
                                    % (task_vars.get("inventory_hostname"), name, text))
                    continue
                problems.append({"variable": name, "value": None,
                                 "message": "%s: cannot be templated: %s" % (name, text)})
        facts = self._templar.template((task_vars.get("ansible_facts") or {}).get("edge"))
        profile = self._templar.template(task_vars.get("edge_facts_profile"))
        present = [n for n in task_vars if n.startswith("edge_")] if warn_unknown else []
        mode = values.get("edge_mode") or self._templar.template(task_vars.get("edge_mode", "apply"))
        runs_runtime = artifacts and "edge_runtime" in roles and _runs("edge_runtime", task_vars)
        checked = edge_intent.validate(
            values, specs, facts=facts, profile=profile, roles=roles, present=present, exports=exports, mode=mode,
            calendar=self._calendar_checker() if "edge_audit_timer" in roles else None,
            controller_artifacts={"tensorrt_by_l4t": tensorrt_table()} if runs_runtime else None)
        bad = {p["variable"] for p in problems}
        problems += [p for p in checked["problems"] if p["variable"] not in bad]
        for warning in checked["warnings"] + (checked["deprecations"] if warn_unknown else []):
            display.warning("%s: %s" % (task_vars.get("inventory_hostname"), warning))
        result.update(changed=False, roles=roles, warnings_unknown=checked["warnings"], problems=problems,
                      board=bool(facts and profile))
        if checked["artifacts"]:
            result["artifacts"] = checked["artifacts"]
        if "edge_audit_timer" in roles:
            result["calendar_checked_on"] = self._calendar_where or "not needed (the audit timer is off)"
        if not facts or not profile:
            result["note"] = ("no board facts (run role edge_facts first): only the types and ranges were checked, "
                              "not the board's CPUs, modes, governors or memory")
        if problems:
            result["failed"] = True
            result["msg"] = edge_intent.summary(task_vars.get("inventory_hostname", "this host"), problems,
                                                refused_by if refused_by is not None else wanted)
        else:
            result["msg"] = "intent of %d role(s) valid%s" % (len(roles), "" if result["board"] else
                                                              " (types and ranges only: no board facts)")
        return checked


def _runs(role, task_vars):
    """Whether ``role`` runs in this run (its tags are selected), so that its artifacts are needed."""
    run_tags = set(task_vars.get("ansible_run_tags") or ["all"])
    skip_tags = set(task_vars.get("ansible_skip_tags") or [])
    if role in skip_tags:
        return False
    return bool(run_tags & {"all", role}) or any(t.startswith(role + "_") for t in run_tags)


def _last_line(*texts):
    for text in texts:
        lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return "rejected"
