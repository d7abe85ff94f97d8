"""Package the reference runtime and engine as deployable artifacts.

`edgetune-dev runtime package` writes, under
.cache/artifacts/ by default:

    edgetune-runtime-<version>.tar.gz            + .manifest.json beside it
    edgetune-engine-<name>-<version>.tar.gz      + .manifest.json beside it
    edgetune-llama-server-<version>-<distro>-<arch>.tar.gz   (one per twin distribution)
    edgetune-engine-smollm2-135m-instruct-q4_1-<version>.tar.gz   (the GGUF engine)

The last two are the LLM runtime and engine (tools/edgetune_dev/llm.py): llama.cpp's
llama-server built from source in a container of each target distribution and
cached by content hash, and the GGUF taken from a Python wheel.

Each tarball holds MANIFEST.json (schema in plugins/module_utils/device/edge_artifact.py);
the sidecar manifest is the same document plus the tarball's sha256 and size.
Tarballs are reproducible: sorted members, fixed owner and mtime, gzip
without a timestamp, so the same sources give the same sha256.

The engine is built here from a spec (runtime/engines/*.json): weights come
from a seeded xorshift stream, and the golden results the runtime checks at
warm-up are computed with exact fractions, independently of the runtime's
floating-point forward pass.
"""
import argparse
import base64
import gzip
import io
import json
import re
import sys
import tarfile
from fractions import Fraction
from pathlib import Path

from edgetune import outputs
from edgetune.errors import UsageError
from edgetune_runtime import engine as engine_mod

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_artifact as artifact

REPO = Path(__file__).resolve().parents[2]
RUNTIME_DIR = REPO / "runtime"
DEFAULT_SPEC = RUNTIME_DIR / "engines" / "mlp-small.json"
DEFAULT_OUT = REPO / ".cache" / "artifacts"
MTIME = 1735689600  # 2025-01-01T00:00:00Z: fixed, so tarballs are reproducible
RUNTIME_COMPAT = {
    "socs": ["tegra234", "rk3588"],
    # Tested on L4T r35 (JetPack 5, Python 3.8) and r36 (JetPack 6); r38 is untested.
    "l4t": ">=35.1,<37",
    "bsp": {"armbian": ">=23.0", "ubuntu": ">=20.04", "debian": ">=11"},
    "requires": {"python": ">=3.8"},
}


def runtime_version():
    text = (RUNTIME_DIR / "edgetune_runtime" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


# ------------------------------------------------------------------ engine
def generate_layers(spec):
    """Integer weights and biases, layer by layer, from the spec's seed."""
    stream = engine_mod.xorshift32(int(spec["seed"]))
    w_range, b_range = int(spec["weight_range"]), int(spec["bias_range"])
    layers, width = [], int(spec["input"]["size"])
    for layer in spec["layers"]:
        n_out = int(layer["out"])
        weights = [[next(stream) % (2 * w_range + 1) - w_range for _ in range(width)] for _ in range(n_out)]
        bias = [next(stream) % (2 * b_range + 1) - b_range for _ in range(n_out)]
        layers.append({"in": width, "out": n_out, "activation": layer.get("activation", "none"),
                       "weights": weights, "bias": bias})
        width = n_out
    return layers


def exact_logits(spec, layers, sample):
    """The forward pass in exact fractions: the reference the runtime's floats must equal."""
    scale_w, scale_b = Fraction(1, int(spec["weight_scale"])), Fraction(1, int(spec["bias_scale"]))
    x = [Fraction(v, int(spec["input"]["scale"])) for v in engine_mod.sample_ints(sample, int(spec["input"]["size"]))]
    for layer in layers:
        y = [sum((Fraction(w) * xi for w, xi in zip(row, x)), Fraction(0)) * scale_w + b * scale_b
             for row, b in zip(layer["weights"], layer["bias"])]
        x = [v if v > 0 else Fraction(0) for v in y] if layer["activation"] == "relu" else y
    return x


def _b64_signed(values):
    return base64.b64encode(bytes(v & 0xFF for v in values)).decode("ascii")


def build_engine_document(spec, version=None):
    layers = generate_layers(spec)
    golden = []
    for sample in spec.get("golden_samples", [0]):
        logits = exact_logits(spec, layers, sample)
        floats = [float(v) for v in logits]
        if any(Fraction(f) != v for f, v in zip(floats, logits)):
            raise UsageError("engine spec %s: logits are not exact in double precision; "
                             "lower the ranges or raise the scales" % spec["name"])
        best = max(range(len(floats)), key=lambda i: (floats[i], -i))
        golden.append({"sample": sample, "logits": floats, "class": best})
    return {
        "format": engine_mod.FORMAT,
        "name": spec["name"],
        "version": version or spec["version"],
        "description": spec.get("description", ""),
        "input": {"size": int(spec["input"]["size"]), "scale": int(spec["input"]["scale"])},
        "layers": [{"in": layer["in"], "out": layer["out"], "activation": layer["activation"],
                    "weight_scale": int(spec["weight_scale"]), "bias_scale": int(spec["bias_scale"]),
                    "weights": _b64_signed(v for row in layer["weights"] for v in row),
                    "bias": _b64_signed(layer["bias"])} for layer in layers],
        "labels": list(spec["labels"]),
        "golden": golden,
    }


# ------------------------------------------------------------------ tarballs
def write_tarball(path, files, compresslevel=9):
    """files: {relative name: (bytes, mode)} -> a reproducible .tar.gz; returns its sha256."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        dirs = sorted({"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)})
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            _fix(info)
            tar.addfile(info)
        for name in sorted(files):
            data, mode = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            _fix(info)
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=compresslevel) as gz:
        gz.write(raw.getvalue())
    data = out.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return artifact.sha256_bytes(data), len(data)


def _fix(info):
    info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "root", "root"


def package(manifest, files, out_dir, stem, compresslevel=9):
    """Write <stem>.tar.gz (with MANIFEST.json) and <stem>.tar.gz.manifest.json; returns the sidecar dict.
    ``compresslevel``: 1 for content that hardly compresses (quantized weights)."""
    manifest = dict(manifest)
    manifest["schema"] = artifact.SCHEMA
    manifest["files"] = {name: artifact.sha256_bytes(data) for name, (data, _) in files.items()}
    problems = artifact.validate_manifest(manifest)
    if problems:
        raise UsageError("refusing to package %s: %s" % (stem, "; ".join(problems)))
    content = dict(files)
    content[artifact.MANIFEST_NAME] = (json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n", 0o644)
    tarball = Path(out_dir) / (stem + ".tar.gz")
    try:
        sha, size = write_tarball(tarball, content, compresslevel)
        sidecar = dict(manifest, artifact={"file": tarball.name, "sha256": sha, "size": size})
        Path(str(tarball) + ".manifest.json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise UsageError("%s was not written: %s" % (tarball, outputs.reason(exc))) from None
    return dict(sidecar, path=str(tarball))


def package_engine(out_dir=DEFAULT_OUT, spec_path=DEFAULT_SPEC, version=None, compatibility=None, document=None,
                   fmt=None):
    """Build and package an engine. ``document`` replaces the built model (tests use it for bad engines);
    ``compatibility`` and ``fmt`` replace the spec's declarations."""
    spec = json.loads(Path(spec_path).read_text())
    document = document if document is not None else build_engine_document(spec, version)
    version = version or spec["version"]
    manifest = {"kind": "engine", "name": spec["name"], "version": version, "entry": "model.json",
                "format": fmt or engine_mod.FORMAT,
                "compatibility": compatibility if compatibility is not None else spec["compatibility"],
                "description": spec.get("description", "")}
    files = {"model.json": (json.dumps(document, separators=(",", ":"), sort_keys=True).encode() + b"\n", 0o644)}
    return package(manifest, files, out_dir, "edgetune-engine-%s-%s" % (spec["name"], version))


def package_runtime(out_dir=DEFAULT_OUT, version=None, compatibility=None):
    version = version or runtime_version()
    files = {}
    for path in sorted(RUNTIME_DIR.rglob("*")):
        rel = path.relative_to(RUNTIME_DIR).as_posix()
        if not path.is_file() or "__pycache__" in rel or rel.startswith("engines/") or rel.endswith(".pyc"):
            continue
        data = path.read_bytes()
        if rel == "edgetune_runtime/__init__.py" and version != runtime_version():
            data = re.sub(rb'__version__ = "[^"]+"', b'__version__ = "' + version.encode() + b'"', data)
        files[rel] = (data, 0o755 if path.stat().st_mode & 0o111 else 0o644)
    manifest = {"kind": "runtime", "name": "edgetune-runtime", "version": version, "entry": "edgetune-runtime",
                "engine_formats": [engine_mod.FORMAT],
                "compatibility": compatibility if compatibility is not None else RUNTIME_COMPAT,
                "description": "edgetune reference runtime: stdlib-only HTTP inference server (runtime/README.md)"}
    return package(manifest, files, out_dir, "edgetune-runtime-%s" % version)


# ------------------------------------------------------------------ CLI
def cmd_package(args):
    outputs.check(directories=[("--out", args.out)])
    out = Path(args.out)
    results = []
    if args.what in ("all", "runtime"):
        results.append(package_runtime(out, args.runtime_version))
    if args.what in ("all", "engine"):
        if not Path(args.engine_spec).is_file():
            raise UsageError("no engine spec at %s" % args.engine_spec)
        results.append(package_engine(out, args.engine_spec, args.engine_version))
    if args.what in ("all", "llm"):
        from edgetune_dev import llm
        distros = [d.strip() for d in args.distro.split(",") if d.strip()] if args.distro else None
        results += llm.package_llm(out, args.arch or None, distros)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for item in results:
            print("%-8s %-26s %-15s sha256 %s  %s" % (item["kind"], item["name"], item["version"],
                                                      item["artifact"]["sha256"], item["path"]))
    return 0


def add_parser(subparsers):
    runtime = subparsers.add_parser("runtime", help="the reference inference runtime and its engine")
    sub = runtime.add_subparsers(dest="runtime_command", required=True)
    p = sub.add_parser("package", help="build the runtime and engine tarballs with manifests")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    p.add_argument("--what", choices=["all", "runtime", "engine", "llm"], default="all",
                   help="llm: llama-server (built per distribution, cached) and the GGUF engine")
    p.add_argument("--arch", default="", help="llama-server's target machine: x86_64 or aarch64 "
                   "(cross-compiled; default: this machine's)")
    p.add_argument("--distro", default="", help="comma-separated Debian codenames to build llama-server for "
                   "(default: the twins' oldest, whose build runs on all of them)")
    p.add_argument("--runtime-version", help="version to stamp on the runtime (default: runtime/edgetune_runtime)")
    p.add_argument("--engine-spec", default=str(DEFAULT_SPEC))
    p.add_argument("--engine-version", help="version to stamp on the engine (default: the spec's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_package)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="edgetune-dev runtime package", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["runtime", "package"] + list(sys.argv[1:] if argv is None else argv))
    try:
        return args.func(args)
    except UsageError as exc:
        print("edgetune-dev: error: %s" % exc, file=sys.stderr)
        return 2
