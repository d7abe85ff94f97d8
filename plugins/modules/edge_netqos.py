#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_netqos: inference traffic priority (eBPF classifier + HTB) on network interfaces."""

DOCUMENTATION = r"""
---
module: edge_netqos
short_description: Put inference traffic into a high-priority HTB class with an eBPF TC classifier
description:
  - On each interface, makes sure the root qdisc is HTB C(1:) with a parent class C(1:1) at the link
    rate, a high-priority leaf (default C(1:10), prio 0) and a default leaf (default C(1:20), prio 1,
    the HTB default), a C(clsact) qdisc, and the edgetune classifier (C(bpf/edge_classifier.c)) on
    clsact egress in direct-action mode. The classifier sets C(skb->priority) to the high class for
    TCP/UDP packets to or from O(ports) and for packets of sockets in the cgroup v2 O(cgroup).
  - The live state is read by the on-device loader C(edgetune-netqos check) (pyroute2 and C(tc -j)
    for qdiscs, classes and the filter with its program id and tag; the bpf syscall for the
    program's maps), which also validates every setting. Nothing is written when a setting is
    invalid, in check mode, or when the live state already matches.
  - Otherwise the loader applies the difference (C(edgetune-netqos apply), which compiles with bcc
    only when the program itself must change and restores the previous qdiscs when a step fails),
    the module writes O(config_file) (read by the C(edgetune-netqos@IF.service) units at boot),
    detaches interfaces that were in the previous O(config_file) but are no longer listed, and
    reads the live state back.
version_added: "0.1.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  interfaces:
    description:
      - Interfaces to manage, each a name or a mapping with C(name) and any of O(rate),
        O(high_rate), O(default_rate), O(ports), O(cgroup), O(high_class), O(default_class) for this
        interface only (and O(high_ceil), O(default_ceil)).
    type: list
    elements: raw
    default: []
  rate:
    description:
      - Link rate (tc notation, for example V(100mbit)) of class C(1:1), for interfaces that do not give
        their own. Set it a little below what the link really carries,
        so that the queue builds up in HTB, where the classes act, and not in the device or beyond.
    type: str
  high_rate:
    description: Guaranteed rate of the inference class, a rate or a percentage of O(rate).
    type: str
    default: 20%
  default_rate:
    description: Guaranteed rate of the default class, a rate, a percentage, or V(rest) (O(rate) minus O(high_rate)).
    type: str
    default: rest
  high_ceil:
    description: What the inference class may borrow up to (HTB ceil), a rate or a percentage of O(rate).
    type: str
    default: 100%
  default_ceil:
    description: What the default class may borrow up to (HTB ceil), a rate or a percentage of O(rate).
    type: str
    default: 100%
  ports:
    description: TCP and UDP ports (destination or source) of inference traffic, at most 16; ranges like V(9000-9003).
    type: list
    elements: raw
    default: []
  cgroup:
    description:
      - cgroup v2 whose sockets' traffic is inference traffic, as a path under the v2 root or a systemd
        slice name (V(ai-infer.slice) is the cgroup C(ai.slice/ai-infer.slice)); empty for none.
      - It must exist when the module applies; on hybrid hosts the v2 tree is C(/sys/fs/cgroup/unified).
    type: str
    default: ""
  high_class:
    description: Class id of the inference class (tc notation, hexadecimal minor).
    type: str
    default: "1:10"
  default_class:
    description: Class id of the default class.
    type: str
    default: "1:20"
  replace_root:
    description: Replace a root qdisc that edgetune did not make (the module refuses by default).
    type: bool
    default: false
  state:
    description: V(absent) detaches every interface of O(interfaces) and of O(config_file), and removes O(config_file).
    type: str
    choices: [present, absent]
    default: present
  config_file:
    description: Where the settings are kept for the boot-time units (JSON, read by C(edgetune-netqos --config)).
    type: path
    default: /etc/edgetune/netqos.json
  loader:
    description: The installed loader (C(tools/edgetune/bpf.py)).
    type: path
    default: /usr/local/sbin/edgetune-netqos
  python:
    description: The Python that has the distribution's python3-bpfcc and python3-pyroute2.
    type: path
    default: /usr/bin/python3
  source:
    description: The installed classifier source (C(bpf/edge_classifier.c)); its hash names the attached program.
    type: path
    default: /usr/local/share/edgetune/bpf/edge_classifier.c
attributes:
  check_mode:
    description:
      - Reads the live state through the loader and reports exactly what a real run would change; writes nothing.
      - When the loader is not installed yet (in check mode the role has not installed it), every interface
        is reported as changing, without reading its live state.
    support: full
  diff_mode:
    description: The config file before and after, and per interface the differences of the live state.
    support: full
  platform:
    description: Runs on the device (Linux, Python 3.8 or later); the loader needs root.
    support: full
    platforms: linux
requirements:
  - On the device, python3-bpfcc, python3-pyroute2, iproute2 and the running kernel's headers (for bcc).
notes:
  - The kernel needs CONFIG_NET_SCH_HTB, CONFIG_NET_CLS_BPF, CONFIG_NET_SCH_INGRESS (clsact),
    CONFIG_BPF_SYSCALL, and for O(cgroup) CONFIG_SOCK_CGROUP_DATA (selected by CONFIG_CGROUP_BPF).
  - The program and its maps live as long as the filter; a reboot loses them. The C(edge_netqos) role
    installs C(edgetune-netqos@.service) to apply O(config_file) again at boot.
"""

EXAMPLES = r"""
- name: Prioritise the inference API and the inference slice on eth0
  edge_netqos:
    interfaces:
      - name: eth0
        rate: 900mbit
    ports: [8000, 50051]
    cgroup: ai-infer.slice

- name: Remove it again
  edge_netqos:
    state: absent
"""

RETURN = r"""
interfaces:
  description: Per interface, the differences found before the run, what was done, and the attached program.
  returned: always
  type: dict
  sample:
    eth0:
      differences: ["root qdisc is mq, not htb 1:", "no clsact qdisc", "no edge_classifier on clsact egress"]
      actions: ["root qdisc htb 1: default 1:20 with classes 1:1 1:10 1:20", "clsact qdisc"]
      program: {id: 412, tag: 0b992de8dfea7ad3, name: edge_classify, filter: "edgetune-netqos:2440fcde9f58f2d9"}
detached:
  description: Interfaces detached because they left O(interfaces) (or all, with O(state=absent)).
  returned: always
  type: list
  elements: str
status:
  description: What the host runs after the task, V(applied on <interfaces>) or V(removed).
  returned: success
  type: str
  sample: applied on eth0
config_file:
  description: The config file path.
  returned: always
  type: str
config:
  description: The settings written to O(config_file).
  returned: when O(state=present)
  type: dict
config_sha1:
  description: The sha1 of the text of O(config_file) with these settings (the drift audit's file check).
  returned: when O(state=present)
  type: str
"""

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_fileio import atomic_write  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError  # noqa: E402

SETTING_KEYS = ("rate", "high_rate", "default_rate", "high_ceil", "default_ceil", "ports", "cgroup", "high_class",
                "default_class")
MANAGED_BY = "edgetune edge_netqos"


def build_config(params):
    """The JSON config the loader reads: top-level settings and interfaces."""
    config = {"managed_by": MANAGED_BY, "version": 1}
    for key in SETTING_KEYS:
        value = params.get(key)
        if value not in (None, "", []):
            config[key] = value
    interfaces = {}
    for entry in params.get("interfaces") or []:
        if isinstance(entry, str):
            name, overrides = entry, {}
        elif isinstance(entry, dict) and isinstance(entry.get("name"), str):
            overrides = dict((k, v) for k, v in entry.items() if k != "name")
            name = entry["name"]
            unknown = sorted(set(overrides) - set(SETTING_KEYS))
            if unknown:
                raise EdgeError("interface %s: unknown keys %s (allowed: name, %s)"
                                % (name, ", ".join(unknown), ", ".join(SETTING_KEYS)))
        else:
            raise EdgeError("interfaces: %r is neither a name nor a mapping with a name" % (entry,))
        if name in interfaces:
            raise EdgeError("interface %s is listed twice" % name)
        interfaces[name] = overrides
    config["interfaces"] = interfaces
    return config


def config_text(config):
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def read_previous(path):
    """(text, config) of the current config file; ("", None) when absent."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as exc:
        if exc.errno == 2:
            return "", None
        raise EdgeError("cannot read %s: %s" % (path, exc.strerror)) from None
    try:
        config = json.loads(text)
    except ValueError:
        config = None
    return text, config if isinstance(config, dict) else None


def previous_interfaces(config):
    interfaces = (config or {}).get("interfaces") or {}
    return sorted(interfaces) if isinstance(interfaces, (dict, list)) else []


class Loader(object):
    def __init__(self, module):
        self.module = module
        self.python = module.params["python"]
        self.path = module.params["loader"]
        self.source = module.params["source"]

    def available(self):
        return os.path.isfile(self.path) and os.path.isfile(self.source) and os.access(self.python, os.X_OK)

    def run(self, argv, stdin=None, ok=(0,)):
        cmd = [self.python, self.path] + argv
        rc, out, err = self.module.run_command(cmd, data=stdin)
        if rc not in ok:
            message = (err.strip().splitlines() or ["exit code %d" % rc])[-1]
            if message.startswith("edgetune-netqos: error: "):
                message = message[len("edgetune-netqos: error: "):]
            raise EdgeError(message)
        if "--json" in argv:
            try:
                return rc, json.loads(out)
            except ValueError:
                raise EdgeError("%s printed no JSON: %s" % (" ".join(cmd), out[:200])) from None
        return rc, out

    def check(self, config):
        _rc, report = self.run(["check", "--config", "-", "--source", self.source, "--json"],
                               stdin=json.dumps(config), ok=(0, 1))
        return report["interfaces"]

    def apply(self, config, replace_root):
        argv = ["apply", "--config", "-", "--source", self.source, "--json"] + (
            ["--replace-root"] if replace_root else [])
        return self.run(argv, stdin=json.dumps(config))[1]["interfaces"]

    def detach(self, names):
        argv = ["detach", "--json"]
        for name in names:
            argv += ["--interface", name]
        return self.run(argv)[1]["interfaces"]

    def present_interfaces(self):
        rc, out, _err = self.module.run_command(["ip", "-o", "link", "show"])
        if rc != 0:
            return None
        return set(line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines() if ":" in line)


def run_present(module, loader, result):
    params = module.params
    config = build_config(params)
    if not config["interfaces"]:
        raise EdgeError("no interfaces given (use state=absent to remove the classifier)")
    path = params["config_file"]
    before_text, before_config = read_previous(path)
    after_text = config_text(config)
    dropped = [name for name in previous_interfaces(before_config) if name not in config["interfaces"]]
    result["config"] = config
    result["config_sha1"] = hashlib.sha1(after_text.encode()).hexdigest()
    result["status"] = "applied on " + ", ".join(config["interfaces"])
    if not loader.available():
        if module.check_mode:  # the role installs the loader first; in check mode it is not there yet
            result["changed"] = True
            result["interfaces"] = dict((name, {"differences": ["loader %s not installed yet" % loader.path],
                                                "actions": []}) for name in config["interfaces"])
            result["detached"] = dropped
            diff_file(module, result, path, before_text, after_text)
            return
        raise EdgeError("the loader %s, the source %s or %s is missing; install them first (role edge_netqos)"
                        % (loader.path, loader.source, loader.python))
    live = loader.check(config)
    present = loader.present_interfaces()
    if dropped and present is not None:
        gone = [name for name in dropped if name not in present]
        dropped = [name for name in dropped if name in present]  # a vanished device has nothing left to detach
        result["vanished"] = gone
    out = dict((name, {"differences": state["differences"], "actions": [], "program": state.get("program")})
               for name, state in live.items())
    changed = before_text != after_text or bool(dropped) or any(s["differences"] for s in live.values())
    result.update(changed=changed, interfaces=out, detached=dropped)
    diff_file(module, result, path, before_text, after_text, live)
    if module.check_mode or not changed:
        return
    if any(s["differences"] for s in live.values()):
        for report in loader.apply(config, params["replace_root"]):
            out[report["interface"]].update(actions=report["actions"], program=report.get("program"))
    if dropped:
        loader.detach(dropped)
    if before_text != after_text:
        write_config(path, after_text)
    after = loader.check(config)
    remaining = ["%s: %s" % (name, "; ".join(s["differences"])) for name, s in after.items() if s["differences"]]
    if remaining:
        raise EdgeError("read-back after apply still differs: %s" % " | ".join(remaining))


def run_absent(module, loader, result):
    params = module.params
    path = params["config_file"]
    before_text, before_config = read_previous(path)
    names = sorted(set(previous_interfaces(before_config)) | set(build_config(params)["interfaces"]))
    result.update(interfaces={}, detached=[], status="removed")
    targets = []
    if names and loader.available():
        present = loader.present_interfaces() or set(names)
        for name in names:
            if name not in present:
                continue
            _rc, status = loader.run(["status", "--interface", name, "--json"])
            state = status["interfaces"][0]
            ours = state["program"] is not None or (state["root"] or {}).get("handle") == "1:"
            if ours:
                targets.append(name)
                result["interfaces"][name] = {"differences": ["edgetune classifier or htb 1: present"],
                                              "actions": [], "program": state["program"]}
    result["detached"] = targets
    result["changed"] = bool(targets) or bool(before_text)
    if module._diff and before_text:
        result["diff"] = [{"before_header": path, "after_header": path, "before": before_text, "after": ""}]
    if module.check_mode or not result["changed"]:
        return
    if targets:
        for report in loader.detach(targets):
            result["interfaces"][report["interface"]]["actions"] = report["actions"]
    if before_text:
        os.unlink(path)


def diff_file(module, result, path, before_text, after_text, live=None):
    if not module._diff:
        return
    diff = []
    if before_text != after_text:
        diff.append({"before_header": path, "after_header": path, "before": before_text, "after": after_text})
    for name, state in sorted((live or {}).items()):
        if state["differences"]:
            diff.append({"before_header": "%s (live)" % name, "after_header": "%s (live)" % name,
                         "before": "".join(line + "\n" for line in state["differences"]),
                         "after": "in sync with %s\n" % path})
    result["diff"] = diff


def write_config(path, text):
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    atomic_write(path, text, backup=False, mode=0o644)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            interfaces=dict(type="list", elements="raw", default=[]),
            rate=dict(type="str"),
            high_rate=dict(type="str", default="20%"),
            default_rate=dict(type="str", default="rest"),
            high_ceil=dict(type="str", default="100%"),
            default_ceil=dict(type="str", default="100%"),
            ports=dict(type="list", elements="raw", default=[]),
            cgroup=dict(type="str", default=""),
            high_class=dict(type="str", default="1:10"),
            default_class=dict(type="str", default="1:20"),
            replace_root=dict(type="bool", default=False),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            config_file=dict(type="path", default="/etc/edgetune/netqos.json"),
            loader=dict(type="path", default="/usr/local/sbin/edgetune-netqos"),
            python=dict(type="path", default="/usr/bin/python3"),
            source=dict(type="path", default="/usr/local/share/edgetune/bpf/edge_classifier.c"),
        ),
        supports_check_mode=True,
    )
    loader = Loader(module)
    result = {"changed": False, "config_file": module.params["config_file"]}
    try:
        if module.params["state"] == "present":
            run_present(module, loader, result)
        else:
            run_absent(module, loader, result)
    except EdgeError as exc:
        module.fail_json(msg=str(exc), **dict(result, **exc.details))
    except Exception as exc:  # never a traceback: one line saying what went wrong
        module.fail_json(msg="edge_netqos: unexpected %s: %s" % (type(exc).__name__, exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
