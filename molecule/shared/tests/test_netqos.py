"""Inference traffic priority (edge_netqos) on the twins.

The twins have no network (only lo) and no bcc: by default (no
edge_netqos_interfaces) the role must do nothing, and where it is asked to
run it must report "unsupported" and leave the device as it was, not fail the
host. What the classifier does on a kernel is proven in network namespaces by
tests/integration/test_netqos.py.
"""
import json
import re
import subprocess

import pytest
from conftest import inventory_file, recap, run_site

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
    """The HTB root and the eBPF classifier on clsact egress of each interface asked for (the VM twin,
    real devices; the container twins are asked for none)."""
    wanted = interfaces(host)
    if not wanted:
        pytest.skip("edge_netqos_interfaces is empty for this device")
    assert host.file("/etc/edgetune/netqos.json").exists
    for name in wanted:
        qdiscs = host.check_output("tc qdisc show dev %s" % name)
        assert re.search(r"^qdisc htb \S+ root", qdiscs, re.M) and "clsact" in qdiscs, qdiscs
        filters = host.check_output("tc filter show dev %s egress" % name)
        assert "bpf" in filters and "direct-action" in filters, filters


def test_asked_on_a_twin_it_reports_unsupported_and_changes_nothing(host):
    before = qdiscs(host)
    intent = {"edge_netqos_interfaces": [{"name": "lo", "rate": "100mbit"}], "edge_netqos_ports": [8000],
              "edge_netqos_install_packages": False}
    result = run_site(host, "--tags", "edge_facts,edge_netqos", "-e", json.dumps(intent))
    # The one change is the audit's record of this intent (one unsupported check, with the reason);
    # removed again, so that the scenario's own intent (no interfaces) is what the rest sees.
    record = "/etc/edgetune/applied/edge_netqos.json"
    try:
        stats = recap(result.stdout, host.backend.host)
        assert stats["failed"] == 0 and stats["changed"] <= 1, result.stdout[-3000:]
        if stats["changed"]:
            checks = json.loads(host.file(record).content_string)["checks"]
            assert [(c["kind"], c["reason"][:38]) for c in checks] == [
                ("unsupported", "/usr/bin/python3 cannot import bcc and")], checks
    finally:
        host.run("rm -f %s" % record)
    assert "edge_netqos unsupported: /usr/bin/python3 cannot import bcc and pyroute2 (package installation is off); " \
           "install python3-bpfcc python3-pyroute2 iproute2 on the device" in " ".join(result.stdout.split()), \
        result.stdout[-3000:]
    assert qdiscs(host) == before
    for path in FILES:
        assert not host.file(path).exists, path
