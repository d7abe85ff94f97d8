"""The README's quick start, as a new user runs it: its shell blocks in order, in an empty directory
outside the checkout with a HOME of its own (a fresh virtualenv; the CLI's dependencies from the
package index), against a twin standing in for the user's device, ending with a clean audit.

The blocks run verbatim. What the user's device is, the twin says in ``host_vars/`` beside the
README's ``hosts.yml`` (which inventory host_vars override): reached over the Docker connection as
root, with the twins' RT budget. Then `edgetune verify` checks the same device with the checks the
installed wheel ships, and every --help answers: the CLI installed whole.
"""
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from edgetune_dev.twin import manager

pytestmark = pytest.mark.controller

REPO = Path(__file__).resolve().parents[2]
TWIN = "it-quickstart-orin-nx"
BOARD = "orin-nx-16gb-r36"


def quick_start_blocks():
    """The ```sh blocks of the README's "Quick start" section, in order."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)^## ", text, re.M | re.S)
    assert section, "the README has no Quick start section"
    blocks = re.findall(r"^```sh\n(.*?)^```", section.group(1), re.M | re.S)
    assert len(blocks) >= 3, blocks
    return blocks


def host_of(blocks):
    """The device the README's inventory names (its one host)."""
    heredoc = re.search(r"cat > hosts.yml <<'EOF'\n(.*?)^EOF", "".join(blocks), re.M | re.S)
    inventory = yaml.safe_load(heredoc.group(1))
    (host,) = [h for group in inventory["all"]["children"].values() for h in group["hosts"]]
    return host


def timings(output):
    """"N s: command" for each command of the quick start that took a second or more."""
    marks = [line.split(" ", 2) for line in output.splitlines() if line.startswith("quick-start-timer ")]
    return ["%4d s: %s" % (int(after[1]) - int(before[1]), before[2][:100])
            for before, after in zip(marks, marks[1:]) if int(after[1]) - int(before[1]) >= 1]


@pytest.fixture(scope="module")
def twin():
    manager.ensure_images([manager.board(BOARD)["distro"]])
    manager.remove(TWIN)
    manager.create(TWIN, BOARD)
    yield TWIN
    manager.remove(TWIN)


def test_the_quick_start_ends_with_a_clean_audit_of_the_device(twin, tmp_path):
    blocks = quick_start_blocks()
    work = tmp_path / "user"
    (work / "home").mkdir(parents=True)
    assert REPO not in work.parents
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "MOLECULE_", "EDGETUNE_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(work / "home"), EDGETUNE_SRC=str(REPO), ANSIBLE_NOCOLOR="1",
               PATH=os.pathsep.join(["/usr/local/bin", "/usr/bin", "/bin"]),
               # pip's download cache of this machine (what a user who installed before has): the
               # install still resolves every dependency on the index and installs it into the new venv.
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip"))
    host = host_of(blocks)
    twin_vars = work / "host_vars" / ("%s.yml" % host)
    twin_vars.parent.mkdir()
    twin_vars.write_text(yaml.safe_dump({
        "ansible_connection": "community.docker.docker", "ansible_host": twin, "ansible_user": "root",
        "ansible_become": False, "ansible_python_interpreter": "/usr/bin/python3",
        "edge_cgroups_rt_runtime_us": 40000}))
    # The blocks in one shell, as a person pastes them one after the other; stop at the first failure.
    # Each command's time is said after it (bash's DEBUG trap; the blocks themselves run unchanged).
    script = ("set -e\ncd %s\n" % work + "trap 'echo \"quick-start-timer $SECONDS $BASH_COMMAND\"' DEBUG\n"
              + "\n".join(blocks) + "\n:")
    done = subprocess.run(["bash", "-c", script], cwd=str(work), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stdout[-6000:]
    print("\n".join(timings(done.stdout)))
    out = done.stdout
    assert "collection edgetune.fleet" in out and "MANIFEST.json of %s" % (work / "home") in out, out[:3000]
    assert re.search(r"^%s\s+ok\b" % re.escape(host), out, re.M), out[-3000:]  # the audit's table: clean

    # One environment gives edgetune, ansible-playbook and ansible-galaxy; every --help works.
    venv = work / "home" / ".venvs" / "edgetune"
    for tool in ("edgetune", "ansible-playbook", "ansible-galaxy"):
        assert (venv / "bin" / tool).exists(), tool
    for command in ("--help", "plan --help", "audit --help", "verify --help", "tune runtime --help",
                    "pcie show --help", "bpf --help"):
        done = subprocess.run([str(venv / "bin" / "edgetune")] + command.split(), cwd=str(work), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
        assert done.returncode == 0 and done.stdout.startswith("usage: edgetune") and not done.stderr, command

    # The same device, checked by the installed wheel's checks.
    junit = work / "verify.xml"
    done = subprocess.run([str(venv / "bin" / "edgetune"), "verify", "-i", "hosts.yml", "-l", "orin-fleet",
                           "--junit", str(junit), "--checks", "not runtime and not netqos and not pcie"],
                          cwd=str(work), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    suite = ET.parse(str(junit)).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("tests")) - int(suite.get("skipped")) >= 8, ET.tostring(suite)[:2000]
    assert str(REPO) not in done.stdout  # the installed wheel's checks, not the checkout's
    done = subprocess.run([str(venv / "bin" / "edgetune"), "audit", "--json", "-i", "hosts.yml", "-l", host],
                          cwd=str(work), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300, check=False)
    assert done.returncode == 0 and json.loads(done.stdout)["hosts"][host]["status"] == "ok", done.stderr[-2000:]
