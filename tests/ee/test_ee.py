"""The execution environment (extras/awx, image edgetune-ee:<version>) runs the job: `make ee` only.

`edgetune-dev ee build` built the image here with ansible-builder; `edgetune-dev ee test` runs this
file with EDGETUNE_EE_IMAGE and EDGETUNE_EE_NAVIGATOR set (elsewhere it is skipped; `make test`
does not collect tests/ee). The test makes a Docker network of its own (internal: nothing on it
reaches anything else) and one twin on it running sshd, then, from a project directory that holds
only an inventory, an ansible.cfg and a site.yml importing the installed collection's site playbook,
runs with ansible-navigator (the image, never pulled, on that network):

* `ansible-navigator run site.yml`: the whole job over SSH (preflight, tune with the twin's reboot,
  the deploy of the LLM runtime from `make artifacts`' artifacts, mounted read-only);
* `ansible-navigator exec "edgetune audit --json"`: the CLI in the image audits the twin, clean.

Nothing of the checkout is on the image's paths but those artifacts: the collection, the CLI,
Ansible and ansible.posix are the image's.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from edgetune_dev import ee

IMAGE = os.environ.get("EDGETUNE_EE_IMAGE")
NAVIGATOR = os.environ.get("EDGETUNE_EE_NAVIGATOR")

pytestmark = [
    pytest.mark.controller,
    pytest.mark.skipif(not (IMAGE and NAVIGATOR), reason="runs under `make ee` (edgetune-dev ee test), which builds "
                                                          "the image and ansible-navigator's venv"),
]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".cache" / "artifacts"
NETWORK = "edgetune-ee-test"
TWIN = "ee-orin-nx-r36"
BOARD = "orin-nx-16gb-r36"

SITE = """\
---
# The collection's site playbook, as the execution environment has it installed.
- name: The whole job
  ansible.builtin.import_playbook: edgetune.fleet.site
"""

# The CLI reads the collections path from the configuration in effect: named here, as a project's
# ansible.cfg does (the image's default path holds the collection too).
ANSIBLE_CFG = """\
[defaults]
inventory = inventory.yml
collections_path = ~/.ansible/collections:/usr/share/ansible/collections
interpreter_python = auto_silent
host_key_checking = True
retry_files_enabled = False
force_valid_group_names = ignore
callbacks_enabled = edgetune.fleet.edge_summary

[connection]
pipelining = True
"""


def say(message):
    print("edgetune: " + message, flush=True)


def docker(*argv, check=True, **kwargs):
    result = subprocess.run(["docker", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            check=False, **kwargs)
    if check:
        assert result.returncode == 0, "docker %s: %s" % (" ".join(argv), result.stderr.strip())
    return result


def cleanup():
    docker("rm", "-f", TWIN, check=False)
    docker("network", "rm", NETWORK, check=False)


def navigator_env():
    """Ours, less what the checkout's Makefile sets for Ansible (its ansible.cfg, its collection)."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "MOLECULE_"))}


def navigator(project, subcommand, *argv):
    """ansible-navigator SUBCOMMAND in the image, on the test's network, from the project directory, with
    the artifacts mounted read-only: `run PLAYBOOK ARG...` or `exec COMMAND` (run by the image's shell)."""
    common = ["--ee", "true", "--eei", IMAGE, "--pull-policy", "never", "--ce", "docker", "--mode", "stdout",
              "--co=--network=%s" % NETWORK, "--lf", str(project / ("navigator-%s.log" % subcommand)),
              # ansible-runner turns host key checking off unless told: the twin's key is in known_hosts.
              "--senv", "ANSIBLE_HOST_KEY_CHECKING=True",
              # The inventory's artifacts directory: the deploy's source, the audit's desired release.
              "--eev", "%s:%s:ro" % (ARTIFACTS, ARTIFACTS)]
    if subcommand == "run":
        command = [NAVIGATOR, "run", argv[0], *common, "--pae", "false", *argv[1:]]
    else:  # exec takes its command as one word before the options
        command = [NAVIGATOR, "exec", argv[0], *common]
    result = subprocess.run([str(a) for a in command], cwd=str(project), env=navigator_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False, timeout=1800)
    (project / ("navigator-%s.out" % subcommand)).write_text(result.stdout)
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The twin on the test's network, reached over SSH, and a project directory to run from."""
    if not sorted(ARTIFACTS.glob("edgetune-llama-server-*.tar.gz.manifest.json")):
        pytest.fail("no LLM artifacts in %s: `make artifacts` makes them (make ee does first)" % ARTIFACTS)
    cleanup()
    docker("network", "create", "--internal", NETWORK)
    try:
        ee.start_ssh_twin(TWIN, BOARD, NETWORK, say)
        project = tmp_path_factory.mktemp("ee-project")
        key = project / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edgetune-ee-test", "-f", str(key)],
                       check=True)
        docker("exec", "-i", TWIN, "sh", "-c", "install -d -m 0700 /root/.ssh && cat > /root/.ssh/authorized_keys",
               input=(project / "id_ed25519.pub").read_text())
        host_key = docker("exec", TWIN, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
        (project / "known_hosts").write_text("%s %s %s\n" % (TWIN, host_key[0], host_key[1]))
        (project / "site.yml").write_text(SITE)
        (project / "ansible.cfg").write_text(ANSIBLE_CFG)
        # The twins' settings (inventory/twin/group_vars), then this inventory's own: SSH to the twin
        # by its name (Docker's DNS on the test network), host key checked.
        (project / "group_vars").mkdir()
        shutil.copy(REPO / "inventory" / "twin" / "group_vars" / "all.yml", project / "group_vars" / "all.yml")
        inventory = {"all": {
            "vars": {"ansible_connection": "ssh", "ansible_user": "root",
                     "ansible_ssh_private_key_file": str(key),
                     "ansible_ssh_common_args": "-o UserKnownHostsFile=%s" % (project / "known_hosts"),
                     "ansible_python_interpreter": "/usr/bin/python3",
                     "edge_runtime_artifacts_dir": str(ARTIFACTS)},
            "children": {"orin-fleet": {"hosts": {TWIN: None}}},
        }}
        (project / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
        yield project
    finally:
        if os.environ.get("EDGETUNE_EE_KEEP") != "1":
            cleanup()


def test_site_converges_from_the_image(project):
    result = navigator(project, "run", "site.yml")
    assert result.returncode == 0, result.stdout[-4000:]
    recap = [line for line in result.stdout.splitlines() if line.startswith(TWIN) and "failed=" in line]
    assert recap and "failed=0" in recap[-1] and "unreachable=0" in recap[-1], result.stdout[-4000:]


def test_audit_from_the_image_is_clean(project):
    # `exec` runs the command in ansible-runner's environment for ansible-playbook, with its
    # ANSIBLE_STDOUT_CALLBACK=awx_display: the audit's own ansible-runner must not take that callback
    # as the one to wrap (awx_display wrapping itself failed: "no attribute 'CallbackModule'").
    result = navigator(project, "exec", "edgetune audit --json > audit.json")
    report = (project / "audit.json").read_text() if (project / "audit.json").exists() else ""
    assert result.returncode == 0, result.stdout[-3000:] + report[-3000:]
    hosts = json.loads(report)["hosts"]
    assert set(hosts) == {TWIN}
    assert hosts[TWIN]["status"] == "ok", json.dumps(hosts[TWIN], indent=1)[-3000:]
