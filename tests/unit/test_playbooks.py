"""The playbooks' own guards, on real ansible-playbook runs that reach no device."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.controller


def playbook_run(playbook, tmp_path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", EDGETUNE_NO_SUMMARY="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path))
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, *extra, str(REPO / playbook)],
                          cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)


@pytest.mark.parametrize("playbook", ["playbooks/tune.yml", "playbooks/deploy.yml", "site.yml"])
def test_an_apply_refuses_edge_mode_audit_before_any_role(playbook, tmp_path):
    """edge_mode audit is the audit's preflight: tune.yml and deploy.yml stop at once (the roles
    have no audit mode any more, so they would apply), and site.yml before its preflight reads the board."""
    done = playbook_run(playbook, tmp_path, "-e", "edge_mode=audit")
    assert done.returncode == 2, done.stdout[-3000:]
    assert "edge_mode is audit: this playbook applies. Audit with playbooks/audit.yml (edgetune audit), or " \
           "remove edge_mode." in done.stdout
    assert "TASK [edgetune.fleet." not in done.stdout   # no role started


@pytest.mark.parametrize("playbook", ["playbooks/tune.yml", "playbooks/deploy.yml"])
def test_without_edge_mode_the_guard_lets_the_run_through(playbook, tmp_path):
    """The usual run sets no edge_mode: the guard passes (its message is templated all the same,
    so it may name no unset variable). Check mode and a tag no task has: nothing on this machine
    changes, and the run stops later, at the first task that needs the board's facts."""
    done = playbook_run(playbook, tmp_path, "--check", "--tags", "edgetune-no-such-tag")
    guard = done.stdout.split("TASK [Refuse to apply with edge_mode audit]", 1)[1].split("TASK [", 1)[0]
    assert "ok: [localhost]" in guard, done.stdout[-3000:]
    assert "is undefined" not in done.stdout


def reboot_test_command():
    import yaml
    for task in yaml.safe_load((REPO / "playbooks" / "tasks" / "reboot.yml").read_text()):
        if "ansible.builtin.reboot" in task:
            return task["ansible.builtin.reboot"]["test_command"]
    raise AssertionError("playbooks/tasks/reboot.yml has no reboot task")


@pytest.mark.parametrize("says, code, ready", [
    ("running", 0, True),
    ("degraded", 1, True),       # a failed unit: booted all the same
    ("starting", 1, False),      # --wait gave up (its timeout) while the boot still runs
    ("maintenance", 1, False),   # the rescue shell: never "back"
    ("", 1, False),              # "Failed to connect to bus" (stderr): systemd not answering yet
])
def test_the_reboot_is_over_only_once_the_boot_has_settled(tmp_path, says, code, ready):
    """Right after a twin's restart, `systemctl is-system-running --wait` fails at once ("Failed to
    connect to bus", seen) while systemd-tmpfiles has yet to clean /tmp: a module started then lost
    its payload (seen in make test). The reboot's test command fails until the boot is done."""
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n[ -n '%s' ] && echo '%s' || echo 'Failed to connect to bus' >&2\nexit %d\n"
                    % (says, says, code))
    fake.chmod(0o755)
    path = "%s:/usr/bin:/bin" % fake.parent
    done = subprocess.run(["sh", "-c", reboot_test_command()], env=dict(os.environ, PATH=path),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert (done.returncode == 0) == ready, done.stdout
