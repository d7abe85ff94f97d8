"""The human table of `edgetune audit` (tools/edgetune/audit_report.table): an explanation that
several devices share, such as what a hybrid cgroup mode does not enforce, is said once per run;
each device's line has a short reference to it."""
from edgetune import audit_report

# What edge_cgroups reports on a hybrid (L4T r35) device, the same on each device of a kind.
HYBRID = ("cgroup mode is hybrid: systemd enforces CPUWeight, CPUQuota, MemoryMax and IOWeight of edge-inference.slice "
          "here, but AllowedCPUs=4-7, MemoryHigh=6G and the AllowedCPUs drop-ins of system.slice, user.slice and "
          "init.scope are cgroup-v2 settings and are NOT enforced. CPU confinement uses CPUAffinity= instead "
          "(system.conf.d for the system, the unit for the probe; a service in the slice needs its own "
          "CPUAffinity=4-7). To enforce them boot with the unified hierarchy: set edge_bootargs_cgroup_v2: true "
          "(adds systemd.unified_cgroup_hierarchy=1).")


def device(detail=HYBRID):
    return {"status": "ok", "cause": "", "seconds": 1.0, "results": [
        {"setting": "edge-inference.slice AllowedCPUs, MemoryHigh", "role": "edge_cgroups",
         "state": "unsupported", "detail": detail},
        {"setting": "vm.swappiness", "role": "edge_memory", "state": "drifted", "detail": "60, desired 10"},
        {"setting": "governor", "role": "edge_power", "state": "ok", "detail": ""}]}


def test_a_shared_explanation_is_said_once_and_each_device_refers_to_it():
    hosts = {"orin-%02d" % n: device() for n in range(10)}
    hosts["orin-other"] = device(HYBRID.replace("4-7", "2-5"))  # another board: its own words, its own note
    text = audit_report.table(hosts)
    lines = text.splitlines()
    assert text.count("cgroup mode is hybrid") == 11 + 2
    assert text.count("are NOT enforced") == 2  # the paragraph: once per distinct text, not per device
    refs = [line for line in lines if line.startswith("    unsupported")]
    assert len(refs) == 11
    assert all(line.endswith("cgroup mode is hybrid (note 1)") for line in refs[:10])
    assert refs[10].endswith("cgroup mode is hybrid (note 2)")
    assert lines[-3:-1] == ["note 1: " + HYBRID, "note 2: " + HYBRID.replace("4-7", "2-5")]
    assert all(len(line) <= 120 for line in lines if not line.startswith("note ")), text
    assert "    drifted         vm.swappiness" in text and text.count("60, desired 10") == 11  # short: inline
    assert lines[-1] == "fleet: 11 device(s): 11 ok"


def test_without_long_details_there_are_no_notes():
    text = audit_report.table({"a": device("short reason")})
    assert "note" not in text and "short reason" in text
