"""edgetune: tools for tuning and auditing fleets of edge AI devices.

The tools run the very code the devices run: the collection's module
utilities (``ansible_collections.edgetune.fleet.plugins.module_utils``) and
the reference runtime (``runtime/``), imported normally. This checkout *is*
the collection; importing this package makes it importable by that name
through the link ``make collection`` keeps in ``.cache/collections`` (the
path ansible.cfg names), created here when missing.
"""
import sys
from pathlib import Path

__version__ = "0.2.0"

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / ".cache" / "collections"
COLLECTION_LINK = COLLECTIONS / "ansible_collections" / "edgetune" / "fleet"


def _make_collection_importable():
    if not COLLECTION_LINK.is_symlink():
        COLLECTION_LINK.parent.mkdir(parents=True, exist_ok=True)
        COLLECTION_LINK.symlink_to(Path("..", "..", "..", ".."))
    for path in (str(COLLECTIONS), str(REPO / "runtime")):
        if path not in sys.path:
            sys.path.append(path)


_make_collection_importable()
