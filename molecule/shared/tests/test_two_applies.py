"""Two applies on one twin at once, as two operators (or an AWX job and a hand run) would start
them: the second waits for the first's apply lease and, when its edge_lease_wait runs out, fails
with one line naming the first run, having changed nothing; started after the first, it runs."""
import os
import re
import subprocess
import time

import pytest
from conftest import recap

LEASE = "/run/edgetune/apply.lease"

pytestmark = pytest.mark.one_board


def start_site(host, *extra):
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    argv = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "-l", host.backend.host,
            os.path.join(project, "site.yml"), *extra]
    return subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))


def test_a_second_apply_waits_for_the_first_and_never_interleaves(host):
    name = host.backend.host
    assert not host.file(LEASE).exists
    # The first runs every role in full (a minute or more): the second starts while it holds the lease.
    first = start_site(host, "-e", '{"edge_converge_full": true}')
    try:
        deadline = time.time() + 120
        while not host.file(LEASE).exists:
            assert first.poll() is None, first.stdout.read()[-3000:]
            assert time.time() < deadline, "the first run never took the lease"
            time.sleep(0.5)
        holder = host.file(LEASE).content_string
        second = start_site(host, "-e", '{"edge_lease_wait": 3}')
        out = second.communicate(timeout=300)[0]
        assert second.returncode != 0, out[-3000:]
        stats = recap(out, name)
        assert stats["failed"] == 1 and stats["changed"] == 0, out[-3000:]
        refusal = re.search(r"another apply holds this device: (.+?); waited \d+ s", " ".join(out.split()))
        assert refusal and "site.yml" in refusal.group(1), out[-3000:]
        assert host.file(LEASE).content_string == holder        # the first run's lease, untouched
    finally:
        done = first.communicate(timeout=900)[0]
    assert first.returncode == 0 and recap(done, name)["failed"] == 0, done[-3000:]
    assert not host.file(LEASE).exists                          # given back at the end of the run
    after = start_site(host)
    out = after.communicate(timeout=600)[0]
    assert after.returncode == 0 and recap(out, name)["changed"] == 0, out[-3000:]
