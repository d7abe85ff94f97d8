# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device package: what runs on the device outside Ansible's module runs (the device has no
Ansible), from one manifest, installed by one role (edge_package) in one directory.

Each program is named by its entry files; it is installed with every collection file it imports,
transitively, in the collection's package layout, so that the files import each other as the
modules do. The roles that run a program (edge_boot: the boot program, edge_audit_timer: the audit
command, edge_netqos: the network priority loader) depend on role edge_package. Runs on the
controller.
"""
import functools
import posixpath

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_audit, edge_boot, edge_netqos_loader

# The collection this file belongs to (plugins/module_utils/plan/edge_package.py).

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_code

COLLECTION = edge_code.COLLECTION
# By program, its entry files; the boot program also imports the module utility of each kind it
# re-applies by name.
DEVICE_PROGRAMS = {
    "boot": tuple("plugins/module_utils/device/%s.py" % name
                  for name in ("edge_boot",) + tuple(edge_boot.UTILS.values())),
    "audit": ("plugins/modules/edge_audit.py",),
    "netqos": (edge_netqos_loader.PROGRAM,),
}
# The role that installs the package: the programs' code counts as its own code.
ROLE = "edge_package"
# Its default directory (edge_package_install_dir).
DEFAULT_DIR = "/usr/local/lib/edgetune/package"
# Where each program had a directory of its own before the package, installed by the role that runs
# it: the role removes them, and refuses to install the package in one.
EARLIER_DIRS = ("/usr/local/lib/edgetune/boot", "/usr/local/lib/edgetune/audit", "/usr/local/lib/edgetune/netqos")


def program_files(program, root=COLLECTION):
    """The files of one program ({src: the collection file, dest: where below the package's directory}):
    its entries at the top (modules) or in the package layout (module utilities), and what they import."""
    return edge_code.install_layout(edge_code.imported_closure(DEVICE_PROGRAMS[program], root))


@functools.lru_cache(maxsize=None)
def _sources(root):
    return tuple(sorted(set(src for entries in DEVICE_PROGRAMS.values()
                            for src in edge_code.imported_closure(entries, root))))


def files(root=COLLECTION):
    """The package's files, every program's once, as program_files gives them."""
    return edge_code.install_layout(_sources(root))


def sources(root=COLLECTION):
    """The collection files the package holds (relative paths, sorted)."""
    return list(_sources(root))


def checks(installed, directory):
    """The drift audit's ``file`` check of each installed file ({dest: its path on the device, data: its
    bytes}), named by its path in the package (the audit command and its module utility share a name)."""
    top = directory.rstrip("/") + "/"
    return edge_audit.file_checks(ROLE, [{"setting": "device package " + item["dest"][len(top):],
                                          "path": item["dest"], "content": item["data"]} for item in installed])


def earlier_files(directory, root=COLLECTION):
    """Where releases before the module utilities' subpackages (device/, common/, ...) installed them
    in ``directory``: one flat module_utils/ directory. The role removes them with the earlier
    program directories."""
    top = posixpath.join(directory, edge_code.PACKAGE_DIR)
    return sorted(posixpath.join(top, posixpath.basename(src)) for src in _sources(root)
                  if src.startswith("plugins/module_utils/"))


def refused_directory(path):
    """Why ``path`` cannot be the package's directory (an earlier program directory, which the role
    removes, or one under it), or None."""
    path = posixpath.normpath(path)
    for earlier in EARLIER_DIRS:
        if path == earlier or path.startswith(earlier + "/"):
            return "it is where an earlier release kept a program (%s), which role edge_package removes" % earlier
    return None
