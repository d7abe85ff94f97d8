"""Bad input never reaches a device: `ansible-playbook site.yml` refuses it before the first change.

Fresh, never-tuned twins of each board (made with the project's own tool) are
hashed where edgetune writes and where the board's state lives: /etc, /boot,
/opt, /var/lib/edgetune, /var/cache/edgetune, the twin's fake sysfs (CPUs and
cpufreq, devfreq, the EMC clock, the device tree, IRQs, PCIe config space,
the faked kernel tunables, the command line), the inference slice's cgroup
files and the edgetune/ai units systemd knows. Then site.yml runs with bad
values: one run with many independent ones (every message must be there at
once, on every host), a run where only some hosts' intent is bad (the whole
fleet stops before the tune play), and deploy.yml alone (the runtime role's
own check, which must leave nothing in /var/cache/edgetune). After each run
the hashes are the same as before.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from edgetune_dev import artifacts as packager
from edgetune_dev.twin import manager

pytestmark = pytest.mark.controller

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TWINS = {"it-bad-orin-nx": "orin-nx-16gb-r36", "it-bad-agx-r35": "agx-orin-64gb-r35", "it-bad-rock5b": "rock5b-rk3588"}
JETSONS = ["it-bad-orin-nx", "it-bad-agx-r35"]

# Run inside a twin: one line per file (path, then its sha1 or link target),
# and the inference slice's cgroup files under the twin's own cgroup.
SNAPSHOT = r"""
import hashlib, os, subprocess
ROOTS = ["/etc", "/boot", "/opt", "/var/lib/edgetune", "/var/cache/edgetune", "/usr/local/lib/edgetune",
         "/sys/devices/system/cpu", "/sys/firmware/devicetree/base", "/proc/irq", "/sys/kernel/debug/bpmp"]
FILES = ["/proc/cmdline", "/sys/devices/virtual/workqueue/cpumask", "/proc/sys/kernel/sched_rt_runtime_us",
         "/proc/sys/kernel/timer_migration", "/proc/sys/kernel/numa_balancing", "/proc/sys/vm/stat_interval"]
for base in ("/sys/class/devfreq", "/sys/bus/pci/devices"):
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        node = os.path.join(base, name)
        FILES += [os.path.join(node, f) for f in sorted(os.listdir(node)) if os.path.isfile(os.path.join(node, f))]
cgroup = [l.split(":", 2)[2] for l in open("/proc/1/cgroup").read().splitlines() if l.startswith("1:name=systemd")
          or l.startswith("0::")][0].rsplit("/init.scope", 1)[0]
for ctrl in sorted(os.listdir("/sys/fs/cgroup")):
    ROOTS.append("/sys/fs/cgroup/%s%s/ai.slice" % (ctrl, cgroup))
def entry(path):
    if os.path.islink(path):
        return "L " + os.readlink(path)
    try:
        with open(path, "rb") as handle:
            return hashlib.sha1(handle.read()).hexdigest()
    except OSError as exc:
        return "E %s" % exc.errno
lines = []
for root in ROOTS:
    if not os.path.lexists(root):
        lines.append("%s absent" % root)
        continue
    dev = os.lstat(root).st_dev
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if os.lstat(os.path.join(top, d)).st_dev == dev
                         or root.startswith("/sys/fs/cgroup"))
        lines.append("%s/ dir" % top)
        lines += ["%s %s" % (os.path.join(top, f), entry(os.path.join(top, f))) for f in sorted(files)]
lines += ["%s %s" % (f, entry(f)) for f in FILES]
units = subprocess.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "edgetune*", "ai*"],
                       stdout=subprocess.PIPE, universal_newlines=True).stdout
lines += ["unit " + " ".join(u.split()[:4]) for u in units.splitlines()]
print("\n".join(lines))
"""


def snapshot(name):
    done = subprocess.run(["docker", "exec", "-i", name, "python3", "-"], input=SNAPSHOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def snapshots():
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(TWINS, pool.map(snapshot, TWINS)))


def assert_unchanged(before):
    after = snapshots()
    for name in TWINS:
        if after[name] != before[name]:
            gone, new = set(before[name]) - set(after[name]), set(after[name]) - set(before[name])
            pytest.fail("%s changed: before %s; after %s" % (name, sorted(gone)[:10], sorted(new)[:10]))


def flat(text):
    return " ".join(text.split())


def recap(output, names=TWINS):
    """PLAY RECAP counts of ``names`` (each must be there)."""
    found = {}
    for name in names:
        match = re.search(r"^%s\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % name, output, re.M)
        assert match, output[-3000:]
        found[name] = dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))
    return found


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Fresh twins of every board, an inventory of them with the twins' settings, and artifacts."""
    started = time.time()
    base = tmp_path_factory.mktemp("bad-input")
    manager.ensure_images(sorted({manager.board(b)["distro"] for b in TWINS.values()}))
    for name in TWINS:
        manager.remove(name)
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(lambda item: manager.create(*item), TWINS.items()))
    inventory = base / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all.yml").write_text((REPO / "inventory/twin/group_vars/all.yml").read_text())
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"},
        "children": {"orin-fleet": {"hosts": {n: None for n in JETSONS}},
                     "rk3588-fleet": {"hosts": {"it-bad-rock5b": None}}}}}))
    out = base / "artifacts"
    runtime = packager.package_runtime(out)
    engine = packager.package_engine(out)
    compat = dict(json.loads(Path(engine["path"] + ".manifest.json").read_text())["compatibility"], socs=["rk3588"])
    rk_only = packager.package_engine(base / "rk-only", version="0.2.0", compatibility=compat)
    corrupt = base / "corrupt" / "edgetune-engine-broken-0.1.0.tar.gz"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\x1f\x8b\x08 this is not a tarball\n")
    env = dict(os.environ, PATH=str(BIN) + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", PYTHONDONTWRITEBYTECODE="1")
    setup = {"inventory": inventory, "env": env, "base": base, "artifacts": out, "runtime": runtime,
             "engine": engine, "rk_only": rk_only, "corrupt": corrupt, "before": snapshots()}
    print("set-up: %.1f s" % (time.time() - started))
    yield setup
    for name in TWINS:
        manager.remove(name)


def play(fleet, intent, playbook="site.yml"):
    """ansible-playbook from the checkout, the intent as an extra-vars file; (rc, output)."""
    path = fleet["base"] / ("intent-%d.json" % time.monotonic_ns())
    # The MLP test fixture's release (it starts in milliseconds) unless the intent names another.
    path.write_text(json.dumps(dict({"edge_runtime_artifacts_dir": str(fleet["artifacts"]),
                                     "edge_runtime_runtime_src": fleet["runtime"]["path"],
                                     "edge_runtime_engine_src": fleet["engine"]["path"]}, **intent)))
    started = time.time()
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(fleet["inventory"]), playbook, "-e", "@%s" % path],
                          cwd=str(REPO), env=fleet["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    print("%s %s: %.1f s" % (playbook, sorted(intent), time.time() - started))
    return done.returncode, done.stdout


def test_every_bad_value_is_reported_at_once_and_nothing_changes(fleet):
    intent = {
        "edge_power_nvpmodel_mode": "MODE_99W",
        "edge_audit_timer_calendar": "every day at dawn",
        "edge_runtime_health_timeout": -5,
        "edge_bootargs_isolate": "",
        "edge_bootarg_isolate": "4-7",
        "edge_bootargs_cgroup_v2": "maybe",
        "edge_runtime_slice": "ai/infer.slice",
        "edge_runtime_cpus": "4-19",
        "edge_pcie_qos_mappings": [{"device_class": "0x0108", "tcs": "1,2", "vc_id": 1}],
        "edge_netqos_interfaces": ["eth0"], "edge_netqos_rate": "900mbit", "edge_netqos_ports": [8470, 70000],
        "edge_runtime_engine_src": str(fleet["corrupt"]),
        "edge_runtime_engine_sha256": packager.artifact.sha256_file(str(fleet["corrupt"])),
        "edge_cgroups_memory_max": "64T",
    }
    rc, out = play(fleet, intent)
    assert rc != 0
    text = flat(out)
    # The RK3588 has no nvpmodel: the mode is not its problem.
    for name, count in (("it-bad-orin-nx", 11), ("it-bad-agx-r35", 11), ("it-bad-rock5b", 10)):
        assert "%s: %d bad variables in the intent, refused before any change on any device (nothing was changed)" \
            % (name, count) in text, out[-5000:]
    expected = [
        'edge_audit_timer_calendar = "every day at dawn": Failed to parse calendar specification',
        'edge_runtime_health_timeout = -5: allowed: a number above 0 and at most 3600 (seconds)',
        'edge_bootargs_isolate = "": empty (an empty string is not none); allowed: auto, none or a CPU list',
        'edge_bootargs_cgroup_v2 = "maybe": allowed: auto, true or false',
        'edge_runtime_slice = "ai/infer.slice": differs from edge_cgroups_slice = "ai-infer.slice"',
        'edge_runtime_cpus = "4-19": CPUs 8-19 do not exist on this board (the NVIDIA Jetson Orin NX 16GB has '
        'CPUs 0-7)',
        'edge_runtime_cpus = "4-19": CPUs 8-19 do not exist on this board (the Rockchip RK3588 has CPUs 0-7)',
        'edge_runtime_cpus = "4-19": CPUs 12-19 do not exist on this board (the NVIDIA Jetson AGX Orin 64GB has '
        'CPUs 0-11)',
        'is a mapping whose tcs "1,2" is a string, not a list (a string is never split into one: write [1, 2])',
        'edge_netqos_ports = [8470, 70000]: invalid port 70000: ports are 1..65535',
        'a corrupt or foreign artifact: %s is not a readable tarball' % fleet["corrupt"],
        'edge_cgroups_memory_max = "64T": (64.0TiB) is more than the RAM',
        'edge_bootarg_isolate is not a variable of any edgetune role or playbook and is ignored '
        '(did you mean edge_cpu_isolate?)',
        # the CPU split is role edge_cpu's now; the old name is read, with a warning
        'edge_bootargs_isolate is deprecated: name it edge_cpu_isolate',
        'edge_power_nvpmodel_mode = "MODE_99W": not a power mode of the NVIDIA Jetson Orin NX 16GB; allowed: '
        'recommended (MAXN_SUPER), "" (leave the mode alone) or one of MAXN, MAXN_SUPER, 10W, 15W, 25W, 40W',
        'not a power mode of the NVIDIA Jetson AGX Orin 64GB',
        "calendar_checked_on: controller",
    ]
    for words in expected:
        assert words in text, words
    assert "PLAY [Tune the boards]" not in out
    for name, counts in recap(out).items():
        assert counts["changed"] == 0 and counts["failed"] == 1, (name, counts)
    assert_unchanged(fleet["before"])


def test_one_boards_bad_intent_stops_the_whole_fleet_before_the_tune_play(fleet):
    # The engine built for the RK3588 only: refused on the controller for both Jetsons; the
    # ROCK 5B's intent is fine, and it stops too (any_errors_fatal), with nothing copied anywhere.
    rc, out = play(fleet, {"edge_runtime_engine_src": fleet["rk_only"]["path"]})
    assert rc != 0
    text = flat(out)
    for name in JETSONS:
        assert "%s: 1 bad variable in the intent" % name in text
    assert "incompatible release: engine mlp-small 0.2.0 is built for SoC rk3588, but this board is " \
           "tegra234" in text
    assert "it-bad-rock5b: 1 bad variable" not in text
    assert "PLAY [Tune the boards]" not in out and "PLAY [Deploy the inference runtime]" not in out
    assert all(counts["changed"] == 0 for counts in recap(out).values())
    assert_unchanged(fleet["before"])


def test_the_runtime_roles_own_check_refuses_before_the_cache(fleet):
    # deploy.yml alone (no preflight): edge_runtime checks its settings and the artifacts on the
    # controller before anything reaches /var/cache/edgetune.
    rc, out = play(fleet, {"edge_runtime_health_timeout": 0, "edge_runtime_engine_sha256": "0" * 64},
                   playbook="playbooks/deploy.yml")
    assert rc != 0
    text = flat(out)
    assert "refused before role edge_runtime changed anything" in text
    assert "edge_runtime_health_timeout = 0: allowed: a number above 0" in text
    assert "Checksum mismatch for the engine artifact" in text
    assert "nothing was changed" not in text
    # One device at a time (edge_deploy_serial): the first refusal ends the deploy.
    first = [name for name in TWINS if re.search(r"^%s\s+:" % name, out, re.M)]
    assert first and all(counts["changed"] == 0 for counts in recap(out, first).values())
    assert_unchanged(fleet["before"])


def test_a_refusal_on_the_device_removes_what_the_deploy_copied(fleet):
    # Fine on the controller, refused by the device (edge_release: the free space) after the copy:
    # the copied tarballs and the cache directories the run created go again.
    rc, out = play(fleet, {"edge_runtime_min_free_mb": 100000000}, playbook="playbooks/deploy.yml")
    assert rc != 0
    text = flat(out)
    assert "not enough space under /opt/edgetune" in text
    # The refusal last: its reason ends the line, whatever its own punctuation.
    assert "the deploy changed nothing on the device (what this run had copied into /var/cache/edgetune/artifacts " \
           "was removed again, and the current release keeps serving): not enough space under /opt/edgetune" in text
    assert "Copy the artifacts to the device" in out
    assert_unchanged(fleet["before"])
