"""`edgetune-dev twin up` checks the host's inotify limits for the fleet before booting (#15),
on a fake /proc/sys, with a fake docker that answers the measure inside a running twin."""
import json
import sys

import pytest

from edgetune_dev import cli
from edgetune.errors import UsageError
from edgetune_dev.twin import inotify, manager

# Debian's defaults on a small host.
DEFAULTS = {"max_user_instances": 128, "max_user_watches": 8192}


@pytest.fixture
def proc_sys(tmp_path, monkeypatch):
    """A fake /proc/sys with the defaults; edgetune runs as root unless a test says otherwise."""
    root = tmp_path / "proc-sys"
    (root / "fs" / "inotify").mkdir(parents=True)
    for limit, value in DEFAULTS.items():
        (root / "fs" / "inotify" / limit).write_text("%d\n" % value)
    monkeypatch.setattr(inotify, "PROC_SYS", str(root))
    monkeypatch.setattr(inotify, "running_as_root", lambda: True)
    return root


def limits(proc_sys):
    return {limit: int((proc_sys / "fs" / "inotify" / limit).read_text()) for limit in DEFAULTS}


def test_root_raises_both_limits_for_thirty_twins_and_says_so(proc_sys):
    said = []
    inotify.ensure_limits(30, said.append)
    # 32 + 30 * 6 * 1.5 = 302 instances -> 512; 2048 + 30 * 300 * 1.5 = 15548 watches -> 16384.
    assert limits(proc_sys) == {"max_user_instances": 512, "max_user_watches": 16384}
    assert said == [
        "raised fs.inotify.max_user_instances from 128 to 512 for 30 twins "
        "(not kept across reboots: add it to /etc/sysctl.d/ to keep it)",
        "raised fs.inotify.max_user_watches from 8192 to 16384 for 30 twins "
        "(not kept across reboots: add it to /etc/sysctl.d/ to keep it)"]


def test_a_small_fleet_fits_the_defaults_and_nothing_is_touched(proc_sys):
    said = []
    inotify.ensure_limits(3, said.append)
    assert limits(proc_sys) == DEFAULTS and said == []


def test_without_root_one_line_names_the_sysctl_and_the_value(proc_sys, monkeypatch):
    monkeypatch.setattr(inotify, "running_as_root", lambda: False)
    with pytest.raises(UsageError) as error:
        inotify.ensure_limits(30)
    assert str(error.value) == (
        "fs.inotify.max_user_instances is 128; 30 twins need about 302 (6 per twin estimated, with margin): "
        "run `sysctl -w fs.inotify.max_user_instances=512` as root (and add it to /etc/sysctl.d/ to keep it), "
        "then `edgetune-dev twin up` again")
    assert limits(proc_sys) == DEFAULTS


def test_a_kernel_that_refuses_the_write_is_named_too(proc_sys, monkeypatch):
    def refused(path, value):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(inotify, "write_limit", refused)
    with pytest.raises(UsageError, match=r"^fs.inotify.max_user_instances is 128; .*, and it cannot be raised "
                                         r"here \(Operation not permitted\): run `sysctl -w "
                                         r"fs.inotify.max_user_instances=512` on the host$"):
        inotify.ensure_limits(30)


@pytest.fixture
def docker_in_a_twin(tmp_path, monkeypatch):
    """A fake docker: `docker exec TWIN sh -c SCRIPT` prints what a twin's /proc holds; argv recorded."""
    record = tmp_path / "docker-argv.json"
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text("#!%s\nimport json, sys\njson.dump(sys.argv[1:], open(%r, 'w'))\nprint(9)\nprint(410)\n"
                    % (sys.executable, str(record)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    return record


def test_the_use_per_twin_is_measured_on_a_running_twin(proc_sys, docker_in_a_twin):
    said = []
    inotify.ensure_limits(20, said.append, sample_twin="orin-nx-16gb-r36-1")
    assert json.loads(docker_in_a_twin.read_text()) == ["exec", "orin-nx-16gb-r36-1", "sh", "-c",
                                                        inotify.MEASURE_SCRIPT]
    # 32 + 20 * 9 * 1.5 = 302 -> 512; 2048 + 20 * 410 * 1.5 = 14348 -> 16384.
    assert limits(proc_sys) == {"max_user_instances": 512, "max_user_watches": 16384}
    assert said[0].startswith("raised fs.inotify.max_user_instances from 128 to 512 for 20 twins")


def test_measure_script_counts_inotify_descriptors_and_watches():
    """The script run inside a twin, run here on this machine's own /proc: this test's process
    opens one inotify instance with one watch, so both counts are at least 1."""
    import ctypes
    import os
    import subprocess
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init()
    if fd < 0:
        pytest.skip("inotify_init failed here (errno %d)" % ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, b"/", 0x100) >= 0  # IN_CREATE
        counts = subprocess.run(["sh", "-c", inotify.MEASURE_SCRIPT], stdout=subprocess.PIPE, text=True,
                                check=False).stdout.split()
        assert len(counts) == 2 and int(counts[0]) >= 1 and int(counts[1]) >= 1, counts
    finally:
        os.close(fd)


def test_twin_up_checks_before_booting_any_twin(proc_sys, monkeypatch, capsys, tmp_path):
    created = []
    monkeypatch.chdir(tmp_path)  # were it to get that far, the inventory is written here
    monkeypatch.setattr(inotify, "running_as_root", lambda: False)
    monkeypatch.setattr(manager, "ensure_images", lambda distros, say: [])
    monkeypatch.setattr(manager, "twins", lambda fleet_only=False: [])
    monkeypatch.setattr(manager, "create", lambda name, board, say, fleet: created.append(name))
    assert cli.main(["twin", "up", "--fleet", "orin-nx-16gb-r36:30"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("edgetune-dev: error: fs.inotify.max_user_instances is 128; 30 twins")
    assert created == []
