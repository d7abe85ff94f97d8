"""The host's inotify limits against the twins a fleet will run (#15).

Every twin is a systemd system (PID 1, journald, logind, dbus...) whose inotify
instances and watches count against the host's root user: the twins run
without a user namespace of their own. With the default
fs.inotify.max_user_instances of 128 the 21st of 30 twins restarted in a loop
with exit 255 and no log. `twin up` checks both limits for the fleet it is
asked for before booting any twin: it raises them as root (as it installs
Docker as root) and says so, or fails with the sysctl and the value to set.
"""
import math
import os
import subprocess
from pathlib import Path

from edgetune.errors import UsageError

PROC_SYS = "/proc/sys"
LIMITS = ("max_user_instances", "max_user_watches")
# Use per twin when no twin is running to measure one. Instances: 20 twins and
# the host's own use filled 128 (#15), about 6 each. Watches: not measured here;
# systemd watches its unit directories and each unit's cgroup, a few hundred.
PER_TWIN = {"max_user_instances": 6, "max_user_watches": 300}
# What the host itself uses beside the twins (its own systemd, dockerd, editors).
HOST_RESERVE = {"max_user_instances": 32, "max_user_watches": 2048}
MARGIN = 1.5
# Inside a running twin: its inotify instances (file descriptors), then its watches.
MEASURE_SCRIPT = ("ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c 'anon_inode:inotify'; "
                  "cat /proc/[0-9]*/fdinfo/* 2>/dev/null | grep -c '^inotify wd:'")


def sysctl_name(limit):
    return "fs.inotify." + limit


def limit_path(limit, proc_sys):
    return Path(proc_sys) / "fs" / "inotify" / limit


def running_as_root():
    return os.geteuid() == 0


def measure_twin(name):
    """{limit: use} of one running twin, counted inside it with `docker exec`; None if it cannot be read."""
    result = subprocess.run(["docker", "exec", name, "sh", "-c", MEASURE_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, check=False)
    counts = result.stdout.split()
    if len(counts) != 2 or not all(count.isdigit() for count in counts):
        return None
    return dict(zip(LIMITS, (int(count) for count in counts)))


def needed(twin_count, per_twin):
    """{limit: value} for this many twins, with the margin and the host's own use."""
    return {limit: HOST_RESERVE[limit] + math.ceil(twin_count * max(per_twin[limit], 1) * MARGIN)
            for limit in LIMITS}


def ensure_limits(twin_count, say=print, sample_twin=None):
    """Check (and as root raise) both limits for ``twin_count`` twins; ``sample_twin``: a running
    twin to measure the use per twin on (else PER_TWIN). Raises UsageError: the sysctl, the value."""
    measured = measure_twin(sample_twin) if sample_twin else None
    per_twin = measured or PER_TWIN
    basis = "measured on %s" % sample_twin if measured else "estimated"
    for limit, want in needed(twin_count, per_twin).items():
        path = limit_path(limit, PROC_SYS)
        have = int(path.read_text().split()[0])
        if have >= want:
            continue
        # The next power of two, as these limits are usually set (128, 8192, 524288).
        value = 1 << (want - 1).bit_length()
        what = "%s is %d; %d twins need about %d (%d per twin %s, with margin)" % (
            sysctl_name(limit), have, twin_count, want, per_twin[limit], basis)
        if not running_as_root():
            raise UsageError("%s: run `sysctl -w %s=%d` as root (and add it to /etc/sysctl.d/ to keep it), "
                              "then `edgetune-dev twin up` again" % (what, sysctl_name(limit), value))
        try:
            write_limit(path, value)
        except OSError as exc:
            raise UsageError("%s, and it cannot be raised here (%s): run `sysctl -w %s=%d` on the host"
                              % (what, exc.strerror or exc, sysctl_name(limit), value)) from None
        say("raised %s from %d to %d for %d twins (not kept across reboots: add it to /etc/sysctl.d/ to keep it)"
            % (sysctl_name(limit), have, value, twin_count))


def write_limit(path, value):
    path.write_text("%d\n" % value)
