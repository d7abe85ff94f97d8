"""Inference traffic priority (edge_netqos) on the twins.

The twins have no network (only lo) and no bcc: by default (no
edge_netqos_interfaces) the role must do nothing, and where it is asked to
run it must report "unsupported" and leave the device as it was, not fail the
host. What the classifier does on a kernel is proven in network namespaces by
tests/integration/test_netqos.py.
"""
import json

from conftest import recap, run_site

FILES = ["/etc/edgetune/netqos.json", "/etc/systemd/system/edgetune-netqos@.service",
         "/usr/local/sbin/edgetune-netqos", "/usr/local/share/edgetune/bpf/edge_classifier.c"]


def qdiscs(host):
    """Root and clsact qdiscs of every interface, as tc shows them."""
    return host.check_output("tc qdisc show")


def test_default_leaves_the_network_alone(host):
    for path in FILES:
        assert not host.file(path).exists, path
    shown = qdiscs(host)
    assert "htb" not in shown and "clsact" not in shown, shown
    assert "edgetune-netqos@" not in host.check_output("systemctl list-units --all --no-legend 'edgetune-netqos@*'")


def test_asked_on_a_twin_it_reports_unsupported_and_changes_nothing(host):
    before = qdiscs(host)
    intent = {"edge_netqos_interfaces": [{"name": "lo", "rate": "100mbit"}], "edge_netqos_ports": [8000],
              "edge_netqos_install_packages": False}
    result = run_site(host, "--tags", "edge_facts,edge_netqos", "-e", json.dumps(intent))
    stats = recap(result.stdout, host.backend.host)
    assert stats["failed"] == 0 and stats["changed"] == 0, result.stdout[-3000:]
    assert "edge_netqos unsupported: /usr/bin/python3 cannot import bcc and pyroute2 (package installation is off); " \
           "install python3-bpfcc python3-pyroute2 iproute2 on the device" in " ".join(result.stdout.split()), \
        result.stdout[-3000:]
    assert qdiscs(host) == before
    for path in FILES:
        assert not host.file(path).exists, path
