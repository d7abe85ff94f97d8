"""The collection as another repository consumes it.

Builds the tarball with `ansible-galaxy collection build`, installs it into an
empty collections path outside the checkout, and runs a playbook of a
consumer's own (its own ansible.cfg and an inventory of one twin) that uses
the roles, a module and a lookup by FQCN: converge, then `--check` reporting
no change. Nothing of the checkout is on the consumer's paths: not its
ansible.cfg, not its collection link, not its inventory. (The CLI installed
from its wheel in a fresh virtualenv plans, audits and verifies a device in
tests/integration/test_readme_quickstart.py.)
"""
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from edgetune_dev.twin import manager

pytestmark = pytest.mark.controller

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TWIN = "it-consumer-rock5b"
VERSION = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]

PLAYBOOK = """\
- name: Tune a board with edgetune.fleet
  hosts: boards
  gather_facts: false
  roles:
    - role: edgetune.fleet.edge_facts
    # Boot arguments written (and the CPU partition the next roles use); the
    # reboot is the consumer's to take: this playbook leaves it pending.
    - role: edgetune.fleet.edge_bootargs
    - role: edgetune.fleet.edge_cpu
    - role: edgetune.fleet.edge_cgroups
    - role: edgetune.fleet.edge_power
    # After the roles whose settings it re-applies at boot.
    - role: edgetune.fleet.edge_boot
    - role: edgetune.fleet.edge_audit_timer
  tasks:
    - name: Read the NUMA layout
      edgetune.fleet.edge_numa_info:
      register: numa

    - name: Audit what the roles manage
      edgetune.fleet.edge_audit:
        checks: "{{ edge_cpu_audit + edge_cgroups_audit + edge_power_audit }}"
      register: audit

    - name: Nothing the roles manage has drifted
      ansible.builtin.assert:
        that: audit.summary.drifted == 0 and audit.summary.error == 0
        fail_msg: "{{ audit.results | rejectattr('state', 'in', ['ok', 'unsupported']) | list }}"
"""


def clean_env(home):
    """The consumer's environment: no ANSIBLE_* of the checkout's Makefile or molecule."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(PATH=str(BIN) + os.pathsep + env.get("PATH", ""), HOME=str(home), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(home / "ansible.cfg"), PYTHONDONTWRITEBYTECODE="1")
    return env


def run(argv, cwd, env, stderr=subprocess.STDOUT):
    result = subprocess.run(argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=stderr,
                            text=True, check=False)
    return result.returncode, result.stdout if stderr == subprocess.STDOUT else (result.stdout, result.stderr)


def recap(output):
    match = re.search(r"^%s\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % TWIN, output, re.M)
    assert match, output[-4000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    """A consumer project with the built collection installed in its own collections path."""
    base = tmp_path_factory.mktemp("consumer")
    assert REPO not in base.parents
    home = base / "project"
    home.mkdir()
    env = clean_env(home)
    code, out = run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(base / "dist"),
                     str(REPO)], base, env)
    assert code == 0, out
    tarball = base / "dist" / ("edgetune-fleet-%s.tar.gz" % VERSION)
    # --no-deps: its one dependency, ansible.posix, comes with the `ansible` package (no Galaxy here).
    code, out = run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-p",
                     str(base / "collections"), str(tarball)], base, env)
    assert code == 0, out
    (home / "ansible.cfg").write_text(
        "[defaults]\ncollections_path = %s\ninventory = hosts.yml\nhost_key_checking = True\n"
        "interpreter_python = auto_silent\n\n[connection]\npipelining = True\n" % (base / "collections"))
    # This consumer deploys no LLM runtime (an installed collection has no artifacts of its own: one
    # that does points edge_runtime_artifacts_dir at its artifacts), so the plan of its boards has none.
    (home / "hosts.yml").write_text(yaml.safe_dump({"boards": {"hosts": {TWIN: {
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}},
        "vars": {"edge_runtime_enabled": False}}}))
    (home / "tune.yml").write_text(PLAYBOOK)
    return {"home": home, "env": env, "tarball": tarball, "installed": base / "collections"}


@pytest.fixture(scope="module")
def twin():
    manager.ensure_images(["bookworm"])
    manager.remove(TWIN)
    manager.create(TWIN, "rock5b-rk3588")
    yield TWIN
    manager.remove(TWIN)


def test_tarball_leaves_out_the_development_files(consumer):
    with tarfile.open(str(consumer["tarball"])) as tar:
        names = set(tar.getnames())
    for wanted in ("MANIFEST.json", "meta/runtime.yml", "plugins/modules/edge_kernel_cmdline.py",
                   "plugins/module_utils/device/edge_cmdline.py", "plugins/lookup/collection_file.py",
                   "plugins/module_utils/device/edge_netqos_loader.py", "bpf/edge_classifier.c",
                   "roles/edge_bootargs/meta/argument_specs.yml", "playbooks/site.yml"):
        assert wanted in names, wanted
    for unwanted in ("molecule", "tests", "tools", "inventory/twin", ".cache", "Makefile", "ansible.cfg"):
        assert not any(name == unwanted or name.startswith(unwanted + "/") for name in names), unwanted


def test_installed_collection_is_the_only_edgetune_and_renders_its_docs(consumer):
    code, out = run([str(BIN / "ansible-galaxy"), "collection", "list", "edgetune.fleet", "--format", "json"],
                    consumer["home"], consumer["env"])
    assert code == 0, out
    found = json.loads(out[out.index("{"):])
    assert list(found) == [str(consumer["installed"] / "ansible_collections")], found
    # Every module and role the tarball holds renders under its FQCN from the installed copy.
    modules = sorted(name[:-3] for name in os.listdir(consumer["installed"] / "ansible_collections/edgetune/fleet"
                                                      / "plugins/modules") if name.endswith(".py"))
    roles = sorted(os.listdir(consumer["installed"] / "ansible_collections/edgetune/fleet/roles"))
    assert len(modules) >= 14 and len(roles) >= 9
    for kind, names in (("module", modules), ("role", roles), ("lookup", ["collection_file"]),
                        ("filter", ["edge_cpu_partition", "edge_board_profile", "edge_cgroups_plan"])):
        code, (out, err) = run([str(BIN / "ansible-doc"), "-t", kind, "--json"]
                               + ["edgetune.fleet." + n for n in names], consumer["home"], consumer["env"],
                               stderr=subprocess.PIPE)
        assert code == 0 and not err.strip(), err
        docs = json.loads(out)
        assert sorted(docs) == sorted("edgetune.fleet." + n for n in names), out[:2000]
        for name, doc in docs.items():
            if kind == "role":
                assert doc["entry_points"]["main"]["options"], name
            else:
                assert doc["doc"]["short_description"], name
            if kind == "module":
                assert doc["examples"].strip() and doc["return"], name


def test_collection_playbooks_run_by_name(consumer):
    code, out = run([str(BIN / "ansible-playbook"), "edgetune.fleet.site", "--list-tasks"], consumer["home"],
                    consumer["env"])
    assert code == 0, out[-4000:]
    for play in ("Validate the inventory and detect the boards", "Tune the boards", "Deploy the inference runtime"):
        assert "play #" in out and play in out, out[-4000:]
    # The roles are included where the plan says they run (one decision per device), so --list-tasks names
    # each role's include; the roles themselves come from the installed collection.
    assert "Apply the kernel boot arguments" in out and "Deploy the runtime release" in out, out[-4000:]
    installed = consumer["installed"] / "ansible_collections" / "edgetune" / "fleet" / "roles"
    assert (installed / "edge_bootargs" / "tasks" / "main.yml").is_file()


def test_consumer_playbook_converges_a_twin_then_check_mode_changes_nothing(consumer, twin):
    code, out = run([str(BIN / "ansible-playbook"), "tune.yml"], consumer["home"], consumer["env"])
    assert code == 0, out[-4000:]
    assert recap(out)["changed"] > 0
    # The role installed the on-device audit from the installed collection's files.
    audit = subprocess.run(["docker", "exec", twin, "systemctl", "start", "edgetune-audit.service"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert audit.returncode == 0, audit.stdout
    code, out = run([str(BIN / "ansible-playbook"), "tune.yml", "--check", "--diff"], consumer["home"],
                    consumer["env"])
    assert code == 0, out[-4000:]
    assert recap(out) == {"ok": recap(out)["ok"], "changed": 0, "unreachable": 0, "failed": 0}, out[-4000:]
