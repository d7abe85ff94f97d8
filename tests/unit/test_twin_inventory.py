"""`edgetune-dev twin up`'s inventory: every fleet twin of its directory in its group, also one whose
board file is not here; `twin down` removes the twins of one inventory directory only.

docker is faked (manager.run answers `docker ps` with labelled rows); the
inventory file written is read back.
"""
import subprocess

import yaml

from edgetune_dev.twin import manager


def fake_docker(rows):
    def run(argv, **_kwargs):
        assert argv[:3] == ["docker", "ps", "-a"], argv
        return subprocess.CompletedProcess(argv, 0, stdout="".join("\t".join(r) + "\n" for r in rows), stderr="")
    return run


def test_groups_come_from_the_label_and_unknown_boards_are_left_out(monkeypatch, tmp_path, capsys):
    here = str(tmp_path.resolve())
    monkeypatch.setattr(manager, "run", fake_docker([
        ("orin-nx-16gb-r36-1", "orin-nx-16gb-r36", "running", "orin-fleet", here),
        ("cap-x-1", "captured/cap-x", "running", "rk3588-fleet", here),  # captured elsewhere: the label decides
        ("rock5b-rk3588-1", "rock5b-rk3588", "exited", "", here),       # made before the label: from its board
        ("old-captured-1", "captured/gone", "running", "", here),        # no label, no board file: left out
    ]))
    monkeypatch.setattr(manager, "CAPTURED_DIR", tmp_path / "none")
    path = manager.write_inventory(tmp_path)
    groups = yaml.safe_load(path.read_text())["all"]["children"]["twins"]["children"]
    assert groups["orin-fleet"]["hosts"] == {"orin-nx-16gb-r36-1": None}
    assert groups["rk3588-fleet"]["hosts"] == {"cap-x-1": None, "rock5b-rk3588-1": None}
    assert "old-captured-1 (board captured/gone) left out" in capsys.readouterr().err


def test_inventory_and_down_keep_to_their_own_directory(monkeypatch, tmp_path):
    """A test's fleet (`twin up --inventory-dir T`) is not in the demo's inventory and `twin down`
    of the demo leaves it running (it once removed a CI run's twin); a twin made before the
    inventory label belongs to the default directory."""
    from edgetune_dev import cli
    monkeypatch.chdir(tmp_path)
    other = str((tmp_path / "test-fleet").resolve())
    rows = [("orin-nx-16gb-r36-1", "orin-nx-16gb-r36", "running", "orin-fleet", str((tmp_path / "inventory" / "twin"))),
            ("cap-vm-1", "captured/cap-vm", "running", "orin-fleet", other),
            ("rock5b-rk3588-1", "rock5b-rk3588", "running", "rk3588-fleet", "")]
    removed = []

    def run(argv, **_kwargs):
        if argv[:2] == ["docker", "rm"]:
            removed.append(argv[-1])
            return subprocess.CompletedProcess(argv, 0, stdout="", stderr="")
        return fake_docker([row for row in rows if row[0] not in removed])(argv)
    monkeypatch.setattr(manager, "run", run)

    demo = yaml.safe_load(manager.write_inventory("inventory/twin").read_text())["all"]["children"]["twins"]
    assert demo["children"]["orin-fleet"]["hosts"] == {"orin-nx-16gb-r36-1": None}
    assert demo["children"]["rk3588-fleet"]["hosts"] == {"rock5b-rk3588-1": None}
    test = yaml.safe_load(manager.write_inventory(other).read_text())["all"]["children"]["twins"]
    assert test["children"]["orin-fleet"]["hosts"] == {"cap-vm-1": None}

    assert cli.main(["twin", "down"]) == 0
    assert removed == ["orin-nx-16gb-r36-1", "rock5b-rk3588-1"]
    assert [twin["name"] for twin in manager.twins(fleet_only=True)] == ["cap-vm-1"]
    assert cli.main(["twin", "down", "--inventory-dir", other]) == 0
    assert removed[-1] == "cap-vm-1"


def test_the_fleet_inventory_leaves_the_release_to_the_roles_default(monkeypatch, tmp_path):
    """Each twin gets the build its own machine and glibc run from edge_runtime's default (auto),
    not one the inventory pins for all of them."""
    twin = [("orin-nx-16gb-r36-1", "orin-nx-16gb-r36", "running", "", str(tmp_path.resolve()))]
    monkeypatch.setattr(manager, "run", fake_docker(twin))
    written = yaml.safe_load(manager.write_inventory(tmp_path).read_text())["all"]["vars"]
    assert written == {"ansible_connection": "community.docker.docker",
                       "ansible_python_interpreter": "/usr/bin/python3"}


def test_a_twin_made_from_an_older_image_is_reused_and_said_so(monkeypatch):
    """`twin create`/`twin up` keep an existing twin (its state is the device's), and say when its
    image is older than the one built now, and how to get the new one."""
    images = {"orin-old": "sha256:aaa", "orin-new": "sha256:bbb"}

    def run(argv, **_kwargs):
        if argv[:3] == ["docker", "inspect", "-f"] and argv[3].startswith("{{.State.Running}}"):
            out = "true\torin-nx-16gb-r36\t\t\n"
        elif argv[:4] == ["docker", "inspect", "-f", "{{.Image}}"]:
            out = images[argv[4]] + "\n"
        elif argv[:3] == ["docker", "image", "inspect"]:
            assert argv[-1] == "edgetune/twin:bookworm", argv
            out = "sha256:bbb\n"
        else:
            raise AssertionError(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=out, stderr="")

    monkeypatch.setattr(manager, "run", run)
    monkeypatch.setattr(manager, "wait_booted", lambda name: None)
    said = []
    manager.create("orin-new", "orin-nx-16gb-r36", said.append)
    assert said == []
    manager.create("orin-old", "orin-nx-16gb-r36", said.append)
    assert said == ["twin orin-old was made from an older edgetune/twin:bookworm image and keeps it (without what "
                    "the image has gained since, e.g. its eth0 and bcc); `edgetune-dev twin rm orin-old` and create it "
                    "again for the new one"]
