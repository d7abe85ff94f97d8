"""The edge_summary callback's JSON lines (EDGETUNE_SUMMARY_JSON), from real ansible-playbook runs.

A playbook on localhost with a task that changes a file, one that does not and
one that is skipped runs in check mode, then for real, then again: each run
appends one line that names the changed tasks, in check mode too, and says
whether it was check mode. A device with 40 changed tasks gets one short line
in the printed summary; -v lists the tasks' names, the JSON line always does.
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


# A device (set_fact gives it a board profile and a release, as edge_facts would) with 40 changed
# tasks whose names, joined, make the 3,000-character line the summary used to print.
MANY = 40
DEVICE_PLAYBOOK = """
- name: A device with many changes
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Be a device
      ansible.builtin.set_fact:
        edge: {l4t: {version: "36.4.3"}}
        edge_facts_profile: {title: NVIDIA Jetson Orin NX 16GB}
""" + "".join("""    - name: Change setting number %02d of this device, with a name as long as a role's task names are
      ansible.builtin.debug:
        msg: "%02d"
      changed_when: true
""" % (n, n) for n in range(MANY))
# A host's line in the summary: "state board release counts gate", never a list of tasks.
LINE_LIMIT = 160


def run(tmp_path, *extra, playbook_text=PLAYBOOK):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="edgetune.fleet.edge_summary")
    env.pop("EDGETUNE_NO_SUMMARY", None)
    env["EDGETUNE_SUMMARY_JSON"] = str(tmp_path / "runs.jsonl")
    playbook = tmp_path / "play.yml"
    playbook.write_text(playbook_text)
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


def summary_lines(stdout):
    return stdout.split("EDGETUNE FLEET SUMMARY", 1)[1].splitlines()


def test_a_host_with_many_changes_gets_one_short_line_and_v_lists_them(tmp_path):
    names = ["Change setting number %02d of this device, with a name as long as a role's task names are" % n
             for n in range(MANY)]
    quiet = summary_lines(run(tmp_path, playbook_text=DEVICE_PLAYBOOK).stdout)
    host = [line for line in quiet if line.startswith("localhost ")]
    assert len(host) == 1, quiet
    assert len(host[0]) <= LINE_LIMIT, host[0]
    assert host[0].split() == ["localhost", "ok", "NVIDIA", "Jetson", "Orin", "NX", "16GB", "L4T", "36.4.3",
                               "ok=%d" % (MANY + 1), "changed=%d" % MANY, "failed=0", "skipped=0"]
    assert not any("Change setting" in line for line in quiet)
    assert all(len(line) <= LINE_LIMIT for line in quiet), quiet
    assert sum("with -v:" in line for line in quiet) == 1  # the hint is said once per run

    verbose = summary_lines(run(tmp_path, "-v", playbook_text=DEVICE_PLAYBOOK).stdout)
    assert [line for line in verbose if line.startswith("localhost ")] == host
    assert [line.strip() for line in verbose if "Change setting" in line] == ["changed: " + name for name in names]
    assert not any("with -v:" in line for line in verbose)

    quiet_json, verbose_json = lines(tmp_path)  # the names are in the file whatever the verbosity
    for entry in (quiet_json["hosts"]["localhost"], verbose_json["hosts"]["localhost"]):
        assert entry["changed"] == names
        assert entry["board"] == "NVIDIA Jetson Orin NX 16GB" and entry["release"] == "L4T 36.4.3"
        assert entry["counts"]["changed"] == MANY and entry["counts"]["failures"] == 0
        assert entry["gate"] is None and entry["gate_result"] is None


def test_the_host_line_gives_the_gate_result_and_stays_short():
    entry = {"state": "UNREACHABLE", "board": "NVIDIA Jetson AGX Orin 64GB", "release": "L4T 35.6.0",
             "changed": ["task %d" % n for n in range(MANY)], "gate_result": "failed",
             "gate": "time to first token P50 25.389 ms, P99 33.424 ms; inter-token P50 6.993 ms, P99 36.41 ms",
             "counts": {"ok": 1234, "changed": 400, "failures": 10, "skipped": 321}}
    # Imported here: the callback needs ansible-core, which the Python 3.8 run does not have.
    from ansible_collections.edgetune.fleet.plugins.callback import edge_summary
    line = edge_summary.host_line("agx-orin-64gb-r35-1", entry)
    assert line.split()[-6:] == ["ok=1234", "changed=400", "failed=10", "skipped=321", "gate", "FAILED"]
    assert len(line) <= LINE_LIMIT, line
    assert edge_summary.host_line("x", dict(entry, gate_result="passed")).endswith("gate passed")
    assert edge_summary.host_line("x", dict(entry, gate_result=None)).endswith("skipped=321")
    assert "task" not in line and "first token" not in line


# A device audited (edge_audit on a root of the test's own): one file as recorded, one changed.
AUDIT_PLAYBOOK = """
- name: An audited device
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Be a device
      ansible.builtin.set_fact:
        edge: {l4t: {version: "36.4.3"}}
        edge_facts_profile: {title: NVIDIA Jetson Orin NX 16GB}
    - name: Audit the managed settings
      edgetune.fleet.edge_audit:
        root: "{{ root }}"
        checks:
          - {setting: slice unit, role: edge_cgroups, kind: file, path: /etc/a, sha1: "%s"}
          - {setting: probe unit, role: edge_cgroups, kind: file, path: /etc/b, sha1: "%s"}
          - {setting: htb, role: edge_netqos, kind: unsupported, reason: no HTB}
"""


def test_an_audit_names_the_device_findings_in_the_summary(tmp_path):
    import hashlib
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/a").write_text("a\n")
    (root / "etc/b").write_text("changed by hand\n")
    text = AUDIT_PLAYBOOK % (hashlib.sha1(b"a\n").hexdigest(), hashlib.sha1(b"b\n").hexdigest())
    quiet = summary_lines(run(tmp_path, "-e", "root=%s" % root, playbook_text=text).stdout)
    assert [line.strip() for line in quiet if line.strip().startswith("audit:")] == [
        "audit: drifted: probe unit; 1 ok, 1 unsupported"]
    (root / "etc/b").write_text("b\n")
    quiet = summary_lines(run(tmp_path, "-e", "root=%s" % root, playbook_text=text).stdout)
    assert not [line for line in quiet if "audit:" in line]  # a clean device: its line only
