# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel command line parsing and bootloader file editing.

Runs on the device (Python 3.8+, stdlib only).  Everything here is a pure
function on text, so unit tests work on fixture strings and the module decides
when to touch the disk.

Each backend offers ``plan_<backend>(text, args, absent, ...)`` returning
``(new_text, persisted_tokens)``: the file as it should be, and the kernel
arguments the next boot will get from it.  ``new_text == text`` means no
change.  A file we cannot edit safely raises ValueError with a message meant
for the operator; the caller then leaves the file alone.

Sources for the file formats
(NVIDIA edk2-nvidia L4TLauncher.c for extlinux.conf, armbian/build boot-rk35xx.cmd, u-boot-menu,
grub-mkconfig).
"""

import json
import re
from collections import OrderedDict
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput, BadType

CBOOTARGS = "${cbootargs}"
# The kernel's isspace(): these end a token outside double quotes.
KERNEL_WHITESPACE = " \t\n\r\v\f"


# ---------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------

def audit_checks(bootargs, absent, record, keep):
    """Role edge_bootargs's check for the drift audit: the arguments the entry the plan names
    (``bootargs``: the plan's part, with its bootloader, boot file and args) must hold, those it must
    not (``absent``), the role's record of the values it replaced (``record``) and the keys it never
    drops (``keep``)."""
    return [{"setting": "kernel boot arguments", "role": "edge_bootargs", "kind": "cmdline",
             "bootloader": bootargs["bootloader"], "path": bootargs["path"], "args": list(bootargs["args"]),
             "absent": list(absent), "record": record, "keep": list(keep)}]


def split_cmdline(text):
    """Split a kernel command line into tokens the way the kernel does.

    Whitespace separates tokens except inside double quotes.  Quotes stay in
    the token (``key="a b"``) so that :func:`render_cmdline` gives the text back.
    """
    tokens = []
    current = []
    quote_at = None
    for position, char in enumerate(text):
        if char == '"':
            quote_at = None if quote_at is not None else position
            current.append(char)
        elif char in KERNEL_WHITESPACE and quote_at is None:
            if current:
                tokens.append("".join(current))
                current = []
        else:
            current.append(char)
    if quote_at is not None:
        raise BadInput(
            f"unbalanced double quote at character {quote_at + 1} "
            f"of kernel arguments {text!r}"
        )
    if current:
        tokens.append("".join(current))
    return tokens


def render_cmdline(tokens):
    """Join tokens into a command line (inverse of :func:`split_cmdline`)."""
    return " ".join(tokens)


def token_key(token):
    """``isolcpus=1-3`` -> ``isolcpus``; ``quiet`` -> ``quiet``."""
    # The kernel strips a leading quote: "foo=a b" is parameter foo.
    bare = token[1:] if token[:1] == '"' else token
    if "=" in bare:
        return bare.split("=", 1)[0]
    return bare[:-1] if token.startswith('"') and bare.endswith('"') else bare


def _matches_absent(token, item):
    """A bare absent item removes the key in any form; key=value only exact tokens."""
    if "=" in item:
        return token == item
    return token_key(token) == item


def _check_items(name, items):
    if not isinstance(items, (list, tuple)):
        raise BadType(f"{name} must be a list of kernel arguments")
    for item in items:
        if not isinstance(item, str):
            raise BadType(f"{name}: {item!r} is not a string")
        if not item.strip():
            raise BadInput(f"{name}: empty kernel argument")
        if CBOOTARGS in item:
            raise BadInput(
                f"{name}: {CBOOTARGS} belongs to the bootloader and is never edited"
            )
        if "#" in item:
            # extlinux.conf drops everything after '#', even inside quotes.
            raise BadInput(f"{name}: {item!r} contains '#', which bootloader files treat as a comment")
        if split_cmdline(item) != [item]:
            raise BadInput(
                f"{name}: {item!r} must be exactly one kernel argument "
                "(whitespace only inside double quotes)"
            )
        key = token_key(item)
        if not key or '"' in key:
            raise BadInput(f"{name}: {item!r} has no usable parameter name")


def validate_args(args, absent):
    """Raise ValueError unless ``args``/``absent`` are well formed and disjoint."""
    _check_items("args", args)
    _check_items("absent", absent)
    both = sorted({token_key(a) for a in args} & {token_key(a) for a in absent})
    if both:
        raise BadInput(
            "these keys are both in args and absent: {}".format(", ".join(both))
        )
    for key in {token_key(a) for a in args}:
        forms = {"=" in a for a in args if token_key(a) == key}
        if len(forms) > 1:
            raise BadInput(
                f"args uses {key!r} both as a bare flag and as key=value; pick one"
            )


def apply_args(tokens, args, absent):
    """Return a new token list with ``args`` set and ``absent`` removed.

    - ``key=value``: replaces every occurrence of ``key``; the first occurrence
      keeps its place, later duplicates go.  Several args with one key (e.g. two
      ``console=``) replace the key's occurrences together, in the order given.
    - bare flag: appended if that exact token is missing.
    - new tokens go to the end, in the order given.
    - absent ``key`` removes every token with that key; absent ``key=value``
      removes only exact matches.
    - ``${cbootargs}`` is never touched, so it keeps its place (first).
    """
    validate_args(args, absent)
    wanted_values = OrderedDict()
    for arg in args:
        if "=" in arg:
            values = wanted_values.setdefault(token_key(arg), [])
            if arg not in values:
                values.append(arg)

    result = []
    placed = set()
    for token in tokens:
        if token == CBOOTARGS:
            result.append(token)
            continue
        if any(_matches_absent(token, item) for item in absent):
            continue
        key = token_key(token)
        if key in wanted_values:
            if key not in placed:
                result.extend(wanted_values[key])
                placed.add(key)
            continue
        result.append(token)

    for arg in args:
        key = token_key(arg)
        if "=" in arg:
            if key not in placed:
                result.extend(wanted_values[key])
                placed.add(key)
        elif arg not in result:
            result.append(arg)
    return result


def args_satisfied(tokens, args, absent):
    """True when every arg is in ``tokens`` and no absent item matches."""
    return all(a in tokens for a in args) and not any(
        _matches_absent(t, item) for t in tokens for item in absent
    )


def pending_changes(running_tokens, args, absent):
    """Args missing from ``running_tokens`` and absent items still in it."""
    missing, lingering = changes_to_make(running_tokens, args, absent)
    return missing + lingering


def changes_to_make(tokens, args, absent):
    """``(to_add, to_remove)``: the args missing from ``tokens``, the absent items still in them."""
    return [a for a in args if a not in tokens], _absent_still_set(tokens, absent)


def describe_changes(tokens, args, absent):
    """'to add: a b; to remove: c' for what ``tokens`` still need."""
    to_add, to_remove = changes_to_make(tokens, args, absent)
    parts = [("to add: " + " ".join(to_add)) if to_add else "",
             ("to remove: " + " ".join(to_remove)) if to_remove else ""]
    return "; ".join(part for part in parts if part)


def _absent_still_set(tokens, absent):
    return [item for item in absent if any(_matches_absent(t, item) for t in tokens)]


# ---------------------------------------------------------------------------
# Lines: keep every byte, including the line ending (or its absence at EOF)
# ---------------------------------------------------------------------------

def split_lines(text):
    """Split into ``[body, ending]`` pairs; ending is "\\n", "\\r\\n" or "" (last line)."""
    lines = []
    pieces = text.split("\n")
    for index, piece in enumerate(pieces):
        if index == len(pieces) - 1:
            if piece:
                lines.append([piece, ""])
        elif piece.endswith("\r"):
            lines.append([piece[:-1], "\r\n"])
        else:
            lines.append([piece, "\n"])
    return lines


def join_lines(lines):
    return "".join(body + ending for body, ending in lines)


def _newline_of(lines):
    for _body, ending in lines:
        if ending:
            return ending
    return "\n"


# ---------------------------------------------------------------------------
# extlinux.conf as read by NVIDIA L4TLauncher (edk2-nvidia L4TLauncher.c: CleanExtLinuxLine, ProcessExtLinuxConfig)
# ---------------------------------------------------------------------------

GLOBAL_KEYWORDS = ("TIMEOUT", "DEFAULT", "MENU TITLE")
LABEL_KEYWORDS = ("MENU LABEL", "LINUX", "INITRD", "FDT", "APPEND", "OVERLAYS")
MAX_EXTLINUX_LABELS = 10
FALLBACK_LABEL = "edgetune-fallback"
FALLBACK_MENU_LABEL = "edgetune fallback (previous kernel arguments)"
_LOWERCASE_UBOOT = re.compile(r"^\s*(label|append|kernel|linux|fdtdir|default)\b")


class ExtlinuxLine:
    """One line split the way L4TLauncher's CleanExtLinuxLine sees it."""

    def __init__(self, body):
        self.body = body
        hash_at = body.find("#")
        # Everything from '#' on is ignored by the bootloader, even in APPEND.
        self.code = body if hash_at < 0 else body[:hash_at]
        self.comment = "" if hash_at < 0 else body[hash_at:]
        stripped = self.code.lstrip(" \t")
        self.indent = self.code[: len(self.code) - len(stripped)]
        self.keyword = None
        for keyword in GLOBAL_KEYWORDS + ("LABEL",) + LABEL_KEYWORDS:
            # Case-sensitive prefix match, as StrnCmp in CheckCommandString.
            if stripped.startswith(keyword):
                self.keyword = keyword
                break
        rest = stripped[len(self.keyword):] if self.keyword else ""
        value = rest.strip(" \t")
        self.separator = rest[: len(rest) - len(rest.lstrip(" \t"))] if value else rest
        self.trailing = rest[len(rest.rstrip(" \t")):] if value else ""
        self.value = value

    def with_value(self, value):
        """The line body with a new value; indent, spacing and comment kept."""
        separator = self.separator or " "
        return self.indent + self.keyword + separator + value + self.trailing + self.comment


class ExtlinuxLabel:
    def __init__(self, name, start):
        self.name = name
        self.start = start  # index of the LABEL line
        self.end = start  # index of the label's last keyword line
        self.append_lines = []


class ExtlinuxConfig:
    """Parsed extlinux.conf; refuses files L4TLauncher would misread.

    ``check=False`` parses without refusing (a reader that only looks at what
    boots, such as ``edgetune twin capture``; see :meth:`booted_label`).
    """

    def __init__(self, text, check=True):
        self.lines = split_lines(text)
        self.parsed = [ExtlinuxLine(body) for body, _ending in self.lines]
        self.labels = []
        self.default = None
        for index, line in enumerate(self.parsed):
            if line.keyword == "DEFAULT":
                self.default = line.value  # the last DEFAULT wins, as in the parser
            elif line.keyword == "LABEL":
                self.labels.append(ExtlinuxLabel(line.value, index))
            elif line.keyword in LABEL_KEYWORDS and self.labels:
                label = self.labels[-1]
                label.end = index
                if line.keyword == "APPEND":
                    label.append_lines.append(index)
        if check:
            self._check()

    def _check(self):
        if not self.labels:
            if any(_LOWERCASE_UBOOT.match(body) for body, _ending in self.lines):
                raise BadInput(
                    "no LABEL line: this file uses lowercase U-Boot keywords "
                    "(label/append/...), so it is not an L4TLauncher extlinux.conf "
                    "(L4TLauncher matches keywords case-sensitively)"
                )
            raise BadInput("no LABEL line: not an L4TLauncher extlinux.conf")
        if len(self.labels) > MAX_EXTLINUX_LABELS:
            raise BadInput(
                f"{len(self.labels)} labels, but L4TLauncher reads at most "
                f"{MAX_EXTLINUX_LABELS}"
            )
        names = [label.name for label in self.labels]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise BadInput("duplicate LABEL names: {}".format(", ".join(duplicates)))
        if self.default is None:
            raise BadInput("no DEFAULT line; refusing to guess which label boots")
        label = self.default_label()
        if label is None:
            raise BadInput(
                "DEFAULT {!r} names no label (labels: {})".format(self.default, ", ".join(names))
            )
        if label.name == FALLBACK_LABEL:
            raise BadInput(
                f"DEFAULT is {FALLBACK_LABEL}, edgetune's own fallback; set DEFAULT back to the "
                "label you want to tune"
            )
        if not label.append_lines:
            raise BadInput(f"the default label {label.name!r} has no APPEND line")
        if len(label.append_lines) > 1:
            raise BadInput(
                f"the default label {label.name!r} has "
                f"{len(label.append_lines)} APPEND lines; keep one"
            )

    def default_label(self):
        for label in self.labels:
            if label.name == self.default:
                return label
        return None

    def booted_label(self):
        """The label L4TLauncher boots, refused file or not: the one DEFAULT names among the first
        MAX_EXTLINUX_LABELS, else the first label; None without labels."""
        labels = self.labels[:MAX_EXTLINUX_LABELS]
        for label in labels:
            if label.name == self.default:
                return label
        return labels[0] if labels else None

    def booted_append(self):
        """The APPEND value of :meth:`booted_label` (its last APPEND line, as L4TLauncher reads
        them), ``${cbootargs}`` included; None without one."""
        label = self.booted_label()
        if label is None or not label.append_lines:
            return None
        return self.parsed[label.append_lines[-1]].value

    def find_label(self, name):
        return next((label for label in self.labels if label.name == name), None)

    def append_tokens(self, label):
        line = self.parsed[label.append_lines[0]]
        try:
            return split_cmdline(line.value)
        except ValueError as exc:
            raise BadInput(f"APPEND of label {label.name!r}: {exc}") from exc

    def fallback_block(self, label):
        """Copy of ``label``'s lines renamed to the fallback label."""
        newline = _newline_of(self.lines)
        block = []
        has_menu_label = False
        for index in range(label.start, label.end + 1):
            line = self.parsed[index]
            if line.keyword in GLOBAL_KEYWORDS:
                continue  # a stray TIMEOUT/DEFAULT must not be duplicated
            if index == label.start:
                body = line.with_value(FALLBACK_LABEL)
            elif line.keyword == "MENU LABEL":
                body = line.with_value(FALLBACK_MENU_LABEL)
                has_menu_label = True
            else:
                body = line.body
            block.append([body, newline])
        if not has_menu_label:
            inner = [self.parsed[i] for i in range(label.start + 1, label.end + 1)
                     if self.parsed[i].keyword]
            indent = inner[0].indent if inner else self.parsed[label.start].indent
            block.insert(1, [indent + "MENU LABEL " + FALLBACK_MENU_LABEL, newline])
        return block


def _replace_lines(lines, start, end, block):
    """Replace ``lines[start:end + 1]`` by ``block``, keeping the file's EOF state."""
    at_eof_without_newline = end == len(lines) - 1 and lines[end][1] == ""
    if at_eof_without_newline:
        block[-1][1] = ""
    return lines[:start] + block + lines[end + 1:]


def _insert_after(lines, index, block):
    """Insert a blank line and ``block`` after ``lines[index]``."""
    newline = _newline_of(lines)
    lines = [list(line) for line in lines]
    block = [["", newline]] + block
    if lines[index][1] == "":
        # Inserting after the last line of a file without a final newline.
        lines[index][1] = newline
        block[-1][1] = ""
    return lines[: index + 1] + block + lines[index + 1:]


def persisted_from_append(tokens):
    """L4TLauncher removes the first ${cbootargs}; the rest reaches the kernel."""
    tokens = list(tokens)
    if CBOOTARGS in tokens:
        tokens.remove(CBOOTARGS)
    return tokens


def booted_with(old_tokens, new_tokens, running_tokens):
    """True when the running kernel got ``old_tokens`` for every argument this
    edit changes: the entry as it is now is known to boot this device."""
    old = [t for t in old_tokens if t != CBOOTARGS]
    new = [t for t in new_tokens if t != CBOOTARGS]
    changed_keys = set(token_key(t) for t in set(old) ^ set(new))
    return all([t for t in old if token_key(t) == key] == [t for t in running_tokens if token_key(t) == key]
               for key in changed_keys)


def plan_extlinux(text, args, absent, fallback=True, running=None):
    """Edit the APPEND line of the label DEFAULT names.

    When the APPEND changes and ``fallback`` is true, a label
    ``edgetune-fallback`` holding the default label as it was before the edit
    is inserted after it. An existing fallback is refreshed only when the
    running kernel (``running``, the tokens of /proc/cmdline; None: unknown)
    booted with the entry as it was: an entry edited by hand or by an update and
    never booted must not replace a fallback that is known to boot.
    """
    validate_args(args, absent)
    config = ExtlinuxConfig(text)
    label = config.default_label()
    old_tokens = config.append_tokens(label)
    new_tokens = apply_args(old_tokens, args, absent)
    if new_tokens == old_tokens:
        return text, persisted_from_append(old_tokens)

    lines = [list(line) for line in config.lines]
    append_index = label.append_lines[0]
    lines[append_index][0] = config.parsed[append_index].with_value(render_cmdline(new_tokens))
    if fallback:
        block = config.fallback_block(label)
        existing = config.find_label(FALLBACK_LABEL)
        if existing is not None:
            if running is None or booted_with(old_tokens, new_tokens, running):
                lines = _replace_lines(lines, existing.start, existing.end, block)
        elif len(config.labels) + 1 > MAX_EXTLINUX_LABELS:
            raise BadInput(
                f"adding the {FALLBACK_LABEL} label would make {len(config.labels) + 1} "
                f"labels, but L4TLauncher reads at most {MAX_EXTLINUX_LABELS}: remove an "
                "unused LABEL block from the file, or disable the fallback label "
                "(fallback=false)"
            )
        else:
            lines = _insert_after(lines, label.end, block)
    return join_lines(lines), persisted_from_append(new_tokens)


def extlinux_fallback_label(text):
    """The fallback label's name if ``text`` has one, else None."""
    for body, _ending in split_lines(text):
        line = ExtlinuxLine(body)
        if line.keyword == "LABEL" and line.value == FALLBACK_LABEL:
            return FALLBACK_LABEL
    return None


# ---------------------------------------------------------------------------
# Armbian /boot/armbianEnv.txt (armbian/build config/bootscripts/boot-rk35xx.cmd)
# ---------------------------------------------------------------------------

# Defaults set by boot-rk35xx.cmd before it imports armbianEnv.txt.
ARMBIAN_SCRIPT_DEFAULTS = {
    "rootdev": "/dev/mmcblk0p1",
    "verbosity": "1",
    "console": "both",
    "bootlogo": "false",
    "rootfstype": "ext4",
    "docker_optimizations": "on",
    "earlycon": "off",
}
ARMBIAN_DOCKER_ARGS = ["cgroup_enable=cpuset", "cgroup_memory=1", "cgroup_enable=memory"]


def parse_armbian_env(text):
    """Return (lines, env, index of the last extraargs line or None)."""
    lines = split_lines(text)
    env = {}
    extraargs_index = None
    for index, (body, _ending) in enumerate(lines):
        stripped = body.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, equals, value = body.partition("=")
        if not equals or not key or key != key.strip() or " " in key or "\t" in key:
            raise BadInput(
                f"line {index + 1} is not key=value, a comment or blank: {body!r}"
            )
        env[key] = value  # env import -t: one key per line, the last wins
        if key == "extraargs":
            extraargs_index = index
    return lines, env, extraargs_index


def armbian_boot_tokens(env):
    """The command line boot-rk35xx.cmd builds from the imported variables.

    ``ubootpart=${partuuid}`` is left out (the partition UUID is only known to
    U-Boot) and so is any ``name=${var}`` whose variable is empty.
    """
    env = dict(ARMBIAN_SCRIPT_DEFAULTS, **env)
    console = env.get("console", "")
    consoleargs = []
    if console in ("display", "both"):
        consoleargs = ["console=tty1"]
    if console in ("serial", "both"):
        consoleargs = ["console=ttyS2,1500000"] + consoleargs
    if env.get("earlycon") == "on":
        consoleargs = ["earlycon"] + consoleargs
    if env.get("bootlogo") == "true":
        consoleargs = ["splash", "plymouth.ignore-serial-consoles"] + consoleargs
    else:
        consoleargs = ["splash=verbose"] + consoleargs

    def setting(prefix, name):
        value = env.get(name, "")
        return [prefix + value] if value else []

    tokens = setting("root=", "rootdev") + ["rootwait"] + setting("rootfstype=", "rootfstype")
    tokens += consoleargs + ["consoleblank=0"] + setting("loglevel=", "verbosity")
    tokens += setting("usb-storage.quirks=", "usbstoragequirks")
    tokens += split_cmdline(env.get("extraargs", ""))
    tokens += split_cmdline(env.get("extraboardargs", ""))
    if env.get("docker_optimizations") == "on":
        tokens += ARMBIAN_DOCKER_ARGS
    return tokens


def plan_armbian(text, args, absent):
    """Edit the last ``extraargs=`` line (or add one at the end)."""
    validate_args(args, absent)
    lines, env, extraargs_index = parse_armbian_env(text)
    old_tokens = split_cmdline(env.get("extraargs", ""))
    new_tokens = apply_args(old_tokens, args, absent)
    new_text = text
    if new_tokens != old_tokens:
        new_line = "extraargs=" + render_cmdline(new_tokens)
        if extraargs_index is not None:
            lines[extraargs_index][0] = new_line
            new_text = join_lines(lines)
        elif text and not text.endswith("\n"):
            new_text = text + "\n" + new_line  # keep the missing final newline
        else:
            new_text = text + new_line + "\n"
        env["extraargs"] = render_cmdline(new_tokens)
    persisted = armbian_boot_tokens(env)
    lingering = _absent_still_set(persisted, absent)
    if lingering:
        raise BadInput(
            "absent {} would still be on the command line: boot-rk35xx.cmd adds it "
            "from an armbianEnv.txt setting other than extraargs (console, verbosity, "
            "docker_optimizations, ...); change that setting instead".format(", ".join(lingering))
        )
    return new_text, persisted


# ---------------------------------------------------------------------------
# Shell assignments (/etc/default/u-boot, /etc/default/grub)
# ---------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^(\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=)(.*)$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _expand(text, position, env, where):
    """Expand ``$NAME``/``${NAME}`` at ``text[position]``; return (value, next position)."""
    if env is None:
        raise BadInput(f"{where}: cannot evaluate {text!r}: it refers to a shell variable")
    following = text[position + 1: position + 2]
    if following == "(":
        raise BadInput(f"{where}: cannot evaluate command substitution in {text!r}")
    if following == "{":
        close = text.find("}", position)
        name = text[position + 2: close] if close > 0 else ""
        if not _NAME.fullmatch(name):
            raise BadInput(f"{where}: cannot evaluate {text!r} (only ${{NAME}} is understood)")
        end = close + 1
    else:
        match = _NAME.match(text, position + 1)
        if not match:
            raise BadInput(f"{where}: cannot evaluate '$' in {text!r}")
        name, end = match.group(0), match.end()
    value = env.get(name, "")
    if value is None:
        raise BadInput(f"{where}: {text!r} uses ${name}, whose value cannot be evaluated")
    return value, end


def parse_shell_word(text, env, where):
    """Parse one shell word (quotes, escapes, simple $NAME expansion).

    ``env`` None means no expansion is allowed.  Returns (value, rest of text).
    Command substitution and anything else we cannot evaluate raises ValueError.
    """
    if "`" in text or "$(" in text:
        raise BadInput(f"{where}: cannot evaluate command substitution in {text!r}")
    value = []
    position = 0
    while position < len(text):
        char = text[position]
        if char in " \t":
            break
        if char in ";&|<>()":
            raise BadInput(f"{where}: cannot evaluate {text!r} (not a plain assignment)")
        if char == "'":
            close = text.find("'", position + 1)
            if close < 0:
                raise BadInput(f"{where}: unbalanced single quote in {text!r}")
            value.append(text[position + 1: close])
            position = close + 1
        elif char == '"':
            position += 1
            while True:
                if position >= len(text):
                    raise BadInput(f"{where}: unbalanced double quote in {text!r}")
                char = text[position]
                if char == '"':
                    position += 1
                    break
                if char == "\\" and text[position + 1: position + 2] in ('"', "\\", "$", "`"):
                    value.append(text[position + 1])
                    position += 2
                else:
                    piece, position = _char_or_expansion(text, position, env, where)
                    value.append(piece)
        elif char == "\\":
            value.append(text[position + 1: position + 2])
            position += 2
        else:
            piece, position = _char_or_expansion(text, position, env, where)
            value.append(piece)
    return "".join(value), text[position:]


def _char_or_expansion(text, position, env, where):
    """The word's next piece at ``position``: a $NAME expanded, else the character itself."""
    if text[position] == "$":
        return _expand(text, position, env, where)
    return text[position], position + 1


def shell_double_quote(value):
    """Quote ``value`` for a shell double-quoted string."""
    escaped = re.sub(r'([\\"$`])', r"\\\1", value)
    return '"' + escaped + '"'


def _parse_assignment(body, env, where):
    """Return (name, value, prefix, rest) for ``NAME=value # comment`` or None."""
    match = _ASSIGNMENT.match(body)
    if not match:
        return None
    prefix, name, raw_value = match.group(1), match.group(2), match.group(3)
    value, rest = parse_shell_word(raw_value, env, where)
    if rest.strip() and not rest.strip().startswith("#"):
        raise BadInput(f"{where}: cannot evaluate {body!r} (more than one word)")
    return name, value, prefix, rest


def evaluate_shell_assignments(text, env, filename, needed=None):
    """Apply the ``NAME=value`` lines of ``text`` to ``env`` (in place).

    Only the variables in ``needed`` (all when None) must be evaluable: stock
    /etc/default/grub sets GRUB_DISTRIBUTOR with a command substitution, which
    we record as unknown (None) and refuse only if a needed variable uses it.
    """
    for number, (body, _ending) in enumerate(split_lines(text), 1):
        stripped = body.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{filename} line {number}"
        match = _ASSIGNMENT.match(body)
        if not match:
            raise BadInput(
                f"{where}: cannot evaluate {body!r} (only NAME=value lines are understood)"
            )
        name = match.group(2)
        try:
            env[name] = _parse_assignment(body, env, where)[1]
        except ValueError:
            if needed is None or name in needed:
                raise
            env[name] = None
    return env


# ---------------------------------------------------------------------------
# u-boot-menu: /etc/kernel/cmdline, or U_BOOT_PARAMETERS in /etc/default/u-boot
# ---------------------------------------------------------------------------

def plan_kernel_cmdline(text, args, absent):
    """Edit a one-line command line file, keeping surrounding whitespace as found."""
    validate_args(args, absent)
    if len([line for line in text.splitlines() if line.strip()]) > 1:
        raise BadInput("expected a single line of kernel arguments, found several")
    old_tokens = split_cmdline(text)
    new_tokens = apply_args(old_tokens, args, absent)
    if new_tokens == old_tokens:
        return text, old_tokens
    core = text.strip(KERNEL_WHITESPACE)
    if core:
        start = text.index(core)
        prefix, suffix = text[:start], text[start + len(core):]
    else:
        prefix, suffix = "", text
    return prefix + render_cmdline(new_tokens) + suffix, new_tokens


def plan_uboot_default(text, args, absent, filename="/etc/default/u-boot"):
    """Edit the last ``U_BOOT_PARAMETERS=`` assignment of /etc/default/u-boot."""
    validate_args(args, absent)
    lines = split_lines(text)
    found = None
    for index, (body, _ending) in enumerate(lines):
        match = _ASSIGNMENT.match(body)
        if match and match.group(2) == "U_BOOT_PARAMETERS":
            found = index
    if found is None:
        raise BadInput(
            f"{filename} has no U_BOOT_PARAMETERS line; u-boot-update would use its built-in "
            "default, which cannot be read from here: add the line, or create "
            "/etc/kernel/cmdline"
        )
    where = f"{filename} line {found + 1}"
    _name, value, prefix, rest = _parse_assignment(lines[found][0], None, where)
    old_tokens = split_cmdline(value)
    new_tokens = apply_args(old_tokens, args, absent)
    if new_tokens == old_tokens:
        return text, old_tokens
    lines[found][0] = prefix + shell_double_quote(render_cmdline(new_tokens)) + rest
    return join_lines(lines), new_tokens


# ---------------------------------------------------------------------------
# GRUB: our own drop-in /etc/default/grub.d/99-edgetune.cfg
# ---------------------------------------------------------------------------

GRUB_DROPIN_HEADER = "# Managed by edgetune (edge_kernel_cmdline)"
GRUB_CMDLINE_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
_GRUB_DROPIN_LINE = re.compile(r'^GRUB_CMDLINE_LINUX="\$GRUB_CMDLINE_LINUX( .*)?"$')


def grub_dropin_tokens(text, filename="99-edgetune.cfg"):
    """Our tokens from a drop-in we wrote; ValueError if someone else wrote it."""
    assignments = [body for body, _e in split_lines(text)
                   if body.strip() and not body.strip().startswith("#")]
    if len(assignments) != 1 or not _GRUB_DROPIN_LINE.match(assignments[0]):
        raise BadInput(
            f"{filename} was not written by edgetune (expected one line "
            'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX ..."); move it aside'
        )
    env = {"GRUB_CMDLINE_LINUX": ""}
    _name, value, _prefix, _rest = _parse_assignment(assignments[0], env, filename)
    return split_cmdline(value)


def render_grub_dropin(tokens):
    value = shell_double_quote(render_cmdline(tokens))[1:-1]
    joined = "$GRUB_CMDLINE_LINUX" + (" " + value if value else "")
    return f'{GRUB_DROPIN_HEADER}\nGRUB_CMDLINE_LINUX="{joined}"\n'


def grub_persisted_tokens(env):
    """grub-mkconfig's 10_linux: GRUB_CMDLINE_LINUX then GRUB_CMDLINE_LINUX_DEFAULT."""
    return split_cmdline(env.get("GRUB_CMDLINE_LINUX", "")) + split_cmdline(
        env.get("GRUB_CMDLINE_LINUX_DEFAULT", "")
    )


def plan_grub(text, args, absent, grub_text, dropins, grub_name="/etc/default/grub",
              dropin_name="99-edgetune.cfg"):
    """Plan our drop-in.

    ``text`` is our drop-in's text (None when it does not exist),
    ``grub_text`` is /etc/default/grub, ``dropins`` maps the names of the other
    grub.d/*.cfg files to their text.  Returns (new_text or None, persisted).
    """
    validate_args(args, absent)
    old_tokens = grub_dropin_tokens(text, dropin_name) if text is not None else []
    new_tokens = apply_args(old_tokens, args, absent)
    if new_tokens == old_tokens:
        new_text = text
    else:
        new_text = render_grub_dropin(new_tokens)

    # Evaluate as grub-mkconfig does: /etc/default/grub, then grub.d/*.cfg sorted.
    sources = [(grub_name, grub_text)]
    in_order = dict(dropins)
    if new_text is not None:
        in_order[dropin_name] = new_text
    sources += [(name, in_order[name]) for name in sorted(in_order)]

    env = {}
    set_by = {}  # absent item -> the last file that put it on the command line
    for name, source in sources:
        evaluate_shell_assignments(source, env, name, needed=GRUB_CMDLINE_VARIABLES)
        for item in _absent_still_set(grub_persisted_tokens(env), absent):
            set_by.setdefault(item, name)
        for item in list(set_by):
            if item not in _absent_still_set(grub_persisted_tokens(env), absent):
                del set_by[item]
    if set_by:
        raise BadInput(
            "absent items are still set in files edgetune does not edit: "
            + "; ".join(f"{item} in {name}" for item, name in sorted(set_by.items()))
        )
    persisted = grub_persisted_tokens(env)
    lost = [arg for arg in args if arg not in persisted]
    if lost:
        later = [name for name in sorted(in_order) if name > dropin_name]
        raise BadInput(
            f"{', '.join(lost)} would not reach the command line: a drop-in sorted after "
            f"{dropin_name} resets GRUB_CMDLINE_LINUX ({', '.join(later) or 'none found'})"
        )
    return new_text, persisted


# ---------------------------------------------------------------------------
# The record of the arguments a caller manages
# ---------------------------------------------------------------------------
# A JSON file on the device: the args set last time ("args"), and for each of
# their keys the tokens the boot file gave that key before the key was first
# set ("replaced"). When a key leaves the args, its old tokens come back (an
# extra that replaced root= or console= gives the vendor's value back); a key
# that had none is removed, unless the caller keeps it (``keep``).

RECORD_OWNER = "edgetune"


def parse_record(text, name="the record"):
    """The record as ``{"args": [...], "replaced": {key: [tokens]}}``.

    Records of older releases have no "replaced": their keys are removed on drop.
    """
    if text is None or not text.strip():
        return {"args": [], "replaced": {}}
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    args = data.get("args", []) if isinstance(data, dict) else None
    replaced = data.get("replaced", {}) if isinstance(data, dict) else None
    if (not isinstance(args, list) or not all(isinstance(a, str) for a in args)
            or not isinstance(replaced, dict)
            or not all(isinstance(v, list) and all(isinstance(t, str) for t in v) for v in replaced.values())):
        raise BadInput(
            f"{name} is not a record of managed boot arguments (JSON with a list 'args'): "
            "fix it, or remove it if edgetune never set boot arguments here (the boot files' "
            "edgetune backups, next to them, hold their earlier content)"
        )
    unbooted = data.get("unbooted")
    if unbooted is not None and not _is_unbooted(unbooted):
        raise BadInput(
            f"{name}: 'unbooted' is not an object with a string 'boot_id' and lists 'args' and 'absent': "
            "remove that key (it only remembers changes waiting for a reboot)"
        )
    record = {"args": args, "replaced": replaced}
    if unbooted is not None:
        record["unbooted"] = unbooted
    return record


def _is_unbooted(value):
    return (isinstance(value, dict) and isinstance(value.get("boot_id"), str)
            and all(isinstance(value.get(k), list) and all(isinstance(t, str) for t in value[k])
                    for k in ("args", "absent")))


def render_record(record):
    body = {"managed_by": RECORD_OWNER, "args": record["args"], "replaced": record["replaced"]}
    if record.get("unbooted"):
        body["unbooted"] = record["unbooted"]
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def _unique(items):
    return list(OrderedDict.fromkeys(items))


def reconcile_record(record, args, absent, persisted, keep=(), boot_id=None):
    """Turn the managed args into one edit, and the record to keep after it.

    ``record``: from parse_record; ``persisted``: what the boot file gives the
    next boot now. Returns ``(args, absent, new_record, restored, dropped)``:
    ``args`` plus the old tokens of keys that left the intent, ``absent`` plus
    the keys that left it with nothing to restore (except those in ``keep``).

    ``boot_id``: the running boot's (/proc/sys/kernel/random/boot_id). A key
    that leaves the intent is gone from the record after the run that takes
    it out of the boot file, yet keeps running until the reboot: the record's
    ``unbooted`` part remembers, for the boot it was written in, the tokens
    restored and the keys dropped, and later runs of the same boot still plan
    them (so the change stays pending-reboot, with no reboot policy taking
    it). Another boot ignores them, and they are replaced only by the next
    drop, so the record does not change after the reboot.
    """
    wanted = _unique(token_key(a) for a in args)
    removed = set(token_key(a) for a in absent)
    managed_before = _unique(token_key(a) for a in record["args"])
    restored, dropped = [], []
    for key in managed_before:
        if key in wanted or key in removed:
            continue
        before = record["replaced"].get(key)
        if before:
            restored += [t for t in before if t not in restored]
        elif key not in keep:
            dropped.append(key)
    unbooted = record.get("unbooted")
    still_args, still_absent = [], []
    if unbooted and boot_id and unbooted["boot_id"] == boot_id:
        taken = set(wanted) | removed | set(map(token_key, restored)) | set(dropped)
        still_args = [t for t in unbooted["args"] if token_key(t) not in taken]
        still_absent = [k for k in unbooted["absent"] if k not in taken]
    if boot_id and (restored or dropped):
        unbooted = {"boot_id": boot_id, "args": still_args + restored, "absent": still_absent + dropped}
    replaced = OrderedDict()
    for key in wanted:
        if key in managed_before:
            if key in record["replaced"]:
                replaced[key] = record["replaced"][key]
        else:
            replaced[key] = [t for t in persisted if t != CBOOTARGS and token_key(t) == key]
    new_record = {"args": list(args), "replaced": dict(replaced)}
    if unbooted:
        new_record["unbooted"] = unbooted
    return (list(args) + restored + still_args, list(absent) + dropped + still_absent, new_record,
            restored, dropped)
