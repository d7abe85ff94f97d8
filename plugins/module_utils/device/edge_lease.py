# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One apply at a time per device: the apply lease. Python 3.8+, stdlib only.

Every apply (site.yml, tune.yml, deploy.yml, tagged or not) takes the lease in
its first device execution (edge_facts) and gives it back at its end
(edge_lease). The lease is a JSON file naming its holder (the run's id, the
controller host, the user, the playbook, since when) with an expiry and the
boot id it was taken in. A second apply waits for it (polling, up to a
timeout), then fails with one line naming the holder. An expired lease, or one
taken in an earlier boot, is taken over (the previous holder is reported); the
same run takes its own lease again (after its reboot, for instance). A file
lock serializes the read-decide-write, so two applies starting together never
both win. Check mode and the audit only read it.

A run that reboots the device on purpose keeps its lease through the reboot:
right before it, the lease is copied to a file that outlives the boot (the
hand-over), which holds the device for that run until the run takes the lease
again in the new boot, or until the hand-over expires (a run that never came
back). Another run that waited meanwhile keeps waiting.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import json
import os
import time

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_bootfile import BOOT_ID, read_boot_id
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import fsync_directory

# In /run: gone at the next boot with whatever run held it; nothing of it outlives a run that gave it
# back (a refused apply leaves no trace in /etc or /var). The boot id is checked all the same, for a
# lease file placed elsewhere.
LEASE_FILE = "/run/edgetune/apply.lease"
# The lease kept through its holder's reboot (/run is empty after it); beside a lease placed elsewhere.
HANDOVER_FILE = "/var/lib/edgetune/apply.lease.reboot"
FORMAT = 1
POLL_S = 2.0
HOLDER_KEYS = ("run_id", "controller", "user", "playbook")


def _lock(path):
    """An exclusive lock beside the lease, held for one read-decide-write."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, 0o755, exist_ok=True)  # two takers may make it at once
    handle = open(path + ".lock", "a")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def read(path=LEASE_FILE):
    """The lease as written, or None when there is none (an unreadable file counts as none: it is taken over)."""
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def _write(path, doc):
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w") as handle:
        json.dump(doc, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(temporary, path)
    fsync_directory(os.path.dirname(path) or ".")


def handover_path(path=LEASE_FILE):
    return HANDOVER_FILE if path == LEASE_FILE else path + ".reboot"


def current(path=LEASE_FILE, boot_id=None):
    """The lease that stands for the device: the lease file, else a hand-over its holder left before
    rebooting (in a later boot only: before the reboot the lease file itself holds)."""
    doc = read(path)
    if doc is None:
        kept = read(handover_path(path))
        if kept is not None and kept.get("through_reboot") and kept.get("boot_id") != boot_id:
            doc = kept
    return doc


def _drop_handover(path):
    try:
        os.unlink(handover_path(path))
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def describe(doc, now=None):
    """'controller H, user U, playbook P, since T (expires in N s)' of a lease."""
    now = time.time() if now is None else now
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc.get("since", 0)))
    return "controller %s, user %s, playbook %s, since %s (run %s; expires in %d s)" % (
        doc.get("controller", "?"), doc.get("user", "?"), doc.get("playbook", "?"), since, doc.get("run_id", "?"),
        max(0, int(doc.get("expires", 0) - now)))


def standing(doc, run_id, boot_id, now, ended_run=None):
    """Why ``doc`` does not stop ``run_id``: None while another run holds it, else 'free', 'own',
    'ended' (the controller saw that run's process gone), 'expired' or 'earlier boot'."""
    if doc is None:
        return "free"
    if doc.get("run_id") == run_id:
        return "own"
    if ended_run and doc.get("run_id") == ended_run:
        return "ended"
    if doc.get("boot_id") != boot_id and not doc.get("through_reboot"):
        return "earlier boot"
    if doc.get("expires", 0) <= now:
        return "expired"
    return None


def holder_problems(holder):
    missing = [key for key in HOLDER_KEYS if not holder.get(key)]
    return ["the lease's holder has no %s" % ", ".join(missing)] if missing else []


def take(holder, ttl, wait, path=LEASE_FILE, boot_id_path=BOOT_ID, clock=time.time, sleep=time.sleep,
         ended_run=None):
    """Take the lease for ``holder`` ({run_id, controller, user, playbook}) for ``ttl`` seconds, waiting up
    to ``wait`` seconds while another run holds it (``ended_run``: a run the controller knows has ended,
    whose lease is taken over). Returns {"changed", "waited_s", "took_over", "held_by"}: the previous
    holder's description when its lease was taken over; with ``wait`` 0 and another run holding it,
    "held_by" is that lease and nothing is written. Raises EdgeError naming the holder when a wait
    runs out."""
    problems = holder_problems(holder)
    if problems:
        raise EdgeError(problems)
    boot_id = read_boot_id(boot_id_path)
    began = clock()
    while True:
        with _lock(path):
            now = clock()
            lease = current(path, boot_id)
            why = standing(lease, holder["run_id"], boot_id, now, ended_run)
            if why is not None:
                doc = dict((key, holder[key]) for key in HOLDER_KEYS)
                doc.update(format=FORMAT, boot_id=boot_id, pid=os.getpid(), expires=now + ttl,
                           since=lease["since"] if why == "own" else now)
                _write(path, doc)
                # Whoever holds the device now, a hand-over left before a reboot is spent (or its run is gone).
                _drop_handover(path)
                return {"changed": why != "own", "waited_s": round(now - began, 1), "held_by": None,
                        "took_over": ("%s lease of %s" % (why, describe(lease, now)))
                        if why in ("ended", "expired", "earlier boot") else None}
            if wait <= 0:
                return {"changed": False, "waited_s": 0, "took_over": None, "held_by": lease}
            if now - began >= wait:
                raise EdgeError("another apply holds this device: %s; waited %d s (edge_lease_wait). The lease "
                                "is given back at the end of that run, or expires" % (describe(lease, now),
                                                                                      int(now - began)),
                                holder=lease)
        sleep(min(POLL_S, max(0.1, wait - (now - began))))


def peek(run_id=None, path=LEASE_FILE, boot_id_path=BOOT_ID, clock=time.time):
    """The lease of another run that would stop an apply now (check mode, the audit timer), or None."""
    boot_id = read_boot_id(boot_id_path)
    lease = current(path, boot_id)
    return lease if standing(lease, run_id, boot_id, clock()) is None else None


def keep_through_reboot(run_id, grace, path=LEASE_FILE, clock=time.time):
    """Right before this run reboots the device: its lease, copied where it outlives the boot, holds the
    device for ``grace`` seconds (until the run takes it again in the new boot). False when the run does
    not hold the lease."""
    with _lock(path):
        lease = read(path)
        if lease is None or lease.get("run_id") != run_id:
            return False
        kept = handover_path(path)
        directory = os.path.dirname(kept)
        if directory:
            os.makedirs(directory, 0o755, exist_ok=True)
        _write(kept, dict(lease, through_reboot=True, expires=clock() + grace))
        return True


def give_back(run_id, path=LEASE_FILE):
    """Remove the lease when ``run_id`` holds it; True when it was removed."""
    if not os.path.exists(path):
        return False
    with _lock(path):
        lease = read(path)
        if lease is None or lease.get("run_id") != run_id:
            return False
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        kept = read(handover_path(path))
        if kept is not None and kept.get("run_id") == run_id:  # a reboot that never happened
            _drop_handover(path)
        return True


# ------------------------------------------------------------------ the controller's side
def _proc_start(pid, proc="/proc"):
    """The start time of a process (clock ticks since boot, /proc/PID/stat field 22); None where unknown."""
    try:
        with open("%s/%d/stat" % (proc, pid)) as handle:
            text = handle.read()
        return text[text.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _playbooks(pid, proc="/proc"):
    try:
        with open("%s/%d/cmdline" % (proc, pid), "rb") as handle:
            argv = handle.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return []
    return [os.path.basename(arg) for arg in argv if arg.endswith((".yml", ".yaml"))
            or arg.startswith("edgetune.fleet.")]


def run_identity(controller, user, pid, proc="/proc", fallback_playbook="?"):
    """The holder of an apply run of ansible-playbook process ``pid`` on ``controller``: its run id
    (controller, pid and the process's start time, unique across restarts), user and playbook(s)."""
    start = _proc_start(pid, proc)
    return {"run_id": "%s:%d:%s" % (controller, pid, start or "?"), "controller": controller, "user": user,
            "playbook": " ".join(_playbooks(pid, proc)) or fallback_playbook}


def run_has_ended(run_id, controller, proc="/proc"):
    """True when ``run_id`` is a run of this controller whose process is gone (or is another process
    now); False when it runs, or when this controller cannot tell (another controller, no /proc)."""
    host, _sep, rest = str(run_id).rpartition(":")
    host, _sep, pid = host.rpartition(":")
    if host != controller or not pid.isdigit() or rest == "?" or not os.path.isdir(proc):
        return False
    return _proc_start(int(pid), proc) != rest
