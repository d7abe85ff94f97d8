# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deployable artifacts (engine and runtime tarballs): manifests, checksums,
safe unpacking and the compatibility rules between an artifact and a board.

Runs on the device (Python 3.8+, stdlib only) inside edge_release, and on the
controller inside the packager (tools/edgetune/artifacts.py), so both read
and write the same manifest schema.

Manifest (``MANIFEST.json`` at the root of each tarball; the packager also
writes it beside the tarball as ``<tarball>.manifest.json`` with the
tarball's own ``sha256`` and ``size`` added)::

    {"schema": "edgetune-artifact/1", "kind": "engine" | "runtime",
     "name": "mlp-small", "version": "0.1.0",
     "files": {"model.json": "<sha256>", ...},
     "entry": "model.json",                 # engine: the file the runtime loads
     "format": "edgetune-mlp-json/1",       # engine: its format
     "engine_formats": ["edgetune-mlp-json/1"],   # runtime: formats it loads
     "architecture": "x86_64",              # optional: the machine (uname -m) it runs on
     "backend": "cpu" | "cuda" | "rknn",    # optional: what a runtime computes on
     "compatibility": {
        "socs": ["tegra234", "rk3588"],     # empty or missing: any SoC
        "l4t": ">=35.1,<37",                # Jetson: L4T release range; null: no Jetson
        "bsp": {"armbian": ">=23.0"},       # non-Jetson: distribution/BSP name -> range
        "requires": {"python": ">=3.8", "glibc": ">=2.34",
                     "tensorrt": {"version": "10.3", "version_compatible": false},
                     "rknn": {"toolkit_version": "2.3.0"}}}}
"""

import hashlib
import json
import os
import platform as _platform
import re
import tarfile
from urllib.parse import urlsplit

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import cached_json, controller_cache_dir
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

SCHEMA = "edgetune-artifact/1"
KINDS = ("engine", "runtime")
MANIFEST_NAME = "MANIFEST.json"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
# What a runtime computes on: the CPU, NVIDIA's CUDA (Jetson, with L4T) or Rockchip's NPU (librknnrt).
BACKENDS = ("cpu", "cuda", "rknn")
CLAUSE_RE = re.compile(r"^(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)(\.\*)?$")

# Engine formats that do not depend on the L4T release (nor on a TensorRT build).
PORTABLE_ENGINE_FORMATS = ("gguf",)


class ArtifactError(EdgeError):
    """An artifact or manifest that must not be installed; the message says why."""


# ------------------------------------------------------------------ versions
def parse_version(text):
    """'36.4.3' -> (36, 4, 3); '2.0.0b0' -> (2, 0, 0); '8.5.2-1+cuda11.4' -> (8, 5, 2). None when no digits."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(text or ""))
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def _cmp(a, b):
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def version_matches(version, spec):
    """Does ``version`` satisfy ``spec`` ('>=35.1,<37', '==36.4.*', '3.8', '')? Empty spec: yes.

    Raises ArtifactError on a spec it cannot read; returns False on an unreadable version.
    """
    if spec is None or str(spec).strip() in ("", "*"):
        return True
    have = parse_version(version)
    if have is None:
        return False
    for clause in str(spec).split(","):
        match = CLAUSE_RE.match(clause.strip())
        if not match:
            raise ArtifactError("version range %r: cannot read %r (use e.g. '>=35.1,<37')" % (spec, clause.strip()))
        op, want, wildcard = match.group(1) or "==", parse_version(match.group(2)), match.group(3)
        if wildcard:
            if op not in ("==", "!="):
                raise ArtifactError("version range %r: a wildcard only goes with == or !=" % spec)
            same = have[:len(want)] == want
            if same != (op == "=="):
                return False
            continue
        c = _cmp(have, want)
        ok = {">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0, "==": c == 0, "!=": c != 0}[op]
        if not ok:
            return False
    return True


def major_minor(text):
    parts = parse_version(text) or ()
    return ".".join(str(p) for p in parts[:2])


# ------------------------------------------------------------------ manifests
def validate_manifest(doc, kind=None):
    """Return a list of problems with a manifest (empty when it is well-formed)."""
    if not isinstance(doc, dict):
        return ["the manifest is not a JSON object"]
    problems = []
    if doc.get("schema") != SCHEMA:
        problems.append("schema is %r, expected %r" % (doc.get("schema"), SCHEMA))
    if doc.get("kind") not in KINDS:
        problems.append("kind is %r, expected one of %s" % (doc.get("kind"), ", ".join(KINDS)))
    elif kind and doc["kind"] != kind:
        problems.append("this is a %s artifact where a %s was expected" % (doc["kind"], kind))
    for key in ("name", "version"):
        if not isinstance(doc.get(key), str) or not NAME_RE.match(doc[key]):
            problems.append("%s %r is missing or not a plain name (letters, digits, . _ + -)" % (key, doc.get(key)))
    files = doc.get("files")
    if not isinstance(files, dict) or not files:
        problems.append("files must map each file of the artifact to its sha256")
    else:
        for name, digest in files.items():
            if not safe_relative(name):
                problems.append("file name %r is absolute or leaves the artifact" % name)
            if not isinstance(digest, str) or not HEX64_RE.match(digest):
                problems.append("file %r has no sha256" % name)
    if doc.get("kind") == "engine":
        if not isinstance(doc.get("format"), str) or not doc["format"]:
            problems.append("an engine manifest names its format")
        if not isinstance(files, dict) or doc.get("entry") not in files:
            problems.append("entry %r is not one of the artifact's files" % doc.get("entry"))
    if doc.get("kind") == "runtime":
        formats = doc.get("engine_formats")
        if not isinstance(formats, list) or not formats or not all(isinstance(f, str) for f in formats):
            problems.append("a runtime manifest lists the engine_formats it loads")
    if "backend" in doc and doc["backend"] not in BACKENDS:
        problems.append("backend is %r, expected one of %s" % (doc["backend"], ", ".join(BACKENDS)))
    if "architecture" in doc and (not isinstance(doc["architecture"], str) or not NAME_RE.match(doc["architecture"])):
        problems.append("architecture %r is not a machine name such as x86_64 or aarch64" % (doc["architecture"],))
    compat = doc.get("compatibility", {})
    if not isinstance(compat, dict):
        problems.append("compatibility must be an object")
        return problems
    if not isinstance(compat.get("socs", []), list):
        problems.append("compatibility.socs must be a list")
    if not isinstance(compat.get("bsp") or {}, dict):
        problems.append("compatibility.bsp must map BSP names to version ranges")
    requires = compat.get("requires") or {}
    if not isinstance(requires, dict):
        problems.append("compatibility.requires must be an object")
        requires = {}
    specs = [compat.get("l4t"), requires.get("python"), requires.get("glibc")] + list(
        (compat.get("bsp") or {}).values())
    for spec in specs:
        try:
            version_matches("0", spec)
        except ArtifactError as exc:
            problems.append(str(exc))
    trt = requires.get("tensorrt")
    if trt is not None and (not isinstance(trt, dict) or parse_version(trt.get("version")) is None):
        problems.append("requires.tensorrt needs a version, e.g. {\"version\": \"10.3\"}")
    rknn = requires.get("rknn")
    if rknn is not None and (not isinstance(rknn, dict) or parse_version(rknn.get("toolkit_version")) is None):
        problems.append("requires.rknn needs the toolkit_version the model was converted with")
    return problems


def safe_relative(name):
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        return False
    parts = name.split("/")
    return all(part not in ("", ".", "..") for part in parts)


def sha256_file(path, chunk=1 << 20):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ tarballs
def open_artifact(path):
    try:
        return tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise ArtifactError("%s is not a readable tarball: %s" % (path, exc)) from None


def inspect_tarball(path, kind=None):
    """Read and check an artifact tarball without unpacking it.

    Returns (manifest, members, unpacked_bytes). Every member must be a plain
    file or directory with a safe relative name; every file but the manifest
    must be listed in the manifest with the sha256 of its content.
    """
    with open_artifact(path) as tar:
        members = tar.getmembers()
        names = {}
        for member in members:
            name = member.name[2:] if member.name.startswith("./") else member.name
            name = name.rstrip("/")
            if name in ("", "."):
                continue
            if not safe_relative(name):
                raise ArtifactError("%s: member %r is absolute or leaves the artifact" % (path, member.name))
            if not (member.isfile() or member.isdir()):
                raise ArtifactError("%s: member %r is a link or device; artifacts hold plain files only"
                                    % (path, member.name))
            names[name] = member
        if MANIFEST_NAME not in names or not names[MANIFEST_NAME].isfile():
            raise ArtifactError("%s has no %s at its root: not an edgetune artifact" % (path, MANIFEST_NAME))
        try:
            manifest = json.loads(tar.extractfile(names[MANIFEST_NAME]).read().decode("utf-8"))
        except ValueError as exc:
            raise ArtifactError("%s: %s is not valid JSON (%s)" % (path, MANIFEST_NAME, exc)) from None
        problems = validate_manifest(manifest, kind)
        if problems:
            raise ArtifactError("%s: bad manifest: %s" % (path, "; ".join(problems)))
        files = {n: m for n, m in names.items() if m.isfile() and n != MANIFEST_NAME}
        listed = manifest["files"]
        missing = sorted(set(listed) - set(files))
        extra = sorted(set(files) - set(listed))
        if missing or extra:
            raise ArtifactError("%s: the manifest does not match the content (missing: %s; not listed: %s)"
                                % (path, ", ".join(missing) or "none", ", ".join(extra) or "none"))
        for name, member in sorted(files.items()):
            digest = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
            if digest != listed[name]:
                raise ArtifactError("%s: %s has sha256 %s but the manifest says %s"
                                    % (path, name, digest, listed[name]))
        unpacked = sum(m.size for m in names.values() if m.isfile())
    return manifest, sorted(names), unpacked


def _code_digest():
    with open(os.path.abspath(__file__), "rb") as handle:
        return hashlib.sha1(handle.read()).hexdigest()[:12]


def checked_manifest(path, kind, sha256, cache_dir=None):
    """inspect_tarball(path, kind)'s manifest for a tarball whose content is ``sha256`` (verified
    by the caller), remembered by that sha256 and this file's code: a fleet's preflight checks one
    release once, not once per device (gunzip and hashing a 100 MB model: 2.6 s on the controller).
    A cache that cannot be read or written only costs the check again."""
    cache_dir = controller_cache_dir("artifacts") if cache_dir is None else cache_dir
    entry = os.path.join(cache_dir, "%s-%s-%s.json" % (sha256, kind or "any", _code_digest())) if cache_dir else None
    return cached_json(entry, lambda: inspect_tarball(path, kind)[0])


def unpack(path, dest):
    """Unpack an inspected artifact into the new directory ``dest`` (files 0644/0755, dirs 0755)."""
    with open_artifact(path) as tar:
        for member in tar.getmembers():
            name = (member.name[2:] if member.name.startswith("./") else member.name).rstrip("/")
            if name in ("", "."):
                continue
            if not safe_relative(name) or not (member.isfile() or member.isdir()):
                raise ArtifactError("%s: refusing member %r" % (path, member.name))
            target = os.path.join(dest, *name.split("/"))
            if member.isdir():
                os.makedirs(target, mode=0o755, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            source = tar.extractfile(member)
            with open(target, "wb") as handle:
                while True:
                    block = source.read(1 << 20)
                    if not block:
                        break
                    handle.write(block)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)


# ------------------------------------------------------------------ boards
def device_paths(source, cache_dir, checked=(), runtime=None, engine=None):
    """Where the deploy finds each artifact on the device, and the cache with its parents.

    ``source``: ``controller`` (``checked``: the artifacts the controller checked, {kind, path, sha256},
    copied into ``cache_dir``), ``url`` (downloaded into ``cache_dir`` by the URL's file name) or
    ``device`` (already there); ``runtime`` and ``engine``: (src, sha256) of the url and device
    sources. Returns {"artifacts": [{kind, path, sha256}], "cache_dirs": the cache directory and its
    parents, deepest first (a refused deploy removes the ones it created)}."""
    base = "/" + cache_dir.strip("/")
    if source == "controller":
        found = [{"kind": item["kind"], "path": "%s/%s" % (base, os.path.basename(item["path"])),
                  "sha256": item["sha256"]} for item in checked or ()]
    else:
        found = []
        for kind, (src, sha256) in (("runtime", runtime or ("", "")), ("engine", engine or ("", ""))):
            path = src if source == "device" else "%s/%s" % (base, os.path.basename(urlsplit(src).path))
            found.append({"kind": kind, "path": path, "sha256": str(sha256 or "").lower()})
    parts = base.strip("/").split("/")
    return {"artifacts": found, "cache_dirs": ["/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1)]}


def tensorrt_for_l4t(l4t_version, table):
    """The TensorRT release an L4T release ships, from the role's data table
    [{"l4t": ">=36.4,<37", "tensorrt": "10.3", "jetpack": "6.1/6.2"}, ...]; None when unknown."""
    for row in table or []:
        if version_matches(l4t_version, row.get("l4t")):
            return row
    return None


def compatibility_problems(manifest, device, platform=None, unknown=()):
    """Why ``manifest`` cannot run on ``device``; empty list when it can.

    device: {"soc": "tegra234", "l4t": {"version": "36.4.3"} or None,
             "bsp": {"name": "armbian", "version": "25.8.1"}, "python": "3.11.2",
             "architecture": "aarch64" (uname -m), "glibc": "2.35",
             "tensorrt": "10.3.0" or None (installed, detected), "rknn": "2.3.0" or None}
    platform: {"tensorrt_by_l4t": [...], "rknn_runtime": "2.3.0" or ""} (the role's data).
    Every message names both sides: what the artifact needs and what the board has.
    ``unknown`` names the device keys (python, tensorrt, rknn, architecture, glibc) the caller could
    not learn: the controller's check before anything is copied, from the
    board's facts, leaves those to the device (edge_release) instead of
    reading them as missing.
    """
    platform = platform or {}
    what = "%s %s %s" % (manifest.get("kind"), manifest.get("name"), manifest.get("version"))
    compat = manifest.get("compatibility") or {}
    requires = compat.get("requires") or {}
    problems = []
    soc = device.get("soc")
    l4t = (device.get("l4t") or {}).get("version")
    bsp = device.get("bsp") or {}

    socs = compat.get("socs") or []
    if socs and soc not in socs:
        problems.append("%s is built for SoC %s, but this board is %s" % (what, "/".join(socs), soc or "unknown"))

    arch = manifest.get("architecture")
    if arch and "architecture" not in unknown and device.get("architecture") != arch:
        problems.append("%s is built for %s, but this board is %s"
                        % (what, arch, device.get("architecture") or "unknown"))
    backend = manifest.get("backend")
    problems += _backend_problems(what, backend, soc, l4t)

    if l4t:
        spec = compat.get("l4t")
        # A CPU build needs glibc (requires.glibc), not a given L4T release; a GGUF model runs
        # on any llama.cpp backend, unlike a TensorRT plan.
        if spec is None and backend != "cpu" and manifest.get("format") not in PORTABLE_ENGINE_FORMATS:
            problems.append("%s declares no L4T release range, and this board runs L4T %s" % (what, l4t))
        elif spec is not None and not version_matches(l4t, spec):
            problems.append("%s needs L4T %s, but this board runs L4T %s" % (what, spec, l4t))
    else:
        ranges = compat.get("bsp") or {}
        name, version = bsp.get("name"), bsp.get("version")
        if ranges and name not in ranges:
            problems.append("%s supports BSP %s, but this board runs %s %s" % (
                what, ", ".join("%s %s" % kv for kv in sorted(ranges.items())), name, version))
        elif ranges and not version_matches(version, ranges[name]):
            problems.append("%s needs %s %s, but this board runs %s %s" % (what, name, ranges[name], name, version))

    python_spec = requires.get("python")
    if python_spec and "python" not in unknown and not version_matches(device.get("python"), python_spec):
        problems.append("%s needs python3 %s, but the runtime's interpreter is Python %s"
                        % (what, python_spec, device.get("python") or "missing"))

    glibc_spec = requires.get("glibc")
    if glibc_spec and "glibc" not in unknown and not version_matches(device.get("glibc"), glibc_spec):
        problems.append("%s needs glibc %s, but this board has %s" % (
            what, glibc_spec, "glibc %s" % device["glibc"] if device.get("glibc") else "no glibc found"))

    trt = requires.get("tensorrt")
    if trt:
        problems += _tensorrt_problems(what, trt, l4t, device.get("tensorrt"), platform.get("tensorrt_by_l4t"),
                                       "tensorrt" not in unknown)
    rknn = requires.get("rknn")
    if rknn:
        runtime = device.get("rknn") or platform.get("rknn_runtime") or None
        if "rknn" not in unknown or runtime or soc not in RKNN_SOCS:
            problems += _rknn_problems(what, rknn, soc, runtime)
    return problems


def _backend_problems(what, backend, soc, l4t):
    if backend == "cuda" and not l4t:
        return ["%s is built for the CUDA backend, which needs an NVIDIA Jetson with L4T, but this board (%s) "
                "runs no L4T" % (what, soc or "unknown SoC")]
    if backend == "rknn" and soc not in RKNN_SOCS:
        return ["%s is built for the RKNN backend (Rockchip NPU), but this board's SoC is %s"
                % (what, soc or "unknown")]
    return []


def _trt_fits(engine_version, have, version_compatible):
    want = parse_version(engine_version)[:2]
    got = (parse_version(have) or ())[:2]
    if version_compatible:  # TensorRT 10 version-compatible plans run on later 10.x
        return bool(got) and got[0] == want[0] and got >= want
    return got == want


def _tensorrt_problems(what, trt, l4t, installed, table, check_installed=True):
    version = str(trt.get("version"))
    compatible = bool(trt.get("version_compatible"))
    rule = ("TensorRT %s.x, %s or later (version-compatible plan)" % (major_minor(version).split(".", 1)[0],
                                                                      major_minor(version))
            if compatible else "TensorRT %s (a plan loads only on the TensorRT release that built it)"
            % major_minor(version))
    if not l4t:
        return ["%s needs %s, which comes with NVIDIA L4T, but this board runs no L4T" % (what, rule)]
    row = tensorrt_for_l4t(l4t, table)
    if row is None:
        return ["%s needs %s, and L4T %s is not in the role's L4T-to-TensorRT table "
                "(roles/edge_runtime/vars/main.yml); add it there" % (what, rule, l4t)]
    if not _trt_fits(version, row["tensorrt"], compatible):
        return ["%s needs %s, but this board runs L4T %s, which ships TensorRT %s%s" % (
            what, rule, l4t, row["tensorrt"], " (JetPack %s)" % row["jetpack"] if row.get("jetpack") else "")]
    if not check_installed:
        return []
    if installed is None:
        return ["%s needs %s; L4T %s ships TensorRT %s but it is not installed on this board (no libnvinfer "
                "found): install the JetPack runtime (nvidia-tensorrt)" % (what, rule, l4t, row["tensorrt"])]
    if not _trt_fits(version, installed, compatible):
        return ["%s needs %s, but the installed TensorRT is %s" % (what, rule, installed)]
    return []


RKNN_SOCS = ("rk3588", "rk3588s", "rk3576", "rk3568", "rk3566", "rk3562")


def _rknn_problems(what, rknn, soc, runtime_version):
    toolkit = str(rknn.get("toolkit_version"))
    if soc not in RKNN_SOCS:
        return ["%s is an RKNN model (rknn-toolkit2 %s), but this board's SoC is %s, not a Rockchip NPU"
                % (what, toolkit, soc)]
    if not runtime_version:
        return ["%s needs librknnrt %s or later; no librknnrt was found on this board and "
                "edge_runtime_rknn_version is not set" % (what, toolkit)]
    want, have = parse_version(toolkit), parse_version(runtime_version) or (0,)
    if have[0] != want[0] or _cmp(have, want) < 0:
        return ["%s was converted with rknn-toolkit2 %s and needs librknnrt %s.x at %s or later, but this board "
                "has librknnrt %s" % (what, toolkit, want[0], toolkit, runtime_version)]
    return []


def pairing_problems(runtime_manifest, engine_manifest):
    formats = runtime_manifest.get("engine_formats") or []
    if engine_manifest.get("format") not in formats:
        return ["runtime %s %s loads engine formats %s, not %s (engine %s %s)" % (
            runtime_manifest.get("name"), runtime_manifest.get("version"), ", ".join(formats),
            engine_manifest.get("format"), engine_manifest.get("name"), engine_manifest.get("version"))]
    return []


# ------------------------------------------------------------------ the default release
# edge_runtime_runtime_src/engine_src "auto": the reference LLM runtime and its GGUF engine,
# chosen from the manifests the packager writes beside each tarball (<tarball>.manifest.json).
AUTO = "auto"
DEFAULT_RUNTIME = "llama-server"
SIDECAR = ".manifest.json"


def _sidecars(artifacts_dir):
    """[(manifest with its tarball's ``path``)] for each readable sidecar whose tarball exists."""
    try:
        names = sorted(os.listdir(artifacts_dir))
    except OSError as exc:
        raise ArtifactError("cannot list the artifacts directory %s: %s" % (artifacts_dir, exc.strerror)) from None
    found = []
    for name in names:
        if not name.endswith(".tar.gz" + SIDECAR):
            continue
        sidecar = os.path.join(artifacts_dir, name)
        try:
            with open(sidecar) as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue
        tarball = sidecar[:-len(SIDECAR)]
        if isinstance(manifest, dict) and os.path.isfile(tarball):
            found.append(dict(manifest, path=tarball))
    return found


def default_release(artifacts_dir, device, platform=None, unknown=()):
    """The runtime and engine that ``auto`` deploys: (runtime manifest, engine manifest), each with
    its tarball's ``path``.

    The runtime is the newest llama-server build in ``artifacts_dir`` that this device runs (its
    architecture and glibc, as ``device`` says: see compatibility_problems), the build for the
    newest glibc among equal versions. The engine is the newest GGUF engine that runtime loads and
    the board accepts; engines of more than one name are ambiguous and refused.
    """
    manifests = _sidecars(artifacts_dir)
    servers, refused = [], []
    for manifest in manifests:
        if manifest.get("kind") == "runtime" and manifest.get("name") == DEFAULT_RUNTIME:
            problems = compatibility_problems(manifest, device, platform, unknown)
            if problems:
                refused.append(problems[0])
            else:
                servers.append(manifest)
    if not servers:
        why = "; ".join(sorted(set(refused)))
        raise ArtifactError("no %s build in %s runs on this board (%s, glibc %s)%s. Build one with `make artifacts%s`, "
                            "or name the runtime tarball" % (
                                DEFAULT_RUNTIME, artifacts_dir, device.get("architecture") or "unknown",
                                device.get("glibc") or "unknown", ": " + why if why else "",
                                "" if device.get("architecture") in (None, detect_architecture())
                                else " ARCH=%s" % device["architecture"]))

    def glibc_wanted(manifest):
        spec = str(((manifest.get("compatibility") or {}).get("requires") or {}).get("glibc") or "")
        return parse_version(spec.lstrip("<>=!")) or (0,)

    server = max(servers, key=lambda m: (parse_version(m.get("version")) or (0,), glibc_wanted(m)))
    engines = [m for m in manifests if m.get("kind") == "engine" and m.get("format") in PORTABLE_ENGINE_FORMATS
               and not pairing_problems(server, m) and not compatibility_problems(m, device, platform, unknown)]
    names = sorted(set(str(m.get("name")) for m in engines))
    if not engines:
        raise ArtifactError("no GGUF engine in %s that %s %s loads on this board. Package one with "
                            "`make artifacts`, or name the engine tarball" % (
                                artifacts_dir, server.get("name"), server.get("version")))
    if len(names) > 1:
        raise ArtifactError("more than one GGUF engine in %s (%s): name the one to deploy" % (
            artifacts_dir, ", ".join(names)))
    engine = max(engines, key=lambda m: parse_version(m.get("version")) or (0,))
    return server, engine


# What ``auto`` cannot know on the controller (the device checks it after the copy: edge_release).
AUTO_UNKNOWN = ("python", "tensorrt", "rknn")


def release_device(facts):
    """What ``auto`` picks a release by (default_release's ``device``), from edge_facts' facts."""
    facts = facts or {}
    return {"soc": facts.get("soc"), "l4t": facts.get("l4t"), "bsp": facts.get("bsp"),
            "architecture": facts.get("architecture"), "glibc": facts.get("glibc")}


def controller_tarball(src, artifacts_dir):
    """Where a tarball named on the controller (edge_runtime_*_src, not auto) is: a path as given,
    a file name in ``artifacts_dir``."""
    return src if os.path.isabs(src) else os.path.join(artifacts_dir or ".", src)


def cached_sha256_file(path, cache_dir=None):
    """sha256_file(path), kept on the controller's disk by the file's path, inode, size and times (a
    byte written changes the times; a file put in its place, the inode): the audit of a fleet names the
    same tarballs for every device, each in a worker process of its own. Controller only."""
    cache_dir = controller_cache_dir("sha256") if cache_dir is None else cache_dir
    entry = None
    if cache_dir:
        info = os.stat(path)
        key = json.dumps([os.path.realpath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns,
                          info.st_ctime_ns])
        entry = os.path.join(cache_dir, hashlib.sha1(key.encode()).hexdigest() + ".json")
    return cached_json(entry, lambda: sha256_file(path))


def identity(path, kind, sha256=None):
    """What a tarball on the controller is, wherever the controller keeps it: {"name", "version",
    "sha256"}, the name and version from its manifest (the packager's sidecar where it describes this
    tarball, else the MANIFEST.json inside; None where neither can be read). ``sha256``: the tarball's,
    where the caller hashed it already. OSError where the tarball cannot be read."""
    sha256 = sha256 or cached_sha256_file(path)
    manifest = None
    try:
        with open(path + SIDECAR) as handle:
            manifest = json.load(handle)
        if not isinstance(manifest, dict) or (manifest.get("artifact") or {}).get("sha256") != sha256:
            manifest = None
    except (OSError, ValueError, AttributeError):
        manifest = None
    if manifest is None:
        try:
            manifest = checked_manifest(path, kind, sha256)
        except ArtifactError:
            manifest = {}
    return {"name": manifest.get("name"), "version": manifest.get("version"), "sha256": sha256}


# ------------------------------------------------------------------ detection on the device
TENSORRT_LIB_DIRS = ("/usr/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu/nvidia", "/usr/local/lib")
RKNN_LIBS = ("/usr/lib/librknnrt.so", "/usr/lib/aarch64-linux-gnu/librknnrt.so", "/usr/local/lib/librknnrt.so")


def detect_tensorrt(root="/"):
    """Installed TensorRT version from libnvinfer.so.X.Y.Z's file name, else None."""
    best = None
    for directory in TENSORRT_LIB_DIRS:
        full = os.path.join(root, directory.lstrip("/"))
        try:
            names = os.listdir(full)
        except OSError:
            continue
        for name in names:
            match = re.match(r"^libnvinfer\.so\.(\d+\.\d+\.\d+)$", name)
            if match and (best is None or parse_version(match.group(1)) > parse_version(best)):
                best = match.group(1)
    return best


def detect_glibc():
    """This system's glibc version ('2.36'), else None (another C library)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        text = ""
    if text.startswith("glibc "):
        return text.split()[1]
    name, version = _platform.libc_ver()
    return version if name == "glibc" and version else None


def detect_architecture():
    """The machine this runs on, as uname -m names it (x86_64, aarch64)."""
    return os.uname().machine


def detect_rknn(root="/"):
    """librknnrt's version from the string it embeds ('librknnrt version: 2.3.0 (...)'), else None."""
    for lib in RKNN_LIBS:
        full = os.path.join(root, lib.lstrip("/"))
        try:
            with open(full, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        match = re.search(rb"librknnrt version: ?(\d+\.\d+\.\d+\w*)", data)
        if match:
            return match.group(1).decode()
    return None
