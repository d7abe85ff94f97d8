"""`edgetune-dev ee`: the execution environment of extras/awx, built and tested here (`make ee`).

build: ansible-builder 3 (the venv's) builds extras/awx/execution-environment.yml with Docker into
``edgetune-ee:<collection version>``, from a copy of extras/awx under .cache/ee/awx holding

* the collection tarball and the CLI's wheel, both built from this checkout (the wheel from a copy
  of cli/, a path: nothing is resolved on an index under the name of the CLI);
* every other wheel the image installs, built on this host by the venv's pip with the checkout's
  pins (requirements.txt) and cached by the list's hash (.cache/ee/wheelhouse/): the image build
  itself reaches no Python index (--build-arg PIP_NO_INDEX=1; the definition makes wheelhouse/
  pip's find-links in every stage);

on a local Debian base, never pulled: a debootstrap root made by the twins' own image builder
(minbase + python3, python3-pip and python3-venv), with a dnf shim over apt-get on top (base/):
ansible-builder's scripts speak dnf. Both are tagged by the hash of
what they are made of and reused. The system packages bindep asks for (the SSH client, systemd for
systemd-analyze) are installed through the shim from the Debian mirror the root came from. The
image is built again only when its inputs changed (.cache/ee/image.json; the collection tarball by
its files, as ansible-galaxy stamps each build with its time).

test: pytest on tests/ee (the image runs site.yml and `edgetune audit` with ansible-navigator
against a twin reached over SSH), with ansible-navigator from a venv of its own (.cache/ee/venv,
pinned in requirements-ee.txt).
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

from edgetune.errors import UsageError
from edgetune_dev import CHECKOUT, host_packages
from edgetune_dev.twin import inotify, manager

HERE = Path(__file__).resolve().parent
CACHE = CHECKOUT / ".cache" / "ee"
DEFINITION = CHECKOUT / "extras" / "awx"
DISTRO = "bookworm"
# The base's Debian packages: Python (3.11 on bookworm), pip (Debian disables ensurepip for its
# system Python: the definition skips ansible-builder's step that runs it) and the venv module
# (ansible-builder's assemble makes a venv). The rest comes through bindep and the shim.
ROOT_PACKAGES = ["python3", "python3-pip", "python3-venv"]
# What ansible-builder's builder stage pip-installs for itself.
BUILDER_PACKAGES = ["bindep", "pyyaml", "packaging"]
NAVIGATOR_REQUIREMENTS = CHECKOUT / "requirements-ee.txt"
NAVIGATOR_VENV = CACHE / "venv"
TESTS = CHECKOUT / "tests" / "ee"
BIN = Path(sys.executable).parent
LOG_LINES = 15


def say(message):
    print("edgetune: " + message, file=sys.stderr, flush=True)


def digest(*parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def tail(text, lines=3):
    return " | ".join(text.strip().splitlines()[-lines:])


def check(argv, what, **kwargs):
    result = manager.run([str(a) for a in argv], **kwargs)
    if result.returncode != 0:
        raise UsageError("%s failed (exit %d): %s" % (what, result.returncode,
                                                       tail((result.stdout or "") + (result.stderr or ""))))
    return result


def version():
    return str(yaml.safe_load((CHECKOUT / "galaxy.yml").read_text())["version"])


def image_tag():
    return "edgetune-ee:%s" % version()


def image_id(tag):
    result = manager.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag])
    return result.stdout.strip() if result.returncode == 0 else None


# ---------------------------------------------------------------- the base image
def ensure_base(say=say):
    """The local Debian base (root + dnf shim), built when missing; returns its tag."""
    manager.ensure_engine(say)
    root = "edgetune/ee-root:%s-%s" % (DISTRO, digest(json.dumps(ROOT_PACKAGES)))
    if not manager.image_exists(root):
        host_packages.require(manager.IMAGE_BUILD_PACKAGES, say)
        manager.debootstrap_image(DISTRO, root, ROOT_PACKAGES, say, note="about a minute")
    files = [f.name.encode() + f.read_bytes() for f in sorted((HERE / "base").iterdir())]
    tag = "edgetune/ee-base:%s-%s" % (DISTRO, digest(image_id(root), *files))
    if not manager.image_exists(tag):
        say("building %s: the dnf shim on %s" % (tag, root))
        check(["docker", "build", "-q", "--build-arg", "ROOT=" + root, "-t", tag, HERE / "base"],
              "docker build of " + tag)
    return tag


# ---------------------------------------------------------------- the build context
def build_collection(dest):
    check([BIN / "ansible-galaxy", "collection", "build", "--force", "--output-path", dest, CHECKOUT],
          "ansible-galaxy collection build", cwd=str(CHECKOUT))
    tarballs = sorted(Path(dest).glob("edgetune-fleet-*.tar.gz"))
    if len(tarballs) != 1:
        raise UsageError("ansible-galaxy collection build left %d tarballs in %s" % (len(tarballs), dest))
    return tarballs[0]


def tarball_content(path):
    """A digest of a tarball's members (names, modes, contents), not of its bytes: ansible-galaxy
    writes the build time into each one."""
    h = hashlib.sha256()
    with tarfile.open(path) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            h.update(("%s\0%o\0%s\0" % (member.name, member.mode, member.type.decode())).encode())
            if member.isfile():
                h.update(hashlib.sha256(tar.extractfile(member).read()).digest())
    return h.hexdigest()


def stable_collection(dest):
    """The collection tarball in dest: the one built last time (.cache/ee/collection/) where the new one
    holds the same files, so that an unchanged collection is an unchanged build input (and Docker's
    layer cache holds)."""
    kept = CACHE / "collection"
    built = build_collection(dest)
    previous = kept / built.name
    if previous.exists() and tarball_content(previous) == tarball_content(built):
        shutil.copy2(previous, built)
    else:
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        shutil.copy2(built, previous)
    return built


def build_cli_wheel(dest):
    """The CLI's wheel from a copy of cli/ (pip builds in the source tree: the checkout's stays as it is),
    offline, with the venv's setuptools and wheel; timestamps fixed, so that the same sources give the
    same wheel (and Docker's layer cache holds)."""
    source = CACHE / "src" / "cli"
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(CHECKOUT / "cli", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc"))
    env = dict(os.environ, SOURCE_DATE_EPOCH="315532800")
    check([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "-w", dest, source], "pip wheel ./cli", env=env)
    wheels = sorted(Path(dest).glob("edgetune-*.whl"))
    if len(wheels) != 1:
        raise UsageError("pip wheel ./cli left %d wheels in %s" % (len(wheels), dest))
    return wheels[0]


def definition(work):
    from ansible_builder.user_definition import UserDefinition
    ee = UserDefinition(str(work / "execution-environment.yml"))
    ee.validate()
    return ee


def requirement_lines(text):
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def image_requirements(work, tarball):
    """Every Python requirement the image build installs: the definition's ansible-core and
    ansible-runner, what ansible-builder's introspection makes of the collection's EE needs and the
    definition's requirements.txt (run here on the tarball, as the builder stage will), the builder
    stage's own tools and the container's init."""
    import ansible_builder
    ee = definition(work)
    wanted = (ee.ansible_ref_install_list or "").split() + list(BUILDER_PACKAGES)
    init = (ee.container_init or {}).get("package_pip")
    if init:
        wanted.append(init)
    introspect = Path(ansible_builder.__file__).parent / "_target_scripts" / "introspect.py"
    with tempfile.TemporaryDirectory(prefix="edgetune-ee-") as tmp:
        check([BIN / "ansible-galaxy", "collection", "install", "--no-deps", "--force", "-p", tmp, tarball],
              "ansible-galaxy collection install (introspection)", cwd=tmp)
        out = Path(tmp) / "requirements.txt"
        check([sys.executable, introspect, "introspect", tmp, "--user-pip", work / "requirements.txt",
               "--write-pip", out, "--write-bindep", Path(tmp) / "bindep.txt"], "ansible-builder introspect")
        wanted += requirement_lines(out.read_text())
    return sorted(set(wanted))


def pins():
    """The checkout's pinned versions (requirements.txt) as pip constraints: name==version, no extras."""
    found = []
    for line in requirement_lines((CHECKOUT / "requirements.txt").read_text()):
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(==\s*\S+)$", line)
        if match:
            found.append(match.group(1) + match.group(3).replace(" ", ""))
    return "\n".join(sorted(found)) + "\n"


def wheelhouse(requirements, say=say):
    """Wheels of every requirement and its dependencies, built by this host's pip (its index and
    settings, none written anywhere) with the checkout's pins; cached by what it is made of."""
    constraints = pins()
    key = digest(json.dumps(requirements), constraints, sys.version)
    root = CACHE / "wheelhouse"
    dest = root / key
    if (dest / ".complete").exists():
        return dest
    shutil.rmtree(root, ignore_errors=True)
    partial = root / (key + ".partial")
    partial.mkdir(parents=True)
    constraints_file = root / "constraints.txt"
    constraints_file.write_text(constraints)
    say("building the image's %d Python requirements and their dependencies as wheels on this host (pip wheel)"
        % len(requirements))
    check([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w", partial,
           "-c", constraints_file, *requirements], "pip wheel of the image's requirements")
    (partial / ".complete").write_text("\n".join(requirements) + "\n")
    partial.rename(dest)
    return dest


def stage(say=say):
    """.cache/ee/awx: extras/awx with the collection tarball, the CLI's wheel and the wheelhouse."""
    work = CACHE / "awx"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(DEFINITION, work, ignore=shutil.ignore_patterns("context", "*.tar.gz", "*.whl"))
    tarball = stable_collection(work / "collections")
    build_cli_wheel(work / "wheels")
    house = wheelhouse(image_requirements(work, tarball), say)
    for wheel in sorted(house.glob("*.whl")):
        os.link(wheel, work / "wheelhouse" / wheel.name)
    return work


def inputs_digest(work, base):
    h = hashlib.sha256((base + "\0" + (image_id(base) or "")).encode())
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(work)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


# ---------------------------------------------------------------- build
def image_size_mb(tag):
    result = manager.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag])
    return int(result.stdout.strip()) / 1e6 if result.returncode == 0 else 0.0


def ansible_builder_build(work, base, tag, say=say):
    """ansible-builder build; Docker's steps shown as they start, everything in .cache/ee/build.log."""
    context = CACHE / "context"
    shutil.rmtree(context, ignore_errors=True)
    argv = [BIN / "ansible-builder", "build", "-f", work / "execution-environment.yml", "-c", context,
            "-t", tag, "--container-runtime", "docker", "-v", "3",
            "--build-arg", "EE_BASE_IMAGE=" + base, "--build-arg", "PIP_NO_INDEX=1"]
    log_path = CACHE / "build.log"
    say("ansible-builder build of %s on %s (log %s)" % (tag, base, log_path))
    last = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=str(work), env=dict(os.environ, TERM="dumb"))
        for line in proc.stdout:
            log.write(line)
            last = (last + [line.rstrip()])[-LOG_LINES:]
            step = re.match(r"^(?:\S+ )?(Step \d+/\d+ : .*)$", line.strip())
            if step:
                say("  " + step.group(1)[:150])
        proc.wait()
    if proc.returncode != 0:
        print("\n".join(last), file=sys.stderr)
        raise UsageError("ansible-builder build of %s failed (exit %d); its output is in %s"
                         % (tag, proc.returncode, log_path))


def build(say=say, force=False):
    """The image edgetune-ee:<version>, built unless the one there was built from the same inputs."""
    base = ensure_base(say)
    work = stage(say)
    tag = image_tag()
    inputs = inputs_digest(work, base)
    stamp = CACHE / "image.json"
    try:
        built = json.loads(stamp.read_text())
    except (OSError, ValueError):
        built = {}
    if not force and built.get("inputs") == inputs and built.get("id") and built.get("id") == image_id(tag):
        say("%s is up to date (built from the same base, collection, wheels and definition)" % tag)
        return tag, False
    ansible_builder_build(work, base, tag, say)
    stamp.write_text(json.dumps({"tag": tag, "id": image_id(tag), "base": base, "inputs": inputs}, indent=2) + "\n")
    return tag, True


# ---------------------------------------------------------------- the test's pieces
def ensure_navigator(say=say):
    """ansible-navigator in a venv of its own (requirements-ee.txt), not the checkout's."""
    want = digest(NAVIGATOR_REQUIREMENTS.read_bytes(), sys.version)
    navigator = NAVIGATOR_VENV / "bin" / "ansible-navigator"
    stamp = NAVIGATOR_VENV / ".installed"
    if navigator.exists() and stamp.exists() and stamp.read_text() == want:
        return navigator
    say("installing ansible-navigator into %s (requirements-ee.txt)" % NAVIGATOR_VENV)
    shutil.rmtree(NAVIGATOR_VENV, ignore_errors=True)
    check([getattr(sys, "_base_executable", sys.executable), "-m", "venv", NAVIGATOR_VENV], "python -m venv")
    check([NAVIGATOR_VENV / "bin" / "pip", "install", "-q", "--disable-pip-version-check",
           "-r", NAVIGATOR_REQUIREMENTS], "pip install -r requirements-ee.txt")
    stamp.write_text(want)
    return navigator


def ssh_twin_image(distro, say=say):
    """The twin image of ``distro`` with Debian's openssh-server (twin_ssh/Dockerfile), tagged by the
    twin image it is made from."""
    manager.ensure_images([distro], say)
    twin = "edgetune/twin:%s" % distro
    dockerfile = HERE / "twin_ssh" / "Dockerfile"
    tag = "edgetune/twin-ssh:%s-%s" % (distro, digest(image_id(twin), dockerfile.read_bytes()))
    if not manager.image_exists(tag):
        say("building %s: %s with openssh-server" % (tag, twin))
        check(["docker", "build", "-q", "--build-arg", "TWIN=" + twin, "-t", tag, dockerfile.parent],
              "docker build of " + tag)
    return tag


def start_ssh_twin(name, board_name, network, say=say):
    """A twin as `edgetune-dev twin create` makes it, but on ``network`` (a Docker network the caller
    made) instead of none, running sshd; returns when it has booted."""
    spec = manager.board(board_name)
    image = ssh_twin_image(spec["distro"], say)
    running = [twin["name"] for twin in manager.twins() if twin["running"]]
    inotify.ensure_limits(len(running) + 1, say, sample_twin=running[0] if running else None)
    options = list(manager.RUN_OPTIONS)
    options[options.index("--network") + 1] = network
    argv = ["docker", "run", "-d", "--name", name, "--hostname", name,
            "--label", "%s=%s" % (manager.LABEL, board_name), "-e", "EDGETUNE_TWIN_BOARD=" + spec["name"],
            *options, *manager.kernel_header_mounts()]
    rt_options = manager.rt_runtime_options(name, say)
    result = manager.run(argv + rt_options + [image])
    if result.returncode != 0 and rt_options and "rt_runtime" in result.stderr:
        manager.remove(name)
        result = manager.run(argv + [image])
    if result.returncode != 0:
        raise UsageError("cannot start twin %s: %s" % (name, result.stderr.strip()))
    manager.wait_booted(name)
    return name


# ---------------------------------------------------------------- commands
def cmd_build(args):
    started = time.time()
    tag, built = build(say, force=args.force)
    say("%s %s (%.0f MB) in %.0f s" % ("built" if built else "reused", tag, image_size_mb(tag), time.time() - started))
    print(tag)
    return 0


def cmd_test(args):
    tag = image_tag()
    if not manager.image_exists(tag):
        raise UsageError("no image %s here: build it first (`edgetune-dev ee build`, or `make ee`)" % tag)
    navigator = ensure_navigator(say)
    env = dict(os.environ, EDGETUNE_EE_IMAGE=tag, EDGETUNE_EE_NAVIGATOR=str(navigator))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", str(TESTS.relative_to(CHECKOUT))] + args.pytest_args,
                          cwd=str(CHECKOUT), env=env, check=False).returncode


def add_parser(subparsers):
    ee = subparsers.add_parser("ee", help="the execution environment (extras/awx): build it, test it (make ee)")
    sub = ee.add_subparsers(dest="ee_command", required=True)
    p = sub.add_parser("build", help="build edgetune-ee:<version> with ansible-builder on a local Debian base")
    p.add_argument("--force", action="store_true", help="run ansible-builder even if the inputs are unchanged")
    p.set_defaults(func=cmd_build)
    p = sub.add_parser("test", help="run tests/ee: site.yml and `edgetune audit` from the image with ansible-navigator")
    p.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    p.set_defaults(func=cmd_test)
