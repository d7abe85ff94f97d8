"""`edgetune audit`: which device drifted, and how.

Runs the collection's audit playbook (edgetune.fleet.audit: the roles render
their desired state on the controller, one edge_audit call per device compares
it with the device) as `ansible-playbook` would from the current directory
(edgetune.ansible_setup), follows it through ansible-runner's event stream,
prints one line per device as its result arrives, and writes the reports
(edgetune.audit_report).

A device is ok, drifted, pending-reboot, unreachable or error, with the cause.
Exit codes: 0 every device ok or pending-reboot, 1 a device drifted or in error, 2 usage or
environment, 3 a device unreachable, 130 interrupted.
"""
import collections
import contextlib
import datetime
import getpass
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

from edgetune import ansible_options, ansible_setup, audit_report, outputs
from edgetune.errors import Interrupted, UsageError, require_module

AUDIT_TASK = "Audit the managed settings"
# A failed task whose connection failed, not its module: docker's exec on a
# stopped twin, ssh losing the device. Ansible reports these as module failures
# ("Module result deserialization failed"); the cause is in module_stderr.
CONNECTION_GONE = re.compile(
    r"is not running|No such container|Connection refused|Connection timed out|Operation timed out"
    r"|No route to host|Connection reset|Connection closed|Could not resolve hostname|Broken pipe",
    re.IGNORECASE)
# Lines that say nothing about why a task failed.
NOISE = re.compile(r"^(Shared connection to \S+ closed\.|Warning: Permanently added .*)$")
# Ansible's messages for a module that returned no result: its stderr says why.
NO_RESULT_MESSAGES = ("MODULE FAILURE", "Module result deserialization failed")
CAUSE_CHARS = 300


def prompt_answers(options, ask=None):
    """{prompt pattern: password}. Ansible asks on its terminal, which ansible-runner holds: the
    passwords are asked here first, and runner answers Ansible's own prompts with them."""
    ask = ask or getpass.getpass
    answers = {}
    if options.ask_pass:
        answers[r"^SSH password:\s*?$"] = ask("SSH password: ")
    if options.ask_become_pass:
        # BECOME, or the become method's name where agnostic_become_prompt is off (SUDO, ...)
        answers[r"^(?!SSH )[A-Z][A-Z0-9_]* password(\[defaults to SSH password\])?:\s*?$"] = ask("BECOME password: ")
    if options.ask_vault_pass:
        answers[r"^Vault password:\s*?$"] = ask("Vault password: ")
    for vault_id in options.vault_id:
        label, _, source = vault_id.rpartition("@")
        if source == "prompt":
            label = label or "default"
            answers[r"^Vault password \(%s\):\s*?$" % re.escape(label)] = ask("Vault password (%s): " % label)
    return answers


# ---------------------------------------------------------------- classification
def meaningful_line(text):
    """The line that says why: the first one, or a Python traceback's last."""
    lines = [line.strip() for line in (text or "").splitlines()]
    lines = [line for line in lines if line and not NOISE.match(line)]
    if not lines:
        return ""
    if lines[0].startswith("Traceback (most recent call last)"):
        return lines[-1]
    return lines[0]


def failure_cause(res):
    """Why a task failed or a device did not answer, in one line."""
    message = meaningful_line(res.get("msg", ""))
    if message.startswith("Task failed: "):  # ansible-core 2.19's prefix: the status says so already
        message = message[len("Task failed: "):]
    stderr = meaningful_line(res.get("module_stderr")) or meaningful_line(res.get("stderr"))
    if stderr and (not message or message.startswith(NO_RESULT_MESSAGES)):
        message = stderr
    elif stderr and message.startswith("non-zero return code"):  # a command's own error comes after
        message = "%s: %s" % (message, stderr)
    return (message or "no message")[:CAUSE_CHARS]


def is_connection_failure(res):
    """A module failure (no result from the module) whose text says the connection or container is gone."""
    if res.get("unreachable"):
        return True
    if "module_stderr" not in res and "Failed to connect" not in str(res.get("msg", "")):
        return False
    return bool(CONNECTION_GONE.search("%s\n%s" % (res.get("module_stderr", ""), res.get("msg", ""))))


def listed(settings, shown=3):
    more = len(settings) - shown
    return ", ".join(settings[:shown]) + (" and %d more" % more if more > 0 else "")


def audited_status(results):
    """(status, cause) of a device from its audit results: a setting that could not be read
    leaves the audit incomplete (error), before drift, before a pending reboot."""
    errors = [r for r in results if r["state"] == "error"]
    if errors:
        return "error", "could not check %s: %s" % (listed([r["setting"] for r in errors]),
                                                       errors[0].get("detail", ""))
    for state in ("drifted", "pending-reboot"):
        settings = [r["setting"] for r in results if r["state"] == state]
        if settings:
            return state, "%s: %s" % (state.replace("-", " "), listed(settings))
    return "ok", ""


class AuditEvents:
    """ansible-runner's events folded into one entry per device; ``on_device(host, entry)`` is
    called as soon as a device's status is known (again if a later result changes it)."""

    def __init__(self, on_device=None, on_output=None):
        self.hosts = {}
        self.output_tail = collections.deque(maxlen=4)
        self._first_task = {}
        self._on_device = on_device
        self._on_output = on_output

    def __call__(self, event):
        text = event.get("stdout")
        if text:
            self.output_tail.extend(line for line in text.splitlines() if line.strip())
            if self._on_output:
                self._on_output(text)
        handler = getattr(self, "_on_" + event.get("event", ""), None)
        if handler:
            handler(event.get("event_data", {}), datetime.datetime.fromisoformat(event["created"]))
        return False  # nothing for runner to keep: its artifacts directory is thrown away

    def _on_runner_on_start(self, data, when):
        self._first_task.setdefault(data["host"], when)

    def _on_runner_on_ok(self, data, when):
        results = data.get("res", {}).get("results")
        if data.get("task") == AUDIT_TASK and isinstance(results, list):
            status, cause = audited_status(results)
            self._decide(data["host"], status, cause, results, when)

    def _on_runner_on_unreachable(self, data, when):
        self._decide(data["host"], "unreachable", failure_cause(data.get("res", {})), [], when)

    def _on_runner_on_failed(self, data, when):
        if data.get("ignore_errors"):
            return
        res = data.get("res", {})
        if is_connection_failure(res):
            self._decide(data["host"], "unreachable", failure_cause(res), [], when)
        else:
            self._decide(data["host"], "error", "%s: %s" % (data.get("task", "?"), failure_cause(res)), [], when)

    def _on_playbook_on_stats(self, data, when):
        seen = set()
        for counts in ("processed", "dark", "failures"):
            seen.update(data.get(counts) or {})
        for host in sorted(seen - set(self.hosts)):
            self._decide(host, "error", "no audit result: the run stopped before this device's audit "
                                        "(see the other devices' errors)", [], when)

    def _decide(self, host, status, cause, results, when):
        first = self._first_task.get(host, when)
        self.hosts[host] = {"status": status, "cause": cause, "results": results,
                            "seconds": round((when - first).total_seconds(), 3)}
        if self._on_device:
            self._on_device(host, self.hosts[host])


class Interruption:
    """Ctrl-C reaches only this process (runner gives ansible-playbook a terminal of its own).
    The first asks ansible-playbook to stop (SIGTERM, which it passes on to its workers: they
    run in sessions of their own); a second has runner kill it."""

    def __init__(self):
        self.count = 0
        self._previous = None
        # Signals are the main thread's: a caller running audits in threads handles them itself.
        self._installed = threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self._installed:
            self._previous = signal.signal(signal.SIGINT, self._interrupted)
        return self

    def __exit__(self, *exc):
        if self._installed:
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous is None else self._previous)

    def _interrupted(self, signum, frame):
        self.count += 1
        if self.count == 1:
            subprocess.run(["pkill", "-TERM", "-P", str(os.getpid())], check=False)  # our children only

    def kill_now(self):
        return self.count > 1


def runner_environment(config, playbook_env):
    env = dict(playbook_env, EDGETUNE_NO_SUMMARY="1", ANSIBLE_NOCOLOR="1")
    # ansible-runner turns host key checking off unless told, and replaces the
    # callback path with its own unless given one to add to: keep the operator's.
    env["ANSIBLE_HOST_KEY_CHECKING"] = str(config.host_key_checking)
    env["ANSIBLE_CALLBACK_PLUGINS"] = os.pathsep.join(config.callback_paths)
    return env


def prepare(options):
    """(the config in effect, ansible-playbook's argv, its environment additions), refusing bad input
    in one line before any device is touched."""
    config = ansible_setup.config_in_effect()
    options.check(config.inventories)
    playbook, playbook_env = ansible_setup.collection_playbook(config, "audit")
    return config, options.playbook_argv(ansible_setup.ansible_playbook(), playbook), playbook_env


@contextlib.contextmanager
def no_outer_runner_callback():
    """Run inside ansible-runner (AWX, `ansible-navigator exec`), edgetune inherits that runner's stdout
    callback (awx_display), which its own runner would load beside its own and fail ("has no attribute
    'CallbackModule'"): this run's runner sets its own, so the inherited one is left out meanwhile."""
    inherited = os.environ.pop("ANSIBLE_STDOUT_CALLBACK", None)
    try:
        yield
    finally:
        if inherited is not None:
            os.environ["ANSIBLE_STDOUT_CALLBACK"] = inherited


def run_audit(options, on_device=None, on_output=None, say=None):
    """Run the audit playbook; returns {host: entry} (see AuditEvents). ``options``:
    edgetune.ansible_options.Options."""
    ansible_runner = require_module("ansible_runner", "edgetune audit")
    config, argv, playbook_env = prepare(options)
    if say:
        say("audit with %s: %s" % (config.describe(), shlex.join(argv)))
    events = AuditEvents(on_device, on_output)
    passwords = prompt_answers(options)  # asked before Ctrl-C is taken over below
    with Interruption() as interruption, tempfile.TemporaryDirectory(prefix="edgetune-audit-") as private_dir, \
            no_outer_runner_callback():
        runner = ansible_runner.run(
            private_data_dir=private_dir, project_dir=os.getcwd(),  # the child runs where we run
            binary=argv[0], cmdline=shlex.join(argv[1:]),
            envvars=runner_environment(config, playbook_env), passwords=passwords,
            event_handler=events, cancel_callback=interruption.kill_now, quiet=True,
            suppress_env_files=True,  # runner would write the vault passwords to its env/ directory
            settings={"suppress_output_file": True, "pexpect_timeout": 1})
    if interruption.count:
        raise Interrupted("audit interrupted: ansible-playbook stopped, no report written")
    if not events.hosts:
        if runner.rc:
            raise UsageError("ansible-playbook stopped before any device: %s" % " | ".join(events.output_tail))
        raise UsageError("no hosts matched with %s; check -i and --limit" % config.describe())
    return events.hosts


def progress_line(host, entry):
    return ("%-28s %-14s %6.1f s  %s" % (host, entry["status"], entry["seconds"], entry["cause"])).rstrip()


def stderr_line(text):
    print(text, file=sys.stderr, flush=True)


def cmd_audit(args):
    # Reports are written, and relative paths resolved, where edgetune was started; one that
    # cannot be written is said now, before any device is touched.
    reports = [("--junit", args.junit), ("--prometheus", args.prometheus)]
    outputs.check(files=reports)
    started = time.time()
    hosts = run_audit(ansible_options.Options.from_args(args),
                      on_device=lambda host, entry: stderr_line(progress_line(host, entry)),
                      on_output=(lambda text: stderr_line(text.rstrip("\n"))) if args.verbose else None,
                      say=lambda message: stderr_line("edgetune: " + message))
    finished = time.time()
    seconds = finished - started
    texts = {"--junit": lambda: audit_report.junit(hosts, seconds),
             "--prometheus": lambda: audit_report.prometheus(hosts, finished)}
    reports = [(option, path, texts[option]()) for option, path in reports if path]
    # The report first: a file that cannot be written after all (exit 2) cannot take it away.
    if args.json:
        print(json.dumps({"hosts": hosts, "summary": audit_report.summary(hosts), "seconds": round(seconds, 1)},
                         indent=2))
    else:
        print(audit_report.table(hosts, args.all))
        stderr_line("audit took %.1f s" % seconds)
    sys.stdout.flush()
    for option, path, text in reports:
        audit_report.write_atomically(path, text, option)
    return audit_report.exit_code(hosts)


def add_parser(subparsers):
    p = subparsers.add_parser(
        "audit", help="drift audit of the fleet (desired vs persisted vs running)",
        description="Runs the collection's audit playbook as ansible-playbook would from the current "
                    "directory: the ansible.cfg Ansible finds (ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, "
                    "/etc/ansible/ansible.cfg), paths relative to here. Progress (one line per device) "
                    "goes to stderr, the report to stdout.")
    ansible_options.add_to(p)
    p.add_argument("--all", action="store_true", help="list the settings that are ok too")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML for CI")
    p.add_argument("--prometheus", metavar="FILE", help="also write a node_exporter textfile")
    p.set_defaults(func=cmd_audit)
