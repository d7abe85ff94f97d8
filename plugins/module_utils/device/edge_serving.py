# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a release is installed intact and whether its service runs it: shared by the
edge_release module (which repairs a damaged release and restarts a service that runs another
one) and the drift audit's ``runtime`` check. Python 3.8+, stdlib only.

A release directory holds ``release.json`` (the artifacts it was unpacked from, by sha256, and
their manifests, which list every file with its sha256) and one directory per artifact kind.
"""
import hashlib
import json
import os
import shutil
import subprocess
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

RELEASE_FILE = "release.json"
# Files up to this size are checked by their sha256 (the programs, configs); bigger ones (a model)
# by their presence and size only: hashing gigabytes on every audit and converge costs a board seconds.
HASHED_UP_TO = 64 * 1024 * 1024


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def installed_problems(release_path, artifacts=None, shown=None):
    """Why the release unpacked at ``release_path`` is not intact, [] when it is. ``artifacts``:
    {kind: sha256} it must come from (None: not compared); ``shown``: the path to name in messages."""
    shown = shown or release_path
    try:
        with open(os.path.join(release_path, RELEASE_FILE)) as handle:
            doc = json.load(handle)
    except (OSError, ValueError) as exc:
        return ["%s/%s cannot be read (%s)" % (shown, RELEASE_FILE, getattr(exc, "strerror", None) or exc)]
    installed = dict((kind, (item or {}).get("sha256")) for kind, item in (doc.get("artifacts") or {}).items())
    problems = ["%s artifact sha256 %s, deployed %s" % (kind, (installed.get(kind) or "none")[:12], sha[:12])
                for kind, sha in sorted((artifacts or {}).items()) if installed.get(kind) != sha]
    for kind, manifest in sorted((doc.get("manifests") or {}).items()):
        for name, sha in sorted(((manifest or {}).get("files") or {}).items()):
            path = os.path.join(release_path, kind, name)
            try:
                size = os.path.getsize(path)
            except OSError:
                problems.append("%s/%s/%s is missing" % (shown, kind, name))
                continue
            if size <= HASHED_UP_TO and sha256_of(path) != sha:
                problems.append("%s/%s/%s was changed" % (shown, kind, name))
    return problems


def unit_state(service):
    """systemd's ActiveState, UnitFileState and MainPID of ``service``; ValueError when unreadable."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        raise BadInput("systemctl is not installed: %s cannot be read" % service)
    done = subprocess.run([systemctl, "show", "--property=ActiveState", "--property=UnitFileState",
                           "--property=MainPID", service], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    if done.returncode != 0:
        raise BadInput("systemctl show %s failed: %s" % (service, (done.stderr or done.stdout).strip()[-200:]))
    state = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    try:
        state["MainPID"] = int(state.get("MainPID") or 0)
    except ValueError:
        state["MainPID"] = 0
    return state


def program_of(pid, proc="/proc"):
    """The resolved path of the program process ``pid`` runs, '' when it is gone or unreadable."""
    try:
        return os.path.realpath(os.readlink(os.path.join(proc, str(pid), "exe")))
    except OSError:
        return ""


def runs_release(program, release_path):
    """Whether ``program`` (program_of's answer) is a file of the release; one deleted or replaced
    on disk since the process started (the kernel adds " (deleted)") is not."""
    return (bool(program) and not program.endswith(" (deleted)")
            and program.startswith(os.path.realpath(release_path) + os.sep))
