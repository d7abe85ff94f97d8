"""`edgetune audit` (tools/edgetune/audit.py, ansible_setup.py) runs as ansible-playbook would.

The end-to-end tests run the real ansible-playbook through ansible-runner from a
site directory outside the checkout, on a stand-in collection edgetune.fleet
whose audit playbook reports what each host's inventory says (local
connection), an ssh host on a closed port, and a host whose Python
interpreter fails the way `docker exec` on a stopped twin does.
"""
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from edgetune import __version__, ansible_options, ansible_setup, audit, cli
from edgetune.errors import Interrupted, UsageError

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.controller

prometheus_client = pytest.importorskip("prometheus_client")
pytest.importorskip("ansible_runner")

FAKE_MODULE = '''#!/usr/bin/python
"""Stand-in edge_audit: reports the results its host's inventory gives, after a pause."""
import time

from ansible.module_utils.basic import AnsibleModule

module = AnsibleModule(argument_spec=dict(checks=dict(type="list", elements="dict", required=True),
                                          host=dict(type="str"), sleep=dict(type="float", default=0)))
time.sleep(module.params["sleep"])
results = module.params["checks"] + [{"setting": "vault", "role": "test", "state": "ok",
                                      "detail": module.params["host"]}]
module.exit_json(changed=False, results=results)
'''

FAKE_AUDIT_PLAYBOOK = """\
- name: Preflight
  hosts: all
  gather_facts: false
  tasks:
    - name: Check the board
      ansible.builtin.fail:
        msg: "unsupported board: {{ fake_board_error }}"
      when: fake_board_error is defined

- name: Compare the desired state with each device
  hosts: all
  gather_facts: false
  tasks:
    - name: Audit the managed settings
      edgetune.fleet.edge_audit:
        checks: "{{ fake_results | default([]) }}"
        host: "{{ fleet_token }}"
        sleep: "{{ fake_sleep | default(0) }}"
"""

# What a twin's `docker exec` says when the container is stopped (community.docker
# returns it as the module's stderr).
STOPPED_CONTAINER_INTERPRETER = """#!/bin/sh
echo "Error response from daemon: container stopped-twin is not running" >&2
exit 1
"""

# Long enough that a fast device's audit stays below it on a loaded 2-core machine (4 s failed once
# beside a molecule run).
SLOW_SECONDS = 8


def result(setting, state, detail=""):
    return {"setting": setting, "role": "edge_test", "state": state, "detail": detail}


HOSTS = {
    "fast-ok": {"fake_results": [result("cpufreq policy0 governor", "ok")]},
    "slow-ok": {"fake_results": [result("cpufreq policy0 governor", "ok")], "fake_sleep": SLOW_SECONDS},
    "drifted-1": {"fake_results": [result("cpufreq policy4 governor", "drifted", "powersave, desired performance"),
                                   result("IRQ affinity", "drifted", "IRQ 70 (eth0) on 8-11"),
                                   result("runtime unit", "ok")]},
    "pending-1": {"fake_results": [result("kernel boot arguments", "pending-reboot", "to add: nohz_full=4-7")]},
    "checkerr-1": {"fake_results": [result("sysctl kernel.sched_rt_runtime_us", "error", "OSError: [Errno 5]"),
                                    result("IRQ affinity", "drifted", "IRQ 3 on 4")]},
    "badboard-1": {"fake_board_error": "unknown compatible acme,board"},
}


def write(path, text, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode:
        path.chmod(mode)
    return path


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vaulted(plaintext, label, password):
    from ansible.parsing.vault import VaultLib, VaultSecret
    blob = VaultLib([(label, VaultSecret(password.encode()))]).encrypt(plaintext, vault_id=label).decode()
    return "!vault |\n" + textwrap.indent(blob, "  ")


@pytest.fixture
def clean_ansible_env(monkeypatch, tmp_path):
    """No ANSIBLE_* from the caller (make exports ANSIBLE_CONFIG), a HOME without ~/.ansible.cfg."""
    for name in list(os.environ):
        if name.startswith("ANSIBLE_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def site(tmp_path, clean_ansible_env, monkeypatch):
    """An operator's directory outside the checkout: its ansible.cfg, inventory, vars and collection."""
    root = tmp_path / "site"
    collection = root / "collections" / "ansible_collections" / "edgetune" / "fleet"
    write(collection / "galaxy.yml", "namespace: edgetune\nname: fleet\nversion: 9.9.9\n")
    write(collection / "playbooks" / "audit.yml", FAKE_AUDIT_PLAYBOOK)
    write(collection / "plugins" / "modules" / "edge_audit.py", FAKE_MODULE)
    # What edgetune imports from the collection (the textfile's metrics), as an installed copy has it.
    os.symlink(str(REPO / "plugins" / "module_utils"), str(collection / "plugins" / "module_utils"))
    # remote_tmp: the modules' files (and the processes running them) are the test's own.
    write(root / "ansible.cfg", "[defaults]\ncollections_path = ./collections\nhost_key_checking = True\n"
                                "remote_tmp = %s\n" % (root / "remote-tmp"))
    interpreter = write(root / "bin" / "stopped-container", STOPPED_CONTAINER_INTERPRETER, 0o755)
    hosts = {name: dict(vars_, ansible_connection="local", ansible_python_interpreter=sys.executable)
             for name, vars_ in HOSTS.items()}
    hosts["stopped-twin"] = {"ansible_connection": "local", "ansible_python_interpreter": str(interpreter)}
    hosts["ghost"] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": closed_port()}
    write(root / "hosts.yml", json.dumps({"all": {"hosts": hosts}}))
    write(root / "vault.yml", "fleet_token: %s\n" % vaulted("s3cret-token", "fleet", "fleet-password"))
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def recorded_argv(tmp_path, monkeypatch):
    """ansible-playbook behind a wrapper that records its arguments, one per line."""
    record = tmp_path / "argv.txt"
    wrapper = write(tmp_path / "bin" / "ansible-playbook", '#!/bin/sh\nprintf "%%s\\n" "$@" > %s\nexec %s "$@"\n'
                    % (record, ansible_setup.ansible_playbook()), 0o755)
    monkeypatch.setattr(ansible_setup, "ansible_playbook", lambda: str(wrapper))
    return record


@pytest.fixture
def stderr_lines(monkeypatch):
    """What the audit prints on stderr, with the moment each line came."""
    lines = []
    monkeypatch.setattr(audit, "stderr_line", lambda text: lines.append((time.monotonic(), text)))
    return lines


def test_fleet_audit_from_an_operator_directory(site, recorded_argv, stderr_lines, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(audit.getpass, "getpass", lambda prompt: asked.append(prompt) or "fleet-password")
    started = time.time()
    code = cli.main(["audit", "-i", "hosts.yml", "-e", "@vault.yml", "-f", "10", "-u", "fleetops",
                     "--private-key", "keys/id_fleet", "--vault-id", "fleet@prompt", "-vv",
                     "--json", "--prometheus", "reports/edgetune.prom", "--junit", "reports/drift.xml"])
    finished = time.time()
    out = capsys.readouterr()
    assert code == 3, (out.err, stderr_lines[-10:])  # unreachable devices: 3, before the drift's 1
    report = json.loads(out.out)  # stdout is the JSON document and nothing else
    hosts = report["hosts"]
    assert {h: e["status"] for h, e in hosts.items()} == {
        "fast-ok": "ok", "slow-ok": "ok", "drifted-1": "drifted", "pending-1": "pending-reboot",
        "checkerr-1": "error", "badboard-1": "error", "stopped-twin": "unreachable", "ghost": "unreachable"}

    # The causes, each from where Ansible put it.
    assert hosts["stopped-twin"]["cause"] == "Error response from daemon: container stopped-twin is not running"
    assert hosts["ghost"]["cause"].startswith("Failed to connect to the host via ssh: ")
    assert hosts["ghost"]["cause"].endswith("Connection refused")
    assert hosts["badboard-1"]["cause"] == "Check the board: unsupported board: unknown compatible acme,board"
    assert hosts["drifted-1"]["cause"] == "drifted: cpufreq policy4 governor, IRQ affinity"
    assert hosts["pending-1"]["cause"] == "pending reboot: kernel boot arguments"
    assert hosts["checkerr-1"]["cause"] == "could not check sysctl kernel.sched_rt_runtime_us: OSError: [Errno 5]"
    # The vaulted variable was decrypted with the password asked here and given to Ansible's prompt.
    assert asked == ["Vault password (fleet): "]
    assert next(r for r in hosts["fast-ok"]["results"] if r["setting"] == "vault")["detail"] == "s3cret-token"

    # The command line as the operator would type it, relative paths kept.
    argv = recorded_argv.read_text().splitlines()
    assert argv == ["-i", "hosts.yml", "-e", "@vault.yml", "--forks", "10", "--user", "fleetops",
                    "--private-key", "keys/id_fleet", "--vault-id", "fleet@prompt", "-vv", "edgetune.fleet.audit"]
    # Ansible itself says which config it read: the operator's, not the checkout's.
    said = [text for _when, text in stderr_lines]
    assert any("Using %s as config file" % (site / "ansible.cfg") in text for text in said), said[:5]

    # One progress line per device, each as its result arrived: the fast devices well before the slow one.
    progress = {}
    for moment, text in stderr_lines:
        name = text.split(" ", 1)[0]
        if name in hosts and re.match(r"^%s +%s +[\d.]+ s" % (re.escape(name), hosts[name]["status"]), text):
            progress.setdefault(name, []).append(moment)
    assert {name: len(moments) for name, moments in progress.items()} == {name: 1 for name in hosts}
    assert progress["slow-ok"][0] - progress["fast-ok"][0] > SLOW_SECONDS / 2
    assert hosts["slow-ok"]["seconds"] >= SLOW_SECONDS > hosts["fast-ok"]["seconds"]

    # The reports, at paths relative to where edgetune ran.
    families = parse_prometheus((site / "reports" / "edgetune.prom").read_text())
    # 1 for a device that answered (its audit may still have found an error), 0 for one that did not.
    assert families["edgetune_device_audited"] == {
        (("host", h), ("status", e["status"])): 0.0 if h in ("badboard-1", "stopped-twin", "ghost") else 1.0
        for h, e in hosts.items()}
    assert families["edgetune_drift"][(("host", "drifted-1"), ("role", "edge_test"),
                                       ("setting", "IRQ affinity"), ("state", "drifted"))] == 1.0
    # What the alert rules read (extras/prometheus): unreachable devices, checks that could not run,
    # a failed device audit counting 1, reboots pending.
    assert {labels[0][1] for labels, value in families["edgetune_device_unreachable"].items() if value} == {
        "stopped-twin", "ghost"}
    assert {labels[0][1]: value for labels, value in families["edgetune_audit_errors"].items() if value} == {
        "checkerr-1": 1.0, "badboard-1": 1.0}
    assert {labels[0][1] for labels, value in families["edgetune_reboot_pending"].items() if value} == {"pending-1"}
    # checkerr-1's status is error, yet one of its settings did drift: the gauge says so.
    assert {labels[0][1] for labels, value in families["edgetune_device_drifted"].items() if value} == {
        "drifted-1", "checkerr-1"}
    durations = families["edgetune_audit_duration_seconds"]
    assert durations[(("host", "slow-ok"),)] >= SLOW_SECONDS
    assert started <= families["edgetune_audit_last_run_timestamp_seconds"][()] <= finished
    suite = ET.parse(str(site / "reports" / "drift.xml")).getroot()
    assert (suite.get("failures"), suite.get("errors")) == ("3", "4")  # 3 drifts; 1 check error + 3 devices


def test_ctrl_c_stops_ansible_and_its_workers(site):
    """Ansible's workers run in sessions of their own: stopping only ansible-playbook would leave
    them running their module; it is asked to stop (SIGTERM), so it stops them too."""
    hosts = json.loads((site / "hosts.yml").read_text())
    hosts["all"]["hosts"]["slow-ok"]["fake_sleep"] = 60
    write(site / "hosts.yml", json.dumps(hosts))

    def module_processes():
        return [pid for pid in os.listdir("/proc")
                if pid.isdigit() and str(site / "remote-tmp").encode() in read_bytes("/proc/%s/cmdline" % pid)]

    def press_ctrl_c_once_the_module_runs():
        # Only while the run is under way: a SIGINT after it would stop pytest itself.
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not module_processes():
            time.sleep(0.2)
        if module_processes():
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c_once_the_module_runs, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(Interrupted, match="audit interrupted: ansible-playbook stopped, no report written"):
        audit.run_audit(ansible_options.Options(inventory=["hosts.yml"], limit="slow-ok",
                                                extra_vars=["fleet_token=t"]))
    assert time.monotonic() - started < 50
    time.sleep(1)
    assert not module_processes(), "processes left running the module"


def read_bytes(path):
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def parse_prometheus(text):
    """{family: {sorted labels: value}} with the Python client's parser, checking each family comes once."""
    from prometheus_client.parser import text_string_to_metric_families
    families = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, "family %s split in two" % family.name
        families[family.name] = {tuple(sorted(s.labels.items())): s.value for s in family.samples}
    return families


@pytest.fixture
def audited_hosts():
    return {
        'odd "host"\\1': {"status": "drifted", "cause": "drifted: x", "seconds": 1.5,
                          "results": [result('quoted "setting"\nsecond line', "drifted"), result("b", "ok")]},
        "gone": {"status": "unreachable", "cause": "Connection refused", "seconds": 0.2, "results": []},
        "fine": {"status": "ok", "cause": "", "seconds": 2.0, "results": [result("b", "ok")]},
    }


def test_prometheus_file_groups_each_family_and_round_trips_labels(audited_hosts):
    from edgetune import audit_report
    text = audit_report.prometheus(audited_hosts, finished_at=1700000000.5)
    families = parse_prometheus(text)
    assert sorted(families) == ["edgetune_audit_duration_seconds", "edgetune_audit_errors",
                                "edgetune_audit_last_run_timestamp_seconds", "edgetune_device_audited",
                                "edgetune_device_drifted", "edgetune_device_unreachable", "edgetune_drift",
                                "edgetune_drift_findings", "edgetune_reboot_pending"]
    assert families["edgetune_device_audited"] == {
        (("host", 'odd "host"\\1'), ("status", "drifted")): 1.0,
        (("host", "gone"), ("status", "unreachable")): 0.0, (("host", "fine"), ("status", "ok")): 1.0}
    assert families["edgetune_drift"][(("host", 'odd "host"\\1'), ("role", "edge_test"),
                                       ("setting", 'quoted "setting"\nsecond line'), ("state", "drifted"))] == 1.0
    assert len(families["edgetune_drift"]) == 3
    assert families["edgetune_audit_duration_seconds"] == {
        (("host", 'odd "host"\\1'),): 1.5, (("host", "gone"),): 0.2, (("host", "fine"),): 2.0}
    assert families["edgetune_audit_last_run_timestamp_seconds"] == {(): 1700000000.5}
    # The device-level gauges of the devices that answered; the unreachable one only in its own gauge.
    assert families["edgetune_device_drifted"] == {(("host", 'odd "host"\\1'),): 1.0, (("host", "fine"),): 0.0}
    assert families["edgetune_drift_findings"] == {(("host", 'odd "host"\\1'), ("role", "edge_test")): 1.0,
                                                   (("host", "fine"), ("role", "edge_test")): 0.0}
    assert families["edgetune_device_unreachable"] == {
        (("host", 'odd "host"\\1'),): 0.0, (("host", "gone"),): 1.0, (("host", "fine"),): 0.0}
    # Each family's samples come together, none interleaved with another's.
    names = [line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert [name for name, _group in itertools.groupby(names)] == list(dict.fromkeys(names))


def test_prometheus_file_passes_the_openmetrics_parser(audited_hosts):
    """The file is Prometheus text format (what node_exporter's textfile collector reads), which
    OpenMetrics extends with a closing `# EOF`; with it, the strict parser must accept the file
    (it refused the interleaved one with "Clashing name")."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    from edgetune import audit_report
    text = audit_report.prometheus(audited_hosts, finished_at=1700000000.5)
    names = {f.name: len(f.samples) for f in text_string_to_metric_families(text + "# EOF\n")}
    assert names == {"edgetune_device_audited": 3, "edgetune_drift": 3, "edgetune_audit_duration_seconds": 3,
                     "edgetune_audit_last_run_timestamp_seconds": 1, "edgetune_device_drifted": 2,
                     "edgetune_drift_findings": 2, "edgetune_reboot_pending": 2, "edgetune_audit_errors": 2,
                     "edgetune_device_unreachable": 3}


def test_prometheus_file_passes_promtool(audited_hosts, tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool is not on PATH (Debian: apt-get install prometheus): not checked with it")
    from edgetune import audit_report
    checked = subprocess.run([promtool, "check", "metrics"], input=audit_report.prometheus(audited_hosts, 1.0),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert checked.returncode == 0, checked.stdout


def test_table_lists_ok_settings_only_with_all(audited_hosts):
    from edgetune import audit_report
    short = audit_report.table(audited_hosts)
    assert "GONE" not in short and "gone                         UNREACHABLE: Connection refused" in short
    assert not re.search(r"^\s+ok\s", short, re.M)
    assert re.search(r"^\s+ok\s+b\s*$", audit_report.table(audited_hosts, show_ok=True), re.M)
    assert short.splitlines()[-1] == "fleet: 3 device(s): 1 drifted, 1 ok, 1 unreachable"


# ---------------------------------------------------------------- which config, which collection
def test_config_search_follows_ansible(site, clean_ansible_env, tmp_path, monkeypatch):
    assert ansible_setup.config_in_effect().path == str(site / "ansible.cfg")  # ./ansible.cfg
    elsewhere = write(tmp_path / "ops" / "ansible.cfg", "[defaults]\ncollections_path = /opt/ops/collections\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(elsewhere))  # ANSIBLE_CONFIG beats ./ansible.cfg
    assert ansible_setup.config_in_effect().path == str(elsewhere)
    monkeypatch.delenv("ANSIBLE_CONFIG")
    monkeypatch.chdir(tmp_path / "ops" / "..")
    user_config = write(clean_ansible_env / ".ansible.cfg", "[defaults]\nforks = 3\n")
    assert ansible_setup.config_in_effect().path == str(user_config)  # then ~/.ansible.cfg


def test_a_config_without_the_collection_is_one_line_naming_where_ansible_looks(
        clean_ansible_env, tmp_path, monkeypatch):
    """No fallback to a checkout: the collection Ansible finds from here, or one line saying how to install it."""
    ops = tmp_path / "ops"
    write(ops / "ansible.cfg", "[defaults]\ncollections_path = ./mine:/opt/ops/collections\n"
                               "[ssh_connection]\nssh_args = -o ProxyJump=bastion\n")
    monkeypatch.chdir(ops)
    config = ansible_setup.config_in_effect()
    with pytest.raises(UsageError) as error:
        ansible_setup.collection_playbook(config, "audit")
    assert str(error.value) == (
        "the collection edgetune.fleet is not installed where %s looks (%s:/opt/ops/collections): %s"
        % (ops / "ansible.cfg", ops / "mine", ansible_setup.INSTALL_HINT))


def test_inside_the_checkout_its_own_config_finds_the_collection(clean_ansible_env, monkeypatch):
    monkeypatch.chdir(REPO)
    config = ansible_setup.config_in_effect()
    assert config.path == str(REPO / "ansible.cfg")
    assert ansible_setup.collection_playbook(config, "audit") == (
        "edgetune.fleet.audit", {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")})


def test_runner_keeps_the_operators_host_key_checking_and_callbacks(site):
    config = ansible_setup.config_in_effect()
    env = audit.runner_environment(config, {})
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"  # ansible-runner would set False
    assert env["ANSIBLE_CALLBACK_PLUGINS"].split(os.pathsep) == config.callback_paths
    assert str(Path(os.environ["HOME"]) / ".ansible" / "plugins" / "callback") in config.callback_paths


# ---------------------------------------------------------------- classification
def test_failure_cause_names_the_real_cause():
    assert audit.failure_cause({"msg": "Module result deserialization failed: No start of json char found",
                                "module_stderr": "\nShared connection to 10.0.0.5 closed.\n"
                                                 "Error response from daemon: container t1 is not running\n"}) == \
        "Error response from daemon: container t1 is not running"
    assert audit.failure_cause({"msg": "MODULE FAILURE", "module_stderr": "Traceback (most recent call last):\n"
                                "  File \"x\", line 1\nModuleNotFoundError: No module named 'apt'\n"}) == \
        "ModuleNotFoundError: No module named 'apt'"
    assert audit.failure_cause({"msg": "non-zero return code", "stderr": "nvpmodel: mode 9 unknown\n"}) == \
        "non-zero return code: nvpmodel: mode 9 unknown"
    assert audit.failure_cause({"msg": "Task failed: Failed to connect to the host via ssh: timed out"}) == \
        "Failed to connect to the host via ssh: timed out"
    assert audit.failure_cause({}) == "no message"


@pytest.mark.parametrize("res, gone", [
    ({"unreachable": True, "msg": "anything"}, True),
    ({"msg": "MODULE FAILURE", "module_stderr": "Error response from daemon: No such container: t1"}, True),
    ({"msg": "MODULE FAILURE", "module_stderr": "ssh: connect to host b port 22: Connection timed out"}, True),
    ({"msg": "MODULE FAILURE", "module_stderr": "Killed"}, False),
    # A module's own failure that happens to say "timed out" is the module's, not the connection's.
    ({"msg": "runtime not ready: Connection refused on 127.0.0.1:8470"}, False),
])
def test_connection_failures_are_told_from_module_failures(res, gone):
    assert audit.is_connection_failure(res) is gone


# ---------------------------------------------------------------- options
def test_verbosity_and_all_are_separate_options():
    args = cli.build_parser().parse_args(["audit", "-vvv", "--all", "--vault-id", "a@prompt", "--vault-id", "b@f"])
    assert (args.verbose, args.all, args.vault_id) == (3, True, ["a@prompt", "b@f"])
    options = ansible_options.Options.from_args(args)
    assert options.playbook_argv("ap", "pb")[-2:] == ["-vvv", "pb"]


def test_password_options_answer_ansibles_own_prompts():
    """-k, -K, -J and prompted vault ids are asked here once, and answer Ansible's own prompts (Ansible 2.19's
    wording: lib/ansible/cli/__init__.py, ask_passwords and the vault secret prompts)."""
    options = ansible_options.Options(ask_pass=True, ask_become_pass=True, ask_vault_pass=True,
                                      vault_id=["prompt", "ops@prompt", "ci@/etc/ci.pw"])
    answers = audit.prompt_answers(options, ask=lambda prompt: "pw for " + prompt)
    patterns = {re.compile(p, re.M): answer for p, answer in answers.items()}
    for prompt, asked in (("SSH password: ", "SSH password: "),
                          ("BECOME password[defaults to SSH password]: ", "BECOME password: "),
                          ("Vault password: ", "Vault password: "),
                          ("Vault password (default): ", "Vault password (default): "),
                          ("Vault password (ops): ", "Vault password (ops): ")):
        assert [answer for p, answer in patterns.items() if p.search(prompt)] == ["pw for " + asked], prompt
    assert len(answers) == 5  # a password file is Ansible's to read, not a prompt


def test_bad_forks_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["audit", "-f", "0"])
    assert exit_.value.code == 2 and "must be a whole number of at least 1" in capsys.readouterr().err


def test_version_names_the_package_and_the_collection(capsys, monkeypatch):
    import yaml
    monkeypatch.setenv("COLUMNS", "40")  # one line however narrow the terminal and long the path
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    collection = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    from ansible.release import __version__ as core
    assert capsys.readouterr().out.strip() == (
        "edgetune %s, ansible-core %s, collection edgetune.fleet %s (galaxy.yml of %s)" % (
            __version__, core, collection, REPO))


def test_no_hosts_is_one_line_with_the_config_named(site, capsys):
    write(site / "empty.yml", "all:\n  hosts: {}\n")
    assert cli.main(["audit", "-i", "empty.yml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "edgetune: error: no hosts matched with %s; check -i and --limit" % (site / "ansible.cfg")


def test_ansible_refusing_to_start_is_one_line_with_its_reason(site, capsys):
    assert cli.main(["audit", "-i", "hosts.yml", "-l", "no-such-host"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("edgetune: error: ansible-playbook stopped before any device: ")
    assert "no hosts to target" in err[-1] and not any(line.startswith("Traceback") for line in err)


def test_an_audit_run_inside_ansible_runner_ignores_the_outer_runners_callback(site, monkeypatch):
    """AWX and `ansible-navigator exec` run edgetune inside ansible-runner, whose stdout callback
    (awx_display, with its plugin directory) the environment carries: the audit's own runner sets its own."""
    import ansible_runner
    outer = Path(ansible_runner.__file__).parent / "display_callback" / "callback"
    monkeypatch.setenv("ANSIBLE_STDOUT_CALLBACK", "awx_display")
    monkeypatch.setenv("ANSIBLE_CALLBACK_PLUGINS", str(outer))
    hosts = audit.run_audit(ansible_options.Options(inventory=["hosts.yml"], limit="fast-ok",
                                                    extra_vars=["fleet_token=t"]))
    assert hosts["fast-ok"]["status"] == "ok", hosts
    assert os.environ["ANSIBLE_STDOUT_CALLBACK"] == "awx_display"  # the caller's environment as it was
