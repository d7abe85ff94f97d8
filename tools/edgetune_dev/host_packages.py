"""Debian packages the tools install on the host (as root, as they install Docker): every apt run goes through here.

One apt run at a time: a lock for the threads of this process (the twin image
builders run in parallel) and a lock file for other edgetune processes (make
test runs the VM scenario beside the rest); apt itself waits for a foreign
holder of its own lock. What is missing is looked at again under the locks, so
a package another caller has just installed is not installed twice. A failure
shows apt's own last lines.

    python3 -m edgetune_dev.host_packages PACKAGE...   # for shell scripts (tools/setup-netqos-host)
"""
import contextlib
import fcntl
import glob
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from edgetune.errors import UsageError

LOCK_FILE = "/var/lock/edgetune-apt.lock"
# Seconds apt waits for another program's hold on its lock (unattended-upgrades, an operator).
APT_LOCK_TIMEOUT = 600
APT_LINES = 3

_in_this_process = threading.Lock()


def is_debian_root():
    return os.geteuid() == 0 and Path("/etc/debian_version").exists() and shutil.which("apt-get") is not None


def present(evidence):
    """A command on PATH, or a file (an absolute path)."""
    return Path(evidence).exists() if os.path.isabs(evidence) else shutil.which(evidence) is not None


def dpkg_installed(package):
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, check=False)
    return status.returncode == 0 and status.stdout.endswith(" installed")


def missing(wanted):
    """wanted: {package: [commands or files it provides]} (none listed: ask dpkg) -> the packages to install."""
    return sorted(package for package, evidence in wanted.items()
                  if not (all(present(e) for e in evidence) if evidence else dpkg_installed(package)))


def require(wanted, say=print):
    """Install what is missing of ``wanted`` (see missing()) in one apt run; returns what was installed."""
    with _in_this_process:
        if not missing(wanted):
            return []
        if not is_debian_root():
            needed = " ".join(missing(wanted))
            raise UsageError("missing host packages %s: install them (Debian: apt-get install %s)" % (needed, needed))
        with _other_processes():
            packages = missing(wanted)  # another edgetune process may have installed them meanwhile
            if packages:
                say("installing Debian's %s" % " ".join(packages))
                apt_get("update", "-qq")
                apt_get("install", "-y", "-qq", *packages)
            return packages


@contextlib.contextmanager
def _other_processes():
    os.makedirs(os.path.dirname(LOCK_FILE), exist_ok=True)
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def apt_get(*args, cwd=None):
    argv = ["apt-get", "-o", "DPkg::Lock::Timeout=%d" % APT_LOCK_TIMEOUT, *args]
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False, cwd=cwd,
                            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-APT_LINES:]
        raise UsageError("apt-get %s failed (exit %d): %s" % (" ".join(a for a in args if not a.startswith("-")),
                                                              result.returncode, " | ".join(said)))


def download(package, directory, say=print):
    """The path of ``package``'s .deb for this host's Debian release, fetched once into ``directory`` with
    apt-get (for a twin of the same release, which has no network)."""
    found = sorted(glob.glob(os.path.join(directory, "%s_*.deb" % package)))
    if found:
        return found[-1]
    os.makedirs(directory, exist_ok=True)
    with _other_processes():
        say("downloading Debian's %s" % package)
        apt_get("update", "-qq")
        apt_get("download", "-o", "APT::Sandbox::User=root", "-o", "Dir::Cache::archives=" + directory, package,
                cwd=directory)
    found = sorted(glob.glob(os.path.join(directory, "%s_*.deb" % package)))
    if not found:
        raise UsageError("apt-get download %s left no .deb in %s" % (package, directory))
    return found[-1]


def main(argv=None):
    packages = sys.argv[1:] if argv is None else argv
    try:
        installed = require({package: [] for package in packages}, say=lambda message: print(message, flush=True))
    except UsageError as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    already = sorted(set(packages) - set(installed))
    if already:
        print("already installed: %s" % " ".join(already))
    return 0


if __name__ == "__main__":
    sys.exit(main())
