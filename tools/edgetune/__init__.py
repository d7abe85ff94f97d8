"""edgetune: the CLI for tuning, planning, auditing and verifying fleets of edge AI devices.

The tools run the very code the devices run: the collection's module
utilities (``ansible_collections.edgetune.fleet.plugins.module_utils``) and,
in a checkout, the reference runtime (``runtime/``), imported normally.
Importing this package makes the collection edgetune.fleet importable by that
name from where Ansible finds it (its collections paths: ansible.cfg as
Ansible finds it from the current directory, ANSIBLE_COLLECTIONS_PATH); run
from a checkout (which *is* the collection), the link ``make collection``
keeps in ``.cache/collections`` (the path its ansible.cfg names) is made
first when missing and is the fallback, and the checkout's tools/ (the
development harness, edgetune_dev) is importable too. Installed from a wheel,
nothing is written next to the package, and there is no harness.
"""
import sys
from pathlib import Path

__version__ = "0.2.0"
# The version of the collection edgetune.fleet this edgetune is released with (galaxy.yml's).
COLLECTION_VERSION = __version__

REPO = Path(__file__).resolve().parents[2]
# This checkout's root when running from one (tools/edgetune of the repository that is the collection), else None.
CHECKOUT = REPO if (REPO / "galaxy.yml").is_file() and (REPO / "tools" / "pyproject.toml").is_file() else None
COLLECTIONS = REPO / ".cache" / "collections"
COLLECTION_LINK = COLLECTIONS / "ansible_collections" / "edgetune" / "fleet"


def _make_collection_importable():
    from edgetune import ansible_setup
    if CHECKOUT and not COLLECTION_LINK.is_symlink():
        COLLECTION_LINK.parent.mkdir(parents=True, exist_ok=True)
        COLLECTION_LINK.symlink_to(Path("..", "..", "..", ".."))
    found = ansible_setup.locate_collection()[0]
    if found is None and CHECKOUT:
        found = COLLECTION_LINK
    paths = [str(found.parents[2])] if found is not None else []  # the directory holding ansible_collections/
    if CHECKOUT:
        # The reference runtime, and the development harness (edgetune_dev: twins, VM, benchmarks, packaging).
        paths += [str(CHECKOUT / "runtime"), str(CHECKOUT / "tools")]
    for path in paths:
        if path not in sys.path:
            sys.path.append(path)


_make_collection_importable()
