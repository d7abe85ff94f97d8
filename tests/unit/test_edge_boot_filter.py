"""plugins/filter/edge_boot_state.py and edge_pcie_boot_settings.py: boot-time state files, on the controller."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.controller
# Filter plugins run on the controller (ansible-core), not on the Python 3.8 device.
AnsibleFilterError = pytest.importorskip("ansible.errors", reason="needs ansible-core").AnsibleFilterError

from ansible_collections.edgetune.fleet.plugins.filter import edge_boot_state as state_plugin  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.filter import edge_pcie_boot_settings as pcie_plugin  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot  # noqa: E402

NVME = {"device_class": "0x0108", "tcs": [1], "vc_id": 1}


def test_filters_are_registered_under_their_names():
    assert state_plugin.FilterModule().filters() == {"edge_boot_state": state_plugin.edge_boot_state}
    assert pcie_plugin.FilterModule().filters() == {"edge_pcie_boot_settings": pcie_plugin.edge_pcie_boot_settings}


def test_state_is_the_boot_programs_document_and_reads_back():
    settings = {"mappings": [{"device_class": "0x0108", "tcs": [1], "vc_id": 1, "timeout": 1.0,
                              "fail_unsupported": False}]}
    text = state_plugin.edge_boot_state(settings, "pcie_vc", "edge_pcie_qos")
    assert text == edge_boot.document("pcie_vc", settings, "edge_pcie_qos") and text.endswith("}\n")
    assert json.loads(text) == {"format": 1, "kind": "pcie_vc", "generated_by": "edge_pcie_qos",
                                "settings": settings}
    assert edge_boot.parse(text, "pcie-vc.json") == ("pcie_vc", settings)


def test_state_of_any_kind():
    for kind in ("irq_affinity", "jetson_clocks", "dvfs", "pcie_vc", "rt_budget"):
        assert json.loads(state_plugin.edge_boot_state({"x": 1}, kind, "role"))["kind"] == kind


@pytest.mark.parametrize("settings, kind, message", [
    ({}, "pcie", "edge_boot_state: unknown kind of boot-time state 'pcie' (known: irq_affinity, jetson_clocks, "
                 "dvfs, pcie_vc, rt_budget)"),
    ([1], "pcie_vc", "edge_boot_state: the settings must be a dict, got list"),
    (None, "pcie_vc", "edge_boot_state: the settings must be a dict, got NoneType"),
    ({"when": object()}, "pcie_vc", "edge_boot_state: the pcie_vc settings cannot be saved as JSON: "),
])
def test_state_refuses_what_the_boot_program_cannot_read(settings, kind, message):
    with pytest.raises(AnsibleFilterError) as info:
        state_plugin.edge_boot_state(settings, kind, "edge_pcie_qos")
    assert str(info.value).startswith(message)


def test_pcie_settings_are_the_module_utilitys():
    assert pcie_plugin.edge_pcie_boot_settings([NVME, {"device": "01:00.0", "tcs": [2, 3], "vc_id": 2}], 0.5, True) \
        == {"mappings": [
            {"device_class": "0x0108", "tcs": [1], "vc_id": 1, "timeout": 0.5, "fail_unsupported": True},
            {"device": "0000:01:00.0", "tcs": [2, 3], "vc_id": 2, "timeout": 0.5, "fail_unsupported": True}]}
    assert pcie_plugin.edge_pcie_boot_settings([NVME])["mappings"][0]["timeout"] == 1.0


def test_pcie_settings_name_every_bad_mapping():
    with pytest.raises(AnsibleFilterError) as info:
        pcie_plugin.edge_pcie_boot_settings([NVME, dict(NVME, tcs=[0]), {"tcs": [1]}], 1.0, False)
    assert str(info.value) == (
        "Invalid PCIe TC/VC mappings: mapping 2 (class 0x0108): TC0 cannot be moved: TC0 is always mapped to VC0; "
        "mapping 3: give exactly one of device (a PCI address) and device_class (a PCI class like 0x0108)")


PLAYBOOK = """
- name: Save the mappings as the role does
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    edge_pcie_qos_mappings:
      - {device_class: "0x0108", tcs: [1], vc_id: 1}
      - {device: "0000:03:00.0", tcs: [5, 6, 7], vc_id: 2}
    edge_pcie_qos_timeout: 1.0
    edge_pcie_qos_fail_unsupported: false
  tasks:
    - name: Write the state file
      ansible.builtin.copy:
        dest: "{{ state_dir }}/pcie-vc.json"
        mode: "0644"
        content: >-
          {{ edge_pcie_qos_mappings
             | edgetune.fleet.edge_pcie_boot_settings(edge_pcie_qos_timeout, edge_pcie_qos_fail_unsupported)
             | edgetune.fleet.edge_boot_state('pcie_vc', 'edge_pcie_qos') }}
"""


def test_a_playbook_renders_the_file_the_boot_program_reads(tmp_path):
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    directory = tmp_path / "boot.d"
    directory.mkdir()
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", EDGETUNE_NO_SUMMARY="1")
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(playbook),
                           "-e", "state_dir=%s" % directory, "-e", "ansible_python_interpreter=" + sys.executable],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False)
    assert done.returncode == 0, done.stdout
    settings = {"mappings": [
        {"device_class": "0x0108", "tcs": [1], "vc_id": 1, "timeout": 1.0, "fail_unsupported": False},
        {"device": "0000:03:00.0", "tcs": [5, 6, 7], "vc_id": 2, "timeout": 1.0, "fail_unsupported": False}]}
    # Byte for byte what the modules' edge_boot.sync writes for the same settings.
    assert (directory / "pcie-vc.json").read_text() == edge_boot.document("pcie_vc", settings, "edge_pcie_qos")
    # And the boot program takes it: on a host without these devices, the class finds none (left as it is)
    # and the address is an error.
    out, err = io.StringIO(), io.StringIO()
    assert edge_boot.apply_dir(str(directory), str(tmp_path / "root"), out, err) == 1
    assert out.getvalue() == ("edgetune-boot: pcie_vc: mapping 1 (class 0x0108): not supported, left as it is: "
                              "no PCI device of class 0x0108 on this host\n")
    assert err.getvalue().startswith(
        "edgetune-boot: pcie_vc: error: mapping 2 (0000:03:00.0): PCI device 0000:03:00.0 not found under ")
    assert len(err.getvalue().splitlines()) == 1


@pytest.mark.parametrize("plugin, name, options", [
    (state_plugin, "edge_boot_state", ["_input", "kind", "generated_by"]),
    (pcie_plugin, "edge_pcie_boot_settings", ["_input", "timeout", "fail_unsupported"]),
])
def test_documentation_parses_and_matches_the_filter(plugin, name, options):
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(plugin.DOCUMENTATION)
    yaml.safe_load(plugin.EXAMPLES)
    assert "_value" in yaml.safe_load(plugin.RETURN)
    assert doc["name"] == name and sorted(doc["options"]) == sorted(options)
    assert [p.strip() for p in doc["positional"].split(",")] == options
