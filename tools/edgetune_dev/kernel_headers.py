"""The running kernel's headers where bcc looks for them: /lib/modules/$(uname -r)/build.

bcc compiles edge_netqos's classifier against them: on this host for the
integration tests and the benchmark, and in the device twins, which share this
host's kernel and see these directories read-only (twin/manager.py). When the
running kernel has no headers there (a cloud or CI kernel), the distribution's
generic headers package is installed and linked in: build -> its -ARCH
directory, source -> its -common sibling. The tc/BPF UAPI the classifier uses
is stable, so older headers compile a program the newer kernel loads.

    python3 -m edgetune_dev.kernel_headers     # for shell scripts (tools/setup-netqos-host)
"""
import os
import platform
import sys
from pathlib import Path

from edgetune_dev import host_packages
from edgetune.errors import UsageError

MODULES_DIR = Path("/lib/modules")
SOURCES_DIR = Path("/usr/src")
# Debian's architecture names, by what uname -m says.
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def modules_dir():
    return MODULES_DIR / os.uname().release


def present():
    return (modules_dir() / "build").is_dir()


def package():
    """Debian's package of the newest generic headers for this architecture ({package: []}, as require() takes it)."""
    arch = DEBIAN_ARCH.get(platform.machine())
    if arch is None:
        raise UsageError("no Debian kernel headers package known for %s: put the running kernel's headers at %s/build"
                         % (platform.machine(), modules_dir()))
    return {"linux-headers-" + arch: []}


def version_key(path):
    """linux-headers-6.1.0-10-amd64 after linux-headers-6.1.0-9-amd64 (numbers compared as numbers)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.name.replace("-", ".").split(".")]


def newest_generic():
    """(build, source) of the newest linux-headers-VERSION-ARCH under SOURCES_DIR, else None."""
    arch = DEBIAN_ARCH.get(platform.machine(), "")
    builds = sorted((p for p in SOURCES_DIR.glob("linux-headers-*-%s" % arch) if p.is_dir()), key=version_key)
    if not builds:
        return None
    build = builds[-1]
    return build, build.with_name(build.name[:-len(arch)] + "common")


def ensure(say=print):
    """Install and link the headers unless the running kernel has them; returns what was done, one line each."""
    target = modules_dir()
    if present():
        return ["%s/build: present (%s), left alone" % (target, (target / "build").resolve())]
    host_packages.require(package(), say)
    done = []
    found = newest_generic()
    if found is None:
        raise UsageError("no %s/linux-headers-*-%s after installing %s" % (SOURCES_DIR, DEBIAN_ARCH[platform.machine()],
                                                                            " ".join(package())))
    build, source = found
    if not source.is_dir():
        raise UsageError("%s is missing (%s is incomplete)" % (source, " ".join(package())))
    target.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target / "build"):  # a link to headers that are gone (removed with an older package)
        done.append("replaced %s/build -> %s, which no longer exists" % (target, os.readlink(target / "build")))
        (target / "build").unlink()
    (target / "build").symlink_to(build)
    done.append("linked %s/build -> %s" % (target, build))
    if os.path.lexists(target / "source"):
        done.append("%s/source: present, left alone" % target)
    else:
        (target / "source").symlink_to(source)
        done.append("linked %s/source -> %s" % (target, source))
    return done


def main():
    try:
        for line in ensure(say=lambda message: print(message, flush=True)):
            print(line)
    except UsageError as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
