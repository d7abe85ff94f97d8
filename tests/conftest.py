"""Make the project's module_utils and library importable the way Ansible does.

Modules import shared code as ``ansible.module_utils.edge_*``; Ansible resolves
that from the ``module_utils`` directory named in ansible.cfg.  The tests
extend the package path the same way, so the code under test is the code that
ships, not a copy.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import ansible.module_utils  # noqa: E402

if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
for extra in (ROOT / "library", ROOT / "tools"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))
