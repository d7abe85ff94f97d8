"""The fixtures of the device checks (a pytest plugin: `edgetune verify` runs pytest with
``-p edgetune.checks.plugin``; molecule's shared conftest registers it too).

Each device's expectations come from its plan, which `edgetune verify`
derived and wrote to $EDGETUNE_VERIFY_PLAN (one entry per host). Where a
concern's role is not enabled for a device, its checks are skipped. Under
molecule, fixtures of the same names in molecule/shared/tests (its conftest,
its test modules) give the twins' hand-written expectations instead: pytest
takes them over a plugin's.
"""
import json
import re

import pytest

from edgetune.checks import VERIFY_PLAN
from edgetune.checks.pcie_qos import NVME_CLASS, intent


def pytest_configure(config):
    config.addinivalue_line("markers", "device: a check that only reads a device; `edgetune verify` runs these "
                                       "against real devices")


@pytest.fixture(scope="module")
def plan(host):
    """Under `edgetune verify`: this device's derived expectations; None under molecule."""
    if not VERIFY_PLAN:
        return None
    with open(VERIFY_PLAN) as handle:
        entry = json.load(handle).get(host.backend.host)
    if entry is None or "error" in entry:
        pytest.fail("%s has no plan: %s" % (host.backend.host, (entry or {}).get("error", "not planned")),
                    pytrace=False)
    return entry["expected"]


@pytest.fixture(scope="module")
def expected(plan):
    """The device's expectations (the shape of molecule's EXPECTED, with the tables below)."""
    if plan is None:
        pytest.fail("no expectations: the device checks run under `edgetune verify`, or in molecule's tests "
                    "(which give their own)", pytrace=False)
    return plan


def enabled(expected, key, role):
    if expected[key] is None:
        pytest.skip("%s is not enabled for this device" % role)
    return expected[key]


# ------------------------------------------------------------------ CPUs and the slice
@pytest.fixture
def sets(expected):
    return expected["sets"]


@pytest.fixture
def sysctls(expected):
    """sysctl (path below /proc/sys) -> value."""
    return enabled(expected, "sysctls", "edge_cpu")


@pytest.fixture
def slice_spec(expected):
    """The slice as the inventory asks for it."""
    return enabled(expected, "slice", "edge_cgroups")


@pytest.fixture
def kernel_cpus(host):
    """The CPUs the running kernel schedules on (on a twin, the host's; its sysfs shows the board's)."""
    return [int(n) for n in re.findall(r"^cpu(\d+) ", host.file("/proc/stat").content_string, re.M)]


@pytest.fixture
def unified(host):
    return host.check_output("stat -fc %T /sys/fs/cgroup") == "cgroup2fs"


# ------------------------------------------------------------------ power
@pytest.fixture
def power(expected):
    """What the inventory asks on this board (the housekeeping governors and the mode's top frequency are
    not known from the plan, and not checked)."""
    return enabled(expected, "power", "edge_power")


@pytest.fixture
def jetson(power):
    if power["mode"] is None:
        pytest.skip("nvpmodel and jetson_clocks exist on Jetson boards only")
    return power


# ------------------------------------------------------------------ the runtime
@pytest.fixture
def runtime(expected):
    """The runtime's settings as the inventory asks for them."""
    return enabled(expected, "runtime", "edge_runtime")


# ------------------------------------------------------------------ PCIe
HOW_TO = ('set it in molecule.yml: provisioner.inventory.group_vars.all.edge_pcie_qos_mappings: '
          '[{device_class: "0x0108", tcs: [1], vc_id: 1}]')


@pytest.fixture
def link(host):
    """(upstream BDF, NVMe BDF) of the device's NVMe link."""
    found = host.run("grep -l '^%s' /sys/bus/pci/devices/*/class" % NVME_CLASS).stdout.split()
    if not found:
        pytest.skip("this device has no NVMe controller")
    nvme = found[0].split("/")[-2]
    upstream = host.check_output("basename $(readlink -f /sys/bus/pci/devices/%s/..)" % nvme)
    return upstream, nvme


@pytest.fixture
def mapping(host):
    """The one mapping the checks know: NVMe by class (other shapes are covered by the unit tests)."""
    mappings = intent(host)
    if not mappings:
        pytest.skip("edge_pcie_qos_mappings is not set for this device; " + HOW_TO)
    if VERIFY_PLAN and not (len(mappings) == 1 and mappings[0].get("device_class") == NVME_CLASS):
        pytest.skip("these checks know one mapping shape (NVMe by class); this device's: %s" % mappings)
    assert len(mappings) == 1 and mappings[0].get("device_class") == NVME_CLASS, mappings
    wanted = mappings[0]
    tc_map = sum(1 << tc for tc in wanted["tcs"])
    return {"tcs": wanted["tcs"], "tc_map": tc_map, "vc_id": wanted.get("vc_id", 1)}
