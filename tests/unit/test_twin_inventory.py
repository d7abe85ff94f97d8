"""`edgetune twin up`'s inventory: every fleet twin in its group, also one whose board file is not here.

docker is faked (manager.run answers `docker ps` with labelled rows); the
inventory file written is read back.
"""
import subprocess

import yaml

from edgetune.twin import manager


def fake_docker(rows):
    def run(argv, **_kwargs):
        assert argv[:3] == ["docker", "ps", "-a"], argv
        return subprocess.CompletedProcess(argv, 0, stdout="".join("\t".join(r) + "\n" for r in rows), stderr="")
    return run


def test_groups_come_from_the_label_and_unknown_boards_are_left_out(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(manager, "run", fake_docker([
        ("orin-nx-16gb-r36-1", "orin-nx-16gb-r36", "running", "orin-fleet"),
        ("cap-x-1", "captured/cap-x", "running", "rk3588-fleet"),  # captured elsewhere: the label decides
        ("rock5b-rk3588-1", "rock5b-rk3588", "exited", ""),       # made before the label: from its board
        ("old-captured-1", "captured/gone", "running", ""),        # no label, no board file: left out
    ]))
    monkeypatch.setattr(manager, "CAPTURED_DIR", tmp_path / "none")
    path = manager.write_inventory(tmp_path)
    groups = yaml.safe_load(path.read_text())["all"]["children"]["twins"]["children"]
    assert groups["orin-fleet"]["hosts"] == {"orin-nx-16gb-r36-1": None}
    assert groups["rk3588-fleet"]["hosts"] == {"cap-x-1": None, "rock5b-rk3588-1": None}
    assert "old-captured-1 (board captured/gone) left out" in capsys.readouterr().err
