"""Output paths (tools/edgetune/outputs.py): one that cannot be written is one line and exit 2
before any device is touched, and a write that fails after all is one line too, not a traceback.

The tests run as root, for whom permission bits do not stop a write: the paths that cannot
be written are below a regular file or are directories; a directory without permission is
what os.access says of it, so that test stands os.access in."""
import json
import os

import pytest

from edgetune import outputs
from edgetune.errors import UsageError


@pytest.fixture
def place(tmp_path):
    """tmp_path with a regular file `file`, a directory `dir` and a writable `out.txt` in it."""
    (tmp_path / "file").write_text("x\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "out.txt").write_text("old\n")
    return tmp_path


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_what_can_be_written(place):
    before = listing(place)
    assert outputs.problem(place / "new.xml") is None
    assert outputs.problem(place / "out.txt") is None              # replaced
    assert outputs.problem(place / "reports" / "deeper" / "a.prom") is None  # directories made on writing
    assert outputs.problem(place / "dir", directory=True) is None
    assert outputs.problem(place / "new-dir" / "sub", directory=True) is None
    assert outputs.problem("/dev/null") is None                     # written in place
    assert listing(place) == before                                 # the check made nothing


def test_what_cannot_be_written(place, monkeypatch):
    before = listing(place)
    assert outputs.problem(place / "file" / "x.prom") == "%s is not a directory" % (place / "file")
    assert outputs.problem(place / "file" / "a" / "b" / "x.prom") == "%s is not a directory" % (place / "file")
    assert outputs.problem(place / "dir") == "it is a directory"
    assert outputs.problem(place / "file", directory=True) == "%s is not a directory" % (place / "file")
    assert outputs.problem("") == "the path is empty"
    assert outputs.problem("/etc/hostname/x.prom") == "/etc/hostname is not a directory"
    real_access = os.access
    monkeypatch.setattr(outputs.os, "access", lambda path, mode: str(path) != str(place / "dir")
                        and real_access(path, mode))
    assert outputs.problem(place / "dir" / "new" / "x.xml") == "no permission to create files in %s" % (place / "dir")
    assert outputs.problem(place / "dir", directory=True) == "no permission to create files in %s" % (place / "dir")
    assert listing(place) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the permission bits say")
def test_a_directory_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert outputs.problem(locked / "x.xml") == "no permission to create files in %s" % locked
    finally:
        locked.chmod(0o700)


def test_check_names_the_option_and_skips_options_not_given(place):
    outputs.check(files=[("--junit", None), ("--prometheus", str(place / "a.prom"))],
                  directories=[("--out", str(place / "dir"))])
    with pytest.raises(UsageError) as error:
        outputs.check(files=[("--junit", str(place / "ok.xml")), ("--prometheus", str(place / "file" / "x.prom"))])
    assert str(error.value) == "--prometheus %s cannot be written: %s is not a directory" % (
        place / "file" / "x.prom", place / "file")
    assert not (place / "ok.xml").exists()


def test_write_text_is_atomic_and_fails_in_one_line(place):
    outputs.write_text(place / "reports" / "a.txt", "é\n")
    assert (place / "reports" / "a.txt").read_text(encoding="utf-8") == "é\n"
    outputs.write_text(place / "out.txt", "new\n")
    assert (place / "out.txt").read_text() == "new\n"
    before = listing(place)
    with pytest.raises(UsageError) as error:
        outputs.write_text(place / "file" / "x.prom", "text", "--prometheus")
    assert str(error.value).startswith("--prometheus %s was not written: " % (place / "file" / "x.prom"))
    with pytest.raises(UsageError) as error:
        outputs.write_text(place / "dir", "text")
    assert "\n" not in str(error.value)
    assert listing(place) == before  # no temporary file left behind


# ------------------------------------------------------------------ through `edgetune ...`
@pytest.fixture
def cli(monkeypatch):
    """edgetune's and edgetune-dev's main, with everything that would touch a device, a twin or a VM replaced
    by a recorder: cli.main runs either command (the harness's by its commands), cli.prog names it."""
    from edgetune import audit, cli, verify
    from edgetune_dev import cli as harness
    from edgetune_dev.twin import manager
    from edgetune_dev.vm import runner
    started = []

    def refuse(what):
        def call(*args, **kwargs):
            started.append(what)
            raise AssertionError("%s started although an output path cannot be written" % what)
        return call

    monkeypatch.setattr(audit, "run_audit", refuse("audit's ansible-playbook"))
    monkeypatch.setattr(verify, "run_plan", refuse("verify's ansible-playbook"))
    monkeypatch.setattr(verify.subprocess, "run", refuse("a subprocess"))
    monkeypatch.setattr(manager, "up", refuse("twin up"))
    monkeypatch.setattr(manager, "twins", refuse("twin down"))
    monkeypatch.setattr(runner, "up", refuse("vm up"))

    class Both:
        def main(self, argv):
            self.prog = "edgetune-dev" if argv[0] in ("twin", "vm", "runtime") else "edgetune"
            return (harness if self.prog == "edgetune-dev" else cli).main(argv)
    both = Both()
    both.started = started
    return both


@pytest.mark.controller
@pytest.mark.parametrize("argv, option, below", [
    (["audit", "-i", "hosts.yml", "--prometheus", "{bad}"], "--prometheus", "file/x.prom"),
    (["audit", "--junit", "{ok}", "--prometheus", "{bad}"], "--prometheus", "file/sub/x.prom"),
    (["audit", "--json", "--junit", "{bad}"], "--junit", "dir"),
    (["verify", "-l", "orin-fleet", "--junit", "{bad}"], "--junit", "file/j.xml"),
    (["verify", "-l", "orin-fleet", "--keep-plan", "{bad}"], "--keep-plan", "dir"),
    (["runtime", "package", "--what", "engine", "--out", "{bad}"], "--out", "file"),
    (["twin", "up", "--inventory-dir", "{bad}"], "--inventory-dir", "file/inventory"),
    (["twin", "down", "--inventory-dir", "{bad}"], "--inventory-dir", "file"),
    (["vm", "up", "--inventory-dir", "{bad}"], "--inventory-dir", "file/inventory"),
])
def test_an_output_that_cannot_be_written_stops_before_any_device(cli, place, capsys, argv, option, below):
    bad = str(place / below)
    argv = [arg.format(bad=bad, ok=str(place / "ok.xml")) for arg in argv]
    before = listing(place)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert cli.started == []
    assert err.count("\n") == 1, err
    assert err.startswith("%s: error: %s %s cannot be written: " % (cli.prog, option, bad)), err
    assert "Traceback" not in err and out == ""
    assert listing(place) == before


@pytest.mark.controller
def test_an_audit_report_that_cannot_be_written_at_the_end_is_one_line(cli, place, monkeypatch, capsys):
    """The path was fine when the audit started and is not when it ends: the report is still printed."""
    from edgetune import audit
    hosts = {"dev-1": {"status": "ok", "cause": "", "seconds": 1.0, "results": [{"setting": "s", "state": "ok"}]}}

    def audit_then_the_directory_is_gone(*args, **kwargs):
        (place / "reports").rmdir()
        (place / "reports").write_text("now a file\n")
        return hosts

    (place / "reports").mkdir()
    monkeypatch.setattr(audit, "run_audit", audit_then_the_directory_is_gone)
    assert cli.main(["audit", "--json", "--junit", str(place / "reports" / "drift.xml")]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["hosts"] == hosts
    assert err.count("\n") == 1 and err.startswith(
        "edgetune: error: --junit %s was not written: " % (place / "reports" / "drift.xml")), err
