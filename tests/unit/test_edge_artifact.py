"""Manifests, tarball inspection and the compatibility rules (plugins/module_utils/device/edge_artifact.py).

The L4T-to-TensorRT rows used here are written from NVIDIA's JetPack release
notes (JetPack 5.1.x = L4T 35.2-35.6 with TensorRT 8.5.2; JetPack 6.0 = 36.3
with 8.6.2; JetPack 6.1/6.2 = 36.4.x with 10.3), not copied from the role, and
one test checks the role's table against them.
"""
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_artifact import (
    ArtifactError,
    compatibility_problems,
    default_release,
    detect_architecture,
    detect_glibc,
    detect_rknn,
    detect_tensorrt,
    inspect_tarball,
    pairing_problems,
    parse_version,
    safe_relative,
    sha256_bytes,
    tensorrt_for_l4t,
    unpack,
    validate_manifest,
    version_matches,
)

REPO = Path(__file__).resolve().parents[2]
TRT_TABLE = [
    {"l4t": ">=35.2,<36", "tensorrt": "8.5.2", "jetpack": "5.1.x"},
    {"l4t": ">=36.3,<36.4", "tensorrt": "8.6.2", "jetpack": "6.0"},
    {"l4t": ">=36.4,<37", "tensorrt": "10.3.0", "jetpack": "6.1/6.2"},
]
R35 = {"soc": "tegra234", "l4t": {"version": "35.6.0", "major": 35}, "bsp": {"name": "ubuntu", "version": "20.04"},
       "python": "3.8.10", "tensorrt": None, "rknn": None}
R36 = {"soc": "tegra234", "l4t": {"version": "36.4.3", "major": 36}, "bsp": {"name": "ubuntu", "version": "22.04"},
       "python": "3.10.12", "tensorrt": None, "rknn": None}
RK = {"soc": "rk3588", "l4t": None, "bsp": {"name": "armbian", "version": "25.8.1"}, "python": "3.11.2",
      "tensorrt": None, "rknn": None}


def manifest(kind="engine", **compat):
    doc = {"schema": "edgetune-artifact/1", "kind": kind, "name": "m", "version": "1.0",
           "files": {"model.plan": "0" * 64}, "compatibility": compat}
    if kind == "engine":
        doc.update(entry="model.plan", format="tensorrt-plan")
    else:
        doc.update(engine_formats=["edgetune-mlp-json/1"])
    return doc


# ------------------------------------------------------------------ versions
@pytest.mark.parametrize("version,spec,expected", [
    ("36.4.3", ">=35.1,<37", True),
    ("37.0", ">=35.1,<37", False),
    ("35.0.9", ">=35.1", False),
    ("35.1", ">=35.1", True),
    ("36.4.3", "==36.4.*", True),
    ("36.40.0", "==36.4.*", False),
    ("3.8.10", ">=3.8", True),
    ("3.7.17", ">=3.8", False),
    ("2.0.0b0", ">=2.0", True),
    ("8.5.2-1+cuda11.4", "==8.5.2", True),
    ("1.0", "", True),
    ("1.0", None, True),
    (None, ">=1", False),
])
def test_version_matches(version, spec, expected):
    assert version_matches(version, spec) is expected


@pytest.mark.parametrize("spec", ["~=3.8", ">=abc", ">=1.*"])
def test_unreadable_version_range_is_an_error(spec):
    with pytest.raises(ArtifactError, match="version range"):
        version_matches("1.0", spec)


def test_parse_version():
    assert parse_version("v10.3.0.30") == (10, 3, 0, 30)
    assert parse_version("rc") is None


@pytest.mark.parametrize("name,ok", [("a/b.json", True), ("/etc/passwd", False), ("../x", False),
                                     ("a/../../x", False), ("a//b", False), ("", False), ("a\\b", False)])
def test_safe_relative(name, ok):
    assert safe_relative(name) is ok


# ------------------------------------------------------------------ manifests
def test_a_good_manifest_has_no_problems():
    assert validate_manifest(manifest("engine", socs=["tegra234"], l4t=">=36.4,<37")) == []
    assert validate_manifest(manifest("runtime")) == []


@pytest.mark.parametrize("change,message", [
    ({"schema": "other/2"}, "schema"),
    ({"kind": "model"}, "kind"),
    ({"name": "bad name"}, "name"),
    ({"version": ""}, "version"),
    ({"files": {}}, "files must map"),
    ({"files": {"../x": "0" * 64}}, "leaves the artifact"),
    ({"files": {"model.plan": "abc"}}, "no sha256"),
    ({"entry": "other.plan"}, "entry"),
    ({"format": ""}, "format"),
    ({"compatibility": {"l4t": "~35"}}, "version range"),
    ({"compatibility": {"requires": {"tensorrt": {}}}}, "requires.tensorrt"),
    ({"compatibility": {"requires": {"rknn": {"version": "2"}}}}, "toolkit_version"),
    ({"backend": "vulkan"}, "backend is 'vulkan', expected one of cpu, cuda, rknn"),
    ({"architecture": "x86 64"}, "not a machine name"),
    ({"compatibility": {"requires": {"glibc": "2.36+"}}}, "version range"),
])
def test_bad_manifests_are_named(change, message):
    doc = dict(manifest("engine"), **change)
    problems = validate_manifest(doc)
    assert problems and any(message in p for p in problems), problems


def test_kind_must_be_the_expected_one():
    assert any("where a runtime was expected" in p for p in validate_manifest(manifest("engine"), "runtime"))


# ------------------------------------------------------------------ compatibility
def test_tensorrt_10_engine_is_refused_on_r35_naming_both_sides():
    engine = manifest(socs=["tegra234"], l4t=">=35.1,<37", requires={"tensorrt": {"version": "10.3"}})
    problems = compatibility_problems(engine, R35, {"tensorrt_by_l4t": TRT_TABLE})
    assert len(problems) == 1
    text = problems[0]
    assert "TensorRT 10.3" in text and "L4T 35.6.0" in text and "TensorRT 8.5.2" in text


def test_tensorrt_engine_matching_the_release_still_needs_libnvinfer():
    engine = manifest(socs=["tegra234"], l4t=">=36.4,<37", requires={"tensorrt": {"version": "10.3"}})
    problems = compatibility_problems(engine, R36, {"tensorrt_by_l4t": TRT_TABLE})
    assert len(problems) == 1 and "not installed" in problems[0]
    assert compatibility_problems(engine, dict(R36, tensorrt="10.3.0"), {"tensorrt_by_l4t": TRT_TABLE}) == []
    # A plan only loads on the TensorRT release that built it.
    wrong = compatibility_problems(engine, dict(R36, tensorrt="10.4.0"), {"tensorrt_by_l4t": TRT_TABLE})
    assert "installed TensorRT is 10.4.0" in wrong[0]


def test_version_compatible_tensorrt_plan_runs_on_a_later_10x():
    engine = manifest(requires={"tensorrt": {"version": "10.1", "version_compatible": True}}, l4t=">=36")
    assert compatibility_problems(engine, dict(R36, tensorrt="10.3.0"), {"tensorrt_by_l4t": TRT_TABLE}) == []
    older = manifest(requires={"tensorrt": {"version": "10.4", "version_compatible": True}}, l4t=">=36")
    assert compatibility_problems(older, dict(R36, tensorrt="10.3.0"), {"tensorrt_by_l4t": TRT_TABLE})


def test_tensorrt_on_an_l4t_release_missing_from_the_table():
    engine = manifest(requires={"tensorrt": {"version": "8.5"}}, l4t=">=34")
    problems = compatibility_problems(engine, dict(R35, l4t={"version": "34.1.1"}), {"tensorrt_by_l4t": TRT_TABLE})
    assert "not in the role's L4T-to-TensorRT table" in problems[0]


def test_tensorrt_engine_on_a_rockchip_board():
    engine = manifest(requires={"tensorrt": {"version": "8.5"}}, bsp={"armbian": ">=23"})
    assert "runs no L4T" in compatibility_problems(engine, RK, {"tensorrt_by_l4t": TRT_TABLE})[0]


def test_soc_and_l4t_range():
    engine = manifest(socs=["rk3588"], l4t=None)
    problems = compatibility_problems(engine, R36)
    assert any("built for SoC rk3588, but this board is tegra234" in p for p in problems)
    assert any("declares no L4T release range" in p for p in problems)
    old = manifest(l4t=">=36.4")
    assert "needs L4T >=36.4, but this board runs L4T 35.6.0" in compatibility_problems(old, R35)[0]


def test_bsp_ranges_apply_to_non_jetson_boards():
    engine = manifest(socs=["rk3588"], bsp={"armbian": ">=26.0"})
    assert "needs armbian >=26.0, but this board runs armbian 25.8.1" in compatibility_problems(engine, RK)[0]
    other = manifest(socs=["rk3588"], bsp={"ubuntu": ">=22.04"})
    assert "supports BSP ubuntu >=22.04, but this board runs armbian 25.8.1" in compatibility_problems(other, RK)[0]
    assert compatibility_problems(manifest(socs=["rk3588"], bsp={"armbian": ">=23"}), RK) == []


def test_python_requirement_names_the_interpreter_version():
    runtime = manifest("runtime", requires={"python": ">=3.9"}, l4t=">=35")
    assert "needs python3 >=3.9, but the runtime's interpreter is Python 3.8.10" in \
        compatibility_problems(runtime, R35)[0]
    assert "Python missing" in compatibility_problems(runtime, dict(R35, python=None))[0]


def test_rknn_rules():
    engine = manifest(socs=["rk3588"], requires={"rknn": {"toolkit_version": "2.3.0"}})
    assert "no librknnrt was found" in compatibility_problems(engine, RK)[0]
    assert compatibility_problems(engine, dict(RK, rknn="2.3.2")) == []
    assert compatibility_problems(engine, RK, {"rknn_runtime": "2.3.0"}) == []
    assert "has librknnrt 2.1.0" in compatibility_problems(engine, dict(RK, rknn="2.1.0"))[0]
    assert "has librknnrt 1.6.0" in compatibility_problems(engine, dict(RK, rknn="1.6.0"))[0]
    assert any("not a Rockchip NPU" in p for p in compatibility_problems(engine, R36))


def llama_server(arch="aarch64", backend="cpu", glibc=">=2.34"):
    return dict(manifest("runtime", requires={"glibc": glibc}), architecture=arch, backend=backend,
                engine_formats=["gguf"])


def test_backends_known_to_the_check():
    for backend in ("cpu", "cuda", "rknn"):
        assert validate_manifest(llama_server(backend=backend)) == []


def test_architecture_is_the_devices_own():
    board = dict(R36, architecture="aarch64", glibc="2.35")
    assert compatibility_problems(llama_server("aarch64"), board) == []
    problems = compatibility_problems(llama_server("x86_64"), board)
    assert problems == ["runtime m 1.0 is built for x86_64, but this board is aarch64"]
    # The controller leaves the machine to the device (edge_release reads uname there).
    assert compatibility_problems(llama_server("x86_64"), board, unknown=["architecture"]) == []
    assert "but this board is unknown" in compatibility_problems(llama_server(), dict(R36, glibc="2.35"))[0]


def test_glibc_requirement_names_both_versions():
    board = dict(R35, architecture="aarch64", glibc="2.31")
    problems = compatibility_problems(llama_server(glibc=">=2.34"), board)
    assert problems == ["runtime m 1.0 needs glibc >=2.34, but this board has glibc 2.31"]
    assert compatibility_problems(llama_server(glibc=">=2.31"), board) == []
    assert "no glibc found" in compatibility_problems(llama_server(), dict(board, glibc=None))[0]
    assert compatibility_problems(llama_server(), dict(board, glibc=None), unknown=["glibc"]) == []


def test_a_cpu_build_needs_no_l4t_range_but_cuda_needs_l4t():
    jetson = dict(R36, architecture="aarch64", glibc="2.35")
    rock = dict(RK, architecture="aarch64", glibc="2.36")
    # A CPU build runs on any L4T release; the MLP runtime without a backend still declares one.
    assert compatibility_problems(llama_server(), jetson) == []
    assert any("declares no L4T release range" in p for p in compatibility_problems(manifest("runtime"), jetson))
    cuda = llama_server(backend="cuda")
    assert any("declares no L4T release range" in p for p in compatibility_problems(cuda, jetson))
    cuda["compatibility"]["l4t"] = ">=36.4,<37"  # a CUDA build is tied to the L4T release's CUDA
    assert compatibility_problems(cuda, jetson) == []
    assert "CUDA backend, which needs an NVIDIA Jetson with L4T" in \
        compatibility_problems(llama_server(backend="cuda"), rock)[0]
    assert compatibility_problems(llama_server(backend="rknn"), rock) == []
    assert "RKNN backend (Rockchip NPU), but this board's SoC is tegra234" in \
        compatibility_problems(llama_server(backend="rknn"), jetson)[0]


def test_detect_glibc_and_architecture_of_this_machine():
    assert detect_architecture() == os.uname().machine
    version = detect_glibc()
    assert version and parse_version(version) >= (2, 17)
    assert version == os.confstr("CS_GNU_LIBC_VERSION").split()[1]


def test_runtime_and_engine_formats_must_pair():
    problems = pairing_problems(manifest("runtime"), manifest("engine"))
    assert "loads engine formats edgetune-mlp-json/1, not tensorrt-plan" in problems[0]
    assert pairing_problems(manifest("runtime"), dict(manifest("engine"), format="edgetune-mlp-json/1")) == []


def test_tensorrt_table_lookup():
    assert tensorrt_for_l4t("35.6.0", TRT_TABLE)["tensorrt"] == "8.5.2"
    assert tensorrt_for_l4t("36.3.0", TRT_TABLE)["tensorrt"] == "8.6.2"
    assert tensorrt_for_l4t("36.4.3", TRT_TABLE)["tensorrt"] == "10.3.0"
    assert tensorrt_for_l4t("38.2.0", TRT_TABLE) is None


@pytest.mark.controller
def test_the_roles_tensorrt_table_agrees_with_the_release_notes():
    import yaml
    table = yaml.safe_load((REPO / "roles/edge_runtime/vars/main.yml").read_text())["__edge_runtime_tensorrt_by_l4t"]
    for l4t, trt in (("35.1.0", "8.4.1"), ("35.2.1", "8.5.2"), ("35.4.1", "8.5.2"), ("35.6.0", "8.5.2"),
                     ("36.3.0", "8.6.2"), ("36.4.0", "10.3.0"), ("36.4.3", "10.3.0")):
        assert tensorrt_for_l4t(l4t, table)["tensorrt"] == trt, l4t
    assert tensorrt_for_l4t("38.2.0", table) is None


# ------------------------------------------------------------------ tarballs
def make_tar(path, members, manifest_doc=None):
    """members: list of (name, bytes | None for a dir | ('symlink', target))."""
    with tarfile.open(path, "w:gz") as tar:
        if manifest_doc is not None:
            data = json.dumps(manifest_doc).encode()
            info = tarfile.TarInfo("MANIFEST.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, data[1]
                tar.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o755 if name.endswith(".sh") else 0o644
                tar.addfile(info, io.BytesIO(data))
    return path


def engine_manifest_for(files):
    return dict(manifest("engine"), files={n: sha256_bytes(d) for n, d in files.items()},
                entry=sorted(files)[0], format="edgetune-mlp-json/1")


def test_inspect_and_unpack_a_good_artifact(tmp_path):
    files = {"model.json": b'{"x": 1}\n', "bin/run.sh": b"#!/bin/sh\n"}
    tar = make_tar(tmp_path / "a.tar.gz", [("bin", None)] + list(files.items()), engine_manifest_for(files))
    doc, names, size = inspect_tarball(str(tar), "engine")
    assert doc["entry"] == "bin/run.sh" and "MANIFEST.json" in names and size == sum(map(len, files.values())) + len(
        json.dumps(engine_manifest_for(files)).encode())
    dest = tmp_path / "out"
    dest.mkdir()
    unpack(str(tar), str(dest))
    assert (dest / "model.json").read_bytes() == files["model.json"]
    assert os.stat(dest / "bin/run.sh").st_mode & 0o777 == 0o755
    assert os.stat(dest / "model.json").st_mode & 0o777 == 0o644


def test_a_tampered_file_is_caught_by_its_manifest_checksum(tmp_path):
    doc = engine_manifest_for({"model.json": b"good"})
    tar = make_tar(tmp_path / "a.tar.gz", [("model.json", b"evil")], doc)
    with pytest.raises(ArtifactError, match="model.json has sha256 .* but the manifest says"):
        inspect_tarball(str(tar))


@pytest.mark.parametrize("members,message", [
    ([("model.json", b"x"), ("../escape", b"x")], "leaves the artifact"),
    ([("model.json", b"x"), ("/etc/cron.d/x", b"x")], "leaves the artifact"),
    ([("model.json", b"x"), ("link", ("symlink", "/etc/shadow"))], "link or device"),
    ([("model.json", b"x"), ("extra.bin", b"y")], "not listed: extra.bin"),
    ([], "missing: model.json"),
])
def test_unsafe_or_inconsistent_tarballs_are_refused(tmp_path, members, message):
    tar = make_tar(tmp_path / "a.tar.gz", members, engine_manifest_for({"model.json": b"x"}))
    with pytest.raises(ArtifactError, match=message):
        inspect_tarball(str(tar))


def test_no_manifest_and_not_a_tarball(tmp_path):
    tar = make_tar(tmp_path / "a.tar.gz", [("model.json", b"x")])
    with pytest.raises(ArtifactError, match="no MANIFEST.json"):
        inspect_tarball(str(tar))
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(ArtifactError, match="not a readable tarball"):
        inspect_tarball(str(junk))


# ------------------------------------------------------------------ detection
def test_detect_tensorrt_from_the_library_name(tmp_path):
    lib = tmp_path / "usr/lib/aarch64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libnvinfer.so", "libnvinfer.so.8", "libnvinfer.so.8.5.2", "libnvinfer_plugin.so.8.5.2"):
        (lib / name).write_bytes(b"")
    assert detect_tensorrt(str(tmp_path)) == "8.5.2"
    assert detect_tensorrt(str(tmp_path / "nothing")) is None


def test_detect_rknn_from_the_embedded_version_string(tmp_path):
    lib = tmp_path / "usr/lib"
    lib.mkdir(parents=True)
    (lib / "librknnrt.so").write_bytes(b"\x7fELF\0\0junk\0librknnrt version: 2.3.0 (c949ad889d@2024-11-07T11:37:43)\0")
    assert detect_rknn(str(tmp_path)) == "2.3.0"
    assert detect_rknn(str(tmp_path / "nothing")) is None


def test_a_gguf_model_needs_no_l4t_range_but_a_tensorrt_plan_does():
    jetson = dict(R36, architecture="aarch64", glibc="2.35")
    gguf = dict(manifest("engine"), entry="model.gguf", format="gguf", files={"model.gguf": "0" * 64})
    assert compatibility_problems(gguf, jetson) == []
    assert any("declares no L4T release range" in p for p in compatibility_problems(manifest("engine"), jetson))


# ------------------------------------------------------------------ auto: the default release
def sidecar(directory, stem, manifest, tarball=True):
    """A tarball (empty: only its sidecar is read) and the <tarball>.manifest.json the packager writes."""
    directory.mkdir(parents=True, exist_ok=True)
    if tarball:
        (directory / (stem + ".tar.gz")).write_bytes(b"")
    (directory / (stem + ".tar.gz.manifest.json")).write_text(json.dumps(manifest))


SERVER = {"kind": "runtime", "name": "llama-server", "backend": "cpu", "engine_formats": ["gguf"]}
GGUF = {"kind": "engine", "name": "smollm2-135m-instruct-q4_1", "format": "gguf", "compatibility": {}}


def server(version, arch, glibc):
    return dict(SERVER, version=version, architecture=arch, compatibility={"requires": {"glibc": ">=" + glibc}})


@pytest.fixture
def packaged(tmp_path):
    """What `make artifacts` leaves, for two distributions and two machines, and the MLP fixture."""
    out = tmp_path / "artifacts"
    sidecar(out, "edgetune-llama-server-0.5.0-bullseye-x86_64", server("0.5.0", "x86_64", "2.30"))
    sidecar(out, "edgetune-llama-server-0.5.0-bookworm-x86_64", server("0.5.0", "x86_64", "2.36"))
    sidecar(out, "edgetune-llama-server-0.5.0-bullseye-aarch64", server("0.5.0", "aarch64", "2.30"))
    sidecar(out, "edgetune-llama-server-0.4.0-bookworm-aarch64", server("0.4.0", "aarch64", "2.36"))
    sidecar(out, "edgetune-engine-smollm2-0.1.1", dict(GGUF, version="0.1.1"))
    sidecar(out, "edgetune-engine-smollm2-0.1.2", dict(GGUF, version="0.1.2"))
    sidecar(out, "edgetune-runtime-0.1.2", {"kind": "runtime", "name": "edgetune-runtime", "version": "0.1.2",
                                            "engine_formats": ["edgetune-mlp-json/1"]})
    sidecar(out, "edgetune-engine-mlp-small-0.1.0", {"kind": "engine", "name": "mlp-small", "version": "0.1.0",
                                                     "format": "edgetune-mlp-json/1"})
    # A sidecar whose tarball is gone, and one that is not JSON: neither is offered.
    sidecar(out, "edgetune-llama-server-9.0.0-bookworm-x86_64", server("9.0.0", "x86_64", "2.30"), tarball=False)
    (out / "edgetune-llama-server-8.tar.gz").write_bytes(b"")
    (out / "edgetune-llama-server-8.tar.gz.manifest.json").write_text("{not json")
    return out


@pytest.mark.parametrize("device,runtime", [
    # the newest glibc build the device runs; an older glibc gets the older distribution's build
    ({"architecture": "x86_64", "glibc": "2.36"}, "edgetune-llama-server-0.5.0-bookworm-x86_64"),
    ({"architecture": "x86_64", "glibc": "2.31"}, "edgetune-llama-server-0.5.0-bullseye-x86_64"),
    # a newer llama.cpp wins over a newer glibc build of an older one
    ({"architecture": "aarch64", "glibc": "2.36"}, "edgetune-llama-server-0.5.0-bullseye-aarch64"),
])
def test_auto_picks_the_newest_build_the_device_runs_and_the_newest_gguf(packaged, device, runtime):
    chosen, engine = default_release(str(packaged), device)
    assert os.path.basename(chosen["path"]) == runtime + ".tar.gz"
    assert os.path.basename(engine["path"]) == "edgetune-engine-smollm2-0.1.2.tar.gz"
    assert engine["version"] == "0.1.2" and chosen["name"] == "llama-server"


def test_auto_refuses_a_device_no_build_runs_and_says_what_to_build(packaged, tmp_path):
    with pytest.raises(ArtifactError) as caught:
        default_release(str(packaged), {"architecture": "x86_64", "glibc": "2.28"})
    message = str(caught.value)
    assert "no llama-server build in %s runs on this board (x86_64, glibc 2.28)" % packaged in message
    assert "needs glibc >=2.30, but this board has glibc 2.28" in message and "make artifacts" in message
    with pytest.raises(ArtifactError, match=r"riscv64, glibc 2.36\): .*built for x86_64, but this board is "
                                            r"riscv64.* `make artifacts ARCH=riscv64`"):
        default_release(str(packaged), {"architecture": "riscv64", "glibc": "2.36"})
    with pytest.raises(ArtifactError, match="cannot list the artifacts directory"):
        default_release(str(tmp_path / "none"), {"architecture": "x86_64", "glibc": "2.36"})


def test_auto_needs_one_gguf_engine_the_board_accepts(packaged):
    device = {"architecture": "x86_64", "glibc": "2.36", "soc": "tegra234", "l4t": {"version": "36.4.3"}}
    other = dict(GGUF, name="other-7b", version="1.0", compatibility={"socs": ["rk3588"]})
    sidecar(packaged, "edgetune-engine-other-1.0", other)
    assert default_release(str(packaged), device)[1]["version"] == "0.1.2"  # other-7b is for rk3588 only
    with pytest.raises(ArtifactError, match=r"more than one GGUF engine in .* \(other-7b, smollm2-135m-instruct-q4_1\)"
                                            r": name the one to deploy"):
        default_release(str(packaged), dict(device, soc="rk3588", l4t=None))
    for name in ("edgetune-engine-smollm2-0.1.1", "edgetune-engine-smollm2-0.1.2", "edgetune-engine-other-1.0"):
        (packaged / (name + ".tar.gz")).unlink()
    with pytest.raises(ArtifactError, match="no GGUF engine in .* that llama-server 0.5.0 loads on this board"):
        default_release(str(packaged), device)


def test_the_controller_checks_a_tarball_once_per_content(tmp_path, monkeypatch):
    """checked_manifest remembers a checked tarball by its sha256: the same content is not
    unpacked again (a fleet's preflight), other content is, and a failed check is not remembered."""
    from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact
    files = {"model.json": b'{"x": 1}\n'}
    tar = make_tar(tmp_path / "a.tar.gz", [("model.json", files["model.json"])], engine_manifest_for(files))
    sha = edge_artifact.sha256_file(str(tar))
    cache = tmp_path / "cache"
    first = edge_artifact.checked_manifest(str(tar), "engine", sha, str(cache))
    assert first == inspect_tarball(str(tar), "engine")[0] and len(list(cache.iterdir())) == 1

    def unpacked(*_args):
        raise AssertionError("unpacked again")
    monkeypatch.setattr(edge_artifact, "inspect_tarball", unpacked)
    assert edge_artifact.checked_manifest(str(tar), "engine", sha, str(cache)) == first
    with pytest.raises(AssertionError, match="unpacked again"):
        edge_artifact.checked_manifest(str(tar), "engine", "0" * 64, str(cache))
    monkeypatch.undo()
    bad = make_tar(tmp_path / "b.tar.gz", [("model.json", b"evil")], engine_manifest_for({"model.json": b"good"}))
    bad_sha = edge_artifact.sha256_file(str(bad))
    with pytest.raises(ArtifactError, match="but the manifest says"):
        edge_artifact.checked_manifest(str(bad), "engine", bad_sha, str(cache))
    with pytest.raises(ArtifactError, match="but the manifest says"):    # checked again, not remembered
        edge_artifact.checked_manifest(str(bad), "engine", bad_sha, str(cache))
    assert len(list(cache.iterdir())) == 1
    # A cache that cannot be written only costs the check again.
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert edge_artifact.checked_manifest(str(tar), "engine", sha, str(blocked / "sub")) == first
