"""Inference traffic priority (edge_netqos) on the twins.
Each container twin has an Ethernet port, eth0, wired to one peer (a veth pair
in the twin's own network namespace, made at its power-on), bcc and pyroute2;
bcc compiles the classifier against the host kernel's headers, which the twin
sees read-only. The twins' inventory asks for the classifier on eth0: it must
be attached, classify the runtime's traffic into the high class (read from the
HTB class counters) and come back after a reboot (test_twin_converged.py). A
host that cannot run it must be reported "unsupported" and left as it was.
What the classifier does in every case is proven in network namespaces by
tests/integration/test_netqos.py. The device checks are edgetune.checks.netqos's, collected here.
"""
import json
import re

import pytest
from conftest import reboot_twin, recap, run_site

from edgetune.checks.netqos import (  # noqa: F401  (the device checks, collected here)
    FILES, interfaces, qdiscs, test_classifier_is_attached_where_the_inventory_asks,
    test_default_leaves_the_network_alone,
    test_the_runtimes_traffic_is_counted_in_the_high_class_and_the_rest_in_the_default)


# Not a `device` check: `edgetune verify` only reads a device, and this one reboots it.
def test_the_classifier_is_back_after_a_reboot(host):
    """The qdiscs and the program do not survive a reboot: edgetune-netqos@ puts them back, without Ansible."""
    wanted = interfaces(host)
    if not wanted:
        pytest.skip("edge_netqos_interfaces is empty for this device")
    if not host.file("/run/edgetune-twin/boot.json").exists:
        pytest.skip("only a twin is rebooted by the tests")
    reboot_twin(host)
    for name in wanted:
        assert host.service("edgetune-netqos@%s.service" % name).is_running
        assert re.search(r"^qdisc htb 1: root", host.check_output("tc qdisc show dev %s" % name), re.M)
        filters = host.check_output("tc filter show dev %s egress" % name)
        assert "edgetune-netqos:" in filters and "direct-action" in filters, filters
    check = host.run("/usr/local/sbin/edgetune-netqos check --config /etc/edgetune/netqos.json")
    assert check.rc == 0, check.stdout + check.stderr


@pytest.mark.one_board
def test_where_bcc_does_not_import_it_reports_unsupported_and_changes_nothing(host):
    """A Python without bcc and pyroute2 (no site packages) and installation off: reported, not failed."""
    before = qdiscs(host)
    without_bcc = "/usr/local/bin/python3-without-bcc"
    host.run_expect([0], "printf '#!/bin/sh\\nexec /usr/bin/python3 -S \"$@\"\\n' > %s && chmod 755 %s"
                    % (without_bcc, without_bcc))
    intent = {"edge_netqos_interfaces": [{"name": "lo", "rate": "100mbit"}], "edge_netqos_ports": [8000],
              "edge_netqos_install_packages": False, "edge_netqos_python": without_bcc}
    # The one change is the audit's record of this intent (one unsupported check, with the reason);
    # the scenario's own record is put back, so that its intent is what the rest sees.
    record = "/etc/edgetune/applied/edge_netqos.json"
    host.run_expect([0], "if [ -e {0} ]; then cp -p {0} {0}.saved; fi".format(record))
    try:
        result = run_site(host, "--tags", "edge_facts,edge_netqos", "-e", json.dumps(intent))
        stats = recap(result.stdout, host.backend.host)
        assert stats["failed"] == 0 and stats["changed"] <= 1, result.stdout[-3000:]
        if stats["changed"]:
            checks = json.loads(host.file(record).content_string)["checks"]
            assert [c["kind"] for c in checks] == ["unsupported"], checks
            assert checks[0]["reason"].startswith("%s cannot import bcc and pyroute2" % without_bcc), checks
    finally:
        host.run("if [ -e {0}.saved ]; then mv {0}.saved {0}; else rm -f {0}; fi".format(record))
        host.run("rm -f %s" % without_bcc)
    assert ("edge_netqos unsupported: %s cannot import bcc and pyroute2 (package installation is off); "
            "install python3-bpfcc python3-pyroute2 iproute2 on the device" % without_bcc) \
        in " ".join(result.stdout.split()), result.stdout[-3000:]
    assert qdiscs(host) == before
    if not interfaces(host):
        for path in FILES:
            assert not host.file(path).exists, path
