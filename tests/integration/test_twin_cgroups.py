"""Each twin writes only its own cgroups.

The twins share this host's cgroup tree (systemd in a container on a cgroup v1
or hybrid host needs it read-write), so twin B could reach twin A's
``ai-infer.slice`` wherever a path is searched instead of resolved through the
twin's own cgroup (/proc/1/cgroup, as edgetune does). Twin A's slice is made
first, with settings of its own; then twin B is converged and audited with
other settings, its live values changed by hand and repaired. Seen from the
host: A's slice keeps every value and process it had, and B's settings are in
B's cgroup only.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgetune_dev.twin import manager

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TWINS = {"it-cgroups-a": 300, "it-cgroups-b": 700}  # name: its slice's CPUWeight
SLICE = "ai.slice/ai-infer.slice"
# The settings systemd writes into a slice's cgroup on v1/hybrid, and the processes in it.
SETTINGS = ("cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.rt_runtime_us", "memory.limit_in_bytes",
            "memory.soft_limit_in_bytes", "cgroup.procs")

PLAYBOOK = """\
- name: The inference slice, converged and audited
  hosts: all
  gather_facts: false
  roles:
    - role: edgetune.fleet.edge_facts
    - role: edgetune.fleet.edge_cgroups
  tasks:
    - name: Audit the slice
      edgetune.fleet.edge_audit:
        checks: "{{ edge_cgroups_audit }}"
      register: audit

    - name: Nothing of the slice has drifted
      ansible.builtin.assert:
        that: audit.summary.drifted == 0 and audit.summary.error == 0
        fail_msg: "{{ audit.results | rejectattr('state', 'in', ['ok', 'unsupported']) | list }}"
"""


def container_id(name):
    return subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name], stdout=subprocess.PIPE, text=True,
                          check=True).stdout.strip()


def slice_state(name):
    """{path: content} of the slice's settings and processes in the twin's own cgroups, read on the host."""
    state = {}
    for controller in sorted(Path("/sys/fs/cgroup").iterdir()):
        base = controller / "docker" / container_id(name)
        for directory in [base / SLICE, base / "ai.slice"]:
            for setting in SETTINGS:
                path = directory / setting
                if path.is_file():
                    state[str(path)] = path.read_text()
    return state


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    if not Path("/sys/fs/cgroup/cpu").is_dir():
        pytest.skip("a cgroup v1 or hybrid host: the twins' cgroups are the host's v1 tree")
    manager.ensure_images(["bookworm"])
    for name in TWINS:
        manager.remove(name)
        manager.create(name, "rock5b-rk3588")
    tmp = tmp_path_factory.mktemp("twin-cgroups")
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": dict(
        (name, {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
                "edge_cgroups_cpu_weight": weight, "edge_cgroups_cpu_quota": "%d%%" % (weight // 10)})
        for name, weight in TWINS.items())}}))
    (tmp / "slice.yml").write_text(PLAYBOOK)
    yield tmp
    for name in TWINS:
        manager.remove(name)


def converge(tmp, name):
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp / "hosts.yml"), "-l", name,
                           str(tmp / "slice.yml")], cwd=str(REPO), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:]


def test_nothing_run_in_twin_b_reaches_twin_a_slice(twins):
    converge(twins, "it-cgroups-a")
    before = slice_state("it-cgroups-a")
    shares = [path for path in before if path.endswith(SLICE + "/cpu.shares")]
    assert shares and before[shares[0]].strip() == str(300 * 1024 // 100), before
    procs = [p for p in before if p.endswith(SLICE + "/cgroup.procs") and before[p].strip()]
    assert procs, "A's probe runs in A's slice"
    converge(twins, "it-cgroups-b")
    # B's live values changed by hand; B's converge puts them back, in B's cgroup.
    for setting, value in (("cpu.shares", "2"), ("cpu.cfs_quota_us", "-1")):
        subprocess.run(["docker", "exec", "it-cgroups-b", "sh", "-c", "echo %s > $(awk -F: '$2 ~ /(^|,)cpu(,|$)/ "
                        "{print \"/sys/fs/cgroup/cpu\" $3}' /proc/1/cgroup | sed 's|/init.scope$||')/%s/%s"
                        % (value, SLICE, setting)], check=True)
    converge(twins, "it-cgroups-b")
    assert slice_state("it-cgroups-a") == before
    mine = slice_state("it-cgroups-b")
    b_shares = [path for path in mine if path.endswith(SLICE + "/cpu.shares")]
    assert b_shares and mine[b_shares[0]].strip() == str(700 * 1024 // 100), mine
    assert [v for p, v in mine.items() if p.endswith(SLICE + "/cpu.cfs_quota_us")] == ["70000\n"], mine
