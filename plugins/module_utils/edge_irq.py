# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which interrupts may move, and where they should be: shared by the edge_irq_affinity
module (which moves them), its boot-time command, and the drift audit (which only reads).

Reading only: /proc/irq/<n>/smp_affinity_list (or smp_affinity), /proc/interrupts,
the online CPUs and the module's state file.  Nothing here writes.  Python 3.8+, stdlib.

Classification of one interrupt against the housekeeping CPUs:

``ok``    its affinity is exactly the housekeeping CPUs;
``kept``  it lies inside them (pinned to a subset on purpose; with keep_subsets);
``move``  it reaches other CPUs.  Per-CPU and managed interrupts refuse a move
          (the kernel answers EIO): ``hint`` names why when /proc/interrupts
          says so, ``known_refused`` when the state file recorded a refusal.
"""
import errno
import json
import os
import re

try:
    from ansible_collections.edgetune.fleet.plugins.module_utils.edge_cpulist import (
        format_cpulist, parse_cpulist, parse_cpumask)
except ImportError:  # the boot-time command without Ansible: edge_cpulist.py beside this file
    from edge_cpulist import format_cpulist, parse_cpulist, parse_cpumask

STATE_FORMAT = 1
IRQ_DIR = "proc/irq"
INTERRUPTS = "proc/interrupts"
CPU_ONLINE = "sys/devices/system/cpu/online"
DEFAULT_AFFINITY = IRQ_DIR + "/default_smp_affinity"
WORKQUEUE_MASK = "sys/devices/virtual/workqueue/cpumask"

# What the kernel answers to an affinity write it will not do (irq_can_set_affinity_usr()
# is false for per-CPU and managed interrupts: EIO); EPERM where the file is locked,
# ENOSPC where the target CPUs have no free vector (x86).
REFUSALS = {errno.EIO: "EIO", errno.EPERM: "EPERM", errno.ENOSPC: "ENOSPC"}

# Hints from /proc/interrupts. GIC PPIs (hwirq 16-31) are per-CPU by definition.
PERCPU_NAMES = re.compile(r"^(arch_timer|arch_mem_timer|arm-pmu|arm_pmu|kvm guest [pv]timer|vgic)$")
MANAGED_NAMES = (re.compile(r"^nvme\d+q[1-9]\d*$"), re.compile(r"^virtio\d+-(req|request)\.\d+$"))
_ROW = re.compile(r"^\s*(\d+):\s+(.*)$")
_DESC = re.compile(r"^(?P<chip>\S+)\s+(?P<hwirq>\d+)(?:-|\s+)(?P<trigger>[A-Za-z]+)(?:\s+(?P<name>.*))?$")


class IrqError(Exception):
    """Expected failure: one message per problem, plus result keys for fail_json."""

    def __init__(self, errors, **details):
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))
        self.details = details


def under(root, path):
    return os.path.join(root or "/", path.lstrip("/"))


def read_value(path):
    with open(path, "r") as handle:
        return handle.read().strip()


def parse_interrupts(text):
    """/proc/interrupts -> {irq: {chip, hwirq, trigger, name}} for the numbered rows.

    The columns after the per-CPU counts differ by architecture: arm64 prints
    ``GICv3  30 Level  arch_timer``, x86 ``IR-PCI-MSI 524288-edge  nvme0q0``.
    Rows without a number (IPI0, LOC, NMI, ...) have no /proc/irq entry and are skipped.
    """
    lines = text.splitlines()
    if not lines:
        return {}
    ncpus = len(re.findall(r"CPU\d+", lines[0]))
    found = {}
    for line in lines[1:]:
        match = _ROW.match(line)
        if not match:
            continue
        fields = match.group(2).split()
        rest = fields[ncpus:] if all(f.isdigit() for f in fields[:ncpus]) else fields
        desc = " ".join(rest)
        parsed = _DESC.match(desc)
        if parsed:
            info = {"chip": parsed.group("chip"), "hwirq": int(parsed.group("hwirq")),
                    "trigger": parsed.group("trigger"), "name": (parsed.group("name") or "").strip()}
        else:
            info = {"chip": rest[0] if rest else "", "hwirq": None, "trigger": "",
                    "name": " ".join(rest[1:])}
        found[int(match.group(1))] = info
    return found


def read_interrupts(root):
    try:
        return parse_interrupts(read_value(under(root, INTERRUPTS)))
    except OSError:
        return {}


def read_irqs(root):
    """Every /proc/irq/<n> with its affinity file: list of dicts sorted by number."""
    base = under(root, IRQ_DIR)
    try:
        names = os.listdir(base)
    except OSError as exc:
        raise IrqError(["cannot read %s: %s (is /proc mounted?)" % (base, exc.strerror or exc)]) from None
    irqs = []
    for name in sorted((n for n in names if n.isdigit()), key=int):
        directory = os.path.join(base, name)
        listfile = os.path.join(directory, "smp_affinity_list")
        maskfile = os.path.join(directory, "smp_affinity")
        if os.path.exists(listfile):
            path, text = listfile, read_value(listfile)
            cpus = parse_cpulist(text)
        elif os.path.exists(maskfile):
            path, text = maskfile, read_value(maskfile)
            cpus = parse_cpumask(text)
        else:
            continue  # an interrupt without an affinity file cannot be steered at all
        irqs.append({"irq": int(name), "path": path, "affinity": cpus, "mask_width": len(text.replace(",", ""))})
    return irqs


def hint(info, patterns):
    """Why this interrupt is probably not movable, or None."""
    name, chip, hwirq = info.get("name", ""), info.get("chip", ""), info.get("hwirq")
    if chip.upper().startswith("GIC") and hwirq is not None and 16 <= hwirq <= 31:
        return "per-CPU interrupt (GIC PPI %d)" % hwirq
    if PERCPU_NAMES.match(name):
        return "per-CPU interrupt (%s)" % name
    if any(p.match(name) for p in MANAGED_NAMES):
        return "managed interrupt (multi-queue device: %s)" % name
    for pattern in patterns:
        if pattern.search(name):
            return "named unmovable by unmovable_names (%s)" % pattern.pattern
    return None


def compile_patterns(unmovable_names):
    try:
        return [re.compile(p) for p in unmovable_names or []]
    except re.error as exc:
        raise IrqError(["unmovable_names: bad regular expression: %s" % exc]) from None


def refused_key(irq, name):
    return "%d %s" % (irq, name)


def validate_cpus(root, text):
    """The housekeeping CPU list -> sorted CPUs; IrqError when empty, malformed or offline."""
    try:
        cpus = parse_cpulist(text)
    except ValueError as exc:
        raise IrqError(["cpus: %s" % exc]) from None
    if not cpus:
        raise IrqError(["cpus is empty: give the housekeeping CPUs, for example 0-3"])
    online_path = under(root, CPU_ONLINE)
    try:
        online = parse_cpulist(read_value(online_path))
    except (OSError, ValueError) as exc:
        raise IrqError(["cannot read the online CPUs from %s: %s" % (online_path, exc)]) from None
    offline = [c for c in cpus if c not in online]
    if offline:
        raise IrqError(["housekeeping CPUs %s are not online (online: %s); nothing was changed"
                        % (format_cpulist(offline), format_cpulist(online))])
    return cpus


def classify(irqs, interrupts, wanted, keep_subsets=True, patterns=(), known_refused=()):
    """Each interrupt of read_irqs() with name, chip, status (ok, kept, move), hint and known_refused."""
    known = set(known_refused or [])
    classified = []
    for item in irqs:
        info = interrupts.get(item["irq"], {})
        entry = dict(item, name=info.get("name", ""), chip=info.get("chip", ""), hint=None, known_refused=False)
        current = item["affinity"]
        if current == wanted:
            entry["status"] = "ok"
        elif keep_subsets and current and set(current) <= set(wanted):
            entry["status"] = "kept"
        else:
            entry["status"] = "move"
            entry["hint"] = hint(info, patterns)
            entry["known_refused"] = refused_key(item["irq"], entry["name"]) in known
        classified.append(entry)
    return classified


def mask_target(before, wanted, keep_subsets=True):
    """Where a mask file (default_smp_affinity, workqueue cpumask) should be."""
    return before if (keep_subsets and before and set(before) <= set(wanted)) else list(wanted)


def read_state(path):
    """(text, document) of the module's state file; (None, None) when it does not exist."""
    try:
        with open(path, "r") as handle:
            text = handle.read()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, None
        raise IrqError(["cannot read state file %s: %s" % (path, exc.strerror or exc)]) from None
    try:
        doc = json.loads(text)
    except ValueError:
        return text, None
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        return text, None
    return text, doc


def known_refusals(doc):
    refused = (doc or {}).get("refused") or []
    return {refused_key(r["irq"], r.get("name", "")) for r in refused
            if isinstance(r, dict) and isinstance(r.get("irq"), int)}
