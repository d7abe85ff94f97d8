# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The code of each role, as one digest per role: controller side, for the drift audit.

A role's apply record (role edge_record) carries, in its inputs, the digest
of the code that renders that role's desired state, so that a new edgetune
is a change where, and only where, the role's own code changed. A role's
code is:

- its role directory, every file (README.md and compiled Python left out);
- the plugins of this collection its tasks, handlers, templates, vars and
  defaults name by FQCN (``edgetune.fleet.NAME``): plugins/modules/NAME.py and
  plugins/action/NAME.py (a module and the action plugin in front of it),
  plugins/filter/NAME.py and plugins/lookup/NAME.py. The planner's
  (edge_plan, edge_validate) are left out: what the plan gives a role is
  recorded already, as the role's typed variables and the digest of each
  plan part it applies, so a planner change that gives the role the same
  values marks nothing;
- the collection files the role ships by a literal path
  (``lookup('edgetune.fleet.collection_file', 'PATH')``; a path ending in
  ``/`` names the files of that directory), and the files a caller names for
  it (``shipped``: edge_boot's program files come from the plan);
- every Python file of this collection those files import
  (``from ansible_collections.edgetune.fleet.plugins.KIND[.NAME] import ...``,
  found with ast anywhere in the file), transitively.

The digest is the sha1 of the sorted relative paths and their contents.
Nothing here runs on the device; the standard library only.
"""

import ast
import hashlib
import json
import os
import re

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import cached_json, controller_cache_dir

# The collection this file belongs to (plugins/module_utils/plan/edge_code.py).
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PACKAGE = "ansible_collections.edgetune.fleet.plugins"
# The plugin directories a role's FQCN reference may name, in this order.
PLUGIN_KINDS = ("modules", "action", "filter", "lookup")
# The planner: its effect on a role is recorded as the role's variables and plan parts.
PLANNER = ("edge_plan", "edge_validate")
# The role directories whose YAML is read for FQCN references and shipped files
# (meta/ holds documentation and the argument specs, which name no code to run).
REFERRING_DIRS = ("tasks", "handlers", "templates", "vars", "defaults")
SKIPPED = ("README.md",)

_FQCN = re.compile(r"\bedgetune\.fleet\.([A-Za-z_][A-Za-z0-9_]*)")
_RELATIVE = re.compile(r"^\s*from\s+\.", re.MULTILINE)
_SHIPPED = re.compile(r"""edgetune\.fleet\.collection_file['"]\s*,\s*['"]([^'"]+)['"]""")


def _skipped(name):
    return name in SKIPPED or name.endswith(".pyc")


def _files_under(root, relative):
    """The files under root/relative (relative paths, sorted), __pycache__ and SKIPPED left out."""
    found = []
    for directory, dirs, names in os.walk(os.path.join(root, relative)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found.extend(os.path.relpath(os.path.join(directory, name), root)
                     for name in sorted(names) if not _skipped(name))
    return sorted(p.replace(os.sep, "/") for p in found)


def _read_text(root, relative):
    with open(os.path.join(root, relative), "rb") as handle:
        return handle.read().decode("utf-8", "replace")


def role_references(role, root):
    """(plugin names, shipped paths) that the role's tasks, handlers, templates, vars and defaults name."""
    names, shipped = set(), set()
    for sub in REFERRING_DIRS:
        for relative in _files_under(root, "roles/%s/%s" % (role, sub)):
            text = _read_text(root, relative)
            names.update(_FQCN.findall(text))
            shipped.update(_SHIPPED.findall(text))
    return names, shipped


def plugin_files(name, root):
    """The collection's plugin files named NAME (a module and its action plugin, a filter, a lookup)."""
    candidates = ["plugins/%s/%s.py" % (kind, name) for kind in PLUGIN_KINDS]
    return [c for c in candidates if os.path.isfile(os.path.join(root, c))]


def _shipped_files(path, root):
    """A literal collection_file path: the file, or a directory's files where it ends in '/'.
    Anything else (a cache directory, a path that is not there) is no code."""
    path = path.lstrip("/")
    if os.path.isfile(os.path.join(root, path)) and not _skipped(os.path.basename(path)):
        return [path]
    if path.endswith("/") and os.path.isdir(os.path.join(root, path)):
        return _files_under(root, path.rstrip("/"))
    return []


def _module_file(dotted, root):
    """The collection file of a dotted module name (``plugins.KIND.NAME``), or None."""
    relative = dotted.replace(".", "/") + ".py"
    return relative if dotted.startswith("plugins.") and os.path.isfile(os.path.join(root, relative)) else None


def _statements(body):
    """Every statement, nested ones too (an import inside try, if or def), but no expression."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            nested = getattr(node, field, None)
            if isinstance(nested, list):
                yield from _statements(nested)


def python_imports(relative, root):
    """The collection's Python files that root/relative imports (directly), sorted."""
    text = _read_text(root, relative)
    if PACKAGE not in text and not _RELATIVE.search(text):
        return []  # imports nothing of the collection: no need to parse it
    try:
        tree = ast.parse(text, filename=relative)
    except (SyntaxError, ValueError):
        return []  # its content still counts; a broken file has nothing to follow
    package = os.path.dirname(relative).split("/")
    found = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            modules, names, level = [alias.name for alias in node.names], [], 0
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative to the file's package
                base = package[:len(package) - node.level + 1] if node.level <= len(package) else []
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            modules, names, level = [module], [alias.name for alias in node.names], node.level
        else:
            continue
        for module in modules:
            if module.startswith(PACKAGE + "."):
                module = module[len(PACKAGE) - len("plugins"):]
            elif not (level and module.startswith("plugins.")):
                continue
            # `from PACKAGE.module_utils.device import edge_boot` names modules; `from PACKAGE.x.y import z` names.
            for dotted in [module] + [module + "." + name for name in names]:
                path = _module_file(dotted, root)
                if path and path != relative:
                    found.add(path)
    return sorted(found)


# Where a device program's module utilities go below its install directory: the collection's package layout,
# so that they import each other by the names the modules use.
PACKAGE_DIR = "ansible_collections/edgetune/fleet/plugins/module_utils"


def install_layout(sources):
    """A device program's files ({src: the collection file, dest: where below the install directory}):
    module utilities in the package layout, entries such as modules at the top."""
    return [{"src": src, "dest": PACKAGE_DIR + src[len("plugins/module_utils"):]
             if src.startswith("plugins/module_utils/") else os.path.basename(src)} for src in sources]


def imported_closure(entries, root):
    """The entry files and every collection file they import, transitively (relative paths, sorted)."""
    found, todo = set(), list(entries)
    while todo:
        relative = todo.pop()
        if relative not in found:
            found.add(relative)
            todo.extend(python_imports(relative, root))
    return sorted(found)


def role_code_files(role, root, shipped=(), imports=None):
    """The files of the role's code (relative paths, sorted) and the FQCN names it uses that
    are no plugin of this collection (roles, playbooks: nothing to add). ``imports``: a dict
    that keeps each file's imports across calls (one computation for several roles)."""
    imports = {} if imports is None else imports
    names, literal = role_references(role, root)
    files = set(_files_under(root, "roles/" + role))
    pending = []
    unresolved = []
    for name in sorted(names):
        if name in PLANNER:
            continue
        found = plugin_files(name, root)
        if not found:
            unresolved.append(name)
        pending.extend(found)
    for path in sorted(literal) + sorted(shipped):
        pending.extend(_shipped_files(path, root))
    while pending:
        path = pending.pop()
        if path in files:
            continue
        files.add(path)
        if path.endswith(".py"):
            if path not in imports:
                imports[path] = python_imports(path, root)
            pending.extend(imports[path])
    return sorted(files), unresolved


def files_digest(files, root):
    digest = hashlib.sha1()
    for relative in files:
        digest.update(relative.encode() + b"\0")
        with open(os.path.join(root, relative), "rb") as handle:
            digest.update(handle.read() + b"\0")
    return digest.hexdigest()


def role_code_digests(roles, root, shipped=None):
    """{role: sha1 of its own code} (see the module's documentation). ``shipped``:
    {role: collection paths the role installs that its YAML does not name literally}."""
    shipped, imports = shipped or {}, {}
    return dict((role, files_digest(role_code_files(role, root, shipped.get(role) or (), imports)[0], root))
                for role in roles)


def tree_state(root, subdirs=("roles", "plugins")):
    """sha1 of the name, size and modification time of every file under ``subdirs``: what the code
    digests depend on, read with stat alone (milliseconds, where parsing the code takes a second)."""
    digest = hashlib.sha1()
    for sub in subdirs:
        for relative in _files_under(root, sub):
            info = os.stat(os.path.join(root, relative))
            digest.update(("%s %d %d\n" % (relative, info.st_size, info.st_mtime_ns)).encode())
    return digest.hexdigest()


def code_facts(roles, root, programs, installed_by):
    """The device programs' files and the roles' code digests, in one computation: ``programs``:
    {name: entry files}, each with what it imports (imported_closure); ``installed_by``: {name: the
    role that installs that program (one role may install several)}, so that its files count as the
    role's code."""
    files = dict((name, imported_closure(entries, root)) for name, entries in programs.items())
    shipped = {}
    for name, found in sorted(files.items()):
        shipped.setdefault(installed_by[name], set()).update(found)
    shipped = dict((role, sorted(found)) for role, found in shipped.items())
    return {"programs": files, "digests": role_code_digests(roles, root, shipped)}


def cached_code_facts(roles, root, programs, installed_by, cache_dir=None, state=None):
    """code_facts, kept on the controller's disk by the state of the collection's files (tree_state):
    the planner runs once per host, each in a worker process of its own, and parsing the code takes
    about a second where the stat of its files takes milliseconds. A cache that cannot be read or
    written only costs the computation again. ``state``: tree_state(root), where the caller has it."""
    cache_dir = controller_cache_dir("code") if cache_dir is None else cache_dir
    entry = None
    if cache_dir:
        key = hashlib.sha1(json.dumps(["code_facts", state or tree_state(root), os.path.realpath(root), sorted(roles),
                                       sorted((k, list(v)) for k, v in programs.items()),
                                       sorted(installed_by.items())]).encode())
        entry = os.path.join(cache_dir, key.hexdigest() + ".json")
    return cached_json(entry, lambda: code_facts(roles, root, programs, installed_by))
