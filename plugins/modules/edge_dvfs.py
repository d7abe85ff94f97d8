#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_dvfs: CPU (cpufreq) and GPU/NPU/memory (devfreq) governors and limits.

Also a command line for the boot-time re-apply unit, usable without Ansible:
``python3 edge_dvfs.py --apply-state FILE [--sysfs-root /]``.
"""

DOCUMENTATION = r"""
---
module: edge_dvfs
short_description: Set cpufreq and devfreq governors and frequency limits, with read-back
description:
  - Sets the governor and the min/max frequency of cpufreq policies
    (C(/sys/devices/system/cpu/cpufreq/policyN)) and devfreq nodes (C(/sys/class/devfreq/<node>)),
    for example the Jetson Orin GPU (C(17000000.gpu) on L4T r36, C(17000000.ga10b) on r35) or the
    RK3588 GPU, NPU and memory (C(fb000000.gpu), C(fdab0000.npu), C(dmc)).
  - Everything is read and validated first. Any invalid item (a governor the node does not
    offer, a frequency outside its range or between its steps with O(snap=exact), min above max,
    a policy or node the board does not have) fails the task with one message and nothing is
    written.
  - Writes go governor first (a governor change resets the limits on some drivers; the limits
    are read again after it), then the limits in an order that never puts min above max
    (max first when raising, min first when lowering). Every managed attribute is then read
    back; a value that did not stick (for example clamped by an nvpmodel or thermal cap) is an
    error naming the file, the expected and the actual value.
  - With O(state_file), the resolved settings are also saved as JSON, so that a boot-time unit can
    re-apply them with C(python3 edge_dvfs.py --apply-state FILE) (no Ansible needed on the
    board). Runtime sysfs settings do not survive a reboot by themselves.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  cpufreq:
    description: cpufreq policies to manage.
    type: list
    elements: dict
    default: []
    suboptions:
      policy:
        description:
          - Policy number, the first CPU of the cluster (C(policy4) is V(4)).
          - Exactly one of O(cpufreq[].policy) and O(cpufreq[].cpus) is required.
        type: int
      cpus:
        description:
          - A CPU number; the policy that governs this CPU is meant (found through the
            C(cpuN/cpufreq) link, or the policies' C(related_cpus)).
        type: int
      governor:
        description: Governor name; must be listed in C(scaling_available_governors).
        type: str
      min_freq:
        description:
          - Lowest frequency in kHz, or V(min) / V(max) for the lowest / highest step of
            C(scaling_available_frequencies) (C(cpuinfo_min_freq) / C(cpuinfo_max_freq) when the
            driver has no table). Must lie within C(cpuinfo_min_freq)..C(cpuinfo_max_freq).
        type: raw
      max_freq:
        description: Highest frequency in kHz, or V(min) / V(max); as O(cpufreq[].min_freq).
        type: raw
  devfreq:
    description: devfreq nodes to manage.
    type: list
    elements: dict
    default: []
    suboptions:
      node:
        description: Node name under C(/sys/class/devfreq), for example V(17000000.gpu) or V(dmc).
        type: str
        required: true
      governor:
        description: Governor name; must be listed in C(available_governors).
        type: str
      min_freq:
        description:
          - Lowest frequency in Hz, or V(min) / V(max) for the lowest / highest step of
            C(available_frequencies).
        type: raw
      max_freq:
        description: Highest frequency in Hz, or V(min) / V(max).
        type: raw
  snap:
    description:
      - What to do with a frequency that is not a step of the node's table.
      - V(exact) rejects it and names the nearest steps; V(down) takes the highest step at or
        below it, V(up) the lowest step at or above it, V(nearest) the closest step (the lower
        one on a tie). A frequency outside the range is always an error.
    type: str
    choices: [exact, down, up, nearest]
    default: exact
  sysfs_root:
    description: Prefix for every sysfs path (for tests and fake trees).
    type: path
    default: /
  state_file:
    description:
      - Also save the resolved settings (policy numbers, frequencies after snapping) to this
        JSON file, atomically and only when its content changes, for the boot-time re-apply.
      - Written after the settings were applied and read back successfully; not written in
        check mode. Policies and nodes missing from the board are not saved. A policy skipped as
        inactive (all its CPUs offline, with O(fail_on_missing=false)) is saved with its values as
        given (frequencies not yet snapped, with the O(snap) rule when it is not V(exact)), so
        that the boot-time re-apply sets it when a power mode brings its CPUs online (AGX Orin
        MODE_30W to MAXN takes effect at the next boot).
    type: path
  fail_on_missing:
    description:
      - Fail when a policy, CPU or node is not on this board (the message lists the ones it
        has), or when a policy is inactive because all its CPUs are offline (AGX Orin MODE_30W
        takes cpu8-11 offline). With V(false) such items are left out and listed in RV(left_out)
        (inactive policies still go into O(state_file)).
    type: bool
    default: true
attributes:
  check_mode:
    description: Reads and validates everything and reports exactly which writes would be made; writes nothing.
    support: full
  diff_mode:
    description:
      - "One C(path: value) line per managed attribute, before and after; and the state file's
        content when it changes."
    support: full
  platform:
    description: Runs on the board (Linux, Python 3.8 or later).
    support: full
    platforms: linux
notes:
  - Settings made here last until the next reboot, nvpmodel mode change or C(jetson_clocks) run.
    Use O(state_file) with a unit running C(python3 edge_dvfs.py --apply-state FILE) after
    C(nvpmodel.service) to re-apply them at boot.
  - On Jetson, nvpmodel caps the maximum frequencies of the current power mode; a higher
    O(cpufreq[].max_freq) does not stick and fails the read-back.
"""

EXAMPLES = r"""
- name: Pin the RK3588 big cores and the NPU at their top frequencies
  edge_dvfs:
    cpufreq:
      - policy: 4
        governor: performance
        min_freq: max
        max_freq: max
      - cpus: 6
        governor: performance
    devfreq:
      - node: fdab0000.npu
        governor: performance
    state_file: /etc/edgetune/dvfs.json

- name: Cap the Orin NX GPU at about 900 MHz, rounding down to a table step
  edge_dvfs:
    devfreq:
      - node: 17000000.gpu
        max_freq: 900000000
    snap: down

- name: Set the AGX Orin third cluster if this module has it
  edge_dvfs:
    cpufreq:
      - policy: 8
        min_freq: 729600
        max_freq: max
    fail_on_missing: false
"""

RETURN = r"""
settings:
  description:
    - Per kind (C(cpufreq), C(devfreq)) and name (C(policy4), C(dmc)) the directory, the
      attributes the task manages (C(managed)), the C(before) and C(after) values of
      C(governor), C(min_freq) and C(max_freq), and the writes made (check mode, the writes that
      would be made) in order.
    - C(after) is read back from sysfs, or in check mode the planned values.
  returned: success, and on a write or read-back failure for what was done
  type: dict
  sample:
    cpufreq:
      policy4:
        path: /sys/devices/system/cpu/cpufreq/policy4
        managed: [governor, min_freq]
        before: {governor: schedutil, min_freq: 408000, max_freq: 2400000}
        after: {governor: performance, min_freq: 2400000, max_freq: 2400000}
        writes:
          - {file: scaling_governor, old: schedutil, new: performance}
          - {file: scaling_min_freq, old: 408000, new: 2400000}
    devfreq: {}
left_out:
  description:
    - Items left out because O(fail_on_missing=false), with C(reason) V(missing) (not on this
      board) or V(inactive) (a policy whose CPUs are all offline).
    - Not called C(skipped), a key Ansible reads as "the task was skipped".
  returned: always
  type: list
  elements: dict
  sample: [{kind: cpufreq, name: policy8, reason: missing,
            msg: "policy8 not found; present: policy0 (cpus 0-3), policy4 (cpus 4-7)"}]
state_file:
  description: The state file path, when O(state_file) was given.
  returned: when O(state_file) is given
  type: str
  sample: /etc/edgetune/dvfs.json
state_file_changed:
  description: Whether the state file's content changed (or would change in check mode).
  returned: when O(state_file) is given
  type: bool
errors:
  description: Every error message, one per item (the same text as C(msg), split).
  returned: failure
  type: list
  elements: str
diff:
  description:
    - "Before and after text, one C(path: value) line per managed attribute."
    - The state file's content, when it changes.
  returned: diff mode
  type: list
  elements: dict
"""

# Ansible modules keep their imports after the documentation strings.
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

try:
    from ansible.module_utils.basic import AnsibleModule
    from ansible_collections.edgetune.fleet.plugins.module_utils import edge_dvfs as dvfs
    from ansible_collections.edgetune.fleet.plugins.module_utils.edge_fileio import atomic_write
except ImportError:
    # Boot-time CLI on a board without Ansible: load the helper shipped next to
    # this file (module_utils/edge_dvfs.py beside it on the device, or ../module_utils in the collection).
    if "--apply-state" not in sys.argv:
        raise
    import importlib.util

    AnsibleModule = atomic_write = None
    _here = os.path.dirname(os.path.abspath(__file__))
    for _candidate in (os.path.join(_here, "module_utils", "edge_dvfs.py"),
                       os.path.join(_here, os.pardir, "module_utils", "edge_dvfs.py")):
        if os.path.isfile(_candidate):
            _spec = importlib.util.spec_from_file_location("edge_dvfs_utils", _candidate)
            dvfs = importlib.util.module_from_spec(_spec)
            _spec.loader.exec_module(dvfs)
            break
    else:
        sys.stderr.write("edge_dvfs: error: module_utils/edge_dvfs.py not found next to %s\n" % _here)
        raise SystemExit(1)

STATE_FORMAT = 1
CPUFREQ_KEYS = ("policy", "cpus", "governor", "min_freq", "max_freq")
DEVFREQ_KEYS = ("node", "governor", "min_freq", "max_freq")


class DvfsError(Exception):
    """Expected failure: one message per problem, plus result keys for fail_json."""

    def __init__(self, errors, **details):
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))
        self.details = details


class Target(object):
    """One policy or devfreq node: where it is, what is wanted, what was found and done."""

    def __init__(self, kind, name, key, directory, desired):
        self.kind = kind
        self.name = name  # policy4 / fb000000.gpu
        self.key = key  # 4 / fb000000.gpu (as saved in the state file)
        self.directory = directory
        self.desired = desired
        self.current = self.available = self.final = self.after = None
        self.writes = []
        # Why the target is left out now (a policy whose CPUs are all offline), or None.
        self.inactive = None

    def report(self):
        files = dvfs.FILES[self.kind]
        return {
            "path": self.directory,
            "managed": [a for a in dvfs.ATTRS if a in (self.final or {})],
            "before": self.current,
            "after": self.after,
            "writes": [{"file": files[a], "old": old, "new": new} for a, old, new in self.writes],
        }

    def lines(self, state):
        files = dvfs.FILES[self.kind]
        return ["%s: %s" % (os.path.join(self.directory, files[a]), state[a])
                for a in dvfs.ATTRS if a in self.final]


def _wanted(entry, keys):
    return {k: entry[k] for k in keys if entry.get(k) is not None}


def _entry_errors(kind, entry):
    """Shape checks the argument spec does for Ansible, repeated for state files."""
    if not isinstance(entry, dict):
        return ["%s entry %r is not a mapping" % (kind, entry)]
    keys = CPUFREQ_KEYS if kind == dvfs.CPUFREQ else DEVFREQ_KEYS
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        return ["%s entry %r: unknown keys %s" % (kind, entry, ", ".join(unknown))]
    if kind == dvfs.CPUFREQ:
        given = [k for k in ("policy", "cpus") if entry.get(k) is not None]
        if len(given) != 1:
            return ["cpufreq entry %r needs exactly one of policy, cpus" % (entry,)]
        if isinstance(entry[given[0]], bool) or not isinstance(entry[given[0]], int):
            return ["cpufreq entry %r: %s must be an integer" % (entry, given[0])]
    elif not isinstance(entry.get("node"), str) or not entry["node"]:
        return ["devfreq entry %r needs a node name" % (entry,)]
    return []


def select_targets(root, cpufreq, devfreq, fail_on_missing):
    """Map the option entries to Targets; returns (targets, skipped, errors)."""
    targets, skipped, errors = [], [], []
    policies = dvfs.list_policies(root)
    nodes = dvfs.list_devfreq(root)

    def missing(kind, name, msg, reason="missing"):
        if fail_on_missing:
            errors.append(msg)
        else:
            skipped.append({"kind": kind, "name": name, "msg": msg, "reason": reason})

    for entry in cpufreq:
        problems = _entry_errors(dvfs.CPUFREQ, entry)
        if problems:
            errors.extend(problems)
            continue
        number = entry.get("policy")
        if number is None:
            try:
                number = dvfs.policy_for_cpu(root, entry["cpus"])
            except LookupError as exc:
                missing(dvfs.CPUFREQ, "cpu%d" % entry["cpus"], str(exc))
                continue
        if number not in policies:
            missing(dvfs.CPUFREQ, "policy%d" % number, "policy%d not found; present: %s"
                    % (number, dvfs.describe_policies(root)))
            continue
        try:
            inactive = dvfs.inactive_reason(root, number, policies[number])
        except OSError as exc:
            errors.append("policy%d: %s" % (number, exc))
            continue
        desired = _wanted(entry, ("governor", "min_freq", "max_freq"))
        target = Target(dvfs.CPUFREQ, "policy%d" % number, number, policies[number], desired)
        if inactive:
            missing(dvfs.CPUFREQ, "policy%d" % number, inactive, "inactive")
            if fail_on_missing:
                continue
            # Kept (not applied) so that the state file carries it to the next boot.
            target.inactive = inactive
        targets.append(target)

    for entry in devfreq:
        problems = _entry_errors(dvfs.DEVFREQ, entry)
        if problems:
            errors.extend(problems)
            continue
        node = entry["node"]
        if node not in nodes:
            missing(dvfs.DEVFREQ, node, "devfreq node %s not found; present: %s"
                    % (node, " ".join(sorted(nodes)) or "none"))
            continue
        desired = _wanted(entry, ("governor", "min_freq", "max_freq"))
        targets.append(Target(dvfs.DEVFREQ, node, node, nodes[node], desired))

    seen = set()
    for target in targets:
        if (target.kind, target.name) in seen:
            errors.append("%s is given more than once (as policy or through cpus)" % target.name)
        seen.add((target.kind, target.name))
    return targets, skipped, errors


def _write(target, attr, old, new):
    path = os.path.join(target.directory, dvfs.FILES[target.kind][attr])
    try:
        dvfs.write_sysfs(path, new)
    except OSError as exc:
        raise DvfsError(["writing %s to %s failed: %s" % (new, path, exc.strerror or exc)]) from None
    target.writes.append((attr, old, new))


def apply_target(target):
    """Governor, then the limits planned against what the kernel shows after it, then read back."""
    target.writes = []
    current = target.current
    if "governor" in target.final and target.final["governor"] != current["governor"]:
        _write(target, "governor", current["governor"], target.final["governor"])
        current = dvfs.read_state(target.kind, target.directory)
    for attr, old, new in dvfs.limit_writes(current, target.final):
        _write(target, attr, old, new)
    target.after = dvfs.read_state(target.kind, target.directory)
    errors = dvfs.readback_errors(target.kind, target.directory, target.final)
    if errors:
        raise DvfsError(errors)


def _settings(targets):
    settings = {dvfs.CPUFREQ: {}, dvfs.DEVFREQ: {}}
    for target in targets:
        if target.current is not None:
            settings[target.kind][target.name] = target.report()
    return settings


def run(root, cpufreq=(), devfreq=(), snap="exact", fail_on_missing=True, check_mode=False):
    """Read, validate, plan and (unless check_mode) apply and read back.

    Returns (result, targets); ``targets`` holds the applied ones and, with
    fail_on_missing=False, the inactive policies (``target.inactive`` set, nothing read or
    written) for the state file. Raises DvfsError; on a validation error nothing was written.
    """
    if snap not in dvfs.SNAPS:
        raise DvfsError(["snap %r is not one of %s" % (snap, ", ".join(dvfs.SNAPS))])
    selected, skipped, errors = select_targets(root, cpufreq or [], devfreq or [], fail_on_missing)
    targets = [target for target in selected if not target.inactive]
    for target in targets:
        try:
            target.current = dvfs.read_state(target.kind, target.directory)
            target.available = dvfs.read_available(target.kind, target.directory, target.name)
            target.final = dvfs.resolve(target.current, target.desired, target.available, snap)
            target.writes = dvfs.plan(target.current, target.desired, target.available, snap)
        except (ValueError, OSError) as exc:
            errors.append(str(exc))
    if errors:
        raise DvfsError(errors, left_out=skipped)

    done = []
    for target in targets:
        if check_mode:
            target.after = dvfs.apply_state(target.current, target.writes)
            continue
        try:
            apply_target(target)
        except (DvfsError, OSError, ValueError) as exc:
            messages = exc.errors if isinstance(exc, DvfsError) else [str(exc)]
            raise DvfsError(messages, settings=_settings(done + [target]), left_out=skipped,
                            changed=any(t.writes for t in done + [target])) from None
        done.append(target)

    result = {
        "changed": any(target.writes for target in targets),
        "settings": _settings(targets),
        "left_out": skipped,
    }
    return result, targets + [target for target in selected if target.inactive]


def state_document(targets, snap="exact"):
    """The state file's text: the resolved settings, sorted so the content is stable.

    An inactive policy is saved with its values as given; its frequencies are resolved at
    boot, with ``snap`` when they are numbers and ``snap`` is not exact.
    """
    doc = {"format": STATE_FORMAT, "generated_by": "edge_dvfs",
           dvfs.CPUFREQ: [], dvfs.DEVFREQ: []}
    for target in targets:
        entry = {"policy" if target.kind == dvfs.CPUFREQ else "node": target.key}
        if target.inactive:
            entry.update(target.desired)
            numbers = [v for k, v in target.desired.items() if k in dvfs.FREQ_ATTRS and v not in ("min", "max")]
            if numbers and snap != "exact":
                entry["snap"] = snap
        else:
            entry.update(target.final)
        doc[target.kind].append(entry)
    doc[dvfs.CPUFREQ].sort(key=lambda e: e["policy"])
    doc[dvfs.DEVFREQ].sort(key=lambda e: e["node"])
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _read_existing(path):
    try:
        with open(path, "r") as handle:
            return handle.read()
    except OSError as exc:
        if not os.path.exists(path):
            return None
        raise DvfsError(["cannot read state file %s: %s" % (path, exc.strerror or exc)]) from None


def sync_state_file(path, targets, check_mode, snap="exact"):
    """Write the state file when its content differs; returns (before, after)."""
    after = state_document(targets, snap)
    before = _read_existing(path)
    if before != after and not check_mode:
        try:
            directory = os.path.dirname(path)
            if directory:
                os.makedirs(directory, 0o755, exist_ok=True)
            atomic_write(path, after, backup=False, mode=0o644)
        except OSError as exc:
            raise DvfsError(["writing state file %s failed: %s" % (path, exc.strerror or exc)]) from None
    return before, after


def main():
    freq = dict(type="raw")
    module = AnsibleModule(
        argument_spec=dict(
            cpufreq=dict(type="list", elements="dict", default=[], options=dict(
                policy=dict(type="int"), cpus=dict(type="int"), governor=dict(type="str"),
                min_freq=freq, max_freq=freq,
            ), mutually_exclusive=[("policy", "cpus")], required_one_of=[("policy", "cpus")]),
            devfreq=dict(type="list", elements="dict", default=[], options=dict(
                node=dict(type="str", required=True), governor=dict(type="str"),
                min_freq=freq, max_freq=freq,
            )),
            snap=dict(type="str", default="exact", choices=list(dvfs.SNAPS)),
            sysfs_root=dict(type="path", default="/"),
            state_file=dict(type="path"),
            fail_on_missing=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result, targets = run(params["sysfs_root"], params["cpufreq"], params["devfreq"],
                              params["snap"], params["fail_on_missing"], module.check_mode)
        applied = [t for t in targets if not t.inactive]
        diff = [{"before_header": "sysfs", "after_header": "sysfs",
                 "before": "".join(line + "\n" for t in applied for line in t.lines(t.current)),
                 "after": "".join(line + "\n" for t in applied for line in t.lines(t.after))}]
        if params["state_file"]:
            before, after = sync_state_file(params["state_file"], targets, module.check_mode, params["snap"])
            result["state_file"] = params["state_file"]
            result["state_file_changed"] = before != after
            if before != after:
                result["changed"] = True
                diff.append({"before_header": params["state_file"],
                             "after_header": params["state_file"],
                             "before": before or "", "after": after})
        if module._diff:
            result["diff"] = diff
    except DvfsError as exc:
        module.fail_json(msg=str(exc), errors=exc.errors, **exc.details)
    except Exception as exc:  # never a traceback: report what went wrong in one line
        module.fail_json(msg="edge_dvfs: unexpected %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


# --------------------------------------------------------------------------
# Boot-time re-apply (no Ansible)

def apply_state_file(path, root="/", out=sys.stdout, err=sys.stderr):
    """Re-apply a state file; one line per write on ``out``, per error on ``err``. Returns 0/1."""
    try:
        with open(path, "r") as handle:
            doc = json.load(handle)
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError("not an edge_dvfs state file of format %d" % STATE_FORMAT)
        entries = [(dvfs.CPUFREQ, e) for e in doc.get(dvfs.CPUFREQ) or []]
        entries += [(dvfs.DEVFREQ, e) for e in doc.get(dvfs.DEVFREQ) or []]
    except (OSError, ValueError) as exc:
        err.write("edge_dvfs: error: state file %s: %s\n" % (path, getattr(exc, "strerror", None) or exc))
        return 1
    status = 0
    # Each entry on its own: a node whose driver did not load must not keep the others untuned.
    for kind, entry in entries:
        snap = "exact"
        if isinstance(entry, dict) and "snap" in entry:
            entry = dict(entry)
            snap = entry.pop("snap")
        lists = ([entry], []) if kind == dvfs.CPUFREQ else ([], [entry])
        try:
            # Missing items are errors; a policy whose CPUs the power mode keeps offline is not.
            result, targets = run(root, lists[0], lists[1], snap, False, False)
        except DvfsError as exc:
            for message in exc.errors:
                err.write("edge_dvfs: error: %s\n" % message)
            status = 1
            continue
        except Exception as exc:  # never a traceback in the boot log
            err.write("edge_dvfs: error: %s entry %r: %s\n" % (kind, entry, exc))
            status = 1
            continue
        for item in result["left_out"]:
            if item.get("reason") == "inactive":
                out.write("edge_dvfs: %s left as it is: %s\n" % (item["name"], item["msg"]))
            else:
                err.write("edge_dvfs: error: %s\n" % item["msg"])
                status = 1
        for target in targets:
            if target.inactive:
                continue
            for attr, old, new in target.writes:
                out.write("edge_dvfs: %s %s: %s -> %s\n"
                          % (target.name, dvfs.FILES[target.kind][attr], old, new))
    return status


def cli(argv):
    parser = argparse.ArgumentParser(
        prog="edge_dvfs.py", description="Re-apply cpufreq/devfreq settings saved by the edge_dvfs module.")
    parser.add_argument("--apply-state", metavar="FILE", required=True,
                        help="state file written by the module's state_file option")
    parser.add_argument("--sysfs-root", default="/", help="prefix for sysfs paths (default /)")
    args = parser.parse_args(argv)
    return apply_state_file(args.apply_state, args.sysfs_root)


if __name__ == "__main__":
    if "--apply-state" in sys.argv:
        raise SystemExit(cli(sys.argv[1:]))
    main()
