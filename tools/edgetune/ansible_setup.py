"""How Ansible is set up where `edgetune` runs, and how to run the collection's playbooks in it.

The tools run a playbook as the operator's own `ansible-playbook` would from
the current directory: with the ansible.cfg Ansible finds itself
(ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg),
so the operator's ssh_args, ProxyJump, remote_user and inventory apply. Only
when that setup does not find the collection edgetune.fleet is this
checkout's link (.cache/collections) added, after the paths it already has.
"""
import os
from pathlib import Path

from edgetune import COLLECTIONS, REPO
from edgetune.errors import UsageError

NAMESPACE, NAME = "edgetune", "fleet"


class AnsibleConfig:
    """The settings in effect for a run started from the current directory."""

    def __init__(self, path, collections_paths, host_key_checking, callback_paths):
        self.path = path  # None: no ansible.cfg found, Ansible's defaults
        self.collections_paths = collections_paths
        self.host_key_checking = host_key_checking
        self.callback_paths = callback_paths

    def describe(self):
        return self.path or "no ansible.cfg (Ansible's defaults)"


def config_in_effect():
    """Ansible's own search for ansible.cfg and its reading of it (environment variables included)."""
    try:
        from ansible.config.manager import ConfigManager, find_ini_config_file
    except ImportError:
        raise UsageError("ansible-core is not installed for this Python; run `make venv` "
                         "and use .venv/bin/edgetune") from None
    path = find_ini_config_file()
    manager = ConfigManager(path)
    # The default callback path is a template over ANSIBLE_HOME, which Ansible renders when it starts.
    home = {"ANSIBLE_HOME": manager.get_config_value("ANSIBLE_HOME")}
    return AnsibleConfig(path=path,
                         collections_paths=list(manager.get_config_value("COLLECTIONS_PATHS") or []),
                         host_key_checking=bool(manager.get_config_value("HOST_KEY_CHECKING")),
                         callback_paths=list(manager.get_config_value("DEFAULT_CALLBACK_PLUGIN_PATH",
                                                                      variables=home) or []))


def find_collection(collections_paths):
    """The edgetune.fleet directory the first of these paths holds, or None.

    Ansible also looks on its Python's sys.path; a collection found only there
    is not seen here, and the checkout's link then comes first (the same code
    when it is this checkout)."""
    for base in collections_paths:
        candidate = Path(base).expanduser() / "ansible_collections" / NAMESPACE / NAME
        if candidate.is_dir():
            return candidate
    return None


def collection_playbook(config, playbook):
    """(what to give ansible-playbook, environment additions) to run the collection's playbook.

    The collection as the config finds it: by FQCN. Else this checkout's
    playbooks/<playbook>.yml, with the checkout's link after the config's
    collection paths (which the environment variable replaces, so they are
    repeated first)."""
    env = {"ANSIBLE_CONFIG": config.path} if config.path else {}
    if find_collection(config.collections_paths):
        return "%s.%s.%s" % (NAMESPACE, NAME, playbook), env
    in_checkout = REPO / "playbooks" / (playbook + ".yml")
    if not in_checkout.exists():
        raise UsageError("the collection %s.%s is not installed where %s looks (%s): install it with "
                         "`ansible-galaxy collection install`, or run edgetune from its checkout"
                         % (NAMESPACE, NAME, config.describe(), os.pathsep.join(config.collections_paths)))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(config.collections_paths + [str(COLLECTIONS)])
    return str(in_checkout), env


def collection_version():
    """The version in this checkout's galaxy.yml, or None outside a checkout."""
    import yaml
    try:
        return str(yaml.safe_load((REPO / "galaxy.yml").read_text())["version"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None


def run_json_playbook(playbook, inventories=(), limit=None, extra_vars=()):
    """Run the collection's playbook (e.g. "preflight") as the operator's ansible-playbook would,
    with Ansible's JSON callback; its report (a dict). For the tools that read results, not events."""
    import json
    import shutil
    import subprocess
    import sys
    config = config_in_effect()
    target, env = collection_playbook(config, playbook)
    beside = Path(sys.executable).parent / "ansible-playbook"
    executable = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not executable:
        raise UsageError("ansible-playbook not found; run `make venv` and use .venv/bin/edgetune")
    argv = [executable]
    for inventory in inventories:
        argv += ["-i", inventory]
    if limit:
        argv += ["--limit", limit]
    for extra in extra_vars:
        argv += ["-e", extra]
    env = dict(os.environ, **env)
    env.update(ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", EDGETUNE_NO_SUMMARY="1", ANSIBLE_NOCOLOR="1")
    done = subprocess.run(argv + [target], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    try:
        return json.loads(done.stdout)
    except ValueError:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UsageError("%s did not run: %s" % (target, " | ".join(tail))) from None
