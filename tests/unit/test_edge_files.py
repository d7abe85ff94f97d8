"""edge_files: a set of files installed in one module execution, on real directories; and through
real ansible-playbook runs on localhost (the action plugin reads the collection's files)."""
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import edge_files
import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

REPO = Path(__file__).resolve().parents[2]
UID, GID = os.getuid(), os.getgid()


def item(dest, data, mode=0o644):
    return {"dest": str(dest), "data": data, "mode": mode}


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_files_and_their_directories_are_created_with_the_given_modes(tmp_path):
    planned = edge_files.plan([item(tmp_path / "lib/a/tool.py", b"print(1)\n", 0o755),
                               item(tmp_path / "state.json", b"{}", 0o600)], UID, GID)
    assert [p["reasons"] for p in planned] == [["new"], ["new"]]
    created = edge_files.install(planned, UID, GID, 0o750)
    assert created == [str(tmp_path / "lib"), str(tmp_path / "lib/a")]
    assert (tmp_path / "lib/a/tool.py").read_bytes() == b"print(1)\n"
    assert mode_of(tmp_path / "lib/a/tool.py") == 0o755
    assert mode_of(tmp_path / "lib") == 0o750
    assert mode_of(tmp_path / "state.json") == 0o600


def test_only_what_differs_is_written_and_each_reason_is_named(tmp_path):
    same, edited, loose = tmp_path / "same", tmp_path / "edited", tmp_path / "loose"
    for path in (same, edited, loose):
        path.write_bytes(b"v1\n")
        os.chmod(path, 0o644)
    edited.write_bytes(b"edited by hand\n")
    os.chmod(loose, 0o666)
    before = os.stat(same).st_ino
    planned = edge_files.plan([item(same, b"v1\n"), item(edited, b"v1\n"), item(loose, b"v1\n")], UID, GID)
    assert [p["reasons"] for p in planned] == [[], ["content"], ["mode 0666 -> 0644"]]
    edge_files.install(planned, UID, GID, 0o755)
    assert os.stat(same).st_ino == before  # not rewritten
    assert edited.read_bytes() == b"v1\n" and mode_of(loose) == 0o644


def test_check_mode_reports_the_changes_with_a_diff_and_writes_nothing(tmp_path):
    (tmp_path / "unit").write_text("old\n")
    os.chmod(tmp_path / "unit", 0o644)
    params = {"owner": str(UID), "group": str(GID), "directory_mode": "0755", "files": [
        {"dest": str(tmp_path / "unit"), "content_b64": "bmV3Cg==", "mode": "0644"},
        {"dest": str(tmp_path / "new/dir/file"), "content_b64": "eA==", "mode": "0600"}]}
    result = edge_files.run(params, check_mode=True)
    assert result["changed"] and result["written"] == [str(tmp_path / "unit"), str(tmp_path / "new/dir/file")]
    assert result["directories"] == [str(tmp_path / "new"), str(tmp_path / "new/dir")]
    assert result["diff"][0]["before"] == "old\n" and result["diff"][0]["after"] == "new\n"
    assert (tmp_path / "unit").read_text() == "old\n" and not (tmp_path / "new").exists()
    assert edge_files.run(params, check_mode=False)["written"] == result["written"]
    again = edge_files.run(params, check_mode=True)
    assert not again["changed"] and again["diff"] == [] and again["directories"] == []


def test_bad_paths_are_refused_before_any_write(tmp_path):
    with pytest.raises(EdgeError, match="is not an absolute path"):
        edge_files.plan([item("relative/path", b"")], UID, GID)
    # A path of this test's own (whatever the machine has in /tmp).
    twice = tmp_path / "x"
    with pytest.raises(EdgeError, match="%s is given twice" % re.escape(str(twice))):
        edge_files.plan([item(twice, b""), item(twice, b"")], UID, GID)
    assert not twice.exists()


def test_a_directory_or_a_file_in_the_way_is_refused_cleanly(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(EdgeError, match="exists and is not a regular file"):
        edge_files.plan([item(tmp_path / "dir", b"")], UID, GID)
    (tmp_path / "plain").write_text("")
    with pytest.raises(EdgeError, match="plain exists and is not a directory"):
        edge_files.missing_directories(str(tmp_path / "plain/child"))


def test_unknown_owner_and_bad_mode_are_named():
    with pytest.raises(EdgeError, match="no user 'no-such-user-here'"):
        edge_files.resolve_id("no-such-user-here", __import__("pwd").getpwnam, "user")
    with pytest.raises(EdgeError, match="mode of /x '0999' is not an octal file mode"):
        edge_files.parse_mode("0999", "mode of /x")


PLAYBOOK = """
- name: Install with edge_files
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Install the program and its record
      edgetune.fleet.edge_files:
        owner: "{{ owner }}"
        group: "{{ group }}"
        files:
          - {src: plugins/module_utils/common/edge_fileio.py, dest: "{{ root }}/lib/edge_fileio.py", mode: "0755"}
          - {content: "{{ {'role': 'edge_cpu'} | to_json }}", dest: "{{ root }}/records/edge_cpu.json", mode: "0600"}
"""


@pytest.mark.controller
def test_real_playbook_runs_check_first_then_install_then_nothing_then_repair(tmp_path):
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    root = tmp_path / "device"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", EDGETUNE_NO_SUMMARY="1")

    def run(*extra):
        argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(playbook),
                "-e", "root=%s owner=%d group=%d" % (root, UID, GID),
                "-e", "ansible_python_interpreter=" + sys.executable, *extra]
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False)

    check = run("--check", "--diff")
    assert check.returncode == 0, check.stdout
    assert "changed=1" in check.stdout and '+{"role": "edge_cpu"}' in check.stdout, check.stdout
    assert not root.exists()
    real = run()
    assert real.returncode == 0 and "changed=1" in real.stdout, real.stdout
    installed = root / "lib/edge_fileio.py"
    assert installed.read_bytes() == (REPO / "plugins/module_utils/common/edge_fileio.py").read_bytes()
    assert mode_of(installed) == 0o755 and mode_of(root / "records/edge_cpu.json") == 0o600
    assert "changed=0" in run().stdout
    installed.write_text("# edited on the device\n")
    repaired = run("--diff")
    assert "changed=1" in repaired.stdout and "-# edited on the device" in repaired.stdout, repaired.stdout
    assert installed.read_bytes() == (REPO / "plugins/module_utils/common/edge_fileio.py").read_bytes()


@pytest.mark.controller
def test_a_source_outside_the_collection_fails_with_one_message(tmp_path):
    from ansible.errors import AnsibleActionFail
    from ansible_collections.edgetune.fleet.plugins.action.edge_files import module_files
    with pytest.raises(AnsibleActionFail, match="is not a path inside the collection"):
        module_files([{"src": "../../etc/passwd", "dest": "/x"}])
    with pytest.raises(AnsibleActionFail, match="needs exactly one of src, content and content_b64"):
        module_files([{"src": "README.md", "content": "x", "dest": "/x"}])
    with pytest.raises(AnsibleActionFail, match="unknown key owner"):
        module_files([{"content": "x", "dest": "/x", "owner": "root"}])


@pytest.mark.controller
def test_relative_destinations_are_under_the_directory():
    from ansible.errors import AnsibleActionFail
    from ansible_collections.edgetune.fleet.plugins.action.edge_files import module_files
    files = module_files([{"content": "x", "dest": "module_utils/a.py"}, {"content": "y", "dest": "/etc/b"}],
                         "/usr/local/lib/edgetune")
    assert [f["dest"] for f in files] == ["/usr/local/lib/edgetune/module_utils/a.py", "/etc/b"]
    with pytest.raises(AnsibleActionFail, match="dest 'a.py' is relative and the task gives no directory"):
        module_files([{"content": "x", "dest": "a.py"}])
    with pytest.raises(AnsibleActionFail, match="directory 'lib' is not an absolute path"):
        module_files([{"content": "x", "dest": "a.py"}], "lib")


def test_absent_paths_are_removed_in_the_same_execution_and_check_mode_only_reports(tmp_path):
    earlier = tmp_path / "lib/boot/ansible_collections"
    earlier.mkdir(parents=True)
    (earlier / "edge_boot.py").write_text("old\n")
    (tmp_path / "old.conf").write_text("x\n")
    params = {"owner": str(UID), "group": str(GID), "directory_mode": "0755",
              "files": [{"dest": str(tmp_path / "lib/package/a.py"), "content_b64": "eA==", "mode": "0644"}],
              "absent": [str(tmp_path / "lib/boot"), str(tmp_path / "old.conf"), str(tmp_path / "never-there")]}
    checked = edge_files.run(params, check_mode=True)
    assert checked["changed"] and checked["removed"] == [str(tmp_path / "lib/boot"), str(tmp_path / "old.conf")]
    assert (earlier / "edge_boot.py").exists() and (tmp_path / "old.conf").exists()
    assert [d["after_header"] for d in checked["diff"]][-2:] == [
        "%s (removed)" % (tmp_path / "lib/boot"), "%s (removed)" % (tmp_path / "old.conf")]
    done = edge_files.run(params, check_mode=False)
    assert done["removed"] == checked["removed"]
    assert not (tmp_path / "lib/boot").exists() and not (tmp_path / "old.conf").exists()
    assert (tmp_path / "lib/package/a.py").read_text() == "x"
    again = edge_files.run(params, check_mode=False)
    assert not again["changed"] and again["removed"] == []


def test_an_absent_path_that_holds_a_file_to_install_is_refused_before_any_write(tmp_path):
    params = {"owner": str(UID), "group": str(GID), "directory_mode": "0755",
              "files": [{"dest": str(tmp_path / "lib/package/a.py"), "content_b64": "eA==", "mode": "0644"}],
              "absent": [str(tmp_path / "lib")]}
    with pytest.raises(EdgeError, match="cannot remove %s: %s is installed there" % (
            re.escape(str(tmp_path / "lib")), re.escape(str(tmp_path / "lib/package/a.py")))):
        edge_files.run(params, check_mode=False)
    assert not (tmp_path / "lib").exists()
    with pytest.raises(EdgeError, match="absent 'lib' is not an absolute path"):
        edge_files.run(dict(params, absent=["lib"]), check_mode=False)


def fake_analyze(tmp_path, refuse):
    """A systemd-analyze that records what it was asked to verify and refuses units containing ``refuse``."""
    seen = tmp_path / "verified"
    script = tmp_path / "systemd-analyze"
    script.write_text("#!/bin/sh\necho \"$2\" >> %s\nif grep -q '%s' \"$2\"; then echo \"$2:3: bad line\"; exit 1; fi\n"
                      % (seen, refuse))
    script.chmod(0o755)
    return str(script), seen


def test_a_unit_systemd_refuses_fails_the_task_before_any_file_is_written(tmp_path):
    analyze, seen = fake_analyze(tmp_path, "Broken=")
    good = dict(item(tmp_path / "etc/ai-infer.slice", b"[Slice]\nCPUWeight=100\n"), unit=True)
    bad = dict(item(tmp_path / "etc/edgetune-probe.service", b"[Service]\nBroken=yes\n"), unit=True)
    plain = item(tmp_path / "etc/notes.txt", b"not a unit\n")
    planned = edge_files.plan([good, plain, bad], UID, GID)
    with pytest.raises(EdgeError, match=r"systemd refuses the new .*/etc/edgetune-probe.service .*"
                                        r"edgetune-probe.service:3: bad line; nothing was written"):
        edge_files.verify_units(planned, analyze)
    assert not (tmp_path / "etc").exists()
    # Each unit under its own name (systemd-analyze wants it), the plain file not at all.
    assert [os.path.basename(line) for line in seen.read_text().split()] == ["ai-infer.slice",
                                                                             "edgetune-probe.service"]
    # An unchanged unit is not checked again; with no systemd-analyze on the device nothing is.
    edge_files.install(edge_files.plan([good], UID, GID), UID, GID, 0o755)
    seen.unlink()
    edge_files.verify_units(edge_files.plan([good], UID, GID), analyze)
    edge_files.verify_units(planned, str(tmp_path / "no-such-analyze"))
    assert not seen.exists()


@pytest.mark.skipif(not os.access("/usr/bin/systemd-analyze", os.X_OK), reason="no systemd-analyze here")
def test_the_real_systemd_analyze_refuses_a_relative_command(tmp_path):
    bad = dict(item(tmp_path / "x.service", b"[Service]\nExecStart=relative-path\n"), unit=True)
    with pytest.raises(EdgeError, match="relative-path"):
        edge_files.verify_units(edge_files.plan([bad], UID, GID))
    good = dict(item(tmp_path / "ai-infer.slice", b"[Unit]\nDescription=x\n[Slice]\nCPUWeight=100\n"), unit=True)
    edge_files.verify_units(edge_files.plan([good], UID, GID))


def test_check_mode_reports_a_unit_without_verifying_it_and_the_real_run_refuses_it_whole(tmp_path, monkeypatch):
    analyze, seen = fake_analyze(tmp_path, "Broken=")
    monkeypatch.setattr(edge_files, "SYSTEMD_ANALYZE", analyze)
    params = {"files": [{"dest": str(tmp_path / "etc/a.conf"), "content": "a\n"},
                        {"dest": str(tmp_path / "etc/x.service"), "content": "[Service]\nBroken=1\n", "unit": True}],
              "owner": str(UID), "group": str(GID), "directory_mode": "0755", "absent": []}
    # Check mode: the programs a unit runs may not be installed yet; the change is reported.
    assert edge_files.run(params, check_mode=True)["written"] == [str(tmp_path / "etc/a.conf"),
                                                                  str(tmp_path / "etc/x.service")]
    assert not seen.exists()
    with pytest.raises(EdgeError, match="systemd refuses the new"):
        edge_files.run(params, check_mode=False)
    assert not (tmp_path / "etc").exists()


def test_previous_contents_are_returned_and_put_back_by_giving_them_as_files(tmp_path):
    env, unit, new = tmp_path / "runtime.env", tmp_path / "runtime.service", tmp_path / "new.conf"
    env.write_text("THREADS=4\n")
    unit.write_text("[Service]\nExecStart=/old\n")
    params = {"owner": str(UID), "group": str(GID), "directory_mode": "0755", "previous": True,
              "files": [{"dest": str(env), "content": "THREADS=6\n"},
                        {"dest": str(unit), "content": "[Service]\nExecStart=/old\n"},
                        {"dest": str(new), "content": "x\n"}]}
    checked = edge_files.run(params, check_mode=True)
    assert env.read_text() == "THREADS=4\n" and not new.exists()
    done = edge_files.run(params, check_mode=False)
    assert done["previous"] == checked["previous"] == [{"dest": str(env), "content_b64": "VEhSRUFEUz00Cg=="}]
    assert env.read_text() == "THREADS=6\n"
    restored = edge_files.run(dict(params, previous=False, files=done["previous"]), check_mode=False)
    assert restored["written"] == [str(env)] and "previous" not in restored
    assert env.read_text() == "THREADS=4\n" and unit.read_text() == "[Service]\nExecStart=/old\n"


@pytest.mark.controller
def test_a_task_gives_content_b64_only_as_base64():
    from ansible.errors import AnsibleActionFail
    from ansible_collections.edgetune.fleet.plugins.action.edge_files import module_files
    assert module_files([{"content_b64": "eA==", "dest": "/x"}]) == [{"dest": "/x", "content_b64": "eA=="}]
    with pytest.raises(AnsibleActionFail, match="content_b64 is not base64"):
        module_files([{"content_b64": "not base64!", "dest": "/x"}])
