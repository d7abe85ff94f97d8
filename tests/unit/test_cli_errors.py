"""`edgetune`'s errors: one line on stderr, the documented exit code, never a traceback, and nothing
touched before the line (edgetune.errors: 0 clean, 1 findings, 2 usage, bad input or output that
cannot be written, 3 unreachable devices, 130 interrupted).

Each case runs the console script of this environment as a user would, from a directory of its own
with its own ansible.cfg (the collection from this checkout's committed link) and inventory, whose one
device listens nowhere (SSH to a closed port on loopback).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.controller

ROOT = Path(__file__).resolve().parents[2]
EDGETUNE = Path(sys.executable).parent / "edgetune"
DEVICE_COMMANDS = (["audit"], ["plan"], ["verify", "-l", "all"], ["tune", "runtime", "-l", "all"])


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def site(tmp_path):
    """An operator's directory: ansible.cfg, an inventory of one unreachable device, a HOME of its own."""
    root = tmp_path / "site"
    (root / "home").mkdir(parents=True)
    (root / "ansible.cfg").write_text("[defaults]\ninventory = hosts.yml\ncollections_path = %s\n"
                                      "host_key_checking = False\n" % (ROOT / "collections"))
    (root / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"ghost": {
        "ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": closed_port(),
        "ansible_user": "nobody"}}}}))
    return root


def environment(root, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_", "EDGETUNE_"))}
    env.update(HOME=str(root / "home"), ANSIBLE_NOCOLOR="1", **extra)
    return env


def edgetune(root, *args, env=None, stdout=subprocess.PIPE, timeout=120):
    return subprocess.run([str(EDGETUNE)] + list(args), cwd=str(root), env=env or environment(root),
                          stdout=stdout, stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout,
                          check=False)


def one_line(done, code, *words):
    """The run ended with exit ``code`` and one line on stderr holding each of ``words``."""
    lines = done.stderr.splitlines()
    assert done.returncode == code, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- help and version, no collection
@pytest.mark.parametrize("command", [
    "--help", "audit --help", "plan --help", "verify --help", "tune --help", "tune runtime --help",
    "pcie --help", "pcie show --help", "bpf --help"])
def test_every_help_works_without_the_collection(tmp_path, command):
    (tmp_path / "home").mkdir()
    done = edgetune(tmp_path, *command.split(), env=environment(tmp_path, ANSIBLE_COLLECTIONS_PATH=str(tmp_path)))
    assert done.returncode == 0 and done.stdout.startswith("usage: edgetune"), done.stderr
    assert done.stderr == ""


def test_help_documents_the_exit_codes(tmp_path):
    (tmp_path / "home").mkdir()
    done = edgetune(tmp_path, "--help")
    assert "exit codes: 0 clean, 1 findings" in " ".join(done.stdout.split())
    assert "3 unreachable devices, 130 interrupted" in " ".join(done.stdout.split())


def test_version_without_the_collection_says_how_to_install_it(tmp_path):
    (tmp_path / "home").mkdir()
    done = edgetune(tmp_path, "--version", env=environment(tmp_path, ANSIBLE_COLLECTIONS_PATH=str(tmp_path)))
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr
    from ansible.release import __version__ as core

    from edgetune import COLLECTION_VERSION, __version__
    assert done.stdout.startswith("edgetune %s, ansible-core %s, collection edgetune.fleet not found"
                                  % (__version__, core))
    assert "ansible-galaxy collection install edgetune-fleet-%s.tar.gz" % COLLECTION_VERSION in done.stdout


def test_bpf_without_the_collection_says_so_in_one_line(tmp_path):
    (tmp_path / "home").mkdir()
    done = edgetune(tmp_path, "bpf", "status", env=environment(tmp_path, ANSIBLE_COLLECTIONS_PATH=str(tmp_path)))
    one_line(done, 2, "the collection edgetune.fleet is not installed where", "ansible-galaxy collection install")


# ---------------------------------------------------------------- output that cannot be written
@pytest.mark.parametrize("command", [["--version"], ["--help"], ["plan", "--help"]])
def test_output_to_a_full_disk_is_one_line_and_exit_2(site, command):
    with open("/dev/full", "w") as full:
        done = edgetune(site, *command, stdout=full)
    one_line(done, 2, "the output was not written to standard output: No space left on device")


@pytest.mark.parametrize("command", [["--version"], ["--help"], ["audit", "--help"]])
def test_a_pipe_closed_early_is_one_line_and_exit_2(site, command):
    reader = subprocess.Popen(["head", "-c0"], stdin=subprocess.PIPE)
    reader.wait()  # closed before edgetune writes a byte
    try:
        done = edgetune(site, *command, stdout=reader.stdin)
    finally:
        reader.stdin.close()
    one_line(done, 2, "the output was not written to standard output: the reader closed it early")


@pytest.mark.parametrize("option, path, why", [
    ("--prometheus", "/proc/edgetune.prom", "no file can be created in /proc"),
    ("--junit", "/etc/hostname/drift.xml", "not a directory"),
    ("--junit", ".", "it is a directory"),
])
def test_a_report_that_cannot_be_written_stops_before_any_device(site, option, path, why):
    started = time.monotonic()
    done = edgetune(site, "audit", option, path)
    one_line(done, 2, "%s %s cannot be written" % (option, path), why)
    assert time.monotonic() - started < 20  # no device was tried (ssh to the closed port would be said)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv, words", [
    (["tune", "runtime", "-l", "all", "--timeout", "-5"], ["--timeout", "must be a whole number of at least 1"]),
    (["tune", "runtime", "-l", "all", "--timeout", "soon"], ["--timeout", "'soon'"]),
    (["audit", "-f", "0"], ["-f/--forks", "must be a whole number of at least 1, not '0'"]),
    (["plan", "--forks", "many"], ["-f/--forks", "'many'"]),
    (["verify"], ["the following arguments are required: -l/--limit"]),
    (["audit", "--no-such-option"], ["unrecognized arguments: --no-such-option"]),
])
def test_bad_arguments_are_one_line_naming_the_option(site, argv, words):
    one_line(edgetune(site, *argv), 2, *words)


@pytest.mark.parametrize("command", DEVICE_COMMANDS)
def test_a_missing_inventory_is_called_missing(site, command):
    one_line(edgetune(site, *command, "-i", "missing.yml"), 2, "-i missing.yml: no such inventory file or directory")


def test_the_config_inventory_missing_is_called_missing_too(site):
    (site / "hosts.yml").unlink()
    one_line(edgetune(site, "audit"), 2, "the inventory %s (ansible.cfg's)" % (site / "hosts.yml"), "no such")


@pytest.mark.parametrize("argv, words", [
    (["--vault-password-file", "nope.txt"], ["--vault-password-file nope.txt: no such file"]),
    (["--vault-id", "ops@nope.txt"], ["--vault-id nope.txt: no such file"]),
    (["-e", "@nope.yml"], ["-e nope.yml: no such file"]),
])
def test_a_missing_file_named_by_an_ansible_option_is_one_line(site, argv, words):
    for command in DEVICE_COMMANDS:
        one_line(edgetune(site, *command, *argv), 2, *words)


def test_verify_refuses_a_password_prompt_it_cannot_answer(site):
    one_line(edgetune(site, "verify", "-l", "all", "-k"), 2, "testinfra, which cannot answer a password prompt")


# ---------------------------------------------------------------- unreachable devices: 3
def test_verify_on_an_unreachable_device_is_one_line_and_exit_3(site, tmp_path):
    junit = tmp_path / "verify.xml"
    done = edgetune(site, "verify", "-l", "all", "--junit", str(junit))
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout and done.stdout == "", done.stdout[-3000:]
    said = [line for line in done.stderr.splitlines() if "ghost" in line]
    assert len(said) == 1 and said[0].startswith("edgetune: ghost: UNREACHABLE: "), done.stderr
    assert len(done.stderr.splitlines()) <= 3, done.stderr  # planning, the device, the time it took
    # CI still gets its report, with the device as an error.
    assert 'name="ghost"' in junit.read_text() and "not verified: unreachable" in junit.read_text()


def test_plan_and_audit_of_an_unreachable_device_exit_3(site):
    done = edgetune(site, "plan")
    assert done.returncode == 3 and "ghost: NOT PLANNED (unreachable)" in done.stdout, done.stderr[-2000:]
    done = edgetune(site, "audit", "--json")
    assert done.returncode == 3, done.stderr[-2000:]
    assert json.loads(done.stdout)["hosts"]["ghost"]["status"] == "unreachable"


def test_callbacks_the_operator_enabled_do_not_break_the_reports(site, tmp_path):
    """profile_tasks and timer, often enabled in an ansible.cfg, print on the stdout that carries the JSON
    report the plan and verify read: the reports come all the same."""
    config = site / "ansible.cfg"
    config.write_text(config.read_text() + "callbacks_enabled = ansible.posix.profile_tasks, ansible.posix.timer\n")
    done = edgetune(site, "plan")
    assert done.returncode == 3 and "ghost: NOT PLANNED (unreachable)" in done.stdout, done.stderr[-2000:]
    done = edgetune(site, "verify", "-l", "all", "--junit", str(tmp_path / "verify.xml"))
    assert done.returncode == 3 and "ghost: UNREACHABLE" in done.stderr, done.stderr[-2000:]
    done = edgetune(site, "audit", "--json")
    assert done.returncode == 3 and json.loads(done.stdout)["hosts"]["ghost"]["status"] == "unreachable"


# ---------------------------------------------------------------- interrupted: 130
CTRL_C_RUNNER = """
import sys
from edgetune import ansible_setup, cli
ansible_setup.ansible_playbook = lambda: sys.argv[1]  # an ansible-playbook that starts, then waits
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("command", DEVICE_COMMANDS)
def test_ctrl_c_exits_130_in_every_device_command(site, tmp_path, command):
    """Ctrl-C (SIGINT to edgetune) while Ansible runs: 130 and one line, in audit, plan, verify and tune alike."""
    started_file = tmp_path / "ansible-playbook.started"
    slow = tmp_path / "ansible-playbook"
    slow.write_text("#!/bin/sh\ntouch %s\nexec sleep 60\n" % started_file)
    slow.chmod(0o755)
    # As from a terminal: SIGINT not ignored (a shell's background job, as CI's, inherits it ignored).
    run = subprocess.Popen([sys.executable, "-c", CTRL_C_RUNNER, str(slow)] + list(command), cwd=str(site),
                           env=environment(site), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not started_file.exists() and run.poll() is None:
        time.sleep(0.05)
    assert started_file.exists(), run.communicate(timeout=60)
    started = time.monotonic()
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert run.returncode == 130, (run.returncode, err[-2000:])
    assert lines and lines[-1].startswith("edgetune: error: ") and "interrupted" in lines[-1], err[-2000:]
    assert "Traceback" not in err and time.monotonic() - started < 20


# ---------------------------------------------------------------- one set of Ansible options
ALL_OPTIONS = ["-i", "a.yml", "-i", "b,", "-l", "orin-fleet", "-e", "x=1", "-e", "@vars.yml", "-f", "7", "-u", "ops",
               "-c", "paramiko", "-k", "--private-key", "id_ops", "-b", "-K", "--become-user", "admin",
               "--vault-id", "ops@prompt", "--vault-password-file", "pw.txt", "--ask-vault-pass", "-vv"]


@pytest.mark.parametrize("command", [["audit"], ["plan"], ["verify"], ["tune", "runtime"]])
def test_every_device_command_takes_ansible_playbooks_options_and_passes_them_on(command):
    from edgetune import ansible_options, cli
    args = cli.build_parser().parse_args(command + ALL_OPTIONS)
    assert ansible_options.Options.from_args(args).argv() == [
        "-i", "a.yml", "-i", "b,", "--limit", "orin-fleet", "-e", "x=1", "-e", "@vars.yml", "--forks", "7",
        "--user", "ops", "--connection", "paramiko", "--private-key", "id_ops", "--become-user", "admin",
        "--ask-pass", "--become", "--ask-become-pass", "--ask-vault-pass", "--vault-id", "ops@prompt",
        "--vault-password-file", "pw.txt", "-vv"]


@pytest.mark.parametrize("command", [["plan", "--json"], ["audit", "--json"]])
def test_a_json_report_to_a_full_disk_ends_with_one_line_and_exit_2(site, command):
    """After Ansible ran (the device unreachable): the report cannot be written, said in the last line."""
    with open("/dev/full", "w") as full:
        done = edgetune(site, *command, stdout=full)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == \
        "edgetune: error: the output was not written to standard output: No space left on device"
