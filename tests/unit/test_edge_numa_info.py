"""edge_numa_info on fixture sysfs trees: single-node SoCs and a two-node host with a PCI accelerator."""
import json

import edge_numa_info as numa
import pytest

from ansible.module_utils.testing import patch_module_args
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError


def node(root, number, cpus):
    directory = root / "sys/devices/system/node" / ("node%d" % number)
    directory.mkdir(parents=True)
    (directory / "cpulist").write_text(cpus + "\n")


def pci(root, address, klass, numa_node):
    directory = root / "sys/bus/pci/devices" / address
    directory.mkdir(parents=True)
    (directory / "class").write_text(klass + "\n")
    (directory / "numa_node").write_text("%d\n" % numa_node)


@pytest.fixture
def two_nodes(tmp_path):
    """A 2-socket host: node0 CPUs 0-7, node1 CPUs 8-15; NVMe on node0, a 3D controller (GPU) on node1."""
    node(tmp_path, 0, "0-7")
    node(tmp_path, 1, "8-15")
    pci(tmp_path, "0000:00:01.0", "0x060400", 0)
    pci(tmp_path, "0000:01:00.0", "0x010802", 0)
    pci(tmp_path, "0000:81:00.0", "0x030200", 1)
    return tmp_path


def test_soc_with_one_node_is_not_applicable(tmp_path):
    node(tmp_path, 0, "0-7")
    result = numa.inspect(str(tmp_path), "", "4-7")
    assert result["applicable"] is False and result["node"] is None and result["node_count"] == 1
    assert result["reason"] == "one NUMA node (node0): NUMA binding does not apply"
    assert result["bind_cpus"] == [4, 5, 6, 7] and result["bind_cpulist"] == "4-7"


def test_kernel_without_numa_is_not_applicable(tmp_path):
    result = numa.inspect(str(tmp_path), "", "4-7")
    assert result["node_count"] == 0 and result["applicable"] is False
    assert "CONFIG_NUMA" in result["reason"]


def test_accelerator_found_by_pci_class(two_nodes):
    result = numa.inspect(str(two_nodes), "", "4-11")
    assert result["applicable"] is True and result["node"] == 1
    assert result["accelerator"].endswith("0000:81:00.0")
    assert result["node_cpus"] == list(range(8, 16))
    assert result["bind_cpus"] == [8, 9, 10, 11] and result["bind_cpulist"] == "8-11"
    assert "class 0x0302" in result["reason"] and "node 1" in result["reason"]


def test_accelerator_given_by_address_wins(two_nodes):
    pci(two_nodes, "0000:02:00.0", "0x120000", 0)
    result = numa.inspect(str(two_nodes), "0000:02:00.0", "4-11")
    assert result["node"] == 0 and result["bind_cpus"] == [4, 5, 6, 7]


def test_accelerator_given_by_sysfs_path(two_nodes):
    result = numa.inspect(str(two_nodes), "/sys/bus/pci/devices/0000:01:00.0", "0-3")
    assert result["node"] == 0 and result["bind_cpulist"] == "0-3"


def test_no_accelerator_on_a_multi_node_host_binds_nothing(tmp_path):
    node(tmp_path, 0, "0-7")
    node(tmp_path, 1, "8-15")
    pci(tmp_path, "0000:01:00.0", "0x010802", 0)
    result = numa.inspect(str(tmp_path), "", "8-15")
    assert result["applicable"] is True and result["node"] is None
    assert result["bind_cpus"] == list(range(8, 16))
    assert "set the accelerator's PCI address" in result["reason"]


def test_accelerator_without_a_node_binds_nothing(two_nodes):
    pci(two_nodes, "0000:82:00.0", "0x030000", -1)
    result = numa.inspect(str(two_nodes), "0000:82:00.0", "8-15")
    assert result["node"] is None and "reports no node" in result["reason"]


def test_missing_accelerator_is_reported(two_nodes):
    result = numa.inspect(str(two_nodes), "0000:99:00.0", "8-15")
    assert result["node"] is None and "does not exist" in result["reason"]


def test_inference_cpus_not_on_the_accelerators_node_fail(two_nodes):
    with pytest.raises(EdgeError, match="none of the inference CPUs 0-3 is on node 1 .CPUs 8-15."):
        numa.inspect(str(two_nodes), "", "0-3")


def test_bad_cpu_list_fails(two_nodes):
    with pytest.raises(EdgeError, match="cpus: invalid CPU list item"):
        numa.inspect(str(two_nodes), "", "4-x")


def test_module_returns_the_binding(two_nodes, capsys):
    with patch_module_args({"root": str(two_nodes), "cpus": "8-11", "_ansible_check_mode": True}):
        with pytest.raises(SystemExit):
            numa.main()
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] is False and result["node"] == 1 and result["nodes"] == {"0": "0-7", "1": "8-15"}


def test_module_fails_with_one_message(two_nodes, capsys):
    with patch_module_args({"root": str(two_nodes), "cpus": "0-3"}):
        with pytest.raises(SystemExit):
            numa.main()
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] is True and result["msg"].startswith("none of the inference CPUs 0-3 is on node 1")
