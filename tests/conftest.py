"""Make the collection importable the way Ansible does, from this checkout.

Modules import shared code as
``ansible_collections.edgetune.fleet.plugins.module_utils.edge_*``; the
checkout links itself as the collection in ``collections/`` (committed, the
path ansible.cfg names), and the tests import through that link, so the code
under test is the code that ships, not a copy. The modules themselves are
imported as top-level files from plugins/modules, as the unit tests call
their functions directly. The CLI (cli/) and the harness (tools/) import from
the checkout too, installed or not (the Python 3.8 run has neither installed).
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / "collections"

for extra in (COLLECTIONS, ROOT / "plugins" / "modules", ROOT / "cli", ROOT / "tools", ROOT / "runtime"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_ansible_collection_loader_left():
    """A test running edgetune in this process may install Ansible's collection loader (as the CLI does to
    import the collection's module utilities from where Ansible finds it): remove it after the test, with
    the modules it loaded, so that the next test imports from this checkout again."""
    yield
    try:
        from ansible.utils.collection_loader import AnsibleCollectionConfig
        from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
    except ImportError:  # no ansible-core (the Python 3.8 run)
        return
    if AnsibleCollectionConfig.collection_finder is None:
        return
    _AnsibleCollectionFinder._remove()
    for name, module in list(sys.modules.items()):
        if name.startswith("ansible_collections.") and "collection_loader" in type(
                getattr(module, "__loader__", None)).__module__:
            del sys.modules[name]


# A line a minute while a test runs long (tests/heartbeat.py); pytest puts this directory on sys.path.
import heartbeat  # noqa: E402

pytest_configure = heartbeat.pytest_configure
pytest_runtest_logstart = heartbeat.pytest_runtest_logstart
pytest_runtest_logfinish = heartbeat.pytest_runtest_logfinish
pytest_unconfigure = heartbeat.pytest_unconfigure
