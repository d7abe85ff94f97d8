"""The edge_summary callback's JSON lines (EDGETUNE_SUMMARY_JSON), from real ansible-playbook runs.

A playbook on localhost with a task that changes a file, one that does not and
one that is skipped runs in check mode, then for real, then again: each run
appends one line that names the changed tasks, in check mode too, and says
whether it was check mode.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.controller

REPO = Path(__file__).resolve().parents[2]

PLAYBOOK = """
- name: A play with one change
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Write the marker file
      ansible.builtin.copy:
        dest: "{{ marker }}"
        content: "marked\\n"
        mode: "0644"
    - name: Read the marker file
      ansible.builtin.stat:
        path: "{{ marker }}"
    - name: Never run
      ansible.builtin.command: "false"
      when: false
"""


def run(tmp_path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="edgetune.fleet.edge_summary")
    env.pop("EDGETUNE_NO_SUMMARY", None)
    env["EDGETUNE_SUMMARY_JSON"] = str(tmp_path / "runs.jsonl")
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(playbook),
            "-e", "marker=%s" % (tmp_path / "marker"), "-e", "ansible_python_interpreter=" + sys.executable, *extra]
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=True)


def lines(tmp_path):
    return [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]


def test_each_run_appends_its_changed_tasks_and_whether_it_was_check_mode(tmp_path):
    run(tmp_path, "--check")
    assert not (tmp_path / "marker").exists()
    run(tmp_path)
    run(tmp_path)
    check, first, second = lines(tmp_path)
    assert [check["check_mode"], first["check_mode"], second["check_mode"]] == [True, False, False]
    assert check["hosts"]["localhost"]["changed"] == ["Write the marker file"]
    assert first["hosts"]["localhost"]["changed"] == ["Write the marker file"]
    assert second["hosts"]["localhost"]["changed"] == []
    assert {run["hosts"]["localhost"]["state"] for run in (check, first, second)} == {"ok"}
    assert check["playbook"].endswith("play.yml") and check["wall_s"] >= 0


def test_a_failed_host_is_said_and_an_unwritable_file_only_warns(tmp_path):
    (tmp_path / "marker").mkdir()  # copy cannot write a file where a directory is
    with pytest.raises(subprocess.CalledProcessError) as error:
        run(tmp_path)
    assert "EDGETUNE FLEET SUMMARY" in error.value.stdout
    assert lines(tmp_path)[-1]["hosts"]["localhost"]["state"] == "FAILED"
    (tmp_path / "runs.jsonl").unlink()
    (tmp_path / "runs.jsonl").mkdir()  # the summary cannot be appended: the run still succeeds
    (tmp_path / "marker").rmdir()
    result = run(tmp_path)
    assert "edge_summary: cannot append to" in result.stdout
