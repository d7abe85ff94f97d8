"""edge_command.run: device commands with a time limit, run for real (a hung one is killed with its children)."""
import time

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_command
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError


def test_the_result_and_the_input_as_run_command_gives_them():
    assert edge_command.run(["sh", "-c", "read answer; echo got $answer; echo warned >&2; exit 3"], data="NO") == \
        (3, "got NO\n", "warned\n")
    assert edge_command.run(["true"]) == (0, "", "")


def test_a_command_that_hangs_is_killed_with_its_children_and_named(tmp_path):
    child = tmp_path / "child.pid"
    started = time.time()
    with pytest.raises(EdgeError, match=r"^sh -c sleep 60 & echo \$! > .* did not finish within 1 s and was killed"):
        edge_command.run(["sh", "-c", "sleep 60 & echo $! > %s; wait" % child], timeout=1)
    assert time.time() - started < 10
    pid = int(child.read_text())
    time.sleep(0.2)
    assert not alive(pid)   # the background child went with the group


def alive(pid):
    """Whether ``pid`` runs (a killed child whose new parent has not reaped it yet is a zombie: dead)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_command_that_cannot_start_is_one_line():
    with pytest.raises(EdgeError, match="cannot run /no/such/nvpmodel: No such file or directory"):
        edge_command.run(["/no/such/nvpmodel", "-q"])
