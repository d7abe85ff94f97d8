"""Make the collection importable the way Ansible does, from this checkout.

Modules import shared code as
``ansible_collections.edgetune.fleet.plugins.module_utils.edge_*``; the
Makefile links the checkout into ``.cache/collections`` as the collection
(the path ansible.cfg names), and the tests import through that link, so the
code under test is the code that ships, not a copy. The modules themselves are
imported as top-level files from plugins/modules, as the unit tests call
their functions directly.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / ".cache" / "collections"

LINK = COLLECTIONS / "ansible_collections" / "edgetune" / "fleet"

if not LINK.is_symlink():  # `make collection` makes the same link; pytest run alone makes it here
    LINK.parent.mkdir(parents=True, exist_ok=True)
    LINK.symlink_to(Path("..", "..", "..", ".."))
for extra in (COLLECTIONS, ROOT / "plugins" / "modules", ROOT / "tools"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

# A line a minute while a test runs long (tests/heartbeat.py); pytest puts this directory on sys.path.
import heartbeat  # noqa: E402

pytest_configure = heartbeat.pytest_configure
pytest_runtest_logstart = heartbeat.pytest_runtest_logstart
pytest_runtest_logfinish = heartbeat.pytest_runtest_logfinish
pytest_unconfigure = heartbeat.pytest_unconfigure
