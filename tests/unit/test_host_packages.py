"""Host packages (tools/edgetune_dev/host_packages.py): every apt run of the tools is serial and once.

A fake apt-get on PATH records each run with its start and end and fails, as
apt does, when a second one starts while one runs; its `install` puts the
package's fake commands (docker, dockerd, debootstrap) on PATH. The twin image
entry point then runs for real with its two parallel builders.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edgetune_dev import cli
from edgetune_dev import host_packages, kernel_headers
from edgetune.errors import UsageError
from edgetune_dev.twin import manager
from edgetune_dev.vm import image

# The tools' apt runs on the development host: not device code, not run under Python 3.8.
pytestmark = pytest.mark.controller

FAKE_APT = r'''#!{python}
import json, os, sys, time
state = os.environ["FAKE_APT_STATE"]
started = time.monotonic()
record = {"argv": sys.argv[1:], "start": started}
try:
    busy = os.open(os.path.join(state, "busy"), os.O_CREAT | os.O_EXCL)
except FileExistsError:
    record.update(concurrent=True, end=time.monotonic())
    with open(os.path.join(state, "apt.jsonl"), "a") as log:
        log.write(json.dumps(record) + "\n")
    sys.stderr.write("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)\n"
                     "E: Unable to acquire the dpkg frontend lock, is another process using it?\n")
    sys.exit(100)
words, skip = [], False
for arg in sys.argv[1:]:
    if skip or arg.startswith("-"):
        skip = arg == "-o"
        continue
    words.append(arg)
time.sleep(0.4)
code = 0
if words[0] == "update" and os.environ.get("FAKE_APT_UPDATE_FAILS"):
    sys.stderr.write("W: Some index files failed to download.\n"
                     "E: Failed to fetch http://apt-mirror.test/debian/dists/bookworm/InRelease  "
                     "Temporary failure resolving 'apt-mirror.test'\n")
    code = 100
elif words[0] == "install":
    provides = json.loads(os.environ["FAKE_APT_PROVIDES"])
    for package in words[1:]:
        for command in provides.get(package, []):
            os.symlink(os.path.join(state, "pool", command), os.path.join(state, "bin", command))
        with open(os.path.join(state, "dpkg-installed"), "a") as installed:
            installed.write(package + "\n")
os.close(busy)
os.unlink(os.path.join(state, "busy"))
record["end"] = time.monotonic()
with open(os.path.join(state, "apt.jsonl"), "a") as log:
    log.write(json.dumps(record) + "\n")
sys.exit(code)
'''

FAKE_DPKG_QUERY = r'''#!{python}
import os, sys
path = os.path.join(os.environ["FAKE_APT_STATE"], "dpkg-installed")
installed = open(path).read().split() if os.path.exists(path) else []
if sys.argv[-1] in installed:
    sys.stdout.write("install ok installed")
    sys.exit(0)
sys.stderr.write("dpkg-query: no packages found matching %s\n" % sys.argv[-1])
sys.exit(1)
'''

# What the packages install: the commands the image build runs.
FAKE_DOCKER = r'''#!{python}
import os, sys
state = os.environ["FAKE_APT_STATE"]
command = sys.argv[1:3]
if command[:1] == ["info"]:
    sys.exit(0 if os.path.exists(os.path.join(state, "dockerd-started")) else 1)
if command == ["image", "inspect"]:
    sys.exit(1)  # no image yet: a fresh machine
if command[:1] == ["import"]:
    sys.stdin.buffer.read()
sys.exit(0)
'''
FAKE_DOCKERD = r'''#!{python}
import os
open(os.path.join(os.environ["FAKE_APT_STATE"], "dockerd-started"), "w").close()
'''
FAKE_DEBOOTSTRAP = r'''#!{python}
import json, os, sys, time
started = time.monotonic()
time.sleep(1)
with open(os.path.join(os.environ["FAKE_APT_STATE"], "builders.jsonl"), "a") as log:
    log.write(json.dumps({"distro": sys.argv[-3], "start": started, "end": time.monotonic()}) + "\n")
'''
TOOLS = Path(__file__).resolve().parents[2] / "tools"
PROVIDES = {"docker.io": ["docker", "dockerd"], "debootstrap": ["debootstrap"]}


def write_script(path, text):
    path.write_text(text.replace("{python}", sys.executable))
    path.chmod(0o755)


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch):
    """PATH with only the fake apt-get, dpkg-query and tar: no Docker, no debootstrap."""
    state, bin_dir, pool = tmp_path, tmp_path / "bin", tmp_path / "pool"
    bin_dir.mkdir()
    pool.mkdir()
    write_script(bin_dir / "apt-get", FAKE_APT)
    write_script(bin_dir / "dpkg-query", FAKE_DPKG_QUERY)
    os.symlink(shutil.which("tar"), str(bin_dir / "tar"))
    for name, text in (("docker", FAKE_DOCKER), ("dockerd", FAKE_DOCKERD), ("debootstrap", FAKE_DEBOOTSTRAP)):
        write_script(pool / name, text)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_APT_STATE", str(state))
    monkeypatch.setenv("FAKE_APT_PROVIDES", json.dumps(PROVIDES))
    monkeypatch.setattr(host_packages, "is_debian_root", lambda: True)
    monkeypatch.setattr(host_packages, "LOCK_FILE", str(state / "edgetune-apt.lock"))
    monkeypatch.setattr(manager, "DOCKERD_LOG", str(state / "dockerd.log"))
    monkeypatch.setattr(manager, "apt_mirror", lambda distro_hint="debian": "http://apt-mirror.test/debian")
    # No headers for the running kernel; the files the headers package would unpack.
    monkeypatch.setattr(kernel_headers, "MODULES_DIR", state / "modules")
    monkeypatch.setattr(kernel_headers, "SOURCES_DIR", state / "src")
    monkeypatch.setattr(kernel_headers.platform, "machine", lambda: "x86_64")
    for unpacked in ("linux-headers-6.1.0-9-amd64", "linux-headers-6.1.0-10-amd64",
                     "linux-headers-6.1.0-10-common"):
        (state / "src" / unpacked).mkdir(parents=True)
    return state


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def apt_runs(state):
    return [(r["argv"][2], [a for a in r["argv"][3:] if not a.startswith("-")]) for r in records(state / "apt.jsonl")]


def assert_serial(runs):
    assert not [r for r in runs if r.get("concurrent")], runs
    for before, after in zip(runs, runs[1:]):
        assert before["end"] <= after["start"], (before, after)


def test_image_build_installs_once_serially_before_its_parallel_builders(fresh_machine):
    said = []
    tags = manager.ensure_images(["bullseye", "bookworm", "bookworm"], said.append)
    assert tags == ["edgetune/twin:bookworm", "edgetune/twin:bullseye"]
    # One apt run for everything the build and the twins need, on a machine that had neither Docker,
    # debootstrap nor the running kernel's headers (which bcc in the twins compiles against).
    assert apt_runs(fresh_machine) == [("update", []), ("install", ["debootstrap", "docker.io", "linux-headers-amd64"])]
    assert said[0] == "installing Debian's debootstrap docker.io linux-headers-amd64"
    modules = kernel_headers.modules_dir()
    assert os.readlink(str(modules / "build")) == str(fresh_machine / "src/linux-headers-6.1.0-10-amd64")
    assert os.readlink(str(modules / "source")) == str(fresh_machine / "src/linux-headers-6.1.0-10-common")
    assert manager.kernel_header_mounts() == [
        "-v", "%s:%s:ro" % (modules, modules),
        "-v", "%s/src/linux-headers-6.1.0-10-amd64:%s/src/linux-headers-6.1.0-10-amd64:ro" % ((fresh_machine,) * 2),
        "-v", "%s/src/linux-headers-6.1.0-10-common:%s/src/linux-headers-6.1.0-10-common:ro" % ((fresh_machine,) * 2)]
    runs = records(fresh_machine / "apt.jsonl")
    assert_serial(runs)
    builders = records(fresh_machine / "builders.jsonl")
    assert sorted(b["distro"] for b in builders) == ["bookworm", "bullseye"]
    # The builders ran in parallel, and only after the install had ended.
    assert max(b["start"] for b in builders) < min(b["end"] for b in builders)
    assert runs[-1]["end"] <= min(b["start"] for b in builders)
    # A second run installs nothing.
    manager.ensure_images(["bookworm", "bullseye"], said.append)
    assert len(records(fresh_machine / "apt.jsonl")) == 2


def test_two_threads_asking_for_one_package_install_it_once(fresh_machine):
    errors = []

    def builder():
        try:
            host_packages.require(manager.IMAGE_BUILD_PACKAGES, say=lambda message: None)
        except UsageError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=builder) for _twice in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert apt_runs(fresh_machine) == [("update", []), ("install", ["debootstrap"])]
    assert_serial(records(fresh_machine / "apt.jsonl"))


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/etc/debian_version"),
                    reason="the helper installs only on Debian as root")
def test_two_processes_run_apt_one_after_the_other(fresh_machine):
    """As when make test runs the VM scenario beside the rest: the lock file (the real one,
    host_packages.LOCK_FILE) keeps two edgetune processes' apt runs apart."""
    env = dict(os.environ, PYTHONPATH=str(TOOLS))
    helpers = [subprocess.Popen([sys.executable, "-m", "edgetune_dev.host_packages", "python3-pyroute2"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _twice in range(2)]
    outputs = sorted(helper.communicate(timeout=120)[0] for helper in helpers)
    assert [helper.returncode for helper in helpers] == [0, 0], outputs
    assert outputs == ["already installed: python3-pyroute2\n", "installing Debian's python3-pyroute2\n"]
    assert apt_runs(fresh_machine) == [("update", []), ("install", ["python3-pyroute2"])]
    assert_serial(records(fresh_machine / "apt.jsonl"))


def test_the_fake_apt_catches_two_runs_at_once_and_its_message_is_shown(fresh_machine):
    """Counter-test: without the helper's lock, two apt runs meet, and the error is apt's own words."""
    failures = []

    def unlocked_update():
        try:
            host_packages.apt_get("update", "-qq")
        except UsageError as exc:
            failures.append(str(exc))

    threads = [threading.Thread(target=unlocked_update) for _twice in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == ["apt-get update failed (exit 100): E: Could not get lock /var/lib/dpkg/lock-frontend. "
                        "It is held by process 4242 (apt-get) | E: Unable to acquire the dpkg frontend lock, "
                        "is another process using it?"]


def test_a_failing_apt_is_one_line_with_apts_own_words(fresh_machine, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_APT_UPDATE_FAILS", "1")
    assert cli.main(["twin", "images"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["edgetune: installing Debian's debootstrap docker.io linux-headers-amd64",
                   "edgetune-dev: error: apt-get update failed (exit 100): W: Some index files failed to download. | "
                   "E: Failed to fetch http://apt-mirror.test/debian/dists/bookworm/InRelease  Temporary failure "
                   "resolving 'apt-mirror.test'"]


def test_vm_image_build_installs_its_host_tools_in_one_run(fresh_machine, monkeypatch, tmp_path):
    class Stop(Exception):
        pass

    def stop_after_install():
        raise Stop()

    monkeypatch.setitem(image.BUILD_PACKAGES, "syslinux-common", [str(tmp_path / "mbr.bin")])
    monkeypatch.setattr(image, "require_loop", stop_after_install)
    with pytest.raises(Stop):
        image.build(say=lambda message: None, force=True)
    assert apt_runs(fresh_machine) == [("update", []), ("install", [
        "debootstrap", "e2fsprogs", "extlinux", "mount", "openssh-client", "qemu-system-x86", "qemu-utils",
        "syslinux-common"])]


def test_packages_without_a_command_are_asked_of_dpkg(fresh_machine, capsys):
    (fresh_machine / "dpkg-installed").write_text("iproute2\n")
    assert host_packages.main(["python3-pyroute2", "iproute2"]) == 0
    assert capsys.readouterr().out == "installing Debian's python3-pyroute2\nalready installed: iproute2\n"
    assert apt_runs(fresh_machine)[-1] == ("install", ["python3-pyroute2"])
    assert host_packages.main(["python3-pyroute2", "iproute2"]) == 0
    assert capsys.readouterr().out == "already installed: iproute2 python3-pyroute2\n"
    assert len(apt_runs(fresh_machine)) == 2


def test_without_root_the_missing_packages_are_named(fresh_machine, monkeypatch):
    monkeypatch.setattr(host_packages, "is_debian_root", lambda: False)
    with pytest.raises(UsageError, match=r"^missing host packages debootstrap: install them "
                                         r"\(Debian: apt-get install debootstrap\)$"):
        host_packages.require(manager.IMAGE_BUILD_PACKAGES)
    assert apt_runs(fresh_machine) == []


def test_headers_replace_a_dangling_build_link_and_keep_a_source(fresh_machine):
    """The running kernel's build link leads to headers that are gone: relinked to the newest
    generic headers; a source link that is there is left alone."""
    modules = kernel_headers.modules_dir()
    modules.mkdir(parents=True)
    (modules / "build").symlink_to(fresh_machine / "src/linux-headers-5.10.0-1-amd64")  # removed long ago
    (modules / "source").symlink_to(fresh_machine / "src/linux-headers-6.1.0-10-common")
    done = kernel_headers.ensure(say=lambda message: None)
    assert os.readlink(str(modules / "build")) == str(fresh_machine / "src/linux-headers-6.1.0-10-amd64")
    assert done[0].startswith("replaced %s/build -> " % modules)
    assert done[-1] == "%s/source: present, left alone" % modules
    assert apt_runs(fresh_machine) == [("update", []), ("install", ["linux-headers-amd64"])]
    assert kernel_headers.ensure(say=lambda message: None) == [
        "%s/build: present (%s), left alone" % (modules, fresh_machine / "src/linux-headers-6.1.0-10-amd64")]
