# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The settings a reboot loses, saved in one format and re-applied by one program at boot.

IRQ affinity and the unbound workqueue mask (role edge_cpu), the jetson_clocks
pin and the cpufreq/devfreq governors and limits (edge_power), PCIe TC/VC
mappings (edge_pcie_qos) and a cgroup v1 slice's RT budget (edge_cgroups) live
in /proc, sysfs, PCI config space and cgroupfs only. The module that applies
one of them saves it in STATE_DIR, a file per kind, all in one format::

    {"format": 1, "kind": "dvfs", "generated_by": "edge_dvfs", "settings": {...}}

and one unit, UNIT (installed by the role edge_boot), runs this file at every
boot::

    cd INSTALL_DIR && python3 -m ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_boot

It applies every state file in the order of KINDS, each on its own (one that
fails does not keep the others from being applied), writes a line per change
on stdout and per error on stderr, and exits 1 when any failed. ``settings``
is what the kind's module utility takes in ``boot_apply(settings, root)``,
which returns (changes, errors) as lists of lines and raises EdgeError for
settings it cannot apply at all.

On the device with its Python (3.8+), without Ansible: the role installs this
file and the module utilities it imports in the collection's package layout.
"""

import argparse
import errno
import importlib
import json
import os
import sys

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import atomic_write

FORMAT = 1
STATE_DIR = "/etc/edgetune/boot.d"
UNIT = "edgetune-boot.service"
# The package of the module utility of each kind (all of them device code).
PACKAGE = "ansible_collections.edgetune.fleet.plugins.module_utils.device"
# (kind, the module utility with its boot_apply), in the order of the boot:
# the interrupts before irqbalance starts, the clocks pinned before the DVFS
# limits go on top of them, the PCIe links, and the slice's RT budget last,
# just before the slice's services start.
KINDS = (
    ("irq_affinity", "edge_irq"),
    ("jetson_clocks", "edge_clocks"),
    ("dvfs", "edge_dvfs"),
    ("pcie_vc", "edge_pcie"),
    ("rt_budget", "edge_rt"),
)
UTILS = dict(KINDS)


def state_path(kind, state_dir=STATE_DIR):
    """Where a kind's state file is: STATE_DIR/irq-affinity.json for irq_affinity."""
    _known(kind)
    return os.path.join(state_dir, kind.replace("_", "-") + ".json")


def _known(kind):
    if kind not in UTILS:
        raise EdgeError("unknown kind of boot-time state %r (known: %s)" % (kind, ", ".join(UTILS)))


def document(kind, settings, generated_by):
    """The state file's text (sorted keys, so that the same settings give the same bytes)."""
    _known(kind)
    return json.dumps({"format": FORMAT, "kind": kind, "generated_by": generated_by, "settings": settings},
                      indent=2, sort_keys=True) + "\n"


def parse(text, path):
    """(kind, settings) of a state file's text; EdgeError naming the file and what to do."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise EdgeError("state file %s is not JSON (%s): run the role that wrote it again" % (path, exc)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("settings"), dict):
        raise EdgeError("state file %s is not an edgetune boot-time state of format %d (format, kind, settings): "
                        "run the role that wrote it again, or remove the file" % (path, FORMAT))
    kind = doc.get("kind")
    if kind not in UTILS:
        raise EdgeError("state file %s: unknown kind %r (known: %s)" % (path, kind, ", ".join(UTILS)))
    return kind, doc["settings"]


def read(path, kind):
    """(text, settings) of a kind's state file: (None, None) when there is none, settings None
    when the file is not this kind's state of this format (it is then written anew)."""
    try:
        with open(path, "r") as handle:
            text = handle.read()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, None
        raise EdgeError("cannot read state file %s: %s" % (path, exc.strerror or exc)) from None
    try:
        found, settings = parse(text, path)
    except EdgeError:
        return text, None
    return text, (settings if found == kind else None)


def sync(path, kind, settings, generated_by, check_mode):
    """Write a kind's state file where its content differs; returns (before, after) texts
    (before None when there was no file). Check mode writes nothing."""
    after = document(kind, settings, generated_by)
    before = read(path, kind)[0]
    if before != after and not check_mode:
        try:
            directory = os.path.dirname(path)
            if directory:
                os.makedirs(directory, 0o755, exist_ok=True)
            atomic_write(path, after, backup=False, mode=0o644)
        except OSError as exc:
            raise EdgeError("writing state file %s failed: %s" % (path, exc.strerror or exc)) from None
    return before, after


def sync_into(result, diff, path, kind, settings, generated_by, check_mode):
    """A module's sync of its state file: ``result`` gets state_file_changed (and changed where the
    file changes), ``diff`` the file's before and after. A failure carries the result so far."""
    try:
        before, after = sync(path, kind, settings, generated_by, check_mode)
    except EdgeError as exc:
        raise EdgeError(exc.errors, **result) from None
    result["state_file_changed"] = before != after
    if before != after:
        result["changed"] = True
        diff.append({"before_header": path, "after_header": path, "before": before or "", "after": after})


def apply_one(kind, settings, root="/"):
    """(changes, errors) of re-applying one kind's settings; never raises."""
    try:
        util = importlib.import_module(PACKAGE + "." + UTILS[kind])
        return util.boot_apply(settings, root)
    except EdgeError as exc:
        return [], exc.errors
    except Exception as exc:  # never a traceback in the boot log
        return [], ["unexpected %s: %s" % (type(exc).__name__, exc)]


def state_files(state_dir):
    """The *.json files of the directory (editor leftovers and the like are not read)."""
    try:
        names = os.listdir(state_dir)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise EdgeError("cannot list %s: %s" % (state_dir, exc.strerror or exc)) from None
    return sorted(os.path.join(state_dir, n) for n in names if n.endswith(".json") and not n.startswith("."))


def apply_dir(state_dir=STATE_DIR, root="/", out=sys.stdout, err=sys.stderr):
    """Re-apply every state file of ``state_dir``; returns the exit status (0, or 1 if any failed)."""
    status = 0
    loaded = []
    try:
        paths = state_files(state_dir)
    except EdgeError as exc:
        err.write("edgetune-boot: error: %s\n" % exc)
        return 1
    for path in paths:
        try:
            with open(path, "r") as handle:
                loaded.append(parse(handle.read(), path))
        except EdgeError as exc:
            err.write("edgetune-boot: error: %s\n" % exc)
            status = 1
        except OSError as exc:
            err.write("edgetune-boot: error: cannot read state file %s: %s\n" % (path, exc.strerror or exc))
            status = 1
    order = list(UTILS)
    for kind, settings in sorted(loaded, key=lambda entry: order.index(entry[0])):
        changes, errors = apply_one(kind, settings, root)
        for line in changes:
            out.write("edgetune-boot: %s: %s\n" % (kind, line))
        for line in errors:
            err.write("edgetune-boot: %s: error: %s\n" % (kind, line))
        if errors:
            status = 1
    out.flush()
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="edgetune-boot",
        description="Re-apply the settings a reboot loses (IRQ affinity, clocks, DVFS, PCIe TC/VC mappings, "
                    "RT budget), as the edgetune roles saved them.")
    parser.add_argument("--state-dir", default=STATE_DIR, help="the saved settings (default %(default)s)")
    parser.add_argument("--root", default="/", help="prefix for /proc and /sys paths (default /)")
    args = parser.parse_args(argv)
    return apply_dir(args.state_dir, args.root)


if __name__ == "__main__":
    raise SystemExit(main())
