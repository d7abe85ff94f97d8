#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_release: verified, versioned releases with an atomic `current` switch."""

DOCUMENTATION = r"""
---
module: edge_release
short_description: Install a runtime and engine release from verified artifacts, switch to it atomically, roll back
description:
  - Manages a releases directory, C(ROOT/releases/<release>/), and two symlinks, C(ROOT/current)
    (the release the service runs) and C(ROOT/previous) (the release that was current before the
    last switch, the rollback target).
  - >-
    Every artifact (a tarball on the device) is checked before anything changes, in this order:
    its sha256 against O(artifacts[].sha256); its C(MANIFEST.json) (schema, kind, every file listed
    with the sha256 of its content, plain files only, no path leaving the artifact); the runtime and
    the engine against the board (SoC, L4T release or BSP, the runtime interpreter's Python version,
    TensorRT through the C(tensorrt_by_l4t) table of O(platform) and the installed libnvinfer, the RKNN runtime);
    the runtime against the engine's format; and the free space under O(root) for the unpacked
    release plus O(min_free_mb). Any failure stops the module with one message naming what the
    artifact needs and what the board has; nothing is changed.
  - O(state=checked) only runs those checks and returns the manifests; it never changes anything.
  - >-
    O(state=current) unpacks each artifact into a temporary directory beside the releases, fsyncs
    it, renames it to C(releases/<release>), points C(previous) at the old current release and
    switches C(current) with a symlink renamed over the old one (atomic: a reader sees the old or
    the new release, never neither). It keeps the newest O(keep) releases and removes older ones,
    never the current or previous one. A release directory is immutable: a release of the same
    name with other artifacts is refused.
  - O(state=rollback) switches C(current) back to C(previous) (or to O(release) when given) and
    removes the C(previous) link, so a second rollback cannot flip back to the failed release.
  - >-
    O(state=current) also checks an installed release against its C(release.json) (every file
    there, those up to 64 MiB by their sha256): a damaged one is unpacked again from its artifacts
    and swapped in (RV(repaired)). With O(service), it reads which program the service runs:
    RV(restart) says whether the service must restart to serve the release (switched, repaired, not
    running, or running another release's program).
  - Every switch is read back (C(readlink)); a link that does not point where it should is an error.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  state:
    description: C(checked), C(current) or C(rollback), see the description.
    type: str
    choices: [checked, current, rollback]
    default: current
  root:
    description: The directory holding C(releases/), C(current) and C(previous).
    type: path
    default: /opt/edgetune
  release:
    description:
      - The release name (letters, digits, C(. _ + -)). Defaults to
        C(<runtime version>+<engine name>-<engine version>) from the manifests.
      - With O(state=rollback), the release to return to instead of C(previous).
    type: str
  artifacts:
    description: The artifacts of the release, each a tarball already on the device. Required unless O(state=rollback).
    type: list
    elements: dict
    suboptions:
      path:
        description: The tarball on the device.
        type: path
        required: true
      sha256:
        description: Its expected sha256 (64 hex digits).
        type: str
        required: true
      kind:
        description: C(runtime) or C(engine); it is also the subdirectory of the release it unpacks into.
        type: str
        choices: [runtime, engine]
        required: true
  device:
    description:
      - The board, as edge_facts describes it (C(ansible_facts.edge)); C(soc), C(l4t) and C(bsp) are used.
    type: dict
    default: {}
  platform:
    description:
      - The role's platform data, C(tensorrt_by_l4t) (a list of C({l4t, tensorrt, jetpack})) and
        C(rknn_runtime) (the librknnrt version when it cannot be detected).
    type: dict
    default: {}
  python:
    description: The interpreter the runtime will run with; its version is checked against the manifests.
    type: path
    default: /usr/bin/python3
  min_free_mb:
    description: Free space (MiB) that must remain under O(root) after unpacking.
    type: int
    default: 64
  keep:
    description: Releases to keep (at least 2, so the rollback target survives).
    type: int
    default: 3
  service:
    description: >-
      The systemd unit that serves C(current); with O(state=current), RV(restart) says whether it
      must restart.
    type: str
notes:
  - Detects TensorRT from C(libnvinfer.so.X.Y.Z) and librknnrt from the version string it embeds.
attributes:
  check_mode:
    description:
      - All checks run (checksums, manifests, compatibility, free space); nothing is unpacked,
        switched or removed; RV(ignore:changed) says whether a real run would change anything.
    support: full
  diff_mode:
    description: Shows the C(current) and C(previous) targets and the release list before and after.
    support: full
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Check the artifacts before changing anything
  edge_release:
    state: checked
    artifacts:
      - {path: /var/cache/edgetune/edgetune-runtime-0.1.0.tar.gz, sha256: "{{ runtime_sha }}", kind: runtime}
      - {path: /var/cache/edgetune/edgetune-engine-mlp-small-0.1.0.tar.gz, sha256: "{{ engine_sha }}", kind: engine}
    device: "{{ ansible_facts.edge }}"
    platform: {tensorrt_by_l4t: [{l4t: ">=36.4,<37", tensorrt: "10.3"}]}
  register: checked

- name: Install and switch
  edge_release:
    state: current
    release: "{{ checked.release }}"
    artifacts: "{{ my_artifacts }}"
    device: "{{ ansible_facts.edge }}"
    keep: 3

- name: Roll back to the previous release
  edge_release:
    state: rollback
"""

RETURN = r"""
release:
  description: The release name (given or derived from the manifests).
  returned: always
  type: str
  sample: 0.1.0+mlp-small-0.1.0
path:
  description: The release's directory.
  returned: always
  type: str
  sample: /opt/edgetune/releases/0.1.0+mlp-small-0.1.0
current:
  description: The release C(current) points to after the run (null when none).
  returned: always
  type: str
previous:
  description: The release C(previous) points to after the run (null when none).
  returned: always
  type: str
before:
  description: The release C(current) pointed to before the run.
  returned: always
  type: str
releases:
  description: Releases present after the run, oldest first.
  returned: always
  type: list
  elements: str
removed:
  description: Releases removed to keep O(keep).
  returned: always
  type: list
  elements: str
manifests:
  description: The C(runtime) and C(engine) manifests read from the tarballs.
  returned: when artifacts are given
  type: dict
checks:
  description: The checks passed, one line each.
  returned: always
  type: list
  elements: str
space:
  description: C(free_mb) under O(root) and C(needed_mb) (unpacked size plus O(min_free_mb)).
  returned: when artifacts are given
  type: dict
repaired:
  description: What was wrong with the installed release that O(state=current) unpacked again ([] when nothing).
  returned: with O(state=current)
  type: list
  elements: str
restart:
  description: >-
    Whether O(service) must restart to serve the release: switched or repaired, or the service is not
    running a program of C(current). False without O(service).
  returned: with O(state=current)
  type: bool
device_versions:
  description: What was detected on the device (C(python), C(tensorrt), C(rknn), C(architecture), C(glibc)).
  returned: when artifacts are given
  type: dict
"""

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_artifact import (  # noqa: E402
    NAME_RE,
    ArtifactError,
    compatibility_problems,
    detect_architecture,
    detect_glibc,
    detect_rknn,
    detect_tensorrt,
    inspect_tarball,
    pairing_problems,
    sha256_file,
    unpack,
)
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import fsync_directory  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_serving import (  # noqa: E402
    RELEASE_FILE, installed_problems, program_of, runs_release, unit_state)

MIB = 1024 * 1024


# ------------------------------------------------------------------ reading
def link_target(root, name):
    """The release a link (current/previous) points to, or None."""
    path = os.path.join(root, name)
    if not os.path.islink(path):
        if os.path.exists(path):
            raise EdgeError("%s exists but is not a symlink; move it away (edgetune manages it as a link)" % path)
        return None
    target = os.readlink(path)
    parts = target.rstrip("/").split("/")
    if len(parts) != 2 or parts[0] != "releases" or not NAME_RE.match(parts[1]):
        raise EdgeError("%s points to %s, not to releases/<name>; fix or remove it" % (path, target))
    return parts[1]


def list_releases(root):
    """Installed releases, oldest first (by the time they were installed)."""
    base = os.path.join(root, "releases")
    if not os.path.isdir(base):
        return []
    names = [n for n in os.listdir(base) if NAME_RE.match(n) and os.path.isdir(os.path.join(base, n))]
    return sorted(names, key=lambda n: (os.stat(os.path.join(base, n)).st_mtime, n))


def read_release(root, name):
    try:
        with open(os.path.join(root, "releases", name, RELEASE_FILE)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def state_of(root):
    return {"current": link_target(root, "current"), "previous": link_target(root, "previous"),
            "releases": list_releases(root)}


def python_version(python, run_command):
    if not os.path.exists(python):
        return None
    rc, out, _err = run_command([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
    return out.strip() if rc == 0 else None


def free_mb(path):
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / MIB


# ------------------------------------------------------------------ plan
def check_artifacts(artifacts, device, platform, versions, min_free, root):
    """Verify everything; returns (manifests by kind, checks, space). Raises EdgeError."""
    checks, manifests, unpacked = [], {}, 0
    kinds = [a["kind"] for a in artifacts]
    if sorted(kinds) != ["engine", "runtime"]:
        raise EdgeError("a release is one runtime and one engine artifact; got %s" % (", ".join(kinds) or "none"))
    for item in artifacts:
        path, kind = item["path"], item["kind"]
        expected = (item.get("sha256") or "").strip().lower()
        if not re.match(r"^[0-9a-f]{64}$", expected):
            raise EdgeError("the %s artifact's sha256 %r is not 64 hex digits" % (kind, item.get("sha256")))
        if not os.path.isfile(path):
            raise EdgeError("the %s artifact %s does not exist on the device" % (kind, path))
        actual = sha256_file(path)
        if actual != expected:
            raise EdgeError("checksum mismatch for the %s artifact %s: sha256 %s, expected %s; "
                            "nothing was changed" % (kind, path, actual, expected))
        checks.append("%s: sha256 %s matches" % (os.path.basename(path), actual))
        try:
            manifest, _members, size = inspect_tarball(path, kind)
        except ArtifactError as exc:
            raise EdgeError(str(exc)) from None
        checks.append("%s: manifest %s %s %s, %d file(s) verified" % (
            os.path.basename(path), kind, manifest["name"], manifest["version"], len(manifest["files"])))
        manifests[kind] = manifest
        unpacked += size
    device = dict(device, python=versions["python"], tensorrt=versions["tensorrt"], rknn=versions["rknn"],
                  architecture=versions.get("architecture"), glibc=versions.get("glibc"))
    problems = []
    for kind in ("runtime", "engine"):
        problems += compatibility_problems(manifests[kind], device, platform)
    problems += pairing_problems(manifests["runtime"], manifests["engine"])
    if problems:
        raise EdgeError("incompatible release, nothing was changed: " + "; ".join(problems))
    where = ("L4T %s" % device["l4t"]["version"]) if device.get("l4t") else "%s %s" % (
        (device.get("bsp") or {}).get("name"), (device.get("bsp") or {}).get("version"))
    checks.append("compatible with %s on %s, Python %s" % (device.get("soc"), where, versions["python"]))
    needed = unpacked / MIB + min_free
    have = free_mb(root)
    if have < needed:
        raise EdgeError("not enough space under %s: %.1f MiB free, %.1f MiB needed (release %.1f MiB + "
                        "min_free_mb %d); nothing was changed" % (root, have, needed, unpacked / MIB, min_free))
    checks.append("space: %.1f MiB free, %.1f MiB needed" % (have, needed))
    return manifests, checks, {"free_mb": round(have, 1), "needed_mb": round(needed, 1)}


def release_record(name, artifacts, manifests):
    return {"release": name,
            "artifacts": {a["kind"]: {"file": os.path.basename(a["path"]), "sha256": a["sha256"].lower()}
                          for a in artifacts},
            "manifests": manifests}


def plan_current(root, name, keep, record, state):
    """What state=current does: returns dict(install, switch, remove)."""
    existing = read_release(root, name) if name in state["releases"] else None
    if name in state["releases"]:
        # An unreadable release.json is damage that state=current repairs (installed_problems names it).
        if existing is not None and existing.get("artifacts") != record["artifacts"]:
            raise EdgeError("release %s is already installed from other artifacts (%s); releases are "
                            "immutable: give the new artifacts a new version" % (
                                name, json.dumps((existing or {}).get("artifacts"), sort_keys=True)))
    install = name not in state["releases"]
    repair = [] if install else installed_problems(os.path.join(root, "releases", name))
    switch = state["current"] != name
    previous = state["current"] if switch else state["previous"]
    after = [r for r in state["releases"] if r != name] + [name]
    protected = {name, previous}
    removable = [r for r in after if r not in protected]
    excess = len(after) - keep
    remove = removable[:max(0, excess)]
    return {"install": install, "repair": repair, "switch": switch, "previous": previous, "remove": remove}


# ------------------------------------------------------------------ apply
def relink(root, name, target):
    """Point ROOT/name at releases/target atomically (or remove it when target is None)."""
    path = os.path.join(root, name)
    if target is None:
        if os.path.islink(path):
            os.unlink(path)
            fsync_directory(root)
        return
    tmp = os.path.join(root, ".%s.%d.tmp" % (name, os.getpid()))
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink("releases/" + target, tmp)
    os.rename(tmp, path)
    fsync_directory(root)
    if link_target(root, name) != target:
        raise EdgeError("read-back: %s does not point to releases/%s after the switch" % (path, target))


def install(root, name, artifacts, record, replace=False):
    """Unpack the release beside the others and rename it into place; ``replace``: swap it for the
    installed (damaged) directory of that name, which is removed after the swap."""
    base = os.path.join(root, "releases")
    os.makedirs(base, mode=0o755, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".incoming-%s-" % name, dir=base)
    try:
        for item in artifacts:
            dest = os.path.join(staging, item["kind"])
            os.makedirs(dest, mode=0o755)
            unpack(item["path"], dest)
        with open(os.path.join(staging, RELEASE_FILE), "w") as handle:
            json.dump(record, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        for dirpath, _dirnames, _filenames in os.walk(staging):
            os.chmod(dirpath, 0o755)
            fsync_directory(dirpath)
        if replace:
            damaged = os.path.join(base, ".damaged-%s-%d" % (name, os.getpid()))
            os.rename(os.path.join(base, name), damaged)
            os.rename(staging, os.path.join(base, name))
            shutil.rmtree(damaged, ignore_errors=True)
        else:
            os.rename(staging, os.path.join(base, name))
        fsync_directory(base)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def serving(service, release_path):
    """Whether ``service`` is active with its main process running a program of the release."""
    try:
        state = unit_state(service)
    except ValueError:
        return False
    return state.get("ActiveState") == "active" and runs_release(program_of(state["MainPID"]), release_path)


def describe(state):
    return "current: %s\nprevious: %s\nreleases: %s\n" % (
        state["current"] or "(none)", state["previous"] or "(none)", " ".join(state["releases"]) or "(none)")


def run(params, check_mode, run_command):
    root = params["root"]
    before = state_of(root)
    result = {"changed": False, "before": before["current"], "removed": [], "checks": []}

    if params["state"] == "rollback":
        target = params["release"] or before["previous"]
        if not target:
            raise EdgeError("no previous release recorded under %s to roll back to" % root)
        if target not in before["releases"]:
            raise EdgeError("cannot roll back to %s: it is not installed under %s/releases" % (target, root))
        after = {"current": target, "previous": None, "releases": before["releases"]}
        if before["current"] != target or before["previous"] is not None:
            result["changed"] = True
            if not check_mode:
                relink(root, "current", target)
                relink(root, "previous", None)
        result.update(release=target, path=os.path.join(root, "releases", target))
        result["checks"].append("rolled back from %s to %s" % (before["current"], target))
        return result, before, after

    artifacts = params["artifacts"] or []
    versions = {"python": python_version(params["python"], run_command),
                "tensorrt": detect_tensorrt(), "rknn": detect_rknn(),
                "architecture": detect_architecture(), "glibc": detect_glibc()}
    manifests, checks, space = check_artifacts(artifacts, params["device"] or {}, params["platform"] or {},
                                               versions, params["min_free_mb"], root)
    name = params["release"] or "%s+%s-%s" % (manifests["runtime"]["version"], manifests["engine"]["name"],
                                              manifests["engine"]["version"])
    if not NAME_RE.match(name):
        raise EdgeError("release name %r: use letters, digits and . _ + - only" % name)
    result.update(release=name, path=os.path.join(root, "releases", name), manifests=manifests, checks=checks,
                  space=space, device_versions=versions)
    record = release_record(name, artifacts, manifests)
    if params["state"] == "checked":
        plan = plan_current(root, name, params["keep"], record, before)
        result["would_install"] = plan["install"]
        result["would_switch"] = plan["switch"]
        return result, before, before

    plan = plan_current(root, name, params["keep"], record, before)
    releases = [r for r in before["releases"] if r != name and r not in plan["remove"]] + [name]
    after = {"current": name, "previous": plan["previous"], "releases": releases}
    result["removed"] = plan["remove"]
    result["repaired"] = plan["repair"]
    result["changed"] = plan["install"] or bool(plan["repair"]) or plan["switch"] or bool(plan["remove"])
    result["restart"] = bool(params.get("service")) and (
        plan["install"] or bool(plan["repair"]) or plan["switch"]
        or not serving(params["service"], os.path.join(root, "releases", name)))
    if not check_mode:
        if plan["install"] or plan["repair"]:
            install(root, name, artifacts, record, replace=bool(plan["repair"]))
        if plan["switch"]:
            relink(root, "previous", plan["previous"])
            relink(root, "current", name)
        for old in plan["remove"]:
            shutil.rmtree(os.path.join(root, "releases", old))
        if plan["remove"]:
            fsync_directory(os.path.join(root, "releases"))
    return result, before, after


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="current", choices=["checked", "current", "rollback"]),
            root=dict(type="path", default="/opt/edgetune"),
            release=dict(type="str"),
            artifacts=dict(type="list", elements="dict", options=dict(
                path=dict(type="path", required=True),
                sha256=dict(type="str", required=True),
                kind=dict(type="str", required=True, choices=["runtime", "engine"]))),
            device=dict(type="dict", default={}),
            platform=dict(type="dict", default={}),
            python=dict(type="path", default="/usr/bin/python3"),
            min_free_mb=dict(type="int", default=64),
            keep=dict(type="int", default=3),
            service=dict(type="str"),
        ),
        required_if=[("state", "checked", ["artifacts"]), ("state", "current", ["artifacts"])],
        supports_check_mode=True,
    )
    params = module.params
    if params["keep"] < 2:
        module.fail_json(msg="keep must be at least 2: the previous release is the rollback target")
    if params["release"] and not NAME_RE.match(params["release"]):
        module.fail_json(msg="release name %r: use letters, digits and . _ + - only" % params["release"])
    try:
        result, before, after = run(params, module.check_mode, module.run_command)
        final = state_of(params["root"]) if not module.check_mode else after
    except (OSError, ArtifactError) as exc:
        module.fail_json(msg="release under %s failed: %s" % (params["root"], exc))
    except EdgeError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    if not module.check_mode and (final["current"], final["previous"], sorted(final["releases"])) != (
            after["current"], after["previous"], sorted(after["releases"])):
        module.fail_json(msg="read-back: expected %s, found %s" % (describe(after), describe(final)))
    result.update(current=final["current"], previous=final["previous"], releases=final["releases"])
    if module._diff:
        result["diff"] = {"before": describe(before), "after": describe(after),
                          "before_header": params["root"], "after_header": params["root"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
