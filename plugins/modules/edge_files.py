#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_files: a set of files installed on the device in one round trip."""

DOCUMENTATION = r"""
---
module: edge_files
short_description: Install a set of files on the device in one round trip
description:
  - Writes each file whose content, mode or owner differs from the one given, atomically (a
    temporary file beside it, renamed over it), and creates missing parent directories.
  - One module execution for all the files, where a loop of M(ansible.builtin.copy) costs two or
    three per file. The roles install the collection's device-side programs (the on-device
    audit, the boot-time commands) and the audit records with it.
  - The action plugin of the same name reads O(files[].src) from the collection on the controller;
    the module receives each file's content encoded in base64.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  files:
    description: The files to install.
    type: list
    elements: dict
    required: true
    suboptions:
      dest:
        description: Path on the device; a relative one is under O(directory).
        type: path
        required: true
      src:
        description:
          - A file of the collection, relative to its root (V(plugins/modules/edge_dvfs.py)); the
            action plugin reads it on the controller. Exclusive with O(files[].content).
        type: str
      content:
        description: The file's text. Exclusive with O(files[].src).
        type: str
      content_b64:
        description:
          - The file's content in base64. The action plugin sets it from O(files[].src) or
            O(files[].content); a task gives it only to put back what an earlier run returned in
            RV(previous). Exclusive with O(files[].src) and O(files[].content).
        type: str
      mode:
        description: The file's mode, in octal.
        type: str
        default: "0644"
      unit:
        description:
          - The file is a systemd unit or drop-in. Where the device has C(systemd-analyze), its new content is
            checked with C(systemd-analyze verify) under its own name before any file of the task is written,
            and a content systemd refuses fails the task naming the file. Not in check mode, where the programs
            a unit runs may not be installed yet.
        type: bool
        default: false
  directory:
    description: The directory on the device that relative O(files[].dest) paths are under.
    type: path
  owner:
    description: Owner of every file (a name or a numeric id).
    type: str
    default: root
  group:
    description: Group of every file (a name or a numeric id).
    type: str
    default: root
  directory_mode:
    description: Mode, in octal, of the parent directories the module creates (existing ones are left alone).
    type: str
    default: "0755"
  previous:
    description:
      - Return, in RV(previous), the content that each written file held before, so that a later task can
        put it back (a deploy's rollback) by giving that list as O(files), with no backup file on the device.
    type: bool
    default: false
  absent:
    description:
      - Paths on the device to remove in the same execution, a directory with all it holds (what an earlier
        release installed elsewhere). A path that is missing is left alone; one that is a file given in
        O(files), or a directory above one, is refused.
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    description: Reports what a real run would write, and writes nothing.
    support: full
  diff_mode:
    description: The before and after text of each file it writes or would write (a mode or owner change as a header).
    support: full
extends_documentation_fragment: edgetune.fleet.edge
"""

EXAMPLES = r"""
- name: Install the boot-time command
  edgetune.fleet.edge_files:
    directory: /usr/local/lib/edgetune
    files:
      - {src: plugins/modules/edge_irq_affinity.py, dest: edge_irq_affinity.py, mode: "0755"}
      - {content: "{{ record | to_nice_json }}", dest: /var/lib/edgetune/applied/edge_cpu.json, mode: "0600"}

- name: Install a file and remove what an earlier release left
  edgetune.fleet.edge_files:
    files:
      - {content: "x=1\n", dest: /etc/example/x.conf}
    absent: [/etc/example/x.d]
"""

RETURN = r"""
written:
  description: The files written (or, in check mode, that a real run writes), in the order given.
  returned: always
  type: list
  elements: path
directories:
  description: The parent directories created (or, in check mode, that a real run creates).
  returned: always
  type: list
  elements: path
previous:
  description:
    - Each written file that existed before, with the content it held (C(dest), C(content_b64)), as a list
      to give as O(files) to put them back. Files that were new are not in it.
  returned: when O(previous) is true
  type: list
  elements: dict
  sample: [{dest: /etc/example/x.conf, content_b64: eD0xCg==}]
removed:
  description: The paths of O(absent) removed (or, in check mode, that a real run removes).
  returned: always
  type: list
  elements: path
"""

import base64
import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import atomic_write

# Ansible's own limit for showing a file in a diff (DEFAULT max_diff_size).
MAX_DIFF_BYTES = 104448
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"


def resolve_id(value, database, kind):
    """A user or group name (or a numeric id) -> its numeric id on this device."""
    value = str(value)
    if value.isdigit():
        return int(value)
    try:
        return database(value)[2]
    except KeyError:
        raise EdgeError("edge_files: no %s %r on this device (create it first, or give a numeric id)"
                        % (kind, value)) from None


def parse_mode(value, what):
    try:
        mode = int(str(value), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise EdgeError("edge_files: %s %r is not an octal file mode such as 0644" % (what, value))
    return mode


def missing_directories(path):
    """The parent directories of ``path`` that do not exist, outermost first."""
    missing = []
    directory = os.path.dirname(path)
    while directory and not os.path.isdir(directory):
        if os.path.lexists(directory):
            raise EdgeError("edge_files: cannot install %s: %s exists and is not a directory" % (path, directory))
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return list(reversed(missing))


def text_for_diff(data):
    if data is None:
        return ""
    if len(data) > MAX_DIFF_BYTES:
        return "(%d bytes: too large to show)\n" % len(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "(%d bytes of binary content)\n" % len(data)


def plan(files, uid, gid):
    """What installing ``files`` (dicts: dest, data (bytes), mode (int)) changes: a list of dicts
    with dest, data, mode, the current content (None for a new file) and the reasons it is
    written (empty: it is already as given)."""
    planned, seen = [], set()
    for item in files:
        dest = item["dest"]
        if not os.path.isabs(dest):
            raise EdgeError("edge_files: %r is not an absolute path" % dest)
        if dest in seen:
            raise EdgeError("edge_files: %s is given twice" % dest)
        seen.add(dest)
        reasons, current = [], None
        try:
            info = os.stat(dest)
        except OSError:
            info = None
        if info is None:
            reasons.append("new")
        elif not stat.S_ISREG(info.st_mode):
            raise EdgeError("edge_files: %s exists and is not a regular file" % dest)
        else:
            try:
                with open(dest, "rb") as handle:
                    current = handle.read()
            except OSError as exc:
                raise EdgeError("edge_files: cannot read %s: %s" % (dest, exc.strerror or exc)) from None
            if current != item["data"]:
                reasons.append("content")
            if stat.S_IMODE(info.st_mode) != item["mode"]:
                reasons.append("mode %04o -> %04o" % (stat.S_IMODE(info.st_mode), item["mode"]))
            if (info.st_uid, info.st_gid) != (uid, gid):
                reasons.append("owner %d:%d -> %d:%d" % (info.st_uid, info.st_gid, uid, gid))
        planned.append(dict(item, current=current, reasons=reasons))
    return planned


def verify_units(planned, analyze=None):
    """Each unit whose content is new or changes, checked by systemd-analyze verify in a directory of its own
    under its own name (it wants the unit's name: systemd 247 has no FILE:UNIT form) before anything is
    written; nothing is checked where the device has no systemd-analyze."""
    analyze = analyze or SYSTEMD_ANALYZE
    if not os.access(analyze, os.X_OK):
        return
    for item in planned:
        if not item.get("unit") or (item["current"] == item["data"] and "new" not in item["reasons"]):
            continue
        scratch = tempfile.mkdtemp(prefix="edge_files-verify-")
        try:
            path = os.path.join(scratch, os.path.basename(item["dest"]))
            with open(path, "wb") as handle:
                handle.write(item["data"])
            done = subprocess.run([analyze, "verify", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  universal_newlines=True, check=False)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if done.returncode != 0:
            said = [line.replace(path, item["dest"]) for line in done.stdout.strip().splitlines()][:3]
            raise EdgeError("edge_files: systemd refuses the new %s (systemd-analyze verify): %s; nothing was written"
                            % (item["dest"], " | ".join(said) or "exit %d" % done.returncode))


def install(planned, uid, gid, directory_mode):
    """Write the planned files that need it; returns the directories created."""
    created = []
    for item in planned:
        if not item["reasons"]:
            continue
        for directory in missing_directories(item["dest"]):
            os.mkdir(directory, directory_mode)
            os.chmod(directory, directory_mode)  # mkdir's mode is masked by the umask
            os.chown(directory, uid, gid)
            created.append(directory)
        try:
            atomic_write(item["dest"], item["data"], backup=False, mode=item["mode"])
            os.chown(item["dest"], uid, gid)
            os.chmod(item["dest"], item["mode"])  # chown may clear set-id bits
        except OSError as exc:
            raise EdgeError("edge_files: cannot write %s: %s" % (item["dest"], exc.strerror or exc)) from None
    return created


def to_remove(absent, files):
    """The paths of ``absent`` that exist, refused where one is a file to install or above one."""
    found = []
    for path in absent:
        if not os.path.isabs(path):
            raise EdgeError("edge_files: absent %r is not an absolute path" % path)
        path = os.path.normpath(path)
        for item in files:
            if item["dest"] == path or item["dest"].startswith(path.rstrip("/") + "/"):
                raise EdgeError("edge_files: cannot remove %s: %s is installed there" % (path, item["dest"]))
        if os.path.lexists(path):
            found.append(path)
    return found


def remove(paths):
    for path in paths:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError as exc:
            raise EdgeError("edge_files: cannot remove %s: %s" % (path, exc.strerror or exc)) from None


def diffs(planned, removed=()):
    return [dict(before_header="%s (%s)" % (item["dest"], ", ".join(item["reasons"])),
                 after_header=item["dest"],
                 before=text_for_diff(item["current"]), after=text_for_diff(item["data"]))
            for item in planned if item["reasons"]] + [
        dict(before_header=path, after_header="%s (removed)" % path, before="%s\n" % path, after="")
        for path in removed]


def run(params, check_mode):
    uid = resolve_id(params["owner"], pwd.getpwnam, "user")
    gid = resolve_id(params["group"], grp.getgrnam, "group")
    directory_mode = parse_mode(params["directory_mode"], "directory_mode")
    files = []
    for item in params["files"]:
        dest = item["dest"]
        if not os.path.isabs(dest) and params.get("directory"):
            dest = os.path.join(params["directory"], dest)
        if item.get("content_b64") is not None:
            data = base64.b64decode(item["content_b64"])
        elif item.get("content") is not None:
            data = item["content"].encode("utf-8")
        else:
            raise EdgeError("edge_files: %s has no content (src is read by the action plugin on the controller)"
                            % dest)
        files.append(dict(dest=dest, data=data, unit=bool(item.get("unit")),
                          mode=parse_mode(item.get("mode") or "0644", "mode of %s" % dest)))
    planned = plan(files, uid, gid)
    removed = to_remove(params.get("absent") or [], files)
    written = [item["dest"] for item in planned if item["reasons"]]
    directories = sorted({d for item in planned if item["reasons"] for d in missing_directories(item["dest"])})
    if not check_mode:
        verify_units(planned)
        directories = install(planned, uid, gid, directory_mode)
        remove(removed)
    result = dict(changed=bool(written or removed), written=written, directories=directories, removed=removed,
                  diff=diffs(planned, removed))
    if params.get("previous"):
        result["previous"] = [{"dest": item["dest"], "content_b64": base64.b64encode(item["current"]).decode("ascii")}
                              for item in planned if item["reasons"] and item["current"] is not None]
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type="list", elements="dict", required=True, options=dict(
                dest=dict(type="path", required=True), src=dict(type="str"), content=dict(type="str"),
                content_b64=dict(type="str", no_log=False), mode=dict(type="str", default="0644"),
                unit=dict(type="bool", default=False))),
            directory=dict(type="path"),
            owner=dict(type="str", default="root"),
            group=dict(type="str", default="root"),
            directory_mode=dict(type="str", default="0755"),
            absent=dict(type="list", elements="path", default=[]),
            previous=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode)
    except EdgeError as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:  # never a traceback
        module.fail_json(msg="edge_files: unexpected %s: %s" % (type(exc).__name__, exc))
    if not module._diff:
        result.pop("diff")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
