"""edgetune-netqos (plugins/module_utils/device/edge_netqos_loader.py): input parsing, validation and the
plan it derives from the live state. Pure functions, no kernel needed; runs
under Python 3.8 too (the loader runs on JetPack 5's Python)."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader as bpf
from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_netqos_loader import NetQosError

# ------------------------------------------------------------------ ports


@pytest.mark.parametrize("value, expected", [
    ("8000", [8000]),
    ("8000,50051", [8000, 50051]),
    (" 50051 , 8000 ", [8000, 50051]),
    ("9000-9002", [9000, 9001, 9002]),
    ([8000, "9000-9001", "8000"], [8000, 9000, 9001]),   # duplicates collapse
    (8000, [8000]),
    ("", []),
    ([], []),
    (None, []),
    ("1,65535", [1, 65535]),
    ("1-16", list(range(1, 17))),                        # exactly the map's size
])
def test_ports_parse(value, expected):
    assert bpf.parse_ports(value) == expected


@pytest.mark.parametrize("value, message", [
    ("0", "invalid port 0"),
    ("65536", "invalid port 65536"),
    ("8000,abc", "invalid port 'abc'"),
    ("8000,,8001", "invalid port ''"),
    ("-5", "invalid port '-5'"),
    ("9002-9000", "end is below the start"),
    ("1-17", "more than 16 ports"),
    (",".join(str(p) for p in range(1000, 1017)), "17 ports given"),
    ([8000, True], "not a number"),
    ([8000.0], "give numbers"),
    ({"port": 8000}, "give numbers"),
])
def test_ports_reject(value, message):
    with pytest.raises(NetQosError, match=message.replace("(", r"\(")):
        bpf.parse_ports(value)


@given(st.sets(st.integers(1, 65535), max_size=16))
def test_ports_round_trip_any_list_up_to_the_map_size(ports):
    assert bpf.parse_ports(",".join(str(p) for p in ports)) == sorted(ports)
    assert bpf.parse_ports(sorted(ports)) == sorted(ports)


@given(st.sets(st.integers(1, 65535), min_size=17, max_size=40))
def test_ports_more_than_the_map_holds_are_refused(ports):
    with pytest.raises(NetQosError, match="at most 16"):
        bpf.parse_ports(sorted(ports))

# ------------------------------------------------------------------ rates


@pytest.mark.parametrize("value, total, expected", [
    ("100mbit", None, 12500000),
    ("1gbit", None, 125000000),
    ("800kbit", None, 100000),
    ("12mbps", None, 12000000),        # bytes per second, as tc reads "mbps"
    ("1mibit", None, 131072),
    ("2.5mbit", None, 312500),
    ("1000000", None, 125000),         # a bare number is bit/s, as in tc
    (8000000, None, 1000000),
    ("20%", 12500000, 2500000),
    ("100%", 12500000, 12500000),
    ("34gbit", None, 4250000000),
])
def test_rates_parse(value, total, expected):
    assert bpf.parse_rate(value, total) == expected


@pytest.mark.parametrize("value, total, message", [
    ("0", None, "is zero"),
    ("0mbit", None, "is zero"),
    (0, None, "is zero"),
    ("7bit", None, "is zero"),           # below one byte per second
    ("-1mbit", None, "not a rate"),
    ("fast", None, "not a rate"),
    ("5furlong", None, "unknown unit"),
    ("20%", None, "needs the link rate"),
    ("0%", 1000, "above 0"),
    ("150%", 1000, "at most 100"),
    ("35gbit", None, "32-bit limit"),
    (None, None, "missing"),
    (True, None, "missing"),
])
def test_rates_reject(value, total, message):
    with pytest.raises(NetQosError, match=message):
        bpf.parse_rate(value, total)


@pytest.mark.parametrize("rate, text", [(12500000, "100mbit"), (125000000, "1gbit"), (100000, "800kbit"),
                                        (312500, "2500kbit"), (1, "8bit")])
def test_rates_format(rate, text):
    assert bpf.format_rate(rate) == text
    assert bpf.parse_rate(text) == rate

# ---------------------------------------------------------------- classes


@pytest.mark.parametrize("value, expected", [("1:10", 0x10010), ("1:a", 0x1000A), ("1:ffff", 0x1FFFF),
                                             (" 1:20 ", 0x10020)])
def test_classids_parse_hex_as_tc_does(value, expected):
    assert bpf.parse_classid(value) == expected
    assert bpf.parse_classid(bpf.format_classid(expected)) == expected


@pytest.mark.parametrize("value, message", [("2:10", "must be 1:<minor>"), ("1:0", "1:0 is the qdisc"),
                                            ("1:1", "1:1 the parent"), ("10", "not a class id"),
                                            ("1:10000", "not a class id"), ("1:g", "not a class id")])
def test_classids_reject(value, message):
    with pytest.raises(NetQosError, match=message):
        bpf.parse_classid(value)

# ---------------------------------------------------------------- cgroups


@pytest.mark.parametrize("value, mount, expected", [
    ("ai-infer.slice", None, "ai.slice/ai-infer.slice"),          # systemd nests slices at each dash
    ("edge-ai-infer.slice", None, "edge.slice/edge-ai.slice/edge-ai-infer.slice"),
    ("machine.slice", None, "machine.slice"),
    ("/ai-infer.slice/", None, "ai-infer.slice"),                  # a path is taken as it is
    ("edge.slice//inference", None, "edge.slice/inference"),
    ("/sys/fs/cgroup/unified/ai-infer.slice", "/sys/fs/cgroup/unified", "ai-infer.slice"),
    ("", None, ""),
    (None, None, ""),
])
def test_cgroup_paths_normalize(value, mount, expected):
    assert bpf.normalize_cgroup(value, mount) == expected


@pytest.mark.parametrize("name", ["-.slice", "ai--infer.slice", "-ai.slice", ".slice"])
def test_cgroup_slice_names_systemd_would_not_nest(name):
    with pytest.raises(NetQosError, match="not a slice name"):
        bpf.normalize_cgroup(name)


def test_cgroup_paths_refuse_dot_dot():
    with pytest.raises(NetQosError, match="'..' are not allowed"):
        bpf.normalize_cgroup("ai-infer.slice/../system.slice")


MOUNTINFO_HYBRID = """\
25 1 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup ro,nosuid shared:8 - tmpfs tmpfs ro,mode=755
27 26 0:25 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:26 / /sys/fs/cgroup/systemd rw,nosuid shared:10 - cgroup cgroup rw,xattr,name=systemd
"""
MOUNTINFO_UNIFIED = "27 25 0:25 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNTINFO_LEGACY = "28 26 0:26 / /sys/fs/cgroup/cpu rw shared:10 - cgroup cgroup rw,cpu\n"


@pytest.mark.parametrize("text, expected", [(MOUNTINFO_HYBRID, "/sys/fs/cgroup/unified"),
                                            (MOUNTINFO_UNIFIED, "/sys/fs/cgroup"), (MOUNTINFO_LEGACY, None)])
def test_cgroup2_mount_found_in_mountinfo(tmp_path, text, expected):
    path = tmp_path / "mountinfo"
    path.write_text(text)
    assert bpf.cgroup2_mount(str(path)) == expected


@pytest.mark.parametrize("text, expected", [
    ("0::/init.scope\n", ""),                                             # a device: systemd at the root
    ("12:cpu,cpuacct:/\n1:name=systemd:/init.scope\n0::/init.scope", ""),  # hybrid, no newline at the end
    ("0::/docker/4f2a/init.scope\n", "docker/4f2a"),                      # a container on the host's cgroup tree
    ("0::/\n", ""),                                                       # PID 1 is not systemd
    ("1:name=systemd:/init.scope\n", ""),                                 # legacy: no v2 line
])
def test_systemd_cgroup_root_from_pid_1s_cgroup(tmp_path, text, expected):
    path = tmp_path / "cgroup"
    path.write_text(text)
    assert bpf.systemd_cgroup_root(str(path)) == expected


def test_a_slice_is_found_below_systemds_own_cgroup(tmp_path, monkeypatch):
    """Where systemd runs below the v2 root, ai.slice/ai-infer.slice is below its cgroup, and the
    level the eBPF helper counts is the depth from the root of the whole hierarchy."""
    (tmp_path / "docker/4f2a/ai.slice/ai-infer.slice").mkdir(parents=True)
    monkeypatch.setattr(bpf, "cgroup2_mount", lambda: str(tmp_path))
    monkeypatch.setattr(bpf, "systemd_cgroup_root", lambda: "docker/4f2a")
    found = bpf.resolve_cgroup("ai.slice/ai-infer.slice", 0x10010)
    assert found["dir"] == str(tmp_path / "docker/4f2a/ai.slice/ai-infer.slice")
    assert (found["path"], found["level"]) == ("ai.slice/ai-infer.slice", 4)
    # Another's slice of the same name (the host's at the root, another twin's below its own
    # systemd) is never taken: twin B's classifier does not reach twin A's slice.
    (tmp_path / "ai.slice/ai-infer.slice").mkdir(parents=True)
    (tmp_path / "docker/9b1c/ai.slice/ai-infer.slice").mkdir(parents=True)
    assert bpf.resolve_cgroup("ai.slice/ai-infer.slice", 0x10010)["dir"] == found["dir"]
    monkeypatch.setattr(bpf, "systemd_cgroup_root", lambda: "docker/77aa")
    with pytest.raises(NetQosError, match="cgroup v2 ai.slice/ai-infer.slice not found .*docker/77aa"):
        bpf.resolve_cgroup("ai.slice/ai-infer.slice", 0x10010)
    # On a device systemd is the root's: the root's slice.
    monkeypatch.setattr(bpf, "systemd_cgroup_root", lambda: "")
    assert bpf.resolve_cgroup("ai.slice/ai-infer.slice", 0x10010)["level"] == 2
    with pytest.raises(NetQosError, match="cgroup v2 edge.slice not found"):
        bpf.resolve_cgroup("edge.slice", 0x10010)

# ------------------------------------------------------- settings, config


def test_resolve_defaults_split_the_link_rate():
    got = bpf.resolve("eth0", overrides={"rate": "100mbit", "ports": "8000"})
    assert got == {"interface": "eth0", "rate": 12500000, "high_rate": 2500000, "default_rate": 10000000,
                   "high_ceil": 12500000, "default_ceil": 12500000,
                   "high_class": 0x10010, "default_class": 0x10020, "ports": [8000], "cgroup": ""}


def test_resolve_ceilings_from_percentages_and_rates():
    got = bpf.resolve("eth0", overrides={"rate": "100mbit", "ports": "8000", "high_ceil": "50%",
                                         "default_ceil": "90mbit"})
    assert (got["high_ceil"], got["default_ceil"]) == (6250000, 11250000)


def test_resolve_precedence_defaults_config_interface_overrides():
    config = {"rate": "100mbit", "ports": [8000], "high_rate": "10mbit", "cgroup": "ai-infer.slice",
              "interfaces": {"wlan0": {"rate": "40mbit", "ports": "50051"}}}
    eth = bpf.resolve("eth0", config)
    wlan = bpf.resolve("wlan0", config)
    cli = bpf.resolve("wlan0", config, {"ports": "8001", "high_rate": None, "rate": None})
    assert (eth["rate"], eth["high_rate"], eth["ports"], eth["cgroup"]) == (12500000, 1250000, [8000],
                                                                            "ai.slice/ai-infer.slice")
    assert (wlan["rate"], wlan["high_rate"], wlan["ports"]) == (5000000, 1250000, [50051])
    assert cli["ports"] == [8001] and cli["rate"] == 5000000  # None means "not given"


@pytest.mark.parametrize("overrides, message", [
    ({"ports": "8000"}, "interface eth0: rate is missing"),
    ({"rate": "0", "ports": "8000"}, "interface eth0: rate '0' is zero"),
    ({"rate": "10mbit", "ports": "8000", "high_rate": "0"}, "high_rate '0' is zero"),
    ({"rate": "10mbit", "ports": "8000", "high_rate": "100%"}, "leave some for the default class"),
    ({"rate": "10mbit", "ports": "8000", "high_rate": "6mbit", "default_rate": "5mbit"}, "exceed the link rate"),
    ({"rate": "10mbit", "ports": "8000", "high_class": "1:20"}, "are both 1:20"),
    ({"rate": "10mbit", "ports": "8000", "high_ceil": "1mbit"}, "high_ceil 1mbit must lie between the class rate"),
    ({"rate": "10mbit", "ports": "8000", "default_ceil": "20mbit"}, "and the link rate 10mbit"),
    ({"rate": "10mbit", "ports": "8000", "default_ceil": "0"}, "default_ceil '0' is zero"),
    ({"rate": "10mbit"}, "nothing to classify"),
    ({"rate": "10mbit", "ports": "8000,x"}, "invalid port 'x'"),
])
def test_resolve_rejects(overrides, message):
    with pytest.raises(NetQosError, match=message):
        bpf.resolve("eth0", overrides=overrides)


@pytest.mark.parametrize("name", ["", "a" * 16, "eth0/x", "eth 0", None])
def test_resolve_rejects_interface_names_the_kernel_would_not_have(name):
    with pytest.raises(NetQosError, match="invalid interface name"):
        bpf.resolve(name, overrides={"rate": "1mbit", "ports": "1"})


def test_resolve_takes_a_cgroup_alone():
    got = bpf.resolve("eth0", overrides={"rate": "1mbit", "cgroup": "ai-infer.slice"})
    assert got["cgroup"] == "ai.slice/ai-infer.slice" and got["ports"] == []


def write(tmp_path, data):
    path = tmp_path / "netqos.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_config_file_loads_and_accepts_a_list_of_interfaces(tmp_path):
    config = bpf.load_config(write(tmp_path, {"version": 1, "rate": "1mbit", "ports": [1], "interfaces": ["eth0"]}))
    assert config["interfaces"] == {"eth0": {}}


@pytest.mark.parametrize("data, message", [
    ("{", "not valid JSON"),
    ("[]", "must be a JSON object"),
    ({"rat": "1mbit"}, "unknown keys: rat"),
    ({"interfaces": {"eth0": {"prots": [1]}}}, "interface eth0 has unknown keys: prots"),
    ({"interfaces": {"eth0": "fast"}}, "must map to an object"),
    ({"interfaces": "eth0"}, "interfaces must be an object"),
])
def test_config_file_rejects(tmp_path, data, message):
    with pytest.raises(NetQosError, match=message):
        bpf.load_config(write(tmp_path, data))


def test_config_file_missing(tmp_path):
    with pytest.raises(NetQosError, match="cannot read the config"):
        bpf.load_config(str(tmp_path / "nope.json"))

# --------------------------------------------------- desired vs live plan


SOURCE = "int edge_classify(void) { return 0; }\n"


def desired(**overrides):
    settings = bpf.resolve("eth0", overrides=dict({"rate": "100mbit", "ports": "8000"}, **overrides))
    return bpf.desired_state(settings, SOURCE, 14)


def live_like(want, **changes):
    """The live state that matches `want`, then changed."""
    classes = dict((c, dict(v, bytes=0, packets=0, drops=0, backlog=0,
                            parent=v["parent"] if v["parent"] != bpf.TC_H_ROOT else bpf.TC_H_ROOT))
                   for c, v in want["classes"].items())
    live = {"interface": "eth0", "index": 2, "clsact": True, "foreign_filters": 0,
            "root": {"kind": "htb", "handle": bpf.ROOT_HANDLE, "default": want["default_minor"]},
            "classes": classes,
            "filters": [{"pref": bpf.FILTER_PREF, "handle": bpf.FILTER_HANDLE, "name": want["filter_name"],
                         "direct_action": True, "prog_id": 7, "prog_name": "edge_classify", "tag": "ab" * 8,
                         "jited": 1, "maps": {"ports": dict(want["ports"]), "cgroup": want["cgroup"]}}]}
    live.update(changes)
    return live


def test_plan_in_sync_has_nothing_to_do():
    want = desired()
    plan, diffs = bpf.compare(want, live_like(want))
    assert diffs == [] and plan["root"] == "ok" and plan["filter"] == "ok" and not plan["maps"]


def test_plan_from_the_kernel_default_root():
    want = desired()
    plan, diffs = bpf.compare(want, live_like(want, root={"kind": "noqueue", "handle": 0}, classes={},
                                              clsact=False, filters=[]))
    assert plan["root"] == "create" and plan["filter"] == "replace" and not plan["clsact"]
    assert "root qdisc is noqueue, not htb 1:" in diffs and "no clsact qdisc" in diffs


def test_plan_refuses_a_root_someone_else_made():
    want = desired()
    plan, diffs = bpf.compare(want, live_like(want, root={"kind": "fq_codel", "handle": 0x80010000}, classes={}))
    assert plan["root"] == "foreign"
    assert diffs[0] == "root qdisc is fq_codel 8001:, not edgetune's htb 1:"


def test_plan_changes_rates_in_place():
    want = desired()
    live = live_like(desired(rate="50mbit"))
    plan, diffs = bpf.compare(want, live)
    assert plan["root"] == "rates" and plan["filter"] == "ok"
    assert "class 1:1 rate is 50mbit, want 100mbit" in diffs


def test_plan_rebuilds_a_tree_with_other_classes():
    want = desired()
    live = live_like(desired(high_class="1:30"))
    plan, diffs = bpf.compare(want, live)
    assert plan["root"] == "rebuild"
    assert "htb classes are 1:1 1:20 1:30, want 1:1 1:10 1:20" in diffs


def test_a_queue_put_behind_a_class_is_drift_and_removed():
    want = desired()
    live = live_like(want, leaves={0x10020: {"kind": "sfq", "handle": 0x200000}})
    plan, diffs = bpf.compare(want, live)
    assert diffs == ["class 1:20 queues in sfq 20:, want HTB's own"]
    assert plan["root"] == "ok" and plan["leaves"] == [(0x10020, {"kind": "sfq", "handle": 0x200000})]
    # A tree rebuilt from scratch takes its leaves with it: nothing to remove one by one.
    plan, _diffs = bpf.compare(want, dict(live_like(desired(high_class="1:30")), leaves=live["leaves"]))
    assert plan["root"] == "rebuild" and plan["leaves"] == []


def test_plan_updates_maps_when_only_ports_differ():
    want = desired(ports="8000,8001")
    plan, diffs = bpf.compare(want, live_like(desired()))
    assert plan["maps"] and plan["filter"] == "ok" and plan["root"] == "ok"
    assert diffs == ["ports map holds 8000->1:10, want 8000->1:10 8001->1:10"]


def test_plan_replaces_the_program_when_its_build_differs():
    want = desired()
    other = bpf.desired_state(bpf.resolve("eth0", overrides={"rate": "100mbit", "ports": "8000"}), SOURCE, 0)
    plan, _diffs = bpf.compare(want, live_like(other))
    assert plan["filter"] == "replace"  # L3 device build (EDGE_L2_LEN=0) is another program


def test_plan_removes_stale_filters_of_ours():
    want = desired()
    live = live_like(want)
    stale = dict(live["filters"][0], pref=50, prog_id=6)
    live["filters"].append(stale)
    plan, diffs = bpf.compare(want, live)
    assert plan["extra_filters"] == [stale] and plan["filter"] == "ok"
    assert "1 stale edgetune filter(s) on egress" in diffs


def test_fingerprint_names_source_and_build_flags():
    base = bpf.fingerprint(SOURCE, bpf.cflags_for(14, False))
    assert base.startswith(bpf.FILTER_PREFIX) and len(base) == len(bpf.FILTER_PREFIX) + 16
    assert base == bpf.fingerprint(SOURCE, bpf.cflags_for(14, False))
    assert base != bpf.fingerprint(SOURCE, bpf.cflags_for(14, True))
    assert base != bpf.fingerprint(SOURCE + " ", bpf.cflags_for(14, False))


def test_the_shipped_classifier_source_is_found_and_has_the_maps_the_loader_reads():
    path, text = bpf.read_source()
    assert path.endswith("bpf/edge_classifier.c")
    for name in (bpf.PROG_FUNC, bpf.PORTS_MAP, bpf.CONFIG_MAP, "EDGE_MAX_PORTS 16", "skb->priority"):
        assert name in text
