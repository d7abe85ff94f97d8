"""The apply lease (plugins/module_utils/device/edge_lease.py): one apply at a time per device. Taken,
kept by its own run, waited for and refused with the holder's name, taken over when expired, from an
earlier boot or from a run its controller saw end; given back only by its holder; two takers
racing for it never both win."""
import json
import multiprocessing
import os

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_lease as lease
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError


def holder(run="ctl:100:555", user="ops", playbook="site.yml"):
    return {"run_id": run, "controller": run.split(":")[0], "user": user, "playbook": playbook}


class Clock:
    def __init__(self, now=1000.0):
        self.now = now
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def paths(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    return {"path": str(tmp_path / "var" / "apply.lease"), "boot_id_path": str(boot)}


def test_a_free_device_is_taken_and_the_lease_names_its_holder(paths):
    clock = Clock()
    found = lease.take(holder(), 600, 60, clock=clock, **paths)
    assert found == {"changed": True, "waited_s": 0.0, "took_over": None, "held_by": None}
    doc = json.loads(open(paths["path"]).read())
    assert doc["run_id"] == "ctl:100:555" and doc["user"] == "ops" and doc["playbook"] == "site.yml"
    assert (doc["since"], doc["expires"], doc["boot_id"]) == (1000.0, 1600.0, "boot-1")
    # Its own run takes it again (renews it), keeping since.
    clock.now = 1500.0
    again = lease.take(holder(), 600, 60, clock=clock, **paths)
    assert again["changed"] is False and again["took_over"] is None
    doc = json.loads(open(paths["path"]).read())
    assert (doc["since"], doc["expires"]) == (1000.0, 2100.0)


def test_another_run_waits_then_fails_with_one_line_naming_the_holder(paths):
    clock = Clock()
    lease.take(holder(), 600, 60, clock=clock, **paths)
    # Without waiting: the holder, nothing written.
    before = open(paths["path"]).read()
    found = lease.take(holder("awx:7:9", user="awx"), 600, 0, clock=clock, **paths)
    assert found["held_by"]["run_id"] == "ctl:100:555" and open(paths["path"]).read() == before
    with pytest.raises(EdgeError) as raised:
        lease.take(holder("awx:7:9", user="awx"), 600, 30, clock=clock, sleep=clock.sleep, **paths)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("another apply holds this device: controller ctl, user ops, playbook site.yml, "
                              "since 1970-01-01 00:16:40 UTC (run ctl:100:555; expires in 570 s); waited 30 s")
    assert sum(clock.slept) >= 30 and max(clock.slept) <= lease.POLL_S
    assert open(paths["path"]).read() == before


def test_the_waiter_gets_the_lease_once_it_is_given_back(paths):
    clock = Clock()
    lease.take(holder(), 600, 60, clock=clock, **paths)

    def sleep_then_give_back(seconds):
        clock.sleep(seconds)
        if clock.now >= 1006:
            assert lease.give_back("ctl:100:555", paths["path"])

    found = lease.take(holder("awx:7:9"), 600, 60, clock=clock, sleep=sleep_then_give_back, **paths)
    assert found["changed"] and 6 <= found["waited_s"] <= 8 and found["took_over"] is None
    assert json.loads(open(paths["path"]).read())["run_id"] == "awx:7:9"


@pytest.mark.parametrize("change, why", [("expired", "expired"), ("reboot", "earlier boot"), ("ended", "ended")])
def test_a_stale_lease_is_taken_over_and_said(paths, change, why):
    clock = Clock()
    lease.take(holder(), 600, 60, clock=clock, **paths)
    ended = None
    if change == "expired":
        clock.now += 601
    elif change == "reboot":
        open(paths["boot_id_path"], "w").write("boot-2\n")
    else:
        ended = "ctl:100:555"
    found = lease.take(holder("awx:7:9"), 600, 0, clock=clock, ended_run=ended, **paths)
    assert found["changed"] and found["held_by"] is None
    assert found["took_over"].startswith("%s lease of controller ctl, user ops, playbook site.yml" % why)


def test_only_the_holder_gives_it_back_and_check_mode_only_peeks(paths):
    lease.take(holder(), 600, 60, **paths)
    assert lease.peek("ctl:100:555", **paths) is None           # its own run is not stopped
    assert lease.peek("other", **paths)["user"] == "ops"
    assert lease.give_back("other", paths["path"]) is False and os.path.exists(paths["path"])
    assert lease.give_back("ctl:100:555", paths["path"]) is True and not os.path.exists(paths["path"])
    assert lease.give_back("ctl:100:555", paths["path"]) is False
    assert lease.peek("other", **paths) is None


def reboot(paths, boot_id="boot-2"):
    """What a reboot leaves: /run emptied (the lease file gone), a new boot id."""
    os.unlink(paths["path"])
    with open(paths["boot_id_path"], "w") as handle:
        handle.write(boot_id + "\n")


def test_a_run_keeps_its_lease_through_its_own_reboot(paths):
    clock = Clock()
    lease.take(holder(), 3600, 0, clock=clock, **paths)
    assert lease.keep_through_reboot("awx:7:9", 900, paths["path"], clock=clock) is False  # not the holder's
    assert lease.keep_through_reboot("ctl:100:555", 900, paths["path"], clock=clock) is True
    kept = lease.handover_path(paths["path"])
    assert json.loads(open(kept).read())["through_reboot"] is True
    # Before the reboot the lease file holds as ever; the copy is not read in the same boot.
    assert lease.peek("awx:7:9", clock=clock, **paths)["run_id"] == "ctl:100:555"
    reboot(paths)
    clock.now += 60
    # Another run waiting across the reboot still finds the device held by the rebooting run.
    found = lease.take(holder("awx:7:9", user="awx"), 600, 0, clock=clock, **paths)
    assert found["held_by"]["run_id"] == "ctl:100:555" and not os.path.exists(paths["path"])
    assert lease.peek("awx:7:9", clock=clock, **paths)["run_id"] == "ctl:100:555"
    with pytest.raises(EdgeError, match="another apply holds this device: controller ctl"):
        lease.take(holder("awx:7:9", user="awx"), 600, 10, clock=clock, sleep=clock.sleep, **paths)
    # The holder takes it again in the new boot: its own lease, the copy gone.
    again = lease.take(holder(), 3600, 0, clock=clock, **paths)
    assert again["changed"] is False and again["took_over"] is None
    doc = json.loads(open(paths["path"]).read())
    assert (doc["boot_id"], doc["since"], doc.get("through_reboot")) == ("boot-2", 1000.0, None)
    assert not os.path.exists(kept)


def test_a_run_that_never_came_back_from_its_reboot_is_taken_over_after_the_grace(paths):
    clock = Clock()
    lease.take(holder(), 3600, 0, clock=clock, **paths)
    lease.keep_through_reboot("ctl:100:555", 900, paths["path"], clock=clock)
    reboot(paths)
    clock.now += 901
    found = lease.take(holder("awx:7:9", user="awx"), 600, 0, clock=clock, **paths)
    assert found["changed"] is True and found["took_over"].startswith("expired lease of controller ctl")
    assert not os.path.exists(lease.handover_path(paths["path"]))


def test_a_reboot_that_did_not_happen_leaves_no_copy_behind(paths):
    clock = Clock()
    lease.take(holder(), 3600, 0, clock=clock, **paths)
    lease.keep_through_reboot("ctl:100:555", 900, paths["path"], clock=clock)
    assert lease.give_back("ctl:100:555", paths["path"]) is True
    assert not os.path.exists(lease.handover_path(paths["path"]))
    assert lease.handover_path() == "/var/lib/edgetune/apply.lease.reboot"


def test_a_holder_without_a_name_is_refused():
    with pytest.raises(EdgeError, match="the lease's holder has no run_id, user"):
        lease.take({"controller": "c", "playbook": "p"}, 60, 0, path="/nonexistent/x")


def _race(args):
    path, boot, run, barrier = args
    barrier.wait()
    return lease.take(holder(run), 600, 0, path=path, boot_id_path=boot)["held_by"] is None


def test_two_applies_starting_together_never_both_win(paths):
    for attempt in range(5):
        if os.path.exists(paths["path"]):
            os.unlink(paths["path"])
        with multiprocessing.Manager() as manager:
            barrier = manager.Barrier(4)
            with multiprocessing.Pool(4) as pool:
                won = pool.map(_race, [(paths["path"], paths["boot_id_path"], "c%d:1:1" % i, barrier)
                                       for i in range(4)])
        assert sum(won) == 1, (attempt, won)


def test_the_controller_tells_a_run_that_ended(tmp_path):
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    stat = "42 (ansible-playbook) S " + " ".join(["0"] * 18) + " 777 0 0"
    (proc / "42" / "stat").write_text(stat)
    (proc / "42" / "cmdline").write_bytes(b"/usr/bin/python3\0/venv/bin/ansible-playbook\0-i\0inv\0site.yml\0")
    me = lease.run_identity("ctl", "ops", 42, str(proc))
    assert me == {"run_id": "ctl:42:777", "controller": "ctl", "user": "ops", "playbook": "site.yml"}
    assert lease.run_has_ended("ctl:42:777", "ctl", str(proc)) is False          # still running
    assert lease.run_has_ended("ctl:42:776", "ctl", str(proc)) is True           # the pid is another process now
    assert lease.run_has_ended("ctl:43:777", "ctl", str(proc)) is True           # gone
    assert lease.run_has_ended("awx:43:777", "ctl", str(proc)) is False          # another controller's: unknown
    assert lease.run_has_ended("ctl:43:?", "ctl", str(proc)) is False


def test_a_copy_left_by_a_run_that_died_before_its_reboot_goes_with_the_next_take(paths):
    clock = Clock()
    lease.take(holder(), 3600, 0, clock=clock, **paths)
    lease.keep_through_reboot("ctl:100:555", 900, paths["path"], clock=clock)
    clock.now += 3601  # the run died; its lease expired in this same boot
    found = lease.take(holder("awx:7:9", user="awx"), 600, 0, clock=clock, **paths)
    assert found["took_over"].startswith("expired lease of controller ctl")
    assert not os.path.exists(lease.handover_path(paths["path"]))
