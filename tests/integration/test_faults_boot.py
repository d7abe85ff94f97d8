"""Faults on the boot file's filesystem: a full /boot and a read-only /boot, on a real Orin NX twin.

The boot arguments' apply (site.yml --tags edge_facts,edge_bootargs, a new argument) meets a /boot that is
a small filesystem filled to the last block, then one mounted read-only. Each run ends at once with one
message naming the file and the fault, and leaves /boot byte for byte as it was: the boot file, its
backups, no temporary file. The run that follows, with the fault gone, takes the failed run's lease over
(saying so) and writes the argument.
"""
import json
import os
import re
import subprocess
import time

import pytest

from edgetune_dev import CHECKOUT
from edgetune_dev.twin import manager

pytestmark = pytest.mark.controller

TWIN = "it-fault-boot-orin"
BOOT_FILE = "/boot/extlinux/extlinux.conf"
ARGUMENT = "edgetune.fault_test=1"
# The twin's /boot on a 64 KiB filesystem of its own holding the same files (the boot emulation reads it).
SMALL_BOOT = ("cp -a /boot /root/boot.orig && mount -t tmpfs -o size=64k,mode=0755 tmpfs /boot "
              "&& cp -a /root/boot.orig/. /boot/")


def sh(command):
    done = subprocess.run(["docker", "exec", TWIN, "sh", "-c", command], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def boot_state():
    """Every file under /boot with its sha256 (the filler left out)."""
    return sh("cd /boot && find . -type f ! -name filler -exec sha256sum {} + | sort")


def apply_bootargs(inventory):
    started = time.time()
    done = subprocess.run(["ansible-playbook", "-i", str(inventory), "-l", TWIN, "site.yml",
                           "--tags", "edge_facts,edge_bootargs",
                           "-e", json.dumps({"edge_bootargs_extra": [ARGUMENT], "edge_reboot_policy": "never"})],
                          cwd=str(CHECKOUT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))
    return done.returncode, done.stdout, time.time() - started


def failure_messages(output):
    """The failed tasks' messages (the yaml result format wraps them over lines: joined again)."""
    flat = " ".join(output.split())
    return [match.group(1) for match in re.finditer(r"fatal: \[[^]]+\]: FAILED! => changed: false msg: '(.*?)' ", flat)]


@pytest.fixture
def twin(tmp_path):
    manager.ensure_images(["bookworm"])
    manager.remove(TWIN)
    manager.create(TWIN, "orin-nx-16gb-r36")
    inventory = manager.write_group_inventory(tmp_path / "inventory", "orin-fleet", [TWIN],
                                              CHECKOUT / "inventory" / "twin" / "group_vars")
    sh(SMALL_BOOT)
    yield inventory
    manager.remove(TWIN)


@pytest.mark.parametrize("fault, make, undo, said", [
    ("full", "dd if=/dev/zero of=/boot/filler bs=1k 2>/dev/null; df /boot | tail -1 | awk '$4 != 0 {exit 1}'",
     "rm /boot/filler", "No space left on device"),
    ("read-only", "mount -o remount,ro /boot", "mount -o remount,rw /boot", "Read-only file system"),
])
def test_the_boot_files_filesystem_at_fault_changes_nothing_and_says_so_in_one_message(twin, fault, make, undo, said):
    before = boot_state()
    sh(make)
    rc, output, seconds = apply_bootargs(twin)
    assert rc != 0 and seconds < 60, output[-3000:]
    messages = failure_messages(output)
    assert len(messages) == 1, output[-3000:]
    assert "writing %s failed" % BOOT_FILE in messages[0] and said in messages[0] \
        and "nothing was changed" in messages[0], messages
    assert boot_state() == before                         # no temporary, no backup, the file as it was
    assert ARGUMENT not in sh("cat " + BOOT_FILE)

    # The fault gone, the next run takes the failed run's lease over, says whose, and writes the argument.
    sh(undo)
    rc, output, _seconds = apply_bootargs(twin)
    assert rc == 0, output[-3000:]
    assert "another apply holds this device" in output and "it has ended, taking its lease over" in output
    assert ARGUMENT in sh("sed -n 's/^ *APPEND //p' %s | head -1" % BOOT_FILE)
