"""Inference traffic priority (edge_netqos): left alone by default; where the inventory asks, the HTB
root and the eBPF classifier on each interface, and the runtime's traffic in the high class."""
import json
import re
import subprocess

import pytest

from edgetune.checks import inventory_file

FILES = ["/etc/edgetune/netqos.json", "/etc/systemd/system/edgetune-netqos@.service",
         "/usr/local/sbin/edgetune-netqos", "/usr/local/share/edgetune/bpf/edge_classifier.c"]


def qdiscs(host):
    """Root and clsact qdiscs of every interface, as tc shows them."""
    return host.check_output("tc qdisc show")


def interfaces(host):
    """The interfaces the inventory asks to classify on (edge_netqos_interfaces; none by default)."""
    done = subprocess.run(["ansible-inventory", "-i", inventory_file(), "--host", host.backend.host],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=True)
    wanted = json.loads(done.stdout).get("edge_netqos_interfaces") or []
    return [i["name"] if isinstance(i, dict) else i for i in wanted]


@pytest.mark.device
def test_default_leaves_the_network_alone(host):
    if interfaces(host):
        pytest.skip("the inventory asks for the classifier here (see the next check)")
    for path in FILES:
        assert not host.file(path).exists, path
    shown = qdiscs(host)
    assert "htb" not in shown and "clsact" not in shown, shown
    assert "edgetune-netqos@" not in host.check_output("systemctl list-units --all --no-legend 'edgetune-netqos@*'")


@pytest.mark.device
def test_classifier_is_attached_where_the_inventory_asks(host):
    """The HTB root and the eBPF classifier on clsact egress of each interface asked for."""
    wanted = interfaces(host)
    if not wanted:
        pytest.skip("edge_netqos_interfaces is empty for this device")
    assert host.file("/etc/edgetune/netqos.json").exists
    for name in wanted:
        qdiscs = host.check_output("tc qdisc show dev %s" % name)
        assert re.search(r"^qdisc htb \S+ root", qdiscs, re.M) and "clsact" in qdiscs, qdiscs
        filters = host.check_output("tc filter show dev %s egress" % name)
        assert "bpf" in filters and "direct-action" in filters, filters


def class_packets(host, interface):
    """HTB class id -> packets sent through it (tc -s class show)."""
    shown = host.check_output("tc -s class show dev %s" % interface)
    found = re.finditer(r"^class htb (\S+) .*?\n\s*Sent \d+ bytes (\d+) pkt", shown, re.M | re.S)
    return {m.group(1): int(m.group(2)) for m in found}


def send_udp(host, port, count):
    host.run_expect([0], "python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                         "[s.sendto(b\"x\" * 64, (\"%s\", %d)) for _ in range(%d)]'" % (TWIN_PEER, port, count))


# The twin's LAN peer (its power-on wires eth0 to it, with a permanent neighbour entry):
# what is sent there leaves through eth0's qdiscs and goes nowhere else.
TWIN_PEER = "192.0.2.1"


@pytest.mark.device
def test_the_runtimes_traffic_is_counted_in_the_high_class_and_the_rest_in_the_default(host):
    wired = "PERMANENT" in host.run("ip neighbour show %s dev eth0" % TWIN_PEER).stdout
    if "eth0" not in interfaces(host) or not wired:
        pytest.skip("no twin peer wired to eth0 here: traffic is only sent to the twin's own peer")
    config = json.loads(host.file("/etc/edgetune/netqos.json").content_string)
    port = config["ports"][0]
    before = class_packets(host, "eth0")
    send_udp(host, port, 20)
    send_udp(host, port + 1, 30)
    after = class_packets(host, "eth0")
    sent = {classid: after[classid] - before.get(classid, 0) for classid in after}
    assert sent["1:10"] >= 20 and sent["1:20"] >= 30, (before, after)
    assert sent["1:10"] < 30, (before, after)  # the other port's packets did not go there
    if config.get("cgroup"):
        # Any port, from a process of the inference slice (the runtime's sockets): the high class.
        slice_name = config["cgroup"].split("/")[-1]
        before = class_packets(host, "eth0")
        host.run_expect([0], "systemd-run --wait --quiet -p Slice=%s python3 -c 'import socket; "
                             "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                             "[s.sendto(b\"x\", (\"%s\", %d)) for _ in range(7)]'" % (slice_name, TWIN_PEER, port + 1))
        after = class_packets(host, "eth0")
        assert after["1:10"] - before["1:10"] >= 7 and after["1:20"] - before["1:20"] < 7, (before, after)
