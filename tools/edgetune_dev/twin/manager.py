"""Build twin images and run twin containers with the local Docker engine.

Images are built here, never pulled: a debootstrap root (mirror read from the
machine's own apt sources) imported as ``edgetune/base:<distro>-<packages digest>``, then the
guest layer (``Dockerfile`` beside this file) as ``edgetune/twin:<distro>``.
"""
import concurrent.futures
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgetune_dev import host_packages, kernel_headers
from edgetune_dev.twin import inotify

HERE = Path(__file__).resolve().parent
BOARDS_DIR = HERE / "guest" / "boards"
# Boards captured from real devices (`edgetune-dev twin capture`), named captured/NAME.
CAPTURED_DIR = Path(os.environ.get("EDGETUNE_CAPTURED_DIR") or HERE.parents[2] / ".cache" / "captured")
CAPTURED = "captured/"
LABEL = "io.edgetune_dev.twin"
# Twins of the fleet `edgetune-dev twin up` manages (the demo's, the inventory's);
# twins created one by one (molecule's, a developer's) do not carry it.
FLEET_LABEL = "io.edgetune.fleet"
# The inventory group of a fleet twin, fixed when it is made: `twin down` and
# the inventory work without its board file (a board captured elsewhere).
GROUP_LABEL = "io.edgetune.group"
# The inventory directory (absolute) of the `twin up` that made a fleet twin:
# `twin down` and the inventory of one directory leave another's twins alone
# (a test's fleet beside the demo's). Twins made before it count as the default's.
INVENTORY_LABEL = "io.edgetune.inventory"
DEFAULT_INVENTORY_DIR = "inventory/twin"

# systemd in a container on this kind of host: --privileged is not
# available here, so the capabilities are listed one by one.  LINUX_IMMUTABLE
# lets the twin make per-CPU and managed IRQ affinity files refuse writes.
RUN_OPTIONS = [
    "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "SYS_NICE",
    "--cap-add", "SYS_PTRACE", "--cap-add", "IPC_LOCK", "--cap-add", "SYS_RAWIO",
    "--cap-add", "LINUX_IMMUTABLE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run", "--tmpfs", "/run/lock",
    # A twin's reboot ends its systemd; the engine starts it again.
    "--restart", "unless-stopped",
    # Twins need no network: Ansible reaches them through `docker exec`.
    "--network", "none",
]
# RT time each twin's container gets (microseconds per second, per CPU: Docker's --cpu-rt-runtime) out of
# the engine's own (dockerd --cpu-rt-runtime, engine()): enough for the ai-infer slice's budget of the
# twins' group vars (edge_cgroups_rt_runtime_us), so SCHED_FIFO in a twin's slice works as on a board.
TWIN_RT_RUNTIME_US = 50000
DOCKER_CPU_CGROUPS = ("/sys/fs/cgroup/cpu/docker", "/sys/fs/cgroup/cpu,cpuacct/docker")
# With bcc and pyroute2, as edge_netqos installs them on a board: the twins run
# the inference traffic classifier on their own eth0 (bcc compiles it against the
# host's kernel headers, mounted read-only: see kernel_header_mounts()).
BASE_PACKAGES = ["systemd", "systemd-sysv", "dbus", "python3", "python3-apt", "iproute2",
                 "procps", "kmod", "e2fsprogs", "util-linux", "stress-ng", "python3-bpfcc", "python3-pyroute2",
                 # the fault harness traces what an apply changes (edgetune-dev faults trace)
                 "strace"]
BOOT_TIMEOUT = 90
# Host packages, as host_packages.require() takes them: {package: commands it provides}.
DOCKER_PACKAGES = {"docker.io": ["docker", "dockerd"]}
IMAGE_BUILD_PACKAGES = {"debootstrap": ["debootstrap"]}
DOCKERD_LOG = "/var/log/edgetune-dockerd.log"


class TwinError(Exception):
    """A one-line, user-facing error (exit code 2)."""


def run(argv, **kwargs):
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("text", True)
    return subprocess.run(argv, check=False, **kwargs)


# ---------------------------------------------------------------- boards
def builtin_boards():
    return {Path(p).stem: json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(BOARDS_DIR / "*.json")))}


def boards():
    """All twin boards: name -> board spec (the twin's own hardware model), the
    captured ones (CAPTURED_DIR/NAME/boards/NAME.json) as captured/NAME."""
    known = builtin_boards()
    for path in sorted(glob.glob(str(CAPTURED_DIR / "*" / "boards" / "*.json"))):
        if Path(path).stem == Path(path).parents[1].name:
            known[CAPTURED + Path(path).stem] = json.loads(Path(path).read_text())
    return known


def twin_prefix(board_name):
    """The container name prefix of a board's twins (captured/NAME -> NAME)."""
    return board_name[len(CAPTURED):] if board_name.startswith(CAPTURED) else board_name


def board(name):
    known = boards()
    if name not in known:
        where = "; captured boards are read from %s" % CAPTURED_DIR if name.startswith(CAPTURED) else ""
        raise TwinError("unknown twin board %r; known boards: %s%s" % (name, ", ".join(known), where))
    return known[name]


def fleet_group(spec):
    return {"jetson": "orin-fleet", "rockchip": "rk3588-fleet"}[spec["family"]]


def parse_fleet(text):
    """'orin-nx-16gb-r36:2,rock5b-rk3588' -> [('orin-nx-16gb-r36', 2), ('rock5b-rk3588', 1)]."""
    fleet = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition(":")
        board(name)
        if count and (not count.isdigit() or int(count) < 1):
            raise TwinError("bad count %r for board %s in fleet spec; use board:N with N >= 1" % (count, name))
        fleet.append((name, int(count or 1)))
    if not fleet:
        raise TwinError("empty fleet spec; give board[:count],... e.g. orin-nx-16gb-r36:2,rock5b-rk3588")
    return fleet


# ---------------------------------------------------------------- engine
def engine_answers():
    return shutil.which("docker") is not None and run(["docker", "info"]).returncode == 0


def ensure_engine(say=print):
    """A Docker engine that answers, started here if need be (Debian, root)."""
    if engine_answers():
        return
    if not host_packages.is_debian_root():
        raise TwinError("no Docker engine answers: install and start Docker "
                        "(on Debian as root, edgetune installs docker.io itself)")
    host_packages.require(DOCKER_PACKAGES, say)
    say("starting dockerd")
    log = open(DOCKERD_LOG, "ab")
    argv = ["dockerd"]
    # RT time for the twins' parent cgroup (Docker's cgroup gets cpu.rt_runtime_us=0
    # otherwise, and SCHED_FIFO in a twin fails with EPERM; role edge_cgroups). Only
    # where the kernel has RT group scheduling on cgroup v1 (elsewhere there is no budget to set).
    if glob.glob("/sys/fs/cgroup/cpu*/cpu.rt_runtime_us"):
        argv.append("--cpu-rt-runtime=900000")
    subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if engine_answers():
            return
        time.sleep(1)
    raise TwinError("dockerd did not answer within 60 s; see %s" % DOCKERD_LOG)


def rt_runtime_options(name, say=print):
    """Docker's --cpu-rt-runtime for a new twin where the engine's cgroup has RT time left to give;
    [] where the kernel has no RT group scheduling on cgroup v1 (nothing to give, none needed) or
    the other twins hold it all (the twin then runs SCHED_FIFO requests as SCHED_OTHER, and says so)."""
    budgets = [os.path.join(parent, "cpu.rt_runtime_us") for parent in DOCKER_CPU_CGROUPS]
    engine_budget = next((path for path in budgets if os.path.exists(path)), None)
    if engine_budget is None:
        return []
    parent = os.path.dirname(engine_budget)
    try:
        given = sum(int(Path(path).read_text()) for path in glob.glob(os.path.join(parent, "*", "cpu.rt_runtime_us")))
        left = int(Path(engine_budget).read_text()) - given
    except (OSError, ValueError):
        left = 0
    if left < TWIN_RT_RUNTIME_US:
        say("twin %s gets no RT budget: the engine's cgroup %s has %d us of RT time left (a twin takes %d; "
            "dockerd needs --cpu-rt-runtime, which `edgetune-dev twin engine` passes)"
            % (name, parent, max(left, 0), TWIN_RT_RUNTIME_US))
        return []
    return ["--cpu-rt-runtime", str(TWIN_RT_RUNTIME_US)]


# ---------------------------------------------------------------- images
def apt_mirror(distro_hint="debian"):
    """The Debian mirror this machine's apt uses (never written into a file)."""
    uris = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for line in Path(path).read_text().splitlines():
            if line.startswith("URIs:"):
                uris += line.split()[1:]
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        if os.path.exists(path):
            for line in Path(path).read_text().splitlines():
                words = line.split("#", 1)[0].split()
                if words and words[0] == "deb":
                    uris += [w for w in words[1:] if "://" in w][:1]
    plain = [u for u in uris if "security" not in u]
    if not plain:
        raise TwinError("no Debian mirror found in /etc/apt/sources.list*; add one so debootstrap can fetch packages")
    return plain[0]


def image_exists(tag):
    return run(["docker", "image", "inspect", tag]).returncode == 0


def base_tag(distro):
    """The base image's tag, named by its package list: an image built before the list
    changed is not reused (one built with other packages would be)."""
    digest = hashlib.sha256(json.dumps(BASE_PACKAGES).encode()).hexdigest()[:12]
    return "edgetune/base:%s-%s" % (distro, digest)


def build_base(distro, say=print):
    """The distribution's base image; ensure_images() installed debootstrap before the builders started."""
    return debootstrap_image(distro, base_tag(distro), BASE_PACKAGES, say)


def debootstrap_image(distro, tag, packages, say=print, note="about a minute"):
    """A local image ``tag`` of ``distro`` made by debootstrap (minbase plus ``packages``)
    from the machine's own mirror; reused when it exists."""
    if image_exists(tag):
        return tag
    mirror = apt_mirror()
    say("building %s with debootstrap (%s)" % (tag, note))
    workdir = tempfile.mkdtemp(prefix="edgetune-rootfs-%s-" % distro, dir="/var/tmp")
    try:
        result = run(["debootstrap", "--variant=minbase", "--include=" + ",".join(packages),
                      distro, workdir, mirror])
        if result.returncode != 0:
            tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
            raise TwinError("debootstrap %s failed: %s" % (distro, " | ".join(tail)))
        for deb in glob.glob(os.path.join(workdir, "var/cache/apt/archives/*.deb")):
            os.unlink(deb)
        tar = subprocess.Popen(["tar", "-C", workdir, "-c", "."], stdout=subprocess.PIPE)
        imported = run(["docker", "import", "-", tag], stdin=tar.stdout)
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise TwinError("docker import of %s failed: %s" % (tag, imported.stderr.strip()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return tag


def build_twin_image(distro, say=print):
    base = build_base(distro, say)
    tag = "edgetune/twin:%s" % distro
    result = run(["docker", "build", "-q", "--build-arg", "BASE=" + base, "-t", tag, str(HERE)])
    if result.returncode != 0:
        raise TwinError("docker build of %s failed: %s" % (tag, result.stderr.strip()[-300:]))
    return tag


def ensure_images(distros, say=print):
    """The twin images of these distributions, built in parallel once every package is installed:
    two builders installing at the same time would meet on apt's lock."""
    distros = sorted(set(distros))
    if not engine_answers() and host_packages.is_debian_root() and host_packages.missing(DOCKER_PACKAGES):
        # A machine without Docker has no image yet: debootstrap comes in the same apt run.
        # So do the kernel headers the twins' classifier compiles against (kernel_headers.ensure()).
        headers = {} if kernel_headers.present() else kernel_headers.package()
        host_packages.require(dict(DOCKER_PACKAGES, **IMAGE_BUILD_PACKAGES, **headers), say)
    ensure_engine(say)
    if not all(image_exists(base_tag(distro)) for distro in distros):
        host_packages.require(IMAGE_BUILD_PACKAGES, say)
    if kernel_headers.present() or host_packages.is_debian_root():
        kernel_headers.ensure(say)
    else:
        say("no kernel headers at %s/build: the twins cannot compile edge_netqos's classifier (it reports "
            "unsupported there); install the running kernel's headers there" % kernel_headers.modules_dir())
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda d: build_twin_image(d, say), distros))


# ---------------------------------------------------------------- kernel headers
def kernel_header_mounts():
    """docker run options that show the host kernel's headers read-only in a twin, at the same
    paths: /lib/modules/RELEASE and the real directories its build and source links lead to.
    The twins share the host's kernel: bcc in a twin compiles edge_netqos's classifier against
    them, found where it looks on a board. [] when the host has none (kernel_headers.ensure())."""
    modules = kernel_headers.modules_dir()
    if not kernel_headers.present():
        return []
    targets = {(modules / link).resolve() for link in ("build", "source") if (modules / link).is_dir()}
    mounts = []
    for path in [modules] + sorted(targets - {modules}):
        mounts += ["-v", "%s:%s:ro" % (path, path)]
    return mounts


# ---------------------------------------------------------------- twins
def container_state(name):
    result = run(["docker", "inspect", "-f", "{{.State.Running}}\t{{index .Config.Labels \"%s\"}}\t"
                  "{{index .Config.Labels \"%s\"}}\t{{index .Config.Labels \"%s\"}}"
                  % (LABEL, FLEET_LABEL, INVENTORY_LABEL), name])
    if result.returncode != 0:
        return None
    running, board_name, fleet, inventory = (result.stdout.rstrip("\n").split("\t") + ["", "", ""])[:4]
    return {"running": running == "true", "board": board_name, "fleet": fleet == "yes",
            "inventory": inventory if fleet == "yes" else ""}


def inventory_key(directory):
    """The value of INVENTORY_LABEL for an inventory directory: its absolute path."""
    return str(Path(directory or DEFAULT_INVENTORY_DIR).resolve())


def create(name, board_name, say=print, fleet=False, inventory_dir=None):
    """Create (or reuse) one twin and wait until it has booted. ``fleet``: a twin of
    the fleet `twin up` manages (in the inventory of ``inventory_dir``, removed by
    `twin down` of that directory)."""
    spec = board(board_name)
    state = container_state(name)
    if state and state["board"] != board_name:
        raise TwinError("container %s exists as a %s twin, not %s; remove it with `edgetune-dev twin rm %s`"
                        % (name, state["board"], board_name, name))
    if state and state["fleet"] != fleet:
        raise TwinError("container %s exists as a twin %s the fleet; remove it with `edgetune-dev twin rm %s`"
                        % (name, "outside" if fleet else "of", name))
    if state and fleet and (state["inventory"] or inventory_key(None)) != inventory_key(inventory_dir):
        raise TwinError("container %s is a twin of the inventory in %s, not %s; remove it with "
                        "`edgetune-dev twin rm %s`"
                        % (name, state["inventory"] or inventory_key(None), inventory_key(inventory_dir), name))
    if state is None:
        labels = ["--label", "%s=%s" % (LABEL, board_name)]
        if fleet:
            labels += ["--label", FLEET_LABEL + "=yes", "--label", "%s=%s" % (GROUP_LABEL, fleet_group(spec)),
                       "--label", "%s=%s" % (INVENTORY_LABEL, inventory_key(inventory_dir))]
        captured = board_name.startswith(CAPTURED)
        argv = ["docker", "create" if captured else "run", *([] if captured else ["-d"]),
                "--name", name, "--hostname", name, *labels, "-e", "EDGETUNE_TWIN_BOARD=" + spec["name"],
                *RUN_OPTIONS, *kernel_header_mounts()]
        rt_options = rt_runtime_options(name, say)
        result = run(argv + rt_options + ["edgetune/twin:%s" % spec["distro"]])
        if result.returncode != 0 and rt_options and "rt_runtime" in result.stderr:
            # Twins created at the same moment took the RT time left: this one goes without.
            say("twin %s gets no RT budget: %s" % (name, result.stderr.strip().splitlines()[-1]))
            run(["docker", "rm", "-f", name])
            result = run(argv + ["edgetune/twin:%s" % spec["distro"]])
        if result.returncode != 0:
            raise TwinError("cannot start twin %s: %s" % (name, result.stderr.strip()))
        if captured:
            # The captured board's files join the image's guest files before its first power-on.
            source = CAPTURED_DIR / twin_prefix(board_name)
            for sub in ("boards", "bootfiles", "nvpmodel_confs"):
                copied = run(["docker", "cp", "%s/%s/." % (source, sub), "%s:/usr/lib/edgetune-twin/%s/" % (name, sub)])
                if copied.returncode != 0:
                    remove(name)
                    raise TwinError("cannot copy %s/%s into twin %s: %s" % (source, sub, name, copied.stderr.strip()))
            started = run(["docker", "start", name])
            if started.returncode != 0:
                raise TwinError("cannot start twin %s: %s" % (name, started.stderr.strip()))
    else:
        if older_image(name, "edgetune/twin:%s" % spec["distro"]):
            say("twin %s was made from an older edgetune/twin:%s image and keeps it (without what the image "
                "has gained since, e.g. its eth0 and bcc); `edgetune-dev twin rm %s` and create it again for the "
                "new one"
                % (name, spec["distro"], name))
        if not state["running"]:
            run(["docker", "start", name])
    wait_booted(name)
    return name


def older_image(name, tag):
    """Whether container ``name`` runs another image than ``tag`` is now."""
    used = run(["docker", "inspect", "-f", "{{.Image}}", name])
    current = run(["docker", "image", "inspect", "-f", "{{.Id}}", tag])
    return used.returncode == 0 and current.returncode == 0 and used.stdout.strip() != current.stdout.strip()


def wait_booted(name, timeout=BOOT_TIMEOUT):
    deadline = time.time() + timeout
    while time.time() < deadline:
        probe = run(["docker", "exec", name, "systemctl", "is-system-running"])
        if probe.stdout.strip() in ("running", "degraded"):
            booted = run(["docker", "exec", name, "cat", "/run/edgetune-twin/boot.json"])
            if booted.returncode == 0:
                return json.loads(booted.stdout)
            break
        time.sleep(1)
    log = run(["docker", "exec", name, "journalctl", "-b", "-u", "edgetune-twin-boot", "--no-pager", "-n", "5"])
    last = " | ".join((log.stdout or log.stderr).strip().splitlines()[-3:])
    raise TwinError("twin %s did not boot within %d s: %s" % (name, timeout, last or "no journal"))


def remove(name):
    run(["docker", "rm", "-f", name])


def remove_all(names):
    """Remove the twins ``names``, four at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(remove, names))


def twins(fleet_only=False, inventory_dir=None):
    """Running or stopped twins, dicts name/board/running/group/inventory. ``fleet_only``:
    those of `twin up`'s fleets; with ``inventory_dir`` too, only the fleet of that directory."""
    result = run(["docker", "ps", "-a", "--filter", "label=" + (FLEET_LABEL if fleet_only else LABEL),
                  "--format", "{{.Names}}\t{{.Label \"%s\"}}\t{{.State}}\t{{.Label \"%s\"}}\t{{.Label \"%s\"}}"
                  % (LABEL, GROUP_LABEL, INVENTORY_LABEL)])
    rows = []
    for line in result.stdout.splitlines():
        name, board_name, state, group, inventory = (line.split("\t") + ["", ""])[:5]
        mine = (inventory or inventory_key(None)) == inventory_key(inventory_dir)
        if fleet_only and inventory_dir is not None and not mine:
            continue
        rows.append({"name": name, "board": board_name, "running": state == "running", "group": group,
                     "inventory": inventory})
    return sorted(rows, key=lambda r: r["name"])


def up(fleet, say=print, inventory_dir=None, prefix=""):
    """Bring up a fleet [(board, count)] of the inventory in ``inventory_dir``, in parallel; returns the twin names
    (PREFIX + the board's twin prefix + -N: a prefix keeps a second fleet apart from the demo's twins)."""
    ensure_images([board(b)["distro"] for b, _ in fleet], say)
    wanted = [("%s%s-%d" % (prefix, twin_prefix(b), i), b) for b, count in fleet for i in range(1, count + 1)]
    # Before any twin boots: the host's inotify limits for every twin that will then run.
    running = [twin["name"] for twin in twins() if twin["running"]]
    others = set(running) - {name for name, _ in wanted}
    inotify.ensure_limits(len(wanted) + len(others), say, sample_twin=running[0] if running else None)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(create, name, b, say, True, inventory_dir) for name, b in wanted]
        for future in futures:
            future.result()
    return [name for name, _ in wanted]


# How Ansible reaches a twin: `docker exec`, the image's Python.
CONNECTION_VARS = {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}


def write_group_inventory(directory, group, names, group_vars):
    """DIRECTORY/hosts.yml holding twins ``names`` (made outside a fleet, as tests make them) in ``group``, with
    ``group_vars`` (a checkout's inventory/twin/group_vars) linked beside it; returns the file's path."""
    import yaml
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "group_vars").symlink_to(group_vars)
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": dict(CONNECTION_VARS), "children": {
        group: {"hosts": {name: None for name in names}}}}}))
    return path


def write_inventory(directory):
    """DIRECTORY/hosts.yml (inventory/twin/ by default) with groups orin-fleet and rk3588-fleet:
    the fleet twins `twin up` made for this directory."""
    groups = {"orin-fleet": {}, "rk3588-fleet": {}}
    for twin in twins(fleet_only=True, inventory_dir=directory):
        group = twin["group"] or (fleet_group(boards()[twin["board"]]) if twin["board"] in boards() else "")
        if group not in groups:
            print("edgetune: twin %s (board %s) left out of the inventory: its board is unknown here"
                  % (twin["name"], twin["board"]), file=sys.stderr)
            continue
        groups[group][twin["name"]] = None
    inventory = {"all": {
        "vars": dict(CONNECTION_VARS),
        "children": {"twins": {"children": {g: {"hosts": hosts} for g, hosts in groups.items()}}},
    }}
    import yaml
    path = Path(directory) / "hosts.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by `edgetune-dev twin up`: the running device twins.\n"
                    + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False))
    return path
