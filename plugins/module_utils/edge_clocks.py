# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``jetson_clocks --show`` says, and whether the clocks are pinned: read by the
edge_jetson_clocks module (which pins and restores them) and by the drift audit.
Python 3.8+, stdlib only.

Pinned means every online CPU shows MinFreq equal to MaxFreq, the GPU too, and the EMC
FreqOverride=1 where the release prints that field (newer r36 releases do not; then the EMC is
not judged). Offline CPUs are not judged (AGX Orin MODE_30W takes cpu8-11 offline).
"""

import os
import re
import shutil

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
        raise ValueError("no 'cpuN: ... MinFreq=... MaxFreq=...' line in the output: %r" % text.strip()[:300])
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
