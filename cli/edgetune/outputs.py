"""The files and directories the `edgetune` subcommands write (reports, inventories, packages).

Each subcommand calls check() with all its output paths before it starts
anything (ansible-playbook, twins, a VM, a build): a path that cannot be
written is one line (UsageError, exit 2) then, not a traceback at the end of
a fleet run. check() leaves nothing: it looks at the path and at its nearest
existing ancestor, and creates and removes a probe file there (a filesystem
such as /proc refuses a new file whatever the permission bits say). Missing directories below that ancestor are
fine; write_text() creates them, as the reports always did (``--junit
reports/drift.xml`` in a fresh directory).

Permissions are what access(2) says for this process (os.access): a
directory without write or search permission for an ordinary user, a
read-only filesystem for anyone. Root passes permission bits, as its writes
do. A path below a regular file (/etc/hostname/x.prom), an output file that
is a directory, or an output directory that is a file is refused for anyone.

write_text() is the write itself: atomic for a regular file (readers such as
node_exporter or CI never see half a file), in place for a device or FIFO
(/dev/stdout), and an OSError it meets is a UsageError line too.
"""
import os
import stat
import tempfile

from edgetune.errors import UsageError


def _named(option, path):
    return ("%s %s" % (option, path)) if option else str(path)


def reason(exc):
    """An OSError as a short reason: its message, and the file it is about."""
    said = exc.strerror or str(exc)
    return "%s: %s" % (said, exc.filename) if exc.filename and exc.strerror else said


def _nearest_existing(path):
    """(ancestor, its os.stat) for the nearest existing ancestor of an absolute path (at worst /)."""
    current = path
    while True:
        parent = os.path.dirname(current)
        try:
            return parent, os.stat(parent)
        except (FileNotFoundError, NotADirectoryError):
            if parent == current:  # cannot happen for an absolute path: / exists
                raise
            current = parent


def _can_create_in(directory, info):
    """None if files can be created in directory (stat info ``info``), else why not."""
    if not stat.S_ISDIR(info.st_mode):
        return "%s is not a directory" % directory
    if not os.access(directory, os.W_OK | os.X_OK):
        return "no permission to create files in %s" % directory
    try:
        handle, probe = tempfile.mkstemp(prefix=".edgetune-probe-", dir=directory)
    except OSError as exc:
        return "no file can be created in %s: %s" % (directory, exc.strerror or exc)
    os.close(handle)
    os.unlink(probe)
    return None


def problem(path, directory=False):
    """Why ``path`` cannot be written as an output file (or, with ``directory``, an output
    directory to create files in), or None if it can. Creates nothing."""
    if not str(path).strip():
        return "the path is empty"
    absolute = os.path.abspath(os.fspath(path))
    try:
        info = os.stat(absolute)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:  # e.g. EACCES on a directory above it, ELOOP
        return reason(exc)
    if info is not None:
        if directory:
            return _can_create_in(absolute, info)
        if stat.S_ISDIR(info.st_mode):
            return "it is a directory"
        if not os.access(absolute, os.W_OK):
            return "no permission to write it"
        if stat.S_ISREG(info.st_mode):
            # Replaced atomically: a new file beside it, renamed over it.
            parent = os.path.dirname(absolute)
            return _can_create_in(parent, os.stat(parent))
        return None  # a device or FIFO, written in place
    try:
        ancestor, ancestor_info = _nearest_existing(absolute)
    except OSError as exc:
        return reason(exc)
    return _can_create_in(ancestor, ancestor_info)


def check(files=(), directories=()):
    """Raise UsageError (one line naming the option) for the first output that cannot be written.

    ``files`` and ``directories``: (option, path) pairs, e.g. [("--junit", args.junit)];
    a pair whose path is None or "" (the option not given) is skipped."""
    for pairs, is_directory in ((files, False), (directories, True)):
        for option, path in pairs:
            if path is None:
                continue
            why = problem(path, directory=is_directory)
            if why:
                raise UsageError("%s cannot be written: %s" % (_named(option, path), why))


def write_text(path, text, option=None):
    """Write an output file (creating missing directories above it); a failure is one UsageError line."""
    absolute = os.path.abspath(os.fspath(path))
    try:
        try:
            info = os.stat(absolute)
        except (FileNotFoundError, NotADirectoryError):
            info = None
        if info is not None and not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
            with open(absolute, "w", encoding="utf-8") as handle:  # /dev/stdout, a FIFO: no rename over it
                handle.write(text)
            return
        os.makedirs(os.path.dirname(absolute), exist_ok=True)
        tmp = os.path.join(os.path.dirname(absolute), "." + os.path.basename(absolute) + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, absolute)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise UsageError("%s was not written: %s" % (_named(option, path), reason(exc))) from None
