"""The playbooks' own guards, on real ansible-playbook runs that reach no device."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.controller


@pytest.mark.parametrize("playbook", ["playbooks/tune.yml", "playbooks/deploy.yml"])
def test_an_apply_refuses_edge_mode_audit_before_any_role(playbook, tmp_path):
    """edge_mode audit is the audit's preflight: tune.yml and deploy.yml stop at once (the roles
    have no audit mode any more, so they would apply)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", EDGETUNE_NO_SUMMARY="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                           "-c", "local", "-e", "edge_mode=audit", "-e", "ansible_python_interpreter=" + sys.executable,
                           str(REPO / playbook)], cwd=str(REPO), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert done.returncode == 2, done.stdout[-3000:]
    assert "edge_mode is audit: this playbook applies. Audit with playbooks/audit.yml (edgetune audit), or " \
           "remove edge_mode." in done.stdout
    assert "TASK [edgetune.fleet." not in done.stdout   # no role started
