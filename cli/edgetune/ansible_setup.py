"""How Ansible is set up where `edgetune` runs, and how to run the collection's playbooks in it.

The tools run a playbook as the operator's own `ansible-playbook` would from
the current directory: with the ansible.cfg Ansible finds itself
(ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg),
so the operator's ssh_args, ProxyJump, remote_user and inventory apply, and
the collection edgetune.fleet where that setup finds it (an installed copy, or
a checkout's committed collections/ link, which its ansible.cfg names).

Only the standard library and edgetune.errors at the top: `--help` and
`--version` work without ansible-core or the collection.
"""
import importlib
import json
import os
import shutil
import sys
from pathlib import Path

from edgetune.errors import UsageError

NAMESPACE, NAME = "edgetune", "fleet"
MODULE_UTILS = "ansible_collections.%s.%s.plugins.module_utils" % (NAMESPACE, NAME)
INSTALL_HINT = ("install it with `ansible-galaxy collection install edgetune-fleet-VERSION.tar.gz` (the release "
                "tarball), or run edgetune from a checkout of the collection")


class AnsibleConfig:
    """The settings in effect for a run started from the current directory."""

    def __init__(self, path, collections_paths, host_key_checking, callback_paths, inventories=()):
        self.path = path  # None: no ansible.cfg found, Ansible's defaults
        self.collections_paths = collections_paths
        self.inventories = list(inventories)  # its inventory setting, resolved as Ansible resolves it
        self.host_key_checking = host_key_checking
        self.callback_paths = callback_paths

    def describe(self):
        return self.path or "no ansible.cfg (Ansible's defaults)"


# The environment of a run whose stdout is Ansible's JSON report. The operator's enabled callbacks
# (profile_tasks, timer) print on that stdout too: the run enables only the report's own callback (an
# empty list is refused by ansible-core; the stdout callback named again is loaded once).
JSON_REPORT_ENV = {"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
                   "EDGETUNE_NO_SUMMARY": "1", "ANSIBLE_NOCOLOR": "1"}


def config_in_effect():
    """Ansible's own search for ansible.cfg and its reading of it (environment variables included)."""
    try:
        from ansible.config.manager import ConfigManager, find_ini_config_file
    except ImportError:
        raise UsageError("ansible-core is not installed for %s: install edgetune with its dependencies "
                         "(they include the ansible package)" % sys.executable) from None
    path = find_ini_config_file()
    manager = ConfigManager(path)
    # The default callback path is a template over ANSIBLE_HOME, which Ansible renders when it starts.
    home = {"ANSIBLE_HOME": manager.get_config_value("ANSIBLE_HOME")}
    return AnsibleConfig(path=path,
                         collections_paths=list(manager.get_config_value("COLLECTIONS_PATHS", variables=home) or []),
                         host_key_checking=bool(manager.get_config_value("HOST_KEY_CHECKING")),
                         callback_paths=list(manager.get_config_value("DEFAULT_CALLBACK_PLUGIN_PATH",
                                                                      variables=home) or []),
                         inventories=list(manager.get_config_value("DEFAULT_HOST_LIST") or []))


def find_collection(collections_paths):
    """The edgetune.fleet directory the first of these paths holds, or None."""
    for base in collections_paths:
        if not base:
            continue
        candidate = Path(base).expanduser() / "ansible_collections" / NAMESPACE / NAME
        if candidate.is_dir():
            return candidate
    return None


def locate_collection():
    """(the edgetune.fleet directory Ansible finds from here or None, the paths looked in).

    Ansible's configured collections paths (its ansible.cfg from the current
    directory, ANSIBLE_COLLECTIONS_PATH), then its Python's sys.path, as
    Ansible searches. Without ansible-core (or with a config it rejects), the
    environment variable's paths."""
    try:
        paths = config_in_effect().collections_paths
    except Exception:  # noqa: BLE001 -- no ansible-core here (Python 3.8 unit tests), a broken ansible.cfg
        paths = [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p]
    paths = [str(p) for p in paths] + [p for p in sys.path if p and p not in paths]
    return find_collection(paths), paths


def collection_version(path):
    """(version, the file it was read from) of the collection at path: an installed collection's
    MANIFEST.json, a checkout's galaxy.yml; (None, None) when neither says."""
    path = Path(path)
    try:
        manifest = json.loads((path / "MANIFEST.json").read_text())
        return str(manifest["collection_info"]["version"]), "MANIFEST.json"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    import yaml
    try:
        return str(yaml.safe_load((path / "galaxy.yml").read_text())["version"]), "galaxy.yml"
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None, None


def not_installed(config):
    return UsageError("the collection %s.%s is not installed where %s looks (%s): %s"
                      % (NAMESPACE, NAME, config.describe(), os.pathsep.join(config.collections_paths)
                         or "no collections path", INSTALL_HINT))


def collection_playbook(config, playbook):
    """(what to give ansible-playbook, environment additions) to run the collection's playbook
    (e.g. "audit"): its FQCN, with the config Ansible found from here made explicit."""
    if not find_collection(config.collections_paths):
        raise not_installed(config)
    env = {"ANSIBLE_CONFIG": config.path} if config.path else {}
    return "%s.%s.%s" % (NAMESPACE, NAME, playbook), env


def module_utils(name):
    """The collection's module utility ``name`` (e.g. "edge_pcie"), imported as Ansible imports it: by
    Ansible's collection loader, from the collections paths in effect here (set up once per process;
    the loader hooks the import system, sys.path stays as it is)."""
    try:
        from ansible.utils.collection_loader import AnsibleCollectionConfig
    except ImportError:
        AnsibleCollectionConfig = None  # no ansible-core (the Python 3.8 unit run): a plain import
    if AnsibleCollectionConfig is not None and AnsibleCollectionConfig.collection_finder is None:
        config = config_in_effect()  # a broken ansible.cfg is one line, before Ansible reads it
        if not find_collection(config.collections_paths + sys.path):
            raise not_installed(config)
        from ansible.plugins.loader import init_plugin_loader
        init_plugin_loader()
    try:
        return importlib.import_module("%s.%s" % (MODULE_UTILS, name))
    except ModuleNotFoundError as error:
        if not MODULE_UTILS.startswith(error.name or "-"):
            raise
        raise not_installed(config_in_effect()) from None


def ansible_playbook():
    """The ansible-playbook of this Python's ansible-core (whose config reading we use), else PATH's."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not found:
        raise UsageError("ansible-playbook is neither beside %s nor on PATH: install edgetune with its "
                         "dependencies (they include the ansible package)" % sys.executable)
    return found


def run_json_playbook(playbook, options):
    """Run the collection's playbook (e.g. "preflight") as the operator's ansible-playbook would,
    with Ansible's JSON callback; its report (a dict). For the tools that read results, not events.
    ``options``: edgetune.ansible_options.Options."""
    import subprocess
    config = config_in_effect()
    target, env = collection_playbook(config, playbook)
    env = dict(os.environ, **env)
    env.update(JSON_REPORT_ENV)
    # Ansible's prompts (-k, -K, --ask-vault-pass) go to the terminal; its report comes on stdout.
    done = subprocess.run(options.playbook_argv(ansible_playbook(), target), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=False)
    return json_report(done, target)


def json_report(done, what):
    """The JSON callback's report of a finished ansible-playbook (subprocess.CompletedProcess), or one line
    naming ``what`` did not run and the last lines Ansible printed."""
    try:
        return json.loads(done.stdout)
    except ValueError:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UsageError("%s did not run: %s" % (what, " | ".join(tail) or "ansible-playbook exited %d with no "
                                                 "output" % done.returncode)) from None


def outcomes(report, task_name):
    """Each host's outcome in a JSON callback report: {"result": the result of the task named ``task_name``}
    where no task failed, else {"error": "unreachable" or "failed", "task": the first failed task's name
    (empty if none is in the report), "message": its message on one line}. Ansible's own count of each
    host's failures decides, so a failure a task ignores is not one."""
    hosts = {}
    for host, stats in report.get("stats", {}).items():
        if stats.get("unreachable") or stats.get("failures"):
            hosts[host] = {"error": "unreachable" if stats.get("unreachable") else "failed", "task": "",
                           "message": ""}
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            for host, result in task.get("hosts", {}).items():
                failed = host in hosts and "result" not in hosts[host]
                if failed and (result.get("unreachable") or result.get("failed")) and not hosts[host]["task"]:
                    hosts[host].update(task=task["task"]["name"], message=" ".join(str(result.get("msg", "")).split()))
                elif not failed and task["task"]["name"] == task_name:
                    hosts[host] = {"result": result}
    return hosts
