# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``jetson_clocks --show`` says, whether the clocks are pinned, and pinning or restoring
them with jetson_clocks: used by the edge_jetson_clocks module, by the boot program (edge_boot,
kind ``jetson_clocks``: store the clocks when they are not pinned, then pin them) and by the
drift audit. Python 3.8+, stdlib only.

Pinned means every online CPU shows MinFreq equal to MaxFreq, the GPU too, and the EMC
FreqOverride=1 where the release prints that field (newer r36 releases do not; then the EMC is
not judged). Offline CPUs are not judged (AGX Orin MODE_30W takes cpu8-11 offline).
"""

import os
import re
import shutil

from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_command
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, EdgeError

DEFAULT_STORE_FILE = "/var/lib/edgetune/jetson_clocks.conf"

# "cpu4:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1728000 CurrentFreq=1728000 IdleStates: ..."
# r35 and r36.4.3 print Online=; later r36 releases drop it (L4T's jetson_clocks script). Offline CPUs may
# show empty values, so every value is optional here.
_CPU_RE = re.compile(r"^cpu(\d+):\s+(?:Online=(\d)\s+)?Governor=(\S*)\s+MinFreq=(\S*)\s+MaxFreq=(\S*)"
                     r"\s+CurrentFreq=(\S*)")
_ONLINE_RE = re.compile(r"^Online CPUs:\s*([0-9,\-]*)")
_GPU_RE = re.compile(r"^GPU MinFreq=(\S*)\s+MaxFreq=(\S*)\s+CurrentFreq=(\S*)")
_EMC_RE = re.compile(r"^EMC MinFreq=(\S*)\s+MaxFreq=(\S*)\s+CurrentFreq=(\S*)(?:\s+FreqOverride=(\d+))?")
_MODE_RE = re.compile(r"^NV Power Mode:\s*(\S+)")


def _int(text):
    return int(text) if text and text.isdigit() else None


def _cpus(text):
    cpus = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, _sep, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def parse_show(text):
    """``jetson_clocks --show`` -> {cpus: {n: {...}}, gpu, emc, power_mode}.

    ValueError when no CPU line is found (not jetson_clocks output).
    """
    show = {"cpus": {}, "gpu": None, "emc": None, "power_mode": None}
    online_header = None
    for raw in text.splitlines():
        line = raw.strip()
        match = _CPU_RE.match(line)
        if match:
            number, online, governor, low, high, cur = match.groups()
            show["cpus"][int(number)] = {
                "online": None if online is None else online == "1", "governor": governor,
                "min": _int(low), "max": _int(high), "cur": _int(cur)}
            continue
        match = _ONLINE_RE.match(line)
        if match:
            online_header = _cpus(match.group(1))
            continue
        match = _GPU_RE.match(line)
        if match:
            show["gpu"] = {"min": _int(match.group(1)), "max": _int(match.group(2)), "cur": _int(match.group(3))}
            continue
        match = _EMC_RE.match(line)
        if match:
            override = match.group(4)
            show["emc"] = {"min": _int(match.group(1)), "max": _int(match.group(2)), "cur": _int(match.group(3)),
                           "override": None if override is None else int(override)}
            continue
        match = _MODE_RE.match(line)
        if match:
            show["power_mode"] = match.group(1)
    if not show["cpus"]:
        raise BadInput("no 'cpuN: ... MinFreq=... MaxFreq=...' line in the output: %r" % text.strip()[:300])
    for number, cpu in show["cpus"].items():
        if cpu["online"] is None:
            # Newer releases: the header line tells; without it every listed CPU counts.
            cpu["online"] = online_header is None or number in online_header
    return show


def not_pinned(show):
    """The clocks that are not pinned, one line each; empty when everything is pinned."""
    found = []
    for number in sorted(show["cpus"]):
        cpu = show["cpus"][number]
        if cpu["online"] and (cpu["min"] is None or cpu["min"] != cpu["max"]):
            found.append("cpu%d: MinFreq=%s MaxFreq=%s" % (number, cpu["min"], cpu["max"]))
    gpu = show["gpu"]
    if gpu is not None and (gpu["min"] is None or gpu["min"] != gpu["max"]):
        found.append("GPU MinFreq=%s MaxFreq=%s" % (gpu["min"], gpu["max"]))
    emc = show["emc"]
    if emc is not None and emc["override"] is not None and emc["override"] != 1:
        found.append("EMC FreqOverride=%d" % emc["override"])
    return found


def summary(show, pinned_prediction=False):
    """Diff text: one line per online CPU, the GPU and the EMC.

    With ``pinned_prediction``, what ``jetson_clocks`` leaves: every minimum at its maximum and
    the EMC locked.
    """
    lines = []
    for number in sorted(show["cpus"]):
        cpu = show["cpus"][number]
        if cpu["online"]:
            low = cpu["max"] if pinned_prediction else cpu["min"]
            lines.append("cpu%d: MinFreq=%s MaxFreq=%s\n" % (number, low, cpu["max"]))
    gpu = show["gpu"]
    if gpu is not None:
        low = gpu["max"] if pinned_prediction else gpu["min"]
        lines.append("GPU: MinFreq=%s MaxFreq=%s\n" % (low, gpu["max"]))
    emc = show["emc"]
    if emc is not None:
        if emc["override"] is not None:
            override = 1 if pinned_prediction else emc["override"]
            lines.append("EMC: FreqOverride=%d\n" % override)
        else:
            current = emc["max"] if pinned_prediction else emc["cur"]
            lines.append("EMC: CurrentFreq=%s MaxFreq=%s\n" % (current, emc["max"]))
    return "".join(lines)


def find_program(name="jetson_clocks"):
    """jetson_clocks on PATH, else in /usr/bin or /usr/sbin (L4T's nvidia-l4t-tools); None when absent."""
    return shutil.which(name) or next(
        (os.path.join(d, name) for d in ("/usr/bin", "/usr/sbin") if os.path.isfile(os.path.join(d, name))), None)


# --------------------------------------------------------------------------
# Running jetson_clocks. ``run_command(argv)`` returns (rc, stdout, stderr): the module and the boot
# program pass subprocess_run (a jetson_clocks that hangs is killed after edge_command's limit).

def subprocess_run(argv):
    return edge_command.run(argv)


def _run(run_command, argv):
    rc, out, err = run_command(argv)
    if rc != 0:
        raise EdgeError("%s failed with rc=%d: %s" % (" ".join(argv), rc, (err or out).strip()[-300:]),
                        rc=rc, stdout=out, stderr=err)
    return out


def read_show(program, run_command):
    argv = [program, "--show"]
    out = _run(run_command, argv)
    try:
        return parse_show(out)
    except ValueError as exc:
        raise EdgeError("cannot read the clocks from %s: %s" % (" ".join(argv), exc), stdout=out) from None


def store(program, store_file, run_command):
    directory = os.path.dirname(store_file)
    if directory and not os.path.isdir(directory):
        try:
            os.makedirs(directory, 0o755)
        except OSError as exc:
            raise EdgeError("cannot create %s for the store file: %s" % (directory, exc.strerror or exc)) from None
    _run(run_command, [program, "--store", store_file])
    if not os.path.isfile(store_file) or os.path.getsize(store_file) == 0:
        raise EdgeError("%s --store %s left no saved values; nothing was pinned" % (program, store_file))


def read_store(store_file):
    """The store file's ``/sys/path:value`` lines as a dict."""
    try:
        with open(store_file) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise EdgeError("cannot read %s: %s" % (store_file, exc.strerror or exc)) from None
    values = {}
    for line in lines:
        path, sep, value = line.strip().rpartition(":")
        if sep and path:
            values[path] = value
    return values


def run(params, check_mode, want_diff, run_command, find_command):
    """Read, decide, act unless in check mode, read back. Returns the result dict.

    ``params``: state (pinned or restored), store_file, jetson_clocks_path (None: ``find_command``
    finds jetson_clocks). EdgeError (with result keys as details) when it cannot be done."""
    program = params.get("jetson_clocks_path") or find_command("jetson_clocks")
    if not program:
        raise EdgeError("jetson_clocks was not found on PATH nor in /usr/bin; it ships with L4T "
                        "(nvidia-l4t-tools): install it or set jetson_clocks_path")
    if params.get("jetson_clocks_path") and not os.access(program, os.X_OK):
        raise EdgeError("jetson_clocks_path %s is not an executable file" % program)
    store_file = params.get("store_file") or DEFAULT_STORE_FILE
    before = read_show(program, run_command)
    unpinned = not_pinned(before)
    result = {
        "changed": False, "pinned_before": not unpinned, "pinned": not unpinned,
        "stored": False, "restored": False, "store_file": store_file,
        "not_pinned": unpinned, "power_mode": before["power_mode"],
    }
    after_text = None
    if params["state"] == "pinned" and unpinned:
        result.update(changed=True, stored=True, pinned=True)
        if check_mode:
            after_text = summary(before, pinned_prediction=True)
        else:
            store(program, store_file, run_command)
            _run(run_command, [program])
            after = read_show(program, run_command)
            left = not_pinned(after)
            if left:
                raise EdgeError("jetson_clocks ran but these clocks are not pinned: %s" % "; ".join(left),
                                stored=True, not_pinned=left)
            after_text = summary(after)
    elif params["state"] == "restored" and not unpinned:
        if not os.path.isfile(store_file):
            raise EdgeError(
                "the clocks are pinned but %s, with the values from before pinning, does not exist: "
                "nothing was changed; reboot (or switch the nvpmodel mode) to reset the clocks" % store_file)
        result.update(changed=True, restored=True, pinned=False, saved_values=read_store(store_file))
        if check_mode:
            after_text = "restored from %s\n" % store_file
        else:
            _run(run_command, [program, "--restore", store_file])
            after = read_show(program, run_command)
            if not not_pinned(after):
                raise EdgeError("jetson_clocks --restore %s left the clocks pinned: the file holds pinned "
                                "values; reboot to reset the clocks" % store_file, restored=True)
            after_text = summary(after)
    if want_diff:
        before_text = summary(before)
        result["diff"] = {"before_header": "jetson_clocks", "after_header": "jetson_clocks",
                          "before": before_text, "after": before_text if after_text is None else after_text}
    return result


# --------------------------------------------------------------------------
# Boot-time pin (edge_boot, kind jetson_clocks)

def boot_settings(store_file, program):
    """The settings of the jetson_clocks state file (what boot_apply takes); EdgeError when the
    boot program could not use them (relative paths: it runs from another directory)."""
    problems = []
    if not isinstance(store_file, str) or not os.path.isabs(store_file):
        problems.append("jetson_clocks settings: store_file must be an absolute path, not %r" % (store_file,))
    if program is not None and (not isinstance(program, str) or not os.path.isabs(program)):
        problems.append("jetson_clocks settings: program must be null (jetson_clocks on PATH, /usr/bin or "
                        "/usr/sbin) or an absolute path, not %r" % (program,))
    if problems:
        raise EdgeError(problems)
    return {"store_file": store_file, "program": program}


def boot_apply(settings, root):
    """Pin the clocks at boot, after nvpmodel has set the power mode: save them with
    ``jetson_clocks --store`` when they are not pinned, then run ``jetson_clocks``.

    ``settings``: {"store_file": "/var/lib/edgetune/jetson_clocks.conf", "program": null or
    "/usr/bin/jetson_clocks"}. ``root`` is not used: jetson_clocks (found on PATH, /usr/bin or
    /usr/sbin, or the absolute ``program``) acts on the running system's sysfs itself. Returns
    (changes, errors), one line; EdgeError for malformed settings."""
    if not isinstance(settings, dict):
        raise EdgeError("jetson_clocks settings must be a mapping with store_file and program, not %r"
                        % (settings,))
    checked = boot_settings(settings.get("store_file"), settings.get("program"))
    params = {"state": "pinned", "store_file": checked["store_file"], "jetson_clocks_path": checked["program"]}
    try:
        result = run(params, False, False, subprocess_run, find_program)
    except EdgeError as exc:
        return [], exc.errors
    except OSError as exc:
        return [], ["cannot run %s: %s" % (checked["program"] or "jetson_clocks", exc.strerror or exc)]
    mode = " (NV Power Mode: %s)" % result["power_mode"] if result["power_mode"] else ""
    if result["changed"]:
        return ["saved the clocks to %s and pinned them%s" % (checked["store_file"], mode)], []
    return ["clocks already pinned%s" % mode], []
