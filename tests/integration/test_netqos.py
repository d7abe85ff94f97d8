"""The eBPF classifier puts inference traffic into the high-priority HTB class.

Two network namespaces made here, joined by a veth pair; the egress of the
sending side is rate-limited by the HTB root the loader sets up. The loader
runs as on the device: /usr/bin/python3 with the distribution's bcc and
pyroute2. Classification is proven by the HTB class counters that
`tc -s class show` prints (parsed here, not by the loader), before and after
traffic that only this test sends, only to the namespaces' own addresses.

Needs root, tc, and the host set up by tools/setup-netqos-host (bcc and
kernel headers); skipped with the reason otherwise.
"""
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_netqos_loader import launcher

pytestmark = [pytest.mark.controller, pytest.mark.netns]

ROOT = Path(__file__).resolve().parents[2]
# The loader as a device runs it: the edgetune-netqos command, here over the checkout's collection link.
LOADER = ROOT / ".cache" / "netqos-test" / "edgetune-netqos"
SYSTEM_PYTHON = "/usr/bin/python3"
A_ADDR, B_ADDR = "10.77.0.1", "10.77.0.2"
A_ADDR6, B_ADDR6 = "fd00:77::1", "fd00:77::2"
INFER_PORT, OTHER_PORT = 8000, 9000
RATE = "5mbit"  # small, so that the classes matter
HIGH, DEFAULT = "1:10", "1:20"


def _why_not():
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, eBPF)"
    for tool in ("ip", "tc", "nsenter"):
        if not shutil.which(tool):
            return "needs %s (iproute2, util-linux)" % tool
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import bcc, pyroute2"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False) if os.path.exists(SYSTEM_PYTHON) else None
    if probe is None or probe.returncode != 0:
        return "%s cannot import bcc and pyroute2: run tools/setup-netqos-host" % SYSTEM_PYTHON
    if not os.path.isdir("/lib/modules/%s/build" % os.uname().release):
        return "no kernel headers at /lib/modules/%s/build: run tools/setup-netqos-host" % os.uname().release
    return None


_REASON = _why_not()
if _REASON:
    pytestmark.append(pytest.mark.skip(reason=_REASON))


@pytest.fixture(scope="module", autouse=True)
def loader_command():
    """The edgetune-netqos command as role edge_netqos writes it, over the collection link of the checkout."""
    LOADER.parent.mkdir(parents=True, exist_ok=True)
    LOADER.write_text(launcher(SYSTEM_PYTHON, str(ROOT / "collections")))
    LOADER.chmod(0o755)


def run(argv, check=True, **kwargs):
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError("%s failed (%d): %s%s" % (" ".join(map(str, argv)), result.returncode,
                                                       result.stdout, result.stderr))
    return result


class Pair(object):
    """Namespaces A (sender, shaped egress on veth `a`) and B (receiver)."""

    def __init__(self, tag):
        self.ns_a, self.ns_b = "etq-%s-a" % tag, "etq-%s-b" % tag
        self.a, self.b = "nq%sa" % tag, "nq%sb" % tag

    def in_ns(self, ns, argv, **kwargs):
        # nsenter keeps this mount namespace, so the cgroup v2 mount stays visible
        # (`ip netns exec` remounts /sys and hides it).
        return run(["nsenter", "--net=/run/netns/%s" % ns] + [str(a) for a in argv], **kwargs)

    def loader(self, *args, env=None):
        full_env = dict(os.environ, **(env or {}))
        return self.in_ns(self.ns_a, [SYSTEM_PYTHON, LOADER] + list(args), check=False, env=full_env)

    def apply(self, *extra, env=None):
        return self.loader("apply", "-i", self.a, "--rate", RATE, "--ports", str(INFER_PORT), "--json", *extra,
                           env=env)

    def tc(self, *args):
        return self.in_ns(self.ns_a, ["tc"] + list(args)).stdout

    def qdisc_state(self):
        """Root and clsact qdiscs and egress filters, without counters."""
        qdiscs = self.tc("qdisc", "show", "dev", self.a)
        filters = run(["nsenter", "--net=/run/netns/%s" % self.ns_a, "tc", "filter", "show", "dev", self.a, "egress"],
                      check=False).stdout
        return qdiscs.strip(), filters.strip()

    def counters(self):
        """{classid: (bytes, packets)} from `tc -s class show`, once the queues are empty."""
        deadline = time.time() + 10
        while True:
            text = self.tc("-s", "class", "show", "dev", self.a)
            backlog = [int(b) for b in re.findall(r"backlog (\d+)b", text)]
            if not any(backlog) or time.time() > deadline:
                break
            time.sleep(0.05)
        found = {}
        for block in text.strip().split("\n\n"):
            head = re.match(r"class htb (\S+) ", block)
            sent = re.search(r"Sent (\d+) bytes (\d+) pkt", block)
            if head and sent:
                found[head.group(1)] = (int(sent.group(1)), int(sent.group(2)))
        return found

    def send_udp(self, port, count, family=4, cgroup_dir="", dstopts=False):
        self.in_ns(self.ns_a, [SYSTEM_PYTHON, "-c", SENDER, family, B_ADDR6 if family == 6 else B_ADDR, port, count,
                               cgroup_dir, "1" if dstopts else ""])


SENDER = r"""
import os, socket, sys
family, addr, port, count, cgroup_dir, dstopts = sys.argv[1:7]
if cgroup_dir:
    with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as handle:
        handle.write(str(os.getpid()))
sock = socket.socket(socket.AF_INET6 if family == "6" else socket.AF_INET, socket.SOCK_DGRAM)
if dstopts:
    # an 8-byte destination options header (PadN): the classifier must skip it
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_DSTOPTS, bytes([0, 0, 1, 4, 0, 0, 0, 0]))
for _ in range(int(count)):
    sock.sendto(b"x" * 200, (addr, int(port)))
"""

TCP_SERVER = r"""
import socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(1); srv.settimeout(20)
conn, _ = srv.accept(); total = 0
while True:
    data = conn.recv(65536)
    if not data:
        break
    total += len(data)
conn.sendall(b"%d" % total); conn.close()
"""

TCP_CLIENT = r"""
import socket, sys, time
deadline = time.time() + 10
while True:
    try:
        sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10); break
    except OSError:
        if time.time() > deadline: raise
        time.sleep(0.05)
sock.sendall(b"y" * 30000); sock.shutdown(socket.SHUT_WR)
print(sock.recv(100).decode())
"""


def delta(before, after):
    return dict((c, (after[c][0] - before.get(c, (0, 0))[0], after[c][1] - before.get(c, (0, 0))[1]))
                for c in after)


@pytest.fixture
def pair(request):
    tag = secrets.token_hex(3)
    pair = Pair(tag)

    def cleanup():
        for ns in (pair.ns_a, pair.ns_b):
            run(["ip", "netns", "del", ns], check=False)  # takes the veth pair with it
    request.addfinalizer(cleanup)
    ipv6 = request.node.get_closest_marker("ipv6") is not None
    for ns in (pair.ns_a, pair.ns_b):
        run(["ip", "netns", "add", ns])
        if not ipv6:
            # Without IPv6 the kernel sends nothing of its own on the links (the veth, the tun
            # test's device): an MLDv2 report (90 bytes) once landed in the default class mid-test.
            run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1"])
    run(["ip", "link", "add", pair.a, "netns", pair.ns_a, "type", "veth", "peer", "name", pair.b, "netns", pair.ns_b])
    for ns, dev, addr, addr6 in ((pair.ns_a, pair.a, A_ADDR, A_ADDR6), (pair.ns_b, pair.b, B_ADDR, B_ADDR6)):
        run(["ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev])
        if ipv6:
            run(["ip", "-n", ns, "addr", "add", addr6 + "/64", "dev", dev, "nodad"])
            # No link-local address: its duplicate address detection would send a neighbour
            # solicitation (86 bytes) at a random moment after link up, into the default class.
            run(["ip", "-n", ns, "link", "set", dev, "addrgenmode", "none"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "link", "set", dev, "up"])
    # Permanent neighbours: no ARP/ND packets of our own in the counters.
    for ns, dev, peer_ns, peer_dev, addrs in ((pair.ns_a, pair.a, pair.ns_b, pair.b, (B_ADDR, B_ADDR6)),
                                              (pair.ns_b, pair.b, pair.ns_a, pair.a, (A_ADDR, A_ADDR6))):
        mac = json.loads(run(["ip", "-n", peer_ns, "-j", "link", "show", peer_dev]).stdout)[0]["address"]
        for addr in addrs if ipv6 else addrs[:1]:
            run(["ip", "-n", ns, "neigh", "replace", addr, "lladdr", mac, "nud", "permanent", "dev", dev])
    return pair


@pytest.fixture
def test_cgroup(request):
    from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader as loader_module
    mount = loader_module.cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy mounted on this host")
    name = "edgetune-test-%s" % secrets.token_hex(3)
    path = os.path.join(mount, name)
    os.mkdir(path)

    def cleanup():
        for _ in range(50):  # the sender has exited; its cgroup empties right after
            try:
                os.rmdir(path)
                return
            except OSError:
                time.sleep(0.1)
    request.addfinalizer(cleanup)
    return name, path


def applied(result):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_inference_port_goes_to_the_high_class_and_the_rest_to_the_default(pair):
    report = applied(pair.apply())
    assert report["changed"] is True
    program = report["interfaces"][0]["program"]
    assert program["id"] and re.match(r"^[0-9a-f]{16}$", program["tag"]) and program["direct_action"]

    before = pair.counters()
    assert set(before) == {"1:1", HIGH, DEFAULT}
    pair.send_udp(OTHER_PORT, 23)
    mid = pair.counters()
    pair.send_udp(INFER_PORT, 37)
    after = pair.counters()
    other, infer = delta(before, mid), delta(mid, after)
    assert other[HIGH][1] == 0 and other[DEFAULT][1] >= 23, other
    assert infer[HIGH][1] == 37, infer
    # 200 bytes payload + UDP 8 + IPv4 20 + Ethernet 14
    assert infer[HIGH][0] == 37 * 242, infer


@pytest.mark.ipv6
def test_ipv6_with_a_destination_options_header_is_classified(pair):
    applied(pair.apply())
    before = pair.counters()
    pair.send_udp(INFER_PORT, 11, family=6)
    pair.send_udp(INFER_PORT, 7, family=6, dstopts=True)
    mid = pair.counters()
    pair.send_udp(OTHER_PORT, 5, family=6, dstopts=True)
    after = pair.counters()
    assert delta(before, mid)[HIGH][1] == 18
    assert delta(mid, after)[HIGH][1] == 0 and delta(mid, after)[DEFAULT][1] >= 5


def test_tcp_to_the_inference_port_is_classified(pair):
    applied(pair.apply())
    server = subprocess.Popen(["nsenter", "--net=/run/netns/%s" % pair.ns_b, SYSTEM_PYTHON, "-c", TCP_SERVER,
                               B_ADDR, str(INFER_PORT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        before = pair.counters()
        reply = pair.in_ns(pair.ns_a, [SYSTEM_PYTHON, "-c", TCP_CLIENT, B_ADDR, INFER_PORT]).stdout
        after = pair.counters()
    finally:
        server.wait(timeout=20)
    assert reply.strip() == "30000"
    moved = delta(before, after)
    # SYN, data segments, ACKs and FIN from A all carry destination port 8000.
    assert moved[HIGH][1] >= 4 and moved[HIGH][0] >= 30000, moved
    assert moved[DEFAULT][1] == 0, moved


def test_sockets_of_a_cgroup_go_to_the_high_class(pair, test_cgroup):
    name, path = test_cgroup
    applied(pair.apply("--cgroup", name))
    status = json.loads(pair.loader("status", "-i", pair.a, "--json").stdout)["interfaces"][0]
    assert status["cgroup"]["id"] == os.stat(path).st_ino
    assert status["cgroup"]["path"] == name and status["cgroup"]["level"] == 1
    before = pair.counters()
    pair.send_udp(OTHER_PORT, 19, cgroup_dir=path)   # other port, but from the cgroup
    mid = pair.counters()
    pair.send_udp(OTHER_PORT, 13)                    # same port, outside the cgroup
    after = pair.counters()
    assert delta(before, mid)[HIGH][1] == 19, delta(before, mid)
    assert delta(mid, after)[HIGH][1] == 0 and delta(mid, after)[DEFAULT][1] >= 13


TUN_HELPER = r"""
import fcntl, os, socket, struct, subprocess, sys, time
fd = os.open("/dev/net/tun", os.O_RDWR)   # the tun device lives while this fd is open
fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", sys.argv[1].encode(), 0x0001 | 0x1000))  # TUNSETIFF, IFF_TUN|NO_PI
subprocess.run(["ip", "addr", "add", "10.88.0.1/24", "dev", sys.argv[1]], check=True)
subprocess.run(["ip", "link", "set", sys.argv[1], "up"], check=True)
apply = subprocess.run([sys.executable, sys.argv[2], "apply", "-i", sys.argv[1], "--rate", "5mbit", "--ports", "8000"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
if apply.returncode:
    sys.exit(apply.stderr)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for port in [8000] * 7 + [9000] * 4:
    sock.sendto(b"z" * 100, ("10.88.0.2", port))
time.sleep(0.5)
print(subprocess.run(["tc", "-s", "class", "show", "dev", sys.argv[1]], stdout=subprocess.PIPE,
                     universal_newlines=True).stdout)
"""


def test_an_l3_device_without_ethernet_header_is_classified(pair):
    """A tun device (link type none, like WireGuard): the program is built with EDGE_L2_LEN=0."""
    out = pair.in_ns(pair.ns_a, [SYSTEM_PYTHON, "-c", TUN_HELPER, "nqtun" + pair.a[2:8], LOADER]).stdout
    sent = dict(re.findall(r"class htb (\S+) .*\n Sent \d+ bytes (\d+) pkt", out))
    assert sent[HIGH] == "7" and sent[DEFAULT] == "4", out
    # 100 bytes payload + UDP 8 + IPv4 20, no link-layer header
    assert re.search(r"class htb 1:10 .*\n Sent 896 bytes 7 pkt", out), out


def test_apply_twice_is_the_same_state_and_one_filter(pair):
    first = applied(pair.apply())["interfaces"][0]
    state = pair.qdisc_state()
    second = applied(pair.apply())
    assert second["changed"] is False and second["interfaces"][0]["actions"] == []
    assert second["interfaces"][0]["program"]["id"] == first["program"]["id"]
    assert pair.qdisc_state() == state
    filters = json.loads(pair.tc("-j", "filter", "show", "dev", pair.a, "egress"))
    assert len([f for f in filters if "options" in f]) == 1
    check = pair.loader("check", "--config", "-", "--json")
    assert check.returncode == 2  # check needs a config; stdin was empty
    config = json.dumps({"rate": RATE, "ports": [INFER_PORT], "interfaces": {pair.a: {}}})
    check = pair.in_ns(pair.ns_a, [SYSTEM_PYTHON, LOADER, "check", "--config", "-", "--json"], check=False,
                       input=config)
    assert check.returncode == 0 and json.loads(check.stdout)["in_sync"] is True, check.stdout + check.stderr


def test_changed_ports_and_rates_are_updated_in_place(pair):
    first = applied(pair.apply())["interfaces"][0]
    report = applied(pair.loader("apply", "-i", pair.a, "--rate", "6mbit", "--ports", "8000,8001",
                                 "--high-ceil", "3mbit", "--json"))
    rep = report["interfaces"][0]
    assert rep["changed"] and rep["program"]["id"] == first["program"]["id"]  # maps updated, not reloaded
    classes = pair.tc("class", "show", "dev", pair.a)
    assert re.search(r"class htb 1:1 root rate 6Mbit ceil 6Mbit", classes), classes
    assert re.search(r"class htb 1:10 parent 1:1 prio 0 rate 1200Kbit ceil 3Mbit", classes), classes
    assert re.search(r"class htb 1:20 parent 1:1 prio 1 rate 4800Kbit ceil 6Mbit", classes), classes
    before = pair.counters()
    pair.send_udp(8001, 9)
    assert delta(before, pair.counters())[HIGH][1] == 9


def test_detach_leaves_no_qdisc_or_filter(pair):
    default_state = pair.qdisc_state()
    applied(pair.apply())
    assert "htb 1:" in pair.qdisc_state()[0]
    result = pair.loader("detach", "-i", pair.a)
    assert result.returncode == 0, result.stderr
    qdiscs, filters = pair.qdisc_state()
    assert "htb" not in qdiscs and "clsact" not in qdiscs and filters == ""
    assert (qdiscs, filters) == default_state


@pytest.mark.parametrize("step", ["qdisc", "clsact", "filter"])
def test_a_failure_mid_way_restores_the_previous_qdiscs(pair, step):
    before = pair.qdisc_state()
    result = pair.apply(env={"EDGETUNE_NETQOS_FAULT": step})
    assert result.returncode == 2
    assert "previous qdisc state restored" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert pair.qdisc_state() == before


def test_a_failure_mid_way_restores_the_previous_rates(pair):
    applied(pair.apply())
    classes = pair.tc("class", "show", "dev", pair.a)
    result = pair.loader("apply", "-i", pair.a, "--rate", "8mbit", "--ports", str(INFER_PORT),
                         env={"EDGETUNE_NETQOS_FAULT": "filter"})
    assert result.returncode == 2, result.stderr
    assert pair.tc("class", "show", "dev", pair.a) == classes


@pytest.mark.parametrize("args, env, message", [
    (["apply", "-i", "nosuchdev0", "--rate", RATE, "--ports", "8000"], None, "interface nosuchdev0 not found"),
    (["apply", "-i", "{a}", "--rate", RATE, "--ports", "8000,abc"], None, "invalid port 'abc'"),
    (["apply", "-i", "{a}", "--rate", RATE, "--ports", "8000,70000"], None, "invalid port 70000"),
    (["apply", "-i", "{a}", "--rate", "0", "--ports", "8000"], None, "rate '0' is zero"),
    (["apply", "-i", "{a}", "--rate", RATE, "--ports", "8000"], {"PYTHONPATH": "{nobcc}"}, "bcc is not installed"),
])
def test_bad_input_is_one_line_and_leaves_the_qdiscs(pair, tmp_path, args, env, message):
    nobcc = tmp_path / "nobcc"
    nobcc.mkdir()
    (nobcc / "bcc.py").write_text("raise ImportError('bcc hidden by the test')\n")
    pair.tc("qdisc", "add", "dev", pair.a, "root", "handle", "8001:", "pfifo")  # a root of the admin's
    before = pair.qdisc_state()
    argv = [a.format(a=pair.a) for a in args]
    extra = ["--replace-root"] if env else []
    result = pair.loader(*(argv + extra), env=dict((k, v.format(nobcc=nobcc)) for k, v in (env or {}).items()))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert pair.qdisc_state() == before


def test_a_root_qdisc_of_someone_else_is_refused_without_replace_root(pair):
    pair.tc("qdisc", "add", "dev", pair.a, "root", "handle", "8001:", "pfifo")
    before = pair.qdisc_state()
    result = pair.apply()
    assert result.returncode == 2 and "--replace-root" in result.stderr
    assert pair.qdisc_state() == before
    applied(pair.apply("--replace-root"))
    assert "qdisc htb 1: root" in pair.qdisc_state()[0]


def test_edgetune_cli_hands_over_to_the_system_python(pair):
    edgetune = shutil.which("edgetune") or os.path.join(os.path.dirname(sys.executable), "edgetune")
    applied(pair.apply())
    result = pair.in_ns(pair.ns_a, [edgetune, "bpf", "status", "-i", pair.a, "--json"], check=False)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)["interfaces"][0]
    assert status["ports"] == {str(INFER_PORT): HIGH}
    assert [c["class"] for c in status["classes"]] == ["1:1", HIGH, DEFAULT]


# ------------------------------------------------- the Ansible module

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run edge_netqos
      edgetune.fleet.edge_netqos: "{{ netqos_args }}"
"""


def run_module(pair, tmp_path, check=False, **args):
    """edge_netqos through ansible-playbook, inside namespace A, as the role calls it."""
    params = dict({"loader": str(LOADER), "python": SYSTEM_PYTHON, "source": str(ROOT / "bpf" / "edge_classifier.c"),
                   "config_file": str(tmp_path / "etc" / "netqos.json")}, **args)
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "vars.json").write_text(json.dumps({"netqos_args": params}))
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "@%s" % (tmp_path / "vars.json"),
            "-e", "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "play.yml")]
    if check:
        argv += ["--check", "--diff"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_INVENTORY="localhost,",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    out = pair.in_ns(pair.ns_a, argv, check=False, env=env, cwd=str(ROOT))
    try:  # the JSON document, then whatever the project's summary callback prints
        doc = json.JSONDecoder().raw_decode(out.stdout[out.stdout.index("{"):])[0]
    except ValueError:
        raise AssertionError(out.stdout[-2000:] + out.stderr[-2000:]) from None
    return doc["plays"][0]["tasks"][0]["hosts"]["localhost"]


def module_args(pair, **extra):
    return dict({"interfaces": [{"name": pair.a, "rate": RATE}], "ports": [INFER_PORT]}, **extra)


def test_module_check_mode_writes_nothing_then_applies_idempotently(pair, tmp_path):
    before = pair.qdisc_state()
    config_file = tmp_path / "etc" / "netqos.json"
    dry = run_module(pair, tmp_path, check=True, **module_args(pair))
    assert dry.get("failed") is not True, dry.get("msg")
    assert dry["changed"] is True and "no edge_classifier on clsact egress" in dry["interfaces"][pair.a]["differences"]
    assert pair.qdisc_state() == before and not config_file.exists()
    assert [d["before_header"] for d in dry["diff"]] == [str(config_file), "%s (live)" % pair.a]

    real = run_module(pair, tmp_path, **module_args(pair))
    assert real["changed"] is True, real.get("msg")
    assert real["status"] == "applied on %s" % pair.a
    assert real["interfaces"][pair.a]["program"]["id"]
    assert json.loads(config_file.read_text())["interfaces"] == {pair.a: {"rate": RATE}}
    assert "qdisc htb 1: root" in pair.qdisc_state()[0]
    counters = pair.counters()
    pair.send_udp(INFER_PORT, 5)
    assert delta(counters, pair.counters())[HIGH][1] == 5

    again = run_module(pair, tmp_path, **module_args(pair))
    assert again["changed"] is False and again["interfaces"][pair.a]["differences"] == []
    state = pair.qdisc_state()
    audit = run_module(pair, tmp_path, check=True, **module_args(pair))
    assert audit["changed"] is False and pair.qdisc_state() == state

    gone = run_module(pair, tmp_path, state="absent")
    assert gone["changed"] is True and gone["detached"] == [pair.a] and gone["status"] == "removed"
    assert pair.qdisc_state() == before and not config_file.exists()
    assert run_module(pair, tmp_path, state="absent")["changed"] is False


def test_module_reports_drift_and_repairs_it(pair, tmp_path):
    run_module(pair, tmp_path, **module_args(pair))
    pair.tc("filter", "del", "dev", pair.a, "egress", "pref", "49")  # someone removed the classifier
    dry = run_module(pair, tmp_path, check=True, **module_args(pair))
    assert dry["changed"] is True and dry["interfaces"][pair.a]["differences"] == \
        ["no edge_classifier on clsact egress"]
    fixed = run_module(pair, tmp_path, **module_args(pair))
    assert fixed["changed"] is True
    assert fixed["interfaces"][pair.a]["actions"] == [
        "program %s attached to clsact egress (direct-action)" % fixed["interfaces"][pair.a]["program"]["filter"]]


@pytest.mark.parametrize("args, message", [
    ({"interfaces": ["nosuchdev0"], "rate": RATE, "ports": [INFER_PORT]}, "interface nosuchdev0 not found"),
    ({"ports": ["8000", "x"]}, "invalid port 'x'"),
    ({"interfaces": [{"name": "{a}", "rate": "0"}]}, "rate '0' is zero"),
    ({"interfaces": [{"name": "{a}", "rat": "1mbit"}]}, "unknown keys rat"),
])
def test_module_bad_input_fails_with_one_message_and_changes_nothing(pair, tmp_path, args, message):
    before = pair.qdisc_state()
    params = module_args(pair)
    params.update(json.loads(json.dumps(args).replace("{a}", pair.a)))
    result = run_module(pair, tmp_path, **params)
    assert result.get("failed") is True and message in result["msg"], result.get("msg")
    assert "\n" not in result["msg"]
    assert pair.qdisc_state() == before and not (tmp_path / "etc" / "netqos.json").exists()


# ---------------------------------------------------- the role, end to end

ROLE_PLAY = """
- hosts: localhost
  gather_facts: false
  pre_tasks:
    - name: Read the kernel features as preflight does
      edgetune.fleet.edge_facts:
  roles:
    - role: edgetune.fleet.edge_netqos
  post_tasks:
    - name: Show the status
      ansible.builtin.debug:
        var: edge_netqos_status
    - name: Show the checks
      ansible.builtin.debug:
        var: edge_netqos_audit
"""


def run_role(pair, tmp_path, check=False, play=ROLE_PLAY, **extra):
    """The edge_netqos role on this host, inside namespace A, with every path under tmp_path and
    no systemd unit (the boot path is for the device), as ansible-playbook runs it."""
    role_vars = dict({
        "edge_netqos_interfaces": [{"name": pair.a, "rate": RATE}], "edge_netqos_ports": [INFER_PORT],
        "edge_netqos_cgroup": "", "edge_netqos_persist": False, "edge_netqos_install_packages": False,
        "edge_netqos_header_packages": [], "edge_netqos_python": SYSTEM_PYTHON,
        "edge_netqos_config_file": str(tmp_path / "etc" / "netqos.json"),
        "edge_netqos_loader_path": str(tmp_path / "sbin" / "edgetune-netqos"),
        "edge_package_install_dir": str(tmp_path / "lib"), "edge_package_remove_earlier": False,
        "edge_netqos_share_dir": str(tmp_path / "share"),
        "ansible_python_interpreter": sys.executable}, **extra)
    (tmp_path / "role.yml").write_text(play)
    (tmp_path / "role-vars.json").write_text(json.dumps(role_vars))
    (tmp_path / "sbin").mkdir(exist_ok=True)
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "@%s" % (tmp_path / "role-vars.json"),
            str(tmp_path / "role.yml")] + (["--check", "--diff"] if check else [])
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    out = pair.in_ns(pair.ns_a, argv, check=False, env=env, cwd=str(ROOT))
    doc = json.JSONDecoder().raw_decode(out.stdout[out.stdout.index("{"):])[0]
    tasks = dict((t["task"]["name"].split(" : ", 1)[-1], t["hosts"]["localhost"]) for t in doc["plays"][0]["tasks"])
    return doc["stats"]["localhost"], tasks


def failed(tasks):
    return [(name, task.get("msg")) for name, task in tasks.items() if task.get("failed")]


def test_role_check_mode_then_apply_then_idempotent_then_absent(pair, tmp_path):
    before = pair.qdisc_state()
    stats, tasks = run_role(pair, tmp_path, check=True)
    assert stats["failures"] == 0 and stats["changed"] > 0
    assert tasks["Show the status"]["edge_netqos_status"] == "applied on %s" % pair.a
    assert pair.qdisc_state() == before and not (tmp_path / "etc").exists()
    assert not (tmp_path / "sbin" / "edgetune-netqos").exists() and not (tmp_path / "lib").exists()

    stats, tasks = run_role(pair, tmp_path)
    assert stats["failures"] == 0, failed(tasks)
    assert tasks["Set the classifier and the HTB classes on the interfaces"]["changed"] is True
    assert (tmp_path / "share" / "edge_classifier.c").read_text() == (ROOT / "bpf" / "edge_classifier.c").read_text()
    # The loader installed with the device package (role edge_package, the role's dependency), run by the command.
    package = tmp_path / "lib" / "ansible_collections" / "edgetune" / "fleet" / "plugins" / "module_utils"
    assert {"common/edge_error.py", "device/edge_netqos_loader.py", "device/edge_boot.py"} <= {
        str(p.relative_to(package)) for p in package.glob("*/*.py")}
    assert os.access(str(tmp_path / "sbin" / "edgetune-netqos"), os.X_OK)
    assert str(tmp_path / "lib") in (tmp_path / "sbin" / "edgetune-netqos").read_text()
    counters = pair.counters()
    pair.send_udp(INFER_PORT, 6)
    assert delta(counters, pair.counters())[HIGH][1] == 6

    state = pair.qdisc_state()
    stats, _tasks = run_role(pair, tmp_path)
    assert stats["changed"] == 0 and stats["failures"] == 0
    stats, _tasks = run_role(pair, tmp_path, check=True)
    assert stats["changed"] == 0 and pair.qdisc_state() == state

    stats, tasks = run_role(pair, tmp_path, edge_netqos_state="absent")
    assert stats["failures"] == 0 and tasks["Show the status"]["edge_netqos_status"] == "removed"
    assert pair.qdisc_state() == before and not (tmp_path / "etc" / "netqos.json").exists()


def audit_in_ns(pair, checks):
    """The drift audit's evaluation of the role's checks, run in namespace A as on the device."""
    code = ("import json, sys\nsys.path.insert(0, %r)\n"
            "from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import audit\n"
            "print(json.dumps(audit(json.load(sys.stdin))[0]))" % str(ROOT / "collections"))
    done = pair.in_ns(pair.ns_a, [sys.executable, "-c", code], input=json.dumps(checks), check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_drift_audit_reads_the_live_classifier_against_the_recorded_settings(pair, tmp_path):
    """The role's netqos check, evaluated as the audit does: ok after the apply, drifted (naming
    what) when the classifier is detached by hand or the rate changed, ok again after the role."""
    stats, tasks = run_role(pair, tmp_path)
    assert stats["failures"] == 0, failed(tasks)
    checks = tasks["Show the checks"]["edge_netqos_audit"]
    assert [(c["setting"], c["kind"]) for c in checks] == [("network priority", "netqos")]
    assert checks[0]["interfaces"] == [pair.a] and checks[0]["config"]["interfaces"] == {pair.a: {"rate": RATE}}
    [result] = audit_in_ns(pair, checks)
    assert (result["state"], result["running"]) == ("ok", "%s in sync" % pair.a), result

    pair.tc("filter", "del", "dev", pair.a, "egress")
    [result] = audit_in_ns(pair, checks)
    assert result["state"] == "drifted" and result["detail"].startswith(pair.a + ": "), result
    assert "edge_classifier" in result["detail"] or "filter" in result["detail"], result

    stats, tasks = run_role(pair, tmp_path)
    assert stats["failures"] == 0 and stats["changed"] > 0, failed(tasks)
    assert audit_in_ns(pair, checks)[0]["state"] == "ok"
    # A rate changed on the device (the classes as another tool left them) is drift too.
    pair.tc("class", "change", "dev", pair.a, "parent", "1:", "classid", "1:1", "htb", "rate", "50mbit")
    [result] = audit_in_ns(pair, checks)
    assert result["state"] == "drifted" and "rate" in result["detail"], result
    # So is a queue put behind a class by hand (the tree's leaves queue in HTB's own FIFO); the role
    # takes it away again.
    stats, tasks = run_role(pair, tmp_path)
    assert stats["failures"] == 0, failed(tasks)
    pair.tc("qdisc", "add", "dev", pair.a, "parent", "1:20", "handle", "20:", "bfifo", "limit", "3000")
    [result] = audit_in_ns(pair, checks)
    assert result["state"] == "drifted" and "class 1:20 queues in bfifo 20:" in result["detail"], result
    stats, tasks = run_role(pair, tmp_path)
    assert stats["failures"] == 0 and stats["changed"] > 0, failed(tasks)
    assert audit_in_ns(pair, checks)[0]["state"] == "ok"
    assert "bfifo" not in pair.tc("qdisc", "show", "dev", pair.a)


def test_role_reports_unsupported_kernels_and_changes_nothing(pair, tmp_path):
    before = pair.qdisc_state()
    features = {"bpf_syscall": True, "htb": False, "cls_bpf": False, "clsact": True, "sock_cgroup_data": True}
    play = ROLE_PLAY.replace("""    - name: Read the kernel features as preflight does
      edgetune.fleet.edge_facts:
""", """    - name: Read the kernel features as preflight does
      edgetune.fleet.edge_facts:
    - name: Pretend the kernel lacks HTB and cls_bpf
      ansible.builtin.set_fact:
        ansible_facts: {edge: {kernel: {release: "5.10.120-tegra", features: %s}}}
""" % json.dumps(features))
    stats, tasks = run_role(pair, tmp_path, play=play)
    assert stats["failures"] == 0
    status = tasks["Show the status"]["edge_netqos_status"]
    assert status == "unsupported: missing CONFIG_NET_SCH_HTB, CONFIG_NET_CLS_BPF in kernel 5.10.120-tegra"
    assert "Set the classifier and the HTB classes on the interfaces" not in tasks or \
        tasks["Set the classifier and the HTB classes on the interfaces"].get("skipped")
    assert pair.qdisc_state() == before and not (tmp_path / "etc").exists()
    stats, tasks = run_role(pair, tmp_path, play=play, edge_netqos_required=True)
    assert stats["failures"] == 1
    assert "CONFIG_NET_SCH_HTB" in tasks["Fail when the classifier is required"]["msg"]



def test_the_boot_unit_command_applies_one_interface_of_the_config(pair, tmp_path):
    """edgetune-netqos@<if>.service runs `apply --config FILE --interface <if> --source ...`."""
    config = tmp_path / "netqos.json"
    config.write_text(json.dumps({"managed_by": "edgetune edge_netqos", "version": 1, "ports": [INFER_PORT],
                                  "interfaces": {pair.a: {"rate": RATE}, "wlan9": {"rate": "1mbit"}}}))
    source = ROOT / "bpf" / "edge_classifier.c"
    result = pair.loader("apply", "--config", str(config), "--interface", pair.a, "--source", str(source))
    assert result.returncode == 0, result.stderr
    assert "qdisc htb 1: root" in pair.qdisc_state()[0]
    again = pair.loader("apply", "--config", str(config), "--interface", pair.a, "--source", str(source))
    assert again.stdout.strip() == "%s: already in the desired state" % pair.a
    whole = pair.loader("apply", "--config", str(config))  # every interface of the file: wlan9 is not here
    assert whole.returncode == 2 and "interface wlan9 not found" in whole.stderr
