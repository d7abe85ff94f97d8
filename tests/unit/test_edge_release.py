"""edge_release on a temporary root: checks before changes, install, atomic switch,
keep-N, rollback, immutability, check mode and diff.

The artifacts are made by the project's own packager (tools/edgetune_dev/artifacts.py)
from a tiny engine spec, so the module is tested on the tarballs it will really get.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import edge_release
import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_artifact import sha256_file
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible.module_utils.testing import patch_module_args
from edgetune_dev import artifacts

DEVICE = {"soc": "tegra234", "l4t": {"major": 36, "revision": "4.3", "version": "36.4.3"},
          "bsp": {"name": "debian", "version": "12"}}
SPEC = {"name": "tiny", "version": "1.0.0", "seed": 7, "input": {"size": 8, "scale": 16},
        "layers": [{"out": 4, "activation": "relu"}, {"out": 3, "activation": "none"}],
        "weight_scale": 64, "weight_range": 8, "bias_scale": 256, "bias_range": 32,
        "labels": ["a", "b", "c"], "golden_samples": [0, 1],
        "compatibility": {"socs": ["tegra234", "rk3588"], "l4t": ">=35.1,<37", "bsp": {"armbian": ">=23.0"},
                          "requires": {"python": ">=3.8"}}}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two releases' worth of artifacts: {version: [artifact dicts for the module]}."""
    out = tmp_path_factory.mktemp("artifacts")
    spec = out / "tiny.json"
    spec.write_text(json.dumps(SPEC))
    releases = {}
    for version in ("1.0.0", "2.0.0", "3.0.0", "4.0.0"):
        runtime = artifacts.package_runtime(out, version)
        engine = artifacts.package_engine(out, spec, version)
        releases[version] = [{"path": runtime["path"], "sha256": runtime["artifact"]["sha256"], "kind": "runtime"},
                             {"path": engine["path"], "sha256": engine["artifact"]["sha256"], "kind": "engine"}]
    incompatible = artifacts.package_engine(out / "bad", spec, "9.0.0", compatibility={
        "socs": ["tegra234"], "l4t": ">=36.4,<37", "requires": {"tensorrt": {"version": "10.3"}}}, fmt="tensorrt-plan")
    releases["tensorrt"] = [releases["1.0.0"][0], {"path": incompatible["path"],
                                                   "sha256": incompatible["artifact"]["sha256"], "kind": "engine"}]
    return releases


def run(capsys, check=False, diff=False, **args):
    args.setdefault("device", DEVICE)
    args.setdefault("python", sys.executable)
    args["_ansible_check_mode"] = check
    args["_ansible_diff"] = diff
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            edge_release.main()
    return json.loads(capsys.readouterr().out)


def name(version):
    return "%s+tiny-%s" % (version, version)


def tree(root):
    """Everything under root: {relative path: link target, 'dir' or file sha256}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            full = os.path.join(dirpath, entry)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = "-> " + os.readlink(full)
            elif os.path.isdir(full):
                out[rel] = "dir"
            else:
                out[rel] = sha256_file(full)
    return out


def test_check_mode_checks_everything_and_writes_nothing(tmp_path, capsys, built):
    root = tmp_path / "opt"
    result = run(capsys, check=True, diff=True, root=str(root), artifacts=built["1.0.0"])
    assert result["changed"] is True and not result.get("failed")
    assert result["release"] == name("1.0.0") and result["current"] == name("1.0.0")
    assert any("sha256" in c and "matches" in c for c in result["checks"])
    assert "current: (none)" in result["diff"]["before"] and "current: %s" % name("1.0.0") in result["diff"]["after"]
    assert not root.exists()


def test_install_switch_and_read_back(tmp_path, capsys, built):
    root = tmp_path / "opt"
    result = run(capsys, root=str(root), artifacts=built["1.0.0"])
    assert result["changed"] and result["current"] == name("1.0.0") and result["previous"] is None
    assert os.readlink(root / "current") == "releases/" + name("1.0.0")
    release = root / "releases" / name("1.0.0")
    assert (release / "runtime" / "edgetune-runtime").stat().st_mode & 0o111
    assert json.loads((release / "engine" / "MANIFEST.json").read_text())["name"] == "tiny"
    record = json.loads((release / "release.json").read_text())
    assert record["artifacts"]["engine"]["sha256"] == built["1.0.0"][1]["sha256"]
    # The unpacked engine is the one the manifest describes, byte for byte.
    manifest = json.loads((release / "engine" / "MANIFEST.json").read_text())
    assert sha256_file(str(release / "engine" / "model.json")) == manifest["files"]["model.json"]
    assert not [p for p in os.listdir(root / "releases") if p.startswith(".")]  # no staging left behind

    again = run(capsys, root=str(root), artifacts=built["1.0.0"])
    assert again["changed"] is False and again["current"] == name("1.0.0")


def test_upgrade_records_previous_and_rollback_returns_to_it(tmp_path, capsys, built):
    root = tmp_path / "opt"
    run(capsys, root=str(root), artifacts=built["1.0.0"])
    up = run(capsys, root=str(root), artifacts=built["2.0.0"], diff=True)
    assert up["changed"] and up["before"] == name("1.0.0") and up["current"] == name("2.0.0")
    assert os.readlink(root / "previous") == "releases/" + name("1.0.0")

    before = tree(root)
    check = run(capsys, check=True, root=str(root), state="rollback")
    assert check["changed"] and check["current"] == name("1.0.0") and tree(root) == before

    back = run(capsys, root=str(root), state="rollback")
    assert back["changed"] and back["current"] == name("1.0.0") and back["previous"] is None
    assert os.readlink(root / "current") == "releases/" + name("1.0.0")
    assert not os.path.lexists(root / "previous")
    # The failed release stays installed (for inspection) but is not current.
    assert name("2.0.0") in back["releases"]
    again = run(capsys, root=str(root), state="rollback")
    assert again["failed"] and "no previous release recorded" in again["msg"]


def test_redeploying_an_installed_release_switches_without_unpacking(tmp_path, capsys, built):
    root = tmp_path / "opt"
    run(capsys, root=str(root), artifacts=built["1.0.0"])
    run(capsys, root=str(root), artifacts=built["2.0.0"])
    run(capsys, root=str(root), state="rollback")
    marker = root / "releases" / name("2.0.0") / "runtime" / "README.md"
    inode = os.stat(marker).st_ino
    result = run(capsys, root=str(root), artifacts=built["2.0.0"])
    assert result["changed"] and result["current"] == name("2.0.0") and result["previous"] == name("1.0.0")
    assert os.stat(marker).st_ino == inode


def test_keep_prunes_the_oldest_but_never_current_or_previous(tmp_path, capsys, built):
    root = tmp_path / "opt"
    for version in ("1.0.0", "2.0.0", "3.0.0"):
        run(capsys, root=str(root), artifacts=built[version], keep=2)
    result = run(capsys, root=str(root), artifacts=built["4.0.0"], keep=2)
    assert result["removed"] == [name("2.0.0")]
    assert sorted(result["releases"]) == sorted([name("3.0.0"), name("4.0.0")])
    assert sorted(os.listdir(root / "releases")) == sorted([name("3.0.0"), name("4.0.0")])
    assert result["previous"] == name("3.0.0")
    assert run(capsys, root=str(root), artifacts=built["4.0.0"], keep=1)["msg"].startswith("keep must be at least 2")


def test_checksum_mismatch_changes_nothing(tmp_path, capsys, built):
    root = tmp_path / "opt"
    run(capsys, root=str(root), artifacts=built["1.0.0"])
    before = tree(root)
    bad = [dict(built["2.0.0"][0]), built["2.0.0"][1]]
    bad[0]["sha256"] = "0" * 64
    result = run(capsys, root=str(root), artifacts=bad)
    assert result["failed"] and "checksum mismatch for the runtime artifact" in result["msg"]
    assert built["2.0.0"][0]["sha256"] in result["msg"] and "0" * 64 in result["msg"]
    assert tree(root) == before


def test_incompatible_engine_is_refused_before_any_change(tmp_path, capsys, built):
    root = tmp_path / "opt"
    run(capsys, root=str(root), artifacts=built["1.0.0"])
    before = tree(root)
    r35 = dict(DEVICE, l4t={"major": 35, "revision": "6.0", "version": "35.6.0"})
    platform = {"tensorrt_by_l4t": [{"l4t": ">=35.2,<36", "tensorrt": "8.5.2"},
                                    {"l4t": ">=36.4,<37", "tensorrt": "10.3.0"}]}
    result = run(capsys, root=str(root), artifacts=built["tensorrt"], device=r35, platform=platform)
    assert result["failed"] and "incompatible release, nothing was changed" in result["msg"]
    assert "TensorRT 10.3" in result["msg"] and "L4T 35.6.0" in result["msg"] and "8.5.2" in result["msg"]
    # The reference runtime does not load a TensorRT plan either, and says so.
    assert "loads engine formats edgetune-mlp-json/1, not tensorrt-plan" in result["msg"]
    assert tree(root) == before
    rock = {"soc": "rk3588", "l4t": None, "bsp": {"name": "armbian", "version": "22.11"}}
    result = run(capsys, root=str(root), artifacts=built["2.0.0"], device=rock)
    assert "needs armbian >=23.0, but this board runs armbian 22.11" in result["msg"]
    assert tree(root) == before


def test_missing_artifact_and_wrong_kinds(tmp_path, capsys, built):
    root = tmp_path / "opt"
    missing = [dict(built["1.0.0"][0], path=str(tmp_path / "nope.tar.gz")), built["1.0.0"][1]]
    result = run(capsys, root=str(root), artifacts=missing)
    assert result["failed"] and "does not exist on the device" in result["msg"]
    swapped = [dict(built["1.0.0"][0], kind="engine"), dict(built["1.0.0"][1], kind="runtime")]
    result = run(capsys, root=str(root), artifacts=swapped)
    assert "this is a runtime artifact where a engine was expected" in result["msg"]
    assert "one runtime and one engine" in run(capsys, root=str(root), artifacts=built["1.0.0"][:1])["msg"]
    assert not root.exists()


def test_python_too_old_for_the_runtime(tmp_path, capsys, built):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 3.6.9\n")
    fake.chmod(0o755)
    result = run(capsys, root=str(tmp_path / "opt"), artifacts=built["1.0.0"], python=str(fake))
    assert result["failed"] and "needs python3 >=3.8, but the runtime's interpreter is Python 3.6.9" in result["msg"]


def test_not_enough_space(tmp_path, capsys, built, monkeypatch):
    monkeypatch.setattr(edge_release, "free_mb", lambda path: 10.0)
    result = run(capsys, root=str(tmp_path / "opt"), artifacts=built["1.0.0"], min_free_mb=64)
    assert result["failed"] and "not enough space under" in result["msg"] and "10.0 MiB free" in result["msg"]
    assert not (tmp_path / "opt").exists()


def test_releases_are_immutable(tmp_path, capsys, built):
    root = tmp_path / "opt"
    run(capsys, root=str(root), artifacts=built["1.0.0"])
    before = tree(root)
    result = run(capsys, root=str(root), artifacts=built["2.0.0"], release=name("1.0.0"))
    assert result["failed"] and "already installed from other artifacts" in result["msg"]
    assert tree(root) == before


def test_foreign_current_is_not_overwritten(tmp_path, capsys, built):
    root = tmp_path / "opt"
    root.mkdir()
    (root / "current").mkdir()
    result = run(capsys, root=str(root), artifacts=built["1.0.0"])
    assert result["failed"] and "exists but is not a symlink" in result["msg"]
    with pytest.raises(EdgeError) as caught:
        edge_release.link_target(str(root), "current")
    assert caught.value.errors == ["%s exists but is not a symlink; move it away (edgetune manages it as a link)"
                                   % (root / "current")]
    assert caught.value.details == {} and str(caught.value) == caught.value.errors[0]


def test_interrupted_unpack_leaves_nothing(tmp_path, capsys, built, monkeypatch):
    root = tmp_path / "opt"

    def boom(path, dest):
        Path(dest, "partial").write_text("x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(edge_release, "unpack", boom)
    result = run(capsys, root=str(root), artifacts=built["1.0.0"])
    assert result["failed"] and "No space left on device" in result["msg"]
    assert os.listdir(root / "releases") == [] and not os.path.lexists(root / "current")


def test_packager_tarballs_are_reproducible(tmp_path, built):
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(SPEC))
    a = artifacts.package_engine(tmp_path / "a", spec, "1.0.0")
    b = artifacts.package_engine(tmp_path / "b", spec, "1.0.0")
    assert a["artifact"]["sha256"] == b["artifact"]["sha256"] == built["1.0.0"][1]["sha256"]
    with tarfile.open(a["path"]) as tar:
        assert {m.uid for m in tar.getmembers()} == {0} and len({m.mtime for m in tar.getmembers()}) == 1


def test_the_device_checks_its_own_machine_and_glibc(tmp_path, capsys, built):
    manifest = {"kind": "runtime", "name": "llama-server", "version": "0.5.0", "entry": "bin/llama-server",
                "engine_formats": ["edgetune-mlp-json/1"], "architecture": "riscv64", "backend": "cpu",
                "compatibility": {"requires": {"glibc": ">=99.0"}}}
    foreign = artifacts.package(manifest, {"bin/llama-server": (b"#!/bin/sh\n", 0o755)}, tmp_path, "foreign")
    release = [{"path": foreign["path"], "sha256": foreign["artifact"]["sha256"], "kind": "runtime"},
               built["1.0.0"][1]]
    result = run(capsys, root=str(tmp_path / "opt"), artifacts=release)
    assert result["failed"] and "incompatible release, nothing was changed" in result["msg"]
    assert "runtime llama-server 0.5.0 is built for riscv64, but this board is %s" % os.uname().machine \
        in result["msg"]
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    assert "needs glibc >=99.0, but this board has glibc %s" % glibc in result["msg"]
    assert not (tmp_path / "opt").exists()


# --------------------------------------------------------------------------
# The release serving: edge_release repairs a damaged release and says when the service must
# restart; the drift audit's runtime check (plugins/module_utils/device/edge_audit.py) names each drift.

SERVICE = "edgetune-runtime.service"


@pytest.fixture
def unit(tmp_path, monkeypatch):
    """A systemctl on PATH that shows the unit as the test sets it ({ActiveState, UnitFileState, MainPID})."""
    state = {"ActiveState": "active", "UnitFileState": "enabled", "MainPID": 0}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shown = tmp_path / "unit.txt"
    systemctl = bin_dir / "systemctl"
    systemctl.write_text("#!/bin/sh\n[ \"$1\" = show ] || exit 1\ncat %s\n" % shown)
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))

    def show(**changes):
        state.update(changes)
        shown.write_text("".join("%s=%s\n" % item for item in sorted(state.items())))
    show()
    return show


@pytest.fixture
def server(tmp_path):
    """Start a process whose program is a copy of sleep at the path given; stopped afterwards."""
    started = []

    def start(program):
        program.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy("/bin/sleep", str(program))
        proc = subprocess.Popen([str(program), "60"])
        started.append(proc)
        return proc.pid
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def runtime_check(root, release, artifacts, **expect):
    return {"setting": "runtime release", "role": "edge_runtime", "kind": "runtime", "root": str(root),
            "release": release, "artifacts": dict((a["kind"], a["sha256"]) for a in artifacts),
            "service": SERVICE, "expect": expect}


def test_the_runtime_check_holds_while_the_release_serves_and_names_each_drift(tmp_path, capsys, built, unit,
                                                                               server):
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import evaluate
    root = tmp_path / "opt"
    run(capsys, root=str(root), artifacts=built["1.0.0"])
    release = root / "releases" / name("1.0.0")
    pid = server(release / "runtime" / "server")
    unit(MainPID=pid)
    mine = sorted(os.sched_getaffinity(0))
    cpus = "%d-%d" % (mine[0], mine[-1]) if len(mine) > 1 else str(mine[0])
    check = runtime_check(root, name("1.0.0"), built["1.0.0"], policy="other", priority=40, cpus=cpus)
    result = evaluate(check)
    assert (result["state"], result["persisted"]) == ("ok", name("1.0.0")), result
    assert result["running"].startswith("%s active, 1 threads other on CPUs" % SERVICE)

    # Each drift on its own, named.
    unit(UnitFileState="disabled")
    assert evaluate(check)["detail"] == "%s is disabled at boot, not enabled" % SERVICE
    unit(UnitFileState="enabled", ActiveState="inactive", MainPID=0)
    assert evaluate(check)["detail"] == "%s is inactive, not active" % SERVICE
    unit(ActiveState="active", MainPID=pid)
    found = evaluate(dict(check, expect=dict(check["expect"], policy="fifo")))
    assert found["state"] == "drifted" and "policy other (expected fifo)" in found["detail"]
    elsewhere = server(tmp_path / "other" / "server")
    unit(MainPID=elsewhere)
    assert "runs %s, not release %s (a restart switches it)" % (tmp_path / "other" / "server", name("1.0.0")) \
        in evaluate(check)["detail"]
    unit(MainPID=pid)
    (release / "runtime" / "edgetune-runtime").write_text("#!/bin/sh\nexit 0\n")
    assert evaluate(check)["detail"] == "%s/releases/%s/runtime/edgetune-runtime was changed" % (root, name("1.0.0"))
    (release / "engine" / "model.json").unlink()
    assert "engine/model.json is missing" in evaluate(check)["detail"]
    run(capsys, root=str(root), artifacts=built["2.0.0"])
    found = evaluate(check)
    assert found["state"] == "drifted" and found["persisted"] == name("2.0.0")
    assert found["detail"].startswith("%s/current is %s, not release %s" % (root, name("2.0.0"), name("1.0.0")))


def test_state_current_repairs_a_damaged_release_and_says_when_to_restart(tmp_path, capsys, built, unit, server):
    root = tmp_path / "opt"
    run(capsys, root=str(root), artifacts=built["1.0.0"])
    release = root / "releases" / name("1.0.0")
    pid = server(release / "runtime" / "server")
    unit(MainPID=pid)
    serving = run(capsys, root=str(root), artifacts=built["1.0.0"], service=SERVICE)
    assert (serving["changed"], serving["restart"], serving["repaired"]) == (False, False, [])
    unit(ActiveState="inactive", MainPID=0)
    stopped = run(capsys, root=str(root), artifacts=built["1.0.0"], service=SERVICE)
    assert (stopped["changed"], stopped["restart"]) == (False, True)
    unit(ActiveState="active", MainPID=pid)

    original = (release / "runtime" / "edgetune-runtime").read_bytes()
    (release / "runtime" / "edgetune-runtime").write_text("#!/bin/sh\nexit 0\n")
    (release / "engine" / "model.json").unlink()
    before = tree(root)
    checked = run(capsys, check=True, root=str(root), artifacts=built["1.0.0"], service=SERVICE)
    assert checked["changed"] and checked["restart"] and tree(root) == before
    repaired = run(capsys, root=str(root), artifacts=built["1.0.0"], service=SERVICE)
    assert repaired["changed"] and repaired["restart"] and repaired["current"] == name("1.0.0")
    assert repaired["repaired"] == ["%s/engine/model.json is missing" % release,
                                    "%s/runtime/edgetune-runtime was changed" % release]
    assert (release / "runtime" / "edgetune-runtime").read_bytes() == original
    assert (release / "engine" / "model.json").is_file()
    assert not [p for p in os.listdir(root / "releases") if p.startswith(".")]
    # The swapped-in directory is the release again; the running program was in the old one.
    assert run(capsys, root=str(root), artifacts=built["1.0.0"], service=SERVICE)["restart"] is True
