"""The audit's declared check schema (plugins/module_utils/device/edge_audit.py CHECK_SCHEMA) and the filters that
build what the roles record: edge_file_checks, edge_record_files, edge_dvfs_overridden, edge_device_artifacts."""
import hashlib
import json
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_audit
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader as netqos
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_artifact import device_paths
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_cmdline import audit_checks as bootargs_checks
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_dvfs import overridden_by_restore
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError

REPO = Path(__file__).resolve().parents[2]

FILE = {"setting": "unit", "role": "edge_x", "kind": "file", "path": "/etc/x", "sha1": "0" * 40}
# One well-formed check of every kind, as the roles write them.
WELL_FORMED = [
    {"setting": "kernel boot arguments", "role": "edge_bootargs", "kind": "cmdline", "bootloader": "extlinux",
     "path": "/boot/extlinux/extlinux.conf", "args": ["isolcpus=4-7"], "absent": [],
     "record": "/etc/edgetune/bootargs.json", "keep": []},
    {"setting": "sysctl vm.swappiness", "role": "edge_cpu", "kind": "value", "path": "/proc/sys/vm/swappiness",
     "desired": "10"},
    {"setting": "memory", "role": "edge_cgroups", "kind": "value", "path": "/sys/fs/cgroup/x/memory.max",
     "desired": 1048576, "compare": "bytes"},
    FILE,
    {"setting": "IRQ affinity", "role": "edge_cpu", "kind": "irq_affinity", "cpus": "0-3", "inference": "4-7",
     "keep_subsets": True, "unmovable_names": [], "state_file": "/var/lib/edgetune/irq.json", "target": "irqs"},
    {"setting": "nvpmodel mode", "role": "edge_power", "kind": "nvpmodel", "mode": "MAXN"},
    {"setting": "PCIe", "role": "edge_pcie_qos", "kind": "pcie_vc", "device": None, "device_class": "0x0108",
     "tcs": [1], "vc_id": 1},
    {"setting": "jetson_clocks", "role": "edge_power", "kind": "jetson_clocks", "desired": "pinned"},
    {"setting": "network priority", "role": "edge_netqos", "kind": "netqos", "config": {}, "interfaces": ["eth0"],
     "loader": "/usr/local/lib/edgetune/edgetune-netqos", "python": "/usr/bin/python3",
     "source": "/usr/local/share/edgetune/edge_classifier.c"},
    {"setting": "runtime release", "role": "edge_runtime", "kind": "runtime", "root": "/opt/edgetune", "release": "r1",
     "artifacts": {"runtime": "ab"}, "service": "edgetune-runtime.service", "expect": {}},
    {"setting": "htb", "role": "edge_netqos", "kind": "unsupported", "reason": "no HTB"},
]


@pytest.mark.parametrize("check", WELL_FORMED, ids=[c["kind"] for c in WELL_FORMED])
def test_every_kind_the_roles_write_is_well_formed(check):
    assert edge_audit.check_problems(check) == []


def test_the_schema_declares_every_kind_the_audit_evaluates():
    assert set(edge_audit.CHECK_SCHEMA) == set(edge_audit.CHECKERS) | {"unsupported"}
    assert {c["kind"] for c in WELL_FORMED} == set(edge_audit.CHECK_SCHEMA)


@pytest.mark.parametrize("check, problem", [
    (dict(FILE, kind="files"), "unknown check kind 'files'"),
    ({k: v for k, v in FILE.items() if k != "sha1"}, "no sha1"),
    (dict(FILE, sha1=None), "sha1 is None, not str"),
    (dict(FILE, shasum="x"), "unknown key shasum for kind file"),
    (dict(WELL_FORMED[7], desired="on"), "desired is 'on', not one of pinned, restored"),
    (dict(WELL_FORMED[4], keep_subsets="yes"), "keep_subsets is 'yes', not bool"),
    (dict(WELL_FORMED[1], desired=True), "desired is True, not str or int or float"),
    ("file", "a check is a mapping, not str"),
])
def test_a_malformed_check_is_named(check, problem):
    assert any(found.startswith(problem) for found in edge_audit.check_problems(check))


def test_the_audit_reports_a_malformed_check_as_an_error_not_a_traceback(tmp_path):
    results, summary = edge_audit.audit([dict(FILE, sha1=None), {"kind": "value"}, ["not", "a", "check"]],
                                        str(tmp_path))
    assert [r["state"] for r in results] == ["error"] * 3
    assert results[0]["setting"] == "unit" and "sha1 is None, not str" in results[0]["detail"]
    assert "no setting" in results[1]["detail"] and "no path" in results[1]["detail"]
    assert summary["error"] == 3


def test_a_key_an_older_record_has_is_tolerated_when_the_audit_reads_it(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/x").write_text("x\n")
    older = dict(FILE, path="/etc/x", sha1=hashlib.sha1(b"x\n").hexdigest(), shasum="from an older edgetune")
    assert edge_audit.check_problems(older) == ["unknown key shasum for kind file"]
    assert edge_audit.check_problems(older, strict=False) == []
    assert edge_audit.evaluate(older, str(tmp_path))["state"] == "ok"


def test_validate_checks_names_the_origin_and_the_check():
    with pytest.raises(EdgeError, match=r"^edge_x_audit: check 'unit': no sha1$"):
        edge_audit.validate_checks([{k: v for k, v in FILE.items() if k != "sha1"}], "edge_x_audit")
    with pytest.raises(EdgeError, match="not a list"):
        edge_audit.validate_checks({"a": 1}, "edge_x_audit")


def test_file_checks_hash_the_rendered_text_and_leave_out_files_not_written():
    checks = edge_audit.file_checks("edge_x", [{"setting": "a", "path": "/etc/a", "content": "héllo\n"},
                                               {"setting": "b", "path": "/etc/b", "content": None},
                                               {"setting": "c", "path": "/etc/c", "content": b"\x00\x01"}])
    assert checks == [
        {"setting": "a", "role": "edge_x", "kind": "file", "path": "/etc/a",
         "sha1": hashlib.sha1("héllo\n".encode()).hexdigest()},
        {"setting": "c", "role": "edge_x", "kind": "file", "path": "/etc/c",
         "sha1": hashlib.sha1(b"\x00\x01").hexdigest()}]
    assert all(edge_audit.check_problems(c) == [] for c in checks)


# Filter plugins run on the controller (ansible-core), not on the Python 3.8 device.
@pytest.mark.controller
def test_the_file_checks_filter_reads_collection_files_by_their_bytes():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.edgetune.fleet.plugins.filter.edge_file_checks import edge_file_checks
    src = "plugins/module_utils/common/edge_cpulist.py"
    checks = edge_file_checks([{"src": src, "dest": "ansible_collections/x/edge_cpulist.py"}], "edge_boot",
                              directory="/usr/local/lib/edgetune", setting="boot program")
    assert checks == [{"setting": "boot program edge_cpulist.py", "role": "edge_boot", "kind": "file",
                       "path": "/usr/local/lib/edgetune/ansible_collections/x/edge_cpulist.py",
                       "sha1": hashlib.sha1((REPO / src).read_bytes()).hexdigest()}]
    with pytest.raises(AnsibleFilterError, match="needs a setting and an absolute path"):
        edge_file_checks([{"dest": "relative", "content": "x"}], "edge_boot", setting="s")
    with pytest.raises(AnsibleFilterError, match="cannot read plugins/none.py"):
        edge_file_checks([{"src": "plugins/none.py", "path": "/x", "setting": "s"}], "edge_boot")


# Filter plugins run on the controller (ansible-core), not on the Python 3.8 device.
@pytest.mark.controller
def test_record_files_are_the_records_edge_audit_reads():
    from ansible_collections.edgetune.fleet.plugins.filter.edge_record_files import edge_record_files
    plan = {"audit": {"record_dir": "/etc/edgetune/applied",
                      "roles": {"edge_x": {"inputs": {"plan": {"x": 1}}}, "edge_y": {"inputs": {}}}}}
    files = edge_record_files(plan, ["edge_x", "edge_y"], [[FILE], []])
    assert [f["dest"] for f in files] == ["/etc/edgetune/applied/edge_x.json", "/etc/edgetune/applied/edge_y.json"]
    assert {f["mode"] for f in files} == {"0600"}
    record = json.loads(files[0]["content"])
    assert record == {"version": edge_audit.RECORD_VERSION, "role": "edge_x", "inputs": {"plan": {"x": 1}},
                      "checks": [FILE]}
    # As Ansible's to_nice_json wrote them before: an unchanged desired state rewrites no record.
    assert files[0]["content"] == json.dumps(record, indent=4, sort_keys=True, separators=(",", ": "))


# Filter plugins run on the controller (ansible-core), not on the Python 3.8 device.
@pytest.mark.controller
def test_a_malformed_check_is_refused_before_any_record_is_written():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.edgetune.fleet.plugins.filter.edge_record_files import edge_record_files
    plan = {"audit": {"record_dir": "/r", "roles": {"edge_x": {"inputs": {}}, "edge_y": {"inputs": {}}}}}
    with pytest.raises(AnsibleFilterError,
                       match=r"^cannot record the apply: edge_y_audit: check 'unit': unknown key sha for kind file$"):
        edge_record_files(plan, ["edge_x", "edge_y"], [[FILE], [dict(FILE, sha="1")]])


SETTINGS = {"cpufreq": {"policy0": {"managed": ["governor", "max_freq"],
                                    "after": {"governor": "performance", "max_freq": 1984000}}},
            "devfreq": {"17000000.gpu": {"managed": ["governor"], "after": {"governor": "performance"}}}}


# Filter plugins run on the controller (ansible-core), not on the Python 3.8 device.
@pytest.mark.controller
def test_a_restore_that_writes_back_other_values_is_a_change_check_mode_reports():
    saved = {"/sys/devices/system/cpu/cpufreq/policy0/scaling_governor": "schedutil",
             "/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq": "1984000",
             "/sys/devices/system/cpu/cpufreq/policy0/scaling_min_freq": "115200",
             "/sys/class/devfreq/17000000.gpu/governor": "nvhost_podgov"}
    assert overridden_by_restore(SETTINGS, saved) == ["/sys/class/devfreq/17000000.gpu/governor",
                                                      "/sys/devices/system/cpu/cpufreq/policy0/scaling_governor"]
    assert overridden_by_restore(SETTINGS, {}) == []
    from ansible_collections.edgetune.fleet.plugins.filter.edge_dvfs_overridden import edge_dvfs_overridden
    restores = [{"restored": True, "saved_values": {"/sys/class/devfreq/17000000.gpu/governor": "performance"}},
                {"restored": True, "saved_values": saved}]
    assert edge_dvfs_overridden({"settings": SETTINGS}, restores) == overridden_by_restore(SETTINGS, saved)
    assert edge_dvfs_overridden({}, restores) == []


def test_artifacts_on_the_device_by_source():
    checked = [{"kind": "runtime", "path": "/ctl/artifacts/rt.tar.gz", "sha256": "aa"},
               {"kind": "engine", "path": "/ctl/artifacts/model.tar.gz", "sha256": "bb"}]
    got = device_paths("controller", "/var/cache/edgetune/", checked)
    assert got == {"artifacts": [{"kind": "runtime", "path": "/var/cache/edgetune/rt.tar.gz", "sha256": "aa"},
                                 {"kind": "engine", "path": "/var/cache/edgetune/model.tar.gz", "sha256": "bb"}],
                   "cache_dirs": ["/var/cache/edgetune", "/var/cache", "/var"]}
    got = device_paths("url", "/var/cache/edgetune", runtime=("http://127.0.0.1:8000/a/rt.tar.gz?x=1", "AA"),
                       engine=("http://127.0.0.1:8000/m.tar.gz", "BB"))
    assert got["artifacts"] == [{"kind": "runtime", "path": "/var/cache/edgetune/rt.tar.gz", "sha256": "aa"},
                                {"kind": "engine", "path": "/var/cache/edgetune/m.tar.gz", "sha256": "bb"}]
    got = device_paths("device", "/var/cache/edgetune", runtime=("/opt/rt.tar.gz", "aa"),
                       engine=("/opt/m.tar.gz", "bb"))
    assert [a["path"] for a in got["artifacts"]] == ["/opt/rt.tar.gz", "/opt/m.tar.gz"]


def test_the_netqos_checks_are_well_formed_in_each_state():
    options = {"interfaces": ["eth0"], "loader": "/usr/local/lib/edgetune/netqos/edge_netqos_loader.py",
               "python": "/usr/bin/python3", "source": "/usr/local/share/edgetune/netqos/edge_classifier.c",
               "config_file": "/etc/edgetune/netqos.json"}
    unsupported = netqos.audit_checks("unsupported: bcc does not import", {}, persist=True, **options)
    assert unsupported == [{"setting": "network priority", "role": "edge_netqos", "kind": "unsupported",
                            "reason": "bcc does not import"}]
    assert netqos.audit_checks("supported", {}, persist=True, **options) == []  # check mode, nothing built yet
    result = {"config": {"interfaces": {"eth0": {"rate": "1gbit"}}}, "config_sha1": "ab" * 20}
    applied = netqos.audit_checks("supported", result, persist=True, **options)
    assert [c["kind"] for c in applied] == ["netqos", "file"]
    assert applied[1] == {"setting": "network priority config", "role": "edge_netqos", "kind": "file",
                          "path": "/etc/edgetune/netqos.json", "sha1": "ab" * 20}
    assert edge_audit.validate_checks(applied, "edge_netqos") == applied
    assert [c["kind"] for c in netqos.audit_checks("supported", result, persist=False, **options)] == ["netqos"]


def test_the_bootargs_check_is_well_formed_from_the_plan():
    plan = {"bootloader": "extlinux", "path": "/boot/extlinux/extlinux.conf", "args": ["isolcpus=4-7"],
            "kernel_isolated": "4-7"}
    checks = bootargs_checks(plan, absent=["quiet"], record="/etc/edgetune/bootargs.json", keep=("root",))
    assert checks == [{"setting": "kernel boot arguments", "role": "edge_bootargs", "kind": "cmdline",
                       "bootloader": "extlinux", "path": "/boot/extlinux/extlinux.conf", "args": ["isolcpus=4-7"],
                       "absent": ["quiet"], "record": "/etc/edgetune/bootargs.json", "keep": ["root"]}]
    assert edge_audit.validate_checks(checks, "edge_bootargs") == checks


def test_the_runtime_release_check_is_well_formed_from_the_deploy():
    check = edge_audit.runtime_release_check(
        "/opt/edgetune/runtime", "llama-0.5.0", [{"kind": "runtime", "sha256": "aa", "path": "/x"},
                                                 {"kind": "engine", "sha256": "bb"}],
        "edgetune-runtime.service", {"policy": "other", "cpus": "4-7"})
    assert check == {"setting": "runtime release", "role": "edge_runtime", "kind": "runtime",
                     "root": "/opt/edgetune/runtime", "release": "llama-0.5.0", "service": "edgetune-runtime.service",
                     "artifacts": {"runtime": "aa", "engine": "bb"}, "expect": {"policy": "other", "cpus": "4-7"}}
    # Check mode before the first deploy: no release yet, still a well-formed check.
    assert edge_audit.runtime_release_check("/opt/r", None, None, "u.service", None)["release"] == ""
    with pytest.raises(EdgeError, match="check 'runtime release': service is None"):
        edge_audit.runtime_release_check("/opt/r", "x", [], None, {})
