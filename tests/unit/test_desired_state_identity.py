"""A controller path is no part of a device's desired state (plugins/module_utils/plan/edge_plan.py,
CONTROLLER_LOCATIONS): the files the controller ships are recorded by what they are.

A twin applied from one checkout (AWX) and audited through another copy of the collection (a laptop)
with the same artifacts in another directory has the same inputs, role by role, so the audit's judge
finds nothing; an artifact one byte apart has other inputs, and the judge names the file that changed.
The artifacts are the project's packager's (tools/edgetune_dev/artifacts.py), as in test_edge_intent.
"""
import json
import shutil
from pathlib import Path

import pytest
from test_edge_intent import SPECS, TENSORRT, board, package_llm

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_audit

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_package, edge_plan
from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_intent as intent

OPTIONS = dict((role, list(options)) for role, options in SPECS.items())
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The controller's caches (sha256 of a file, manifests, code digests) in the test's own directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def plan_of(values, mode="audit", name="orin-nx"):
    """The device's plan as the preflight makes it: an apply resolves and hashes the artifacts in the
    validation, the audit does not (mode audit), and the plan then reads them itself."""
    facts, profile = board(name)
    checked = intent.validate(dict(values), SPECS, facts=facts, profile=profile, mode=mode,
                              controller_artifacts={"tensorrt_by_l4t": TENSORRT})
    assert checked["problems"] == [], checked["problems"]
    assert (checked["artifacts"] is not None) == (mode == "apply" and
                                                  values.get("edge_runtime_artifact_source") in (None, "controller"))
    return edge_plan.build(checked["intent"], facts, profile, checked["partition"], checked["slice"],
                           role_options=OPTIONS, artifacts=checked["artifacts"])


def inputs(plan):
    return dict((role, entry["inputs"]) for role, entry in plan["audit"]["roles"].items())


def judged(applied, today):
    """The audit's judge (edge_audit.judge_records) of a device whose records are ``applied``'s audit part,
    against ``today``'s: {role: (state, detail)} of each role's applied state."""
    evaluated = dict((role, {"inputs": entry["inputs"], "results": []})
                     for role, entry in applied["audit"]["roles"].items() if entry["enabled"])
    results, _summary = edge_audit.judge_records(evaluated, expected=today["audit"]["roles"])
    return dict((r["role"], (r["state"], r["detail"])) for r in results)


def copy_dir(src, dest):
    """Another controller's copy: other paths, other times (copyfile, not copy2)."""
    dest.mkdir(parents=True)
    for item in sorted(Path(src).iterdir()):
        if item.is_file():
            shutil.copyfile(str(item), str(dest / item.name))
    return dest


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    """The reference runtime and engine as the packager writes them (once: building the engine takes
    seconds), the engine's document, and a node exporter .deb."""
    from edgetune_dev import artifacts as packager
    out = tmp_path_factory.mktemp("packaged")
    document = packager.build_engine_document(json.loads(Path(packager.DEFAULT_SPEC).read_text()))
    runtime = packager.package_runtime(out)
    engine = packager.package_engine(out, document=document)
    (out / "prometheus-node-exporter_1.5.0_arm64.deb").write_bytes(b"!<arch>\ndebian-binary   " + b"\0" * 64)
    return {"dir": out, "runtime": Path(runtime["path"]).name, "engine": Path(engine["path"]).name,
            "deb": "prometheus-node-exporter_1.5.0_arm64.deb", "sidecars": {"runtime": runtime, "engine": engine},
            "document": document}


@pytest.fixture
def reference(tmp_path, packaged):
    """The packaged files in this test's controller directory (the test may change them)."""
    return dict(packaged, dir=copy_dir(packaged["dir"], tmp_path / "awx" / "artifacts"))


def named(directory, reference, how, **more):
    """The intent naming the artifacts (and the .deb) in ``directory``: by file name in the artifacts
    directory, or by absolute path."""
    values = {"edge_runtime_artifacts_dir": str(directory),
              "edge_audit_timer_node_exporter": True,
              "edge_audit_timer_node_exporter_package": str(Path(directory) / reference["deb"])}
    for kind in ("runtime", "engine"):
        values["edge_runtime_%s_src" % kind] = (reference[kind] if how == "file name"
                                                else str(Path(directory) / reference[kind]))
    values.update(more)
    return values


def assert_no_path(found, *directories):
    text = json.dumps(found, sort_keys=True)
    for directory in directories:
        assert str(directory) not in text, "a controller path in the recorded inputs: %s" % directory


@pytest.mark.parametrize("how", ["file name", "absolute path"])
def test_the_same_artifacts_in_another_directory_give_the_same_inputs_for_every_role(tmp_path, reference, how):
    laptop = copy_dir(reference["dir"], tmp_path / "laptop" / "checkout" / ".cache" / "artifacts")
    applied = plan_of(named(reference["dir"], reference, how), mode="apply")
    for mode in ("apply", "audit"):
        today = plan_of(named(laptop, reference, how), mode=mode)
        assert inputs(today) == inputs(applied), mode
        assert_no_path(inputs(today), reference["dir"], laptop, tmp_path)
        assert set(judged(applied, today).values()) == {("ok", "")}
    # What the runtime and the audit timer ship is in their inputs, by what it is.
    files = inputs(applied)["edge_runtime"]["files"]
    assert files == {"runtime artifact": {"name": "edgetune-runtime",
                                          "version": reference["sidecars"]["runtime"]["version"],
                                          "sha256": reference["sidecars"]["runtime"]["artifact"]["sha256"]},
                     "engine artifact": {"name": reference["sidecars"]["engine"]["name"],
                                         "version": reference["sidecars"]["engine"]["version"],
                                         "sha256": reference["sidecars"]["engine"]["artifact"]["sha256"]}}
    deb = inputs(applied)["edge_audit_timer"]["files"]["node exporter package"]
    assert deb["name"] == reference["deb"] and len(deb["sha256"]) == 64


def test_auto_picks_the_same_release_from_another_directory(tmp_path):
    """The default: auto, in the checkout's .cache/artifacts (edge_runtime_artifacts_dir's default is
    derived from where the collection is)."""
    awx = tmp_path / "awx" / ".cache" / "artifacts"
    package_llm(awx, "aarch64", "2.35")
    laptop = copy_dir(awx, tmp_path / "laptop" / ".cache" / "artifacts")
    applied = plan_of({"edge_runtime_artifacts_dir": str(awx)}, mode="apply")
    today = plan_of({"edge_runtime_artifacts_dir": str(laptop)})
    assert inputs(today) == inputs(applied)
    assert_no_path(inputs(today), awx, laptop, tmp_path)
    assert [item["name"] for item in inputs(today)["edge_runtime"]["files"].values()] == ["smollm2", "llama-server"]
    assert set(judged(applied, today).values()) == {("ok", "")}


def test_an_artifact_one_byte_apart_is_a_change_of_the_runtime_named_by_the_judge(tmp_path, reference):
    """The same file name in the same directory, repackaged with one byte of the model changed (same
    name and version): the runtime's inputs change, no other role's, and the judge names the engine."""
    from edgetune_dev import artifacts as packager
    values = named(reference["dir"], reference, "file name")
    applied = plan_of(values, mode="apply")
    engine = dict(reference["document"])
    engine["description"] = engine["description"][:-1] + "!"             # its last "." : one byte apart
    rebuilt = packager.package_engine(reference["dir"], document=engine)
    assert Path(rebuilt["path"]).name == reference["engine"]
    for mode in ("apply", "audit"):
        today = plan_of(values, mode=mode)
        changed = sorted(role for role in inputs(today) if inputs(today)[role] != inputs(applied)[role])
        assert changed == ["edge_runtime"], mode
        old, new = reference["sidecars"]["engine"]["artifact"]["sha256"], rebuilt["artifact"]["sha256"]
        assert inputs(today)["edge_runtime"]["files"]["engine artifact"]["sha256"] == new != old
        verdict = judged(applied, today)
        assert verdict["edge_runtime"] == (
            "drifted", "the desired state changed since the last apply (run site.yml): engine artifact sha256 "
                       "%s -> %s" % (old[:12], new[:12]))
        assert set(state for role, state in verdict.items() if role != "edge_runtime") == {("ok", "")}


def test_a_byte_changed_in_the_tarball_itself_is_seen_by_the_audit(tmp_path, reference):
    """One byte flipped in the runtime tarball, its sidecar left as it was: the apply refuses it (checksum
    mismatch); the audit, which does not check the artifacts, still sees another runtime."""
    values = named(reference["dir"], reference, "file name")
    applied = plan_of(values, mode="apply")
    tarball = reference["dir"] / reference["runtime"]
    data = bytearray(tarball.read_bytes())
    data[len(data) // 2] ^= 0x01
    tarball.write_bytes(bytes(data))
    facts, profile = board("orin-nx")
    refused = intent.validate(values, SPECS, facts=facts, profile=profile,
                              controller_artifacts={"tensorrt_by_l4t": TENSORRT})["problems"]
    assert "Checksum mismatch for the runtime artifact" in refused[0]["message"]
    today = plan_of(values)
    assert inputs(today)["edge_runtime"] != inputs(applied)["edge_runtime"]
    state, detail = judged(applied, today)["edge_runtime"]
    assert state == "drifted" and "runtime artifact sha256 %s -> " % (
        reference["sidecars"]["runtime"]["artifact"]["sha256"][:12]) in detail


def test_another_node_exporter_deb_is_a_change_of_the_audit_timer(tmp_path, reference):
    values = named(reference["dir"], reference, "file name")
    applied = plan_of(values, mode="apply")
    deb = reference["dir"] / reference["deb"]
    deb.write_bytes(deb.read_bytes() + b"\0")
    today = plan_of(values)
    assert sorted(r for r in inputs(today) if inputs(today)[r] != inputs(applied)[r]) == ["edge_audit_timer"]
    state, detail = judged(applied, today)["edge_audit_timer"]
    assert state == "drifted" and "node exporter package sha256 " in detail


def test_a_controller_without_the_artifacts_cannot_vouch_for_the_runtime(tmp_path, reference):
    """An audit from a copy of the collection without the artifacts says it cannot judge the runtime
    (an error naming the artifacts), where a path compared equal said nothing; a change it can see is
    still drift."""
    applied = plan_of(named(reference["dir"], reference, "file name"), mode="apply")
    empty = tmp_path / "laptop" / "artifacts"
    empty.mkdir(parents=True)
    (empty / reference["deb"]).write_bytes((reference["dir"] / reference["deb"]).read_bytes())
    today = plan_of(named(empty, reference, "file name"))
    state, detail = judged(applied, today)["edge_runtime"]
    assert state == "error" and detail.startswith("cannot judge it from this controller: ")
    assert "runtime artifact unreadable (" in detail and "engine artifact unreadable (" in detail
    assert str(empty) in detail
    assert judged(applied, today)["edge_audit_timer"] == ("ok", "")
    changed = plan_of(dict(named(empty, reference, "file name"), edge_runtime_port=8471))
    state, detail = judged(applied, changed)["edge_runtime"]
    assert state == "drifted" and "edge_runtime_port" in detail and "unreadable" not in detail


def test_url_and_device_artifacts_are_named_by_the_inventory_not_a_controller_directory():
    """Other sources name the tarballs by URL or device path and sha256 (kept as variables); the
    controller's artifacts directory is not read, and is no input."""
    sha = "ab" * 32
    values = {"edge_runtime_artifact_source": "url", "edge_runtime_runtime_src": "https://example.org/r.tar.gz",
              "edge_runtime_engine_src": "https://example.org/e.tar.gz", "edge_runtime_runtime_sha256": sha,
              "edge_runtime_engine_sha256": sha}
    one = inputs(plan_of(dict(values, edge_runtime_artifacts_dir="/srv/a"), mode="apply"))
    two = inputs(plan_of(dict(values, edge_runtime_artifacts_dir="/home/me/b")))
    assert one == two
    assert one["edge_runtime"]["files"] == {}
    assert one["edge_runtime"]["variables"]["edge_runtime_runtime_src"] == "https://example.org/r.tar.gz"
    assert "edge_runtime_artifacts_dir" not in one["edge_runtime"]["variables"]


def test_the_collection_at_another_path_has_the_same_code_digests(tmp_path):
    """The roles' code enters as digests of relative paths and contents (edge_code), the device package
    too: the collection's files at two paths give the same inputs."""
    roots = []
    for where in ("awx/collections", "laptop/src/edgetune/collections"):
        root = tmp_path / where / "ansible_collections" / "edgetune" / "fleet"
        for sub in ("roles", "plugins", "bpf"):
            shutil.copytree(str(REPO / sub), str(root / sub), ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        roots.append(str(root))
    first, second = (edge_plan.collection_code(root) for root in roots)
    assert first["digests"] == second["digests"] == edge_plan.collection_code()["digests"]
    assert first["programs"] == second["programs"]
    assert edge_package.files(roots[0]) == edge_package.files(roots[1])
