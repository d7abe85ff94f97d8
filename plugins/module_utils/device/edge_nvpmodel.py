# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse NVIDIA nvpmodel configuration files and ``nvpmodel`` output.

Runs on the device (Python 3.8+, stdlib only).

File format (NVIDIA's own comment block in every ``nvpmodel_*.conf``)::

    < PARAM TYPE=FILE|CLOCK NAME=<param> >      then "ARG_NAME /sys/path" lines
    < POWER_MODEL ID=<n> NAME=<name> >          then "PARAM ARG VALUE" lines
    < PM_CONFIG DEFAULT=<n> >                   mandatory

NVIDIA's files contain one header written ``<PARAM TYPE=CLOCK NAME=EMC >``
(no space after ``<``), so headers are matched loosely.  Tabs, CRLF line ends,
comments and a missing final newline are tolerated.  A file without any
POWER_MODEL, or without PM_CONFIG, is refused: nvpmodel itself requires both.

What ``nvpmodel`` prints (L4T's nvpmodel; rbonghi/jetson_stats parses the same lines)::

    nvpmodel -q            NVPM WARN: fan mode is not set!     (optional warnings)
                           NV Power Mode: MODE_30W
                           2
    nvpmodel -q --verbose  NVPM VERB: Current mode: NV Power Mode: MODE_30W
                           2
                           NVPM VERB: PARAM CPU_ONLINE: ARG CORE_8: PATH /sys/...: REAL_VAL: 0 CONF_VAL: 0
"""

import re
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

DEFAULT_CONF = "/etc/nvpmodel.conf"
DEFAULT_STATUS_FILE = "/var/lib/nvpmodel/status"

# "< KIND attrs >"; the space after "<" and before ">" is optional.
_HEADER_RE = re.compile(r"^<\s*(PARAM|POWER_MODEL|PM_CONFIG)\b(.*?)>\s*$")
_ATTR_RE = re.compile(r"([A-Za-z_]+)\s*=\s*(\S+)")
_POWER_MODE_RE = re.compile(r"NV Power Mode:\s*(\S+)")
_VERBOSE_PARAM_RE = re.compile(
    r"PARAM (?P<param>\S+): ARG (?P<arg>\S+): PATH (?P<path>\S+): "
    r"REAL_VAL: (?P<real>\S*) CONF_VAL: (?P<conf>\S*)"
)
# The prompt nvpmodel shows when the new mode can only be applied by a reboot.
REBOOT_REQUIRED_TEXT = "Reboot required for changing to this power mode"


class Mode:
    """One ``< POWER_MODEL >`` section: its id, name and ordered settings."""

    def __init__(self, mode_id, name):
        self.id = mode_id
        self.name = name
        # (param, arg, value) in file order: nvpmodel applies them in this order.
        self.settings = []

    def value(self, param, arg):
        """The value this mode gives ``param``/``arg``, or None."""
        for p_name, a_name, val in self.settings:
            if p_name == param and a_name == arg:
                return val
        return None

    def boot_only_settings(self):
        """Settings that only a reboot can change on a running board.

        The GPU power-gating masks (TPC/FBP) cannot change once the GPU's
        golden context exists; jetson_stats refuses a switch between modes
        whose TPC_PG_MASK differ without ``force`` (which reboots).  On every
        Orin conf the CPU_ONLINE set changes together with the masks, and a
        pending mode shows as CPU_ONLINE REAL_VAL != CONF_VAL, so both count.
        """
        return {
            (p, a): v
            for p, a, v in self.settings
            if p == "CPU_ONLINE" or p.endswith("_POWER_GATING")
        }

    def online_cpus(self):
        """Sorted core numbers this mode puts online (CPU_ONLINE CORE_n 1)."""
        cores = []
        for p_name, a_name, val in self.settings:
            if p_name == "CPU_ONLINE" and val.strip() == "1" and a_name.startswith("CORE_"):
                try:
                    cores.append(int(a_name[len("CORE_"):]))
                except ValueError:
                    pass
        return sorted(cores)

    def __repr__(self):
        return f"Mode({self.id}, {self.name!r})"


class NvpConf:
    """A parsed nvpmodel.conf."""

    def __init__(self, params, modes, default_id):
        self.params = params  # {name: {"type": "FILE"|"CLOCK", "args": {arg: path}}}
        self.modes = modes  # [Mode] in file order
        self.default_id = default_id

    def names(self):
        return [m.name for m in self.modes]

    def by_name(self, name):
        return next((mode for mode in self.modes if mode.name == name), None)

    def by_id(self, mode_id):
        return next((mode for mode in self.modes if mode.id == mode_id), None)

    @property
    def default(self):
        return self.by_id(self.default_id)


def _attrs(text):
    return {k.upper(): v for k, v in _ATTR_RE.findall(text)}


def parse_conf(text):
    """Parse nvpmodel.conf text into an :class:`NvpConf`; ValueError when invalid."""
    params = {}
    modes = []
    default_id = None
    section = None  # ("PARAM", name) or ("POWER_MODEL", Mode) or ("PM_CONFIG", None)

    for lineno, raw in enumerate(text.splitlines(), 1):
        # NVIDIA writes only whole-line comments; cutting at "#" also takes
        # any trailing comment (no name, path or value contains "#").
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = _HEADER_RE.match(line)
        if header:
            kind, attrs = header.group(1), _attrs(header.group(2))
            if kind == "PARAM":
                if "NAME" not in attrs or attrs.get("TYPE") not in ("FILE", "CLOCK"):
                    raise BadInput(f"line {lineno}: PARAM needs TYPE=FILE|CLOCK and NAME: {raw!r}")
                params[attrs["NAME"]] = {"type": attrs["TYPE"], "args": {}}
                section = ("PARAM", attrs["NAME"])
            elif kind == "POWER_MODEL":
                if "ID" not in attrs or "NAME" not in attrs:
                    raise BadInput(f"line {lineno}: POWER_MODEL needs ID and NAME: {raw!r}")
                try:
                    mode_id = int(attrs["ID"])
                except ValueError:
                    raise BadInput(f"line {lineno}: POWER_MODEL ID is not a number: {raw!r}") from None
                if any(m.id == mode_id for m in modes):
                    raise BadInput(f"line {lineno}: POWER_MODEL ID={mode_id} defined twice")
                mode = Mode(mode_id, attrs["NAME"])
                modes.append(mode)
                section = ("POWER_MODEL", mode)
            else:
                try:
                    default_id = int(attrs["DEFAULT"])
                except (KeyError, ValueError):
                    raise BadInput(f"line {lineno}: PM_CONFIG needs DEFAULT=<id>: {raw!r}") from None
                section = ("PM_CONFIG", None)
            continue

        if line.startswith("<"):
            raise BadInput(f"line {lineno}: unknown section header: {raw!r}")
        fields = line.split()
        if section is None or section[0] == "PM_CONFIG":
            raise BadInput(f"line {lineno}: text outside a PARAM or POWER_MODEL section: {raw!r}")
        if section[0] == "PARAM":
            if len(fields) != 2:
                raise BadInput(f"line {lineno}: expected 'ARG_NAME /path': {raw!r}")
            params[section[1]]["args"][fields[0]] = fields[1]
        else:
            if len(fields) != 3:
                raise BadInput(f"line {lineno}: expected 'PARAM ARG VALUE': {raw!r}")
            param, arg, value = fields
            if param not in params or arg not in params[param]["args"]:
                raise BadInput(f"line {lineno}: {param} {arg} is not defined by a PARAM section")
            section[1].settings.append((param, arg, value))

    if not modes:
        raise BadInput("no POWER_MODEL section: not an nvpmodel configuration")
    if default_id is None:
        raise BadInput("no '< PM_CONFIG DEFAULT=<id> >' section: nvpmodel requires one")
    if not any(m.id == default_id for m in modes):
        raise BadInput(f"PM_CONFIG DEFAULT={default_id} names no POWER_MODEL")
    return NvpConf(params, modes, default_id)


def parse_query_output(text):
    """Parse ``nvpmodel -q [--verbose]`` output.

    Returns ``{"name": str, "id": int, "params": [..]}``; ``params`` holds the
    ``--verbose`` lines as dicts (param, arg, path, real, conf), empty
    otherwise.  Warnings may come before the mode line.  ValueError when the
    mode line or the id line after it is missing.
    """
    lines = [line.strip() for line in text.splitlines()]
    for idx, line in enumerate(lines):
        match = _POWER_MODE_RE.search(line)
        if not match:
            continue
        following = [item for item in lines[idx + 1:] if item]
        if not following or not re.match(r"^\d+$", following[0]):
            raise BadInput(f"no mode id after {line!r} in nvpmodel output")
        params = [m.groupdict() for m in map(_VERBOSE_PARAM_RE.search, lines) if m]
        return {"name": match.group(1), "id": int(following[0]), "params": params}
    raise BadInput(f"no 'NV Power Mode:' line in nvpmodel output: {text.strip()[:300]!r}")


def pending_settings(query):
    """Boot-only settings whose live value differs from the mode's (``-q --verbose``).

    A non-empty result means the reported mode is persisted but not running
    yet: it waits for a reboot.
    """
    return [
        p for p in query.get("params", [])
        if (p["param"] == "CPU_ONLINE" or p["param"].endswith("_POWER_GATING"))
        and p["real"] != p["conf"]
    ]


def reboot_needed(conf, target, query):
    """Predict whether switching to ``target`` needs a reboot.

    Compares the target's boot-only settings with the live values in the
    ``-q --verbose`` lines; without those lines, with the settings of the mode
    ``-q`` reported.
    """
    wanted = target.boot_only_settings()
    live = {
        (p["param"], p["arg"]): p["real"]
        for p in query.get("params", [])
        if (p["param"], p["arg"]) in wanted
    }
    if not live:
        current = conf.by_id(query["id"])
        live = current.boot_only_settings() if current else {}
    return any(live.get(key, value) != value for key, value in wanted.items())


def parse_status(text):
    """Parse /var/lib/nvpmodel/status (``pmode:0002 fmode:fanNull``)."""
    status = {"pmode": None, "fmode": None}
    for token in text.split():
        key, _sep, value = token.partition(":")
        if key == "pmode":
            try:
                status["pmode"] = int(value)
            except ValueError:
                pass
        elif key == "fmode":
            status["fmode"] = value
    return status


def status_with_mode(old_text, mode_id):
    """Status file text with ``pmode`` set to ``mode_id`` and the rest kept."""
    token = f"pmode:{mode_id:04d}"
    if old_text and re.search(r"\bpmode:\S*", old_text):
        return re.sub(r"\bpmode:\S*", token, old_text, count=1)
    if old_text and old_text.strip():
        return token + " " + old_text.lstrip()
    return token
