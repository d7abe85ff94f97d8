# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small file helpers shared by the edgetune modules.

Runs on the device (Python 3.8+, stdlib only).  Bootloader files are edited
here, so a write must never leave a half-written file behind: we write a
temporary file in the same directory, fsync it, copy the original's owner and
mode onto it, rename it over the original and fsync the directory so the
rename itself survives a power cut.
"""

import errno
import glob
import json
import os
import shutil
import stat
import tempfile
import time
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

BACKUP_MARKER = ".edgetune-"
BACKUP_SUFFIX = ".bak"
BACKUPS_KEPT = 3
NEW_FILE_MODE = 0o644


def read_text(path):
    """Return the file's text exactly as stored (line endings untouched).

    Decoded in one piece, so that a UnicodeDecodeError's ``object`` is the
    whole file and its ``start`` the offset in it."""
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8")


def backup_files(path):
    """Return this file's edgetune backups, oldest first."""
    pattern = glob.escape(path) + BACKUP_MARKER + "*" + BACKUP_SUFFIX
    # The timestamp in the name sorts chronologically as text.
    return sorted(glob.glob(pattern))


def make_backup(path, prune=True):
    """Copy ``path`` to ``<path>.edgetune-<UTC timestamp>.bak``; with ``prune``, keep the newest few."""
    now = time.time()
    # Microseconds keep two runs within one second from sharing a name.
    micros = int(now % 1 * 1e6)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{micros:06d}Z"
    backup_path = path + BACKUP_MARKER + stamp + BACKUP_SUFFIX
    try:
        shutil.copy2(path, backup_path)
    except BaseException:
        remove_quietly(backup_path)  # a partial copy (disk full)
        raise
    if prune:
        prune_backups(path)
    return backup_path


def prune_backups(path):
    """Delete all but the newest BACKUPS_KEPT backups of ``path``."""
    for old in backup_files(path)[:-BACKUPS_KEPT]:
        try:
            os.unlink(old)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise


def remove_quietly(path):
    """Unlink ``path`` if it exists; never raise (for clean-up on an error path)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def fsync_directory(directory):
    """Flush a directory entry change (our rename) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data, backup=True, mode=None, prune=True):
    """Replace ``path`` with ``data`` (str or bytes) atomically.

    The original's mode, uid and gid are kept (``mode`` overrides the mode; a
    new file gets ``mode`` or 0644).  With ``backup`` and an existing file, the
    original is copied next to it (see :func:`make_backup`).

    The backup is made once the new content is on disk beside the file, and
    taken back when the rename that replaces the file fails (an immutable
    file, a read-only mount): a refused write leaves the file and its backups
    as they were.  Older backups are pruned only after the rename, and only
    with ``prune`` (a caller writing several files prunes when all are
    written: :func:`prune_backups`).

    A symlink is followed: the file it points to is replaced (and backed up),
    the link stays a link.

    Returns the backup path, or None when no backup was made.
    """
    path = os.path.realpath(path)
    if not isinstance(data, bytes):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))

    try:
        original = os.stat(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
        original = None

    backup_path = None
    fd, temp_path = tempfile.mkstemp(
        dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if original is not None:
            current = os.stat(temp_path)
            if (current.st_uid, current.st_gid) != (original.st_uid, original.st_gid):
                os.chown(temp_path, original.st_uid, original.st_gid)
        # chmod after chown: chown may clear set-id bits.
        if mode is None:
            mode = stat.S_IMODE(original.st_mode) if original else NEW_FILE_MODE
        os.chmod(temp_path, mode)
        if backup and original is not None:
            backup_path = make_backup(path, prune=False)
        os.rename(temp_path, path)
    except BaseException:
        remove_quietly(temp_path)
        if backup_path is not None:
            remove_quietly(backup_path)
        raise
    fsync_directory(directory)
    if backup_path is not None and prune:
        prune_backups(path)
    return backup_path


# --------------------------------------------------------------------------
# Kernel files (/proc, sysfs, cgroupfs): read and written in place, never atomically

def under(root, path):
    """``path`` (absolute or relative to /) inside ``root`` (a device twin's or a test's tree)."""
    return os.path.join(root or "/", path.lstrip("/"))


def read_kernel_value(path):
    """A kernel file's value, without the trailing newline."""
    with open(path, "r") as handle:
        return handle.read().strip()


def write_kernel_value(path, value):
    """Write one value the way ``echo value > path`` does: no O_CREAT (a missing attribute is an
    error, never a new file) and no temporary file (the kernel acts on the write itself). Tests
    replace the callers' name for it to act like the kernel."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, ("%s\n" % value).encode("ascii"))
    finally:
        os.close(fd)


def controller_cache_dir(kind):
    """Where the controller keeps what it computed once for many devices: ~/.cache/edgetune/KIND (or
    under XDG_CACHE_HOME); None where there is no home to write to (an execution environment)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "edgetune", kind) if os.path.isabs(base) else None


def cached_json(entry, compute):
    """The JSON value kept in the file ``entry`` (None: no cache), else compute()'s, kept there
    (written beside it, then renamed: forks writing at once leave one whole file). A cache that
    cannot be read or written only costs the computation again; compute()'s errors are not kept."""
    if entry:
        try:
            with open(entry) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            pass
    value = compute()
    if entry:
        try:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            partial = "%s.%d.tmp" % (entry, os.getpid())
            with open(partial, "w") as handle:
                json.dump(value, handle)
            os.rename(partial, entry)
        except OSError:
            pass
    return value


def read_json(path, shown=None):
    """The JSON document of ``path``, None when the file does not exist; ValueError saying why
    (``shown``: the path to name) when it cannot be read or parsed."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BadInput("cannot read %s: %s" % (shown or path, getattr(exc, "strerror", None) or exc)) from None
