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
import os
import shutil
import stat
import tempfile
import time

BACKUP_MARKER = ".edgetune-"
BACKUP_SUFFIX = ".bak"
BACKUPS_KEPT = 3
NEW_FILE_MODE = 0o644


def read_text(path):
    """Return the file's text exactly as stored (line endings untouched)."""
    with open(path, "r", encoding="utf-8", newline="") as handle:
        return handle.read()


def backup_files(path):
    """Return this file's edgetune backups, oldest first."""
    pattern = glob.escape(path) + BACKUP_MARKER + "*" + BACKUP_SUFFIX
    # The timestamp in the name sorts chronologically as text.
    return sorted(glob.glob(pattern))


def make_backup(path):
    """Copy ``path`` to ``<path>.edgetune-<UTC timestamp>.bak``; keep the newest few."""
    now = time.time()
    # Microseconds keep two runs within one second from sharing a name.
    micros = int(now % 1 * 1e6)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{micros:06d}Z"
    backup_path = path + BACKUP_MARKER + stamp + BACKUP_SUFFIX
    shutil.copy2(path, backup_path)
    for old in backup_files(path)[:-BACKUPS_KEPT]:
        try:
            os.unlink(old)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
    return backup_path


def fsync_directory(directory):
    """Flush a directory entry change (our rename) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data, backup=True, mode=None):
    """Replace ``path`` with ``data`` (str or bytes) atomically.

    The original's mode, uid and gid are kept (``mode`` overrides the mode; a
    new file gets ``mode`` or 0644).  With ``backup`` and an existing file, the
    original is first copied next to it (see :func:`make_backup`).

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
    if backup and original is not None:
        backup_path = make_backup(path)

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
        os.rename(temp_path, path)
    except BaseException:
        try:
            os.unlink(temp_path)
        except OSError:
            pass
        raise
    fsync_directory(directory)
    return backup_path
