"""The Ansible options of every subcommand that reaches devices: ansible-playbook's names and meanings.

add_to(parser) adds them; Options.from_args(args) keeps them; playbook_argv()
gives them back to ansible-playbook as the operator typed them (relative paths
stay relative to the current directory, where edgetune runs Ansible). check()
refuses, in one line and before any device is touched, what Ansible would
only find out later or not say at all: a missing inventory, vault password
file or extra-vars file.
"""
import argparse
import os

from edgetune.errors import UsageError


def positive_int(text):
    """A whole number of at least 1 (forks, timeouts, rounds)."""
    if not str(text).isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a whole number of at least 1, not %r" % text)
    return int(text)


def add_to(parser, limit_required=False):
    g = parser.add_argument_group("Ansible options (as ansible-playbook's, passed on to it)")
    g.add_argument("-i", "--inventory", "--inventory-file", dest="inventory", action="append", metavar="INVENTORY",
                   help="inventory file, directory or host list, repeatable (default: ansible.cfg's)")
    g.add_argument("-l", "--limit", metavar="SUBSET", required=limit_required,
                   help="the hosts or groups, e.g. orin-fleet" + (" (required)" if limit_required else ""))
    g.add_argument("-e", "--extra-vars", action="append", metavar="VARS",
                   help="extra variables, key=value, JSON/YAML or @file, repeatable")
    g.add_argument("-f", "--forks", type=positive_int, help="devices in parallel (default: ansible.cfg's)")
    g.add_argument("-u", "--user", help="connect as this user")
    g.add_argument("-c", "--connection", help="connection type (ssh, paramiko, ...)")
    g.add_argument("-k", "--ask-pass", action="store_true", help="ask for the connection password")
    g.add_argument("--private-key", "--key-file", dest="private_key", metavar="FILE",
                   help="SSH private key file")
    g.add_argument("-b", "--become", action="store_true", help="run operations with become")
    g.add_argument("-K", "--ask-become-pass", action="store_true", help="ask for the privilege escalation password")
    g.add_argument("--become-user", help="the user to become (default: root)")
    g.add_argument("--vault-id", action="append", metavar="ID", help="vault identity (label@source), repeatable")
    g.add_argument("--vault-password-file", "--vault-pass-file", dest="vault_password_file", action="append",
                   metavar="FILE", help="vault password file, repeatable")
    g.add_argument("-J", "--ask-vault-pass", "--ask-vault-password", dest="ask_vault_pass", action="store_true",
                   help="ask for the vault password")
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="Ansible's verbosity (-vvv for more)")


class Options:
    """What the operator asked Ansible for, in ansible-playbook's terms."""

    FIELDS = ("inventory", "limit", "extra_vars", "forks", "user", "connection", "ask_pass", "private_key",
              "become", "ask_become_pass", "become_user", "vault_id", "vault_password_file", "ask_vault_pass",
              "verbose")

    def __init__(self, **given):
        unknown = set(given) - set(self.FIELDS)
        if unknown:
            raise TypeError("unknown Ansible options: %s" % ", ".join(sorted(unknown)))
        for field in self.FIELDS:
            value = given.get(field)
            if field in ("inventory", "extra_vars", "vault_id", "vault_password_file"):
                value = list(value or ())
            elif field in ("ask_pass", "become", "ask_become_pass", "ask_vault_pass"):
                value = bool(value)
            elif field == "verbose":
                value = int(value or 0)
            setattr(self, field, value)

    @classmethod
    def from_args(cls, args):
        return cls(**{field: getattr(args, field, None) for field in cls.FIELDS})

    def argv(self):
        """The options as ansible-playbook takes them."""
        out = []
        for inventory in self.inventory:
            out += ["-i", inventory]
        if self.limit:
            out += ["--limit", self.limit]
        for extra in self.extra_vars:
            out += ["-e", extra]
        for flag, value in (("--forks", self.forks), ("--user", self.user), ("--connection", self.connection),
                            ("--private-key", self.private_key), ("--become-user", self.become_user)):
            if value:
                out += [flag, str(value)]
        for flag, on in (("--ask-pass", self.ask_pass), ("--become", self.become),
                         ("--ask-become-pass", self.ask_become_pass), ("--ask-vault-pass", self.ask_vault_pass)):
            if on:
                out.append(flag)
        for vault_id in self.vault_id:
            out += ["--vault-id", vault_id]
        for path in self.vault_password_file:
            out += ["--vault-password-file", path]
        if self.verbose:
            out.append("-" + "v" * self.verbose)
        return out

    def playbook_argv(self, executable, playbook, *extra):
        return [executable] + self.argv() + list(extra) + [playbook]

    def prompts(self):
        """Whether Ansible will ask for a password on the terminal."""
        return self.ask_pass or self.ask_become_pass or self.ask_vault_pass or any(
            vault_id.rpartition("@")[2] == "prompt" for vault_id in self.vault_id)

    def check(self, config_inventories=()):
        """One UsageError line for a file the options name that is not there (before any device)."""
        for inventory in self.inventory or list(config_inventories):
            if "," in inventory:  # a host list: host1,host2,
                continue
            if not os.path.exists(os.path.expanduser(inventory)):
                named = "-i %s" % inventory if self.inventory else "the inventory %s (ansible.cfg's)" % inventory
                raise UsageError("%s: no such inventory file or directory" % named)
        if not self.inventory and not config_inventories:
            raise UsageError("no inventory: give one with -i (or set inventory in ansible.cfg)")
        files = [("--vault-password-file", path) for path in self.vault_password_file]
        files += [("--vault-id", vault_id.rpartition("@")[2]) for vault_id in self.vault_id
                  if vault_id.rpartition("@")[2] != "prompt"]
        files += [("-e", extra[1:]) for extra in self.extra_vars if extra.startswith("@")]
        for option, path in files:
            if path and not os.path.isfile(os.path.expanduser(path)):
                raise UsageError("%s %s: no such file" % (option, path))
