"""The apply lease through Ansible, as the playbooks take it: edge_facts's action plugin names this
run of ansible-playbook, a second run waits for the first and fails with one line naming it, the
first gives it back with edge_lease, and a run of this controller that has ended (killed while it held
the lease) is taken over at once. Two real ansible-playbook processes on localhost, the lease in a
temporary file."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PLAYBOOK = """
- name: An apply
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Read the board and take the apply lease
      edgetune.fleet.edge_facts:
        root: {root}
        lease: {{ttl: 600, wait: {wait}, path: {lease}}}
      register: read
    - name: Say what the lease said
      ansible.builtin.copy:
        content: "{{{{ read.lease | to_json }}}}"
        dest: {out}
        mode: "0600"
    - name: Hold the device
      ansible.builtin.wait_for:
        path: {release}
        timeout: 60
    - name: Give the apply lease back
      edgetune.fleet.edge_lease:
        state: released
        path: {lease}
"""

pytestmark = pytest.mark.controller


def start(tmp_path, name, wait):
    playbook = tmp_path / ("%s.yml" % name)
    playbook.write_text(PLAYBOOK.format(root=tmp_path / "root", wait=wait, lease=tmp_path / "apply.lease",
                                        out=tmp_path / ("%s.json" % name), release=tmp_path / ("%s.go" % name)))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", EDGETUNE_NO_SUMMARY="1")
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
            "-e", "ansible_python_interpreter=" + sys.executable]
    return subprocess.Popen(argv, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)


def wait_for(path, proc, seconds=60):
    deadline = time.time() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "%s never appeared" % path
        time.sleep(0.2)
    return json.loads(path.read_text())


def test_a_second_apply_waits_fails_naming_the_first_and_then_gets_it(tmp_path):
    (tmp_path / "root").mkdir()
    first = start(tmp_path, "first", 0)
    held = wait_for(tmp_path / "first.json", first)
    assert held["taken"] is True and held["held_by"] is None
    lease = json.loads((tmp_path / "apply.lease").read_text())
    assert lease["playbook"] == "first.yml" and lease["run_id"].endswith(":%s" % lease["run_id"].split(":")[2])
    assert lease["run_id"].split(":")[1] == str(first.pid)          # the ansible-playbook process, not a worker

    second = start(tmp_path, "second", 3)
    out, _err = second.communicate(timeout=120)
    assert second.returncode != 0
    # Said once while it waits, and the failure is that line's holder and how long it waited.
    said = [line for line in out.splitlines() if line.startswith("localhost: another apply holds this device")]
    assert len(said) == 1 and "playbook first.yml" in said[0] and "run %s" % lease["run_id"] in said[0], out
    assert "waiting up to 3 s" in said[0]
    flat = " ".join(out.split())
    assert "msg: 'another apply holds this device: controller" in flat and "waited 3 s (edge_lease_wait)" in flat
    assert not (tmp_path / "second.json").exists()                  # it read nothing and wrote nothing

    (tmp_path / "first.go").write_text("")
    assert first.wait(timeout=60) == 0
    assert not (tmp_path / "apply.lease").exists()

    third = start(tmp_path, "third", 0)
    assert wait_for(tmp_path / "third.json", third)["taken"] is True
    third.kill()                                                    # a run that dies holding the lease
    third.wait()
    fourth = start(tmp_path, "fourth", 600)
    said = wait_for(tmp_path / "fourth.json", fourth, seconds=30)   # at once, not after 600 s
    assert said["taken"] and said["took_over"].startswith("ended lease of controller")
    (tmp_path / "fourth.go").write_text("")
    assert fourth.wait(timeout=60) == 0


def descendants(pid):
    """The processes below ``pid`` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry) as handle:
                text = handle.read()
            parents[int(entry)] = int(text[text.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def test_a_waiting_apply_outlives_the_device_going_away_and_then_gets_the_lease(tmp_path):
    """The holder reboots the device while a second run waits on it: the waiting module dies with the
    device (here: killed, as the reboot does). The second run says so, waits for the device to come
    back, goes on waiting for the lease, and takes it when the first gives it back."""
    (tmp_path / "root").mkdir()
    first = start(tmp_path, "first", 0)
    wait_for(tmp_path / "first.json", first)
    second = start(tmp_path, "second", 120)
    said = []
    while not any("another apply holds this device" in line for line in said):
        line = second.stdout.readline()
        assert line, "".join(said)
        said.append(line)
    modules = []
    deadline = time.time() + 30
    while not modules:
        assert time.time() < deadline, "no module of the second run is waiting"
        modules = [pid for pid in descendants(second.pid) if b"ansible-playbook" not in
                   Path("/proc/%d/cmdline" % pid).read_bytes()]
        time.sleep(0.2)
    time.sleep(1)
    for pid in modules:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
    line = ""
    while "went away" not in line:
        line = second.stdout.readline()
        assert line, "the second run never said the device went away"
    assert "waiting for it to come back" in line
    assert second.poll() is None                                    # still waiting
    (tmp_path / "first.go").write_text("")
    assert first.wait(timeout=60) == 0
    taken = wait_for(tmp_path / "second.json", second, seconds=60)
    assert taken["taken"] is True and taken["waited_s"] > 0
    (tmp_path / "second.go").write_text("")
    second.communicate(timeout=60)
    assert second.returncode == 0


def test_a_board_no_profile_matches_fails_in_the_first_task_and_gives_the_lease_back(tmp_path):
    """edge_facts matches the board on the controller in the task that took the lease: an unknown
    board stops the run there, with one line, and the lease goes back (the run changed nothing)."""
    (tmp_path / "root").mkdir()
    playbook = tmp_path / "unknown.yml"
    playbook.write_text(PLAYBOOK.format(root=tmp_path / "root", wait=0, lease=tmp_path / "apply.lease",
                                        out=tmp_path / "unknown.json", release=tmp_path / "unknown.go").replace(
        "        lease: {ttl: 600, wait: 0, path: %s}\n" % (tmp_path / "apply.lease"),
        "        lease: {ttl: 600, wait: 0, path: %s}\n        profiles_dirs: [%s]\n"
        % (tmp_path / "apply.lease", REPO / "roles" / "edge_facts" / "files" / "board_profiles")))
    assert "profiles_dirs" in playbook.read_text()
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", EDGETUNE_NO_SUMMARY="1")
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook), "-e", "ansible_python_interpreter=" + sys.executable], cwd=str(REPO),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=120, check=False)
    assert done.returncode != 0 and "Unknown board: model" in " ".join(done.stdout.split()), done.stdout[-2000:]
    assert not (tmp_path / "unknown.json").exists()
    assert not (tmp_path / "apply.lease").exists()
