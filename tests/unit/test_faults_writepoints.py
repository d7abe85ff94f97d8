"""The write-point tracer's reading of strace output (edgetune_dev.faults): lines as strace 6.1 printed them
for real module runs on a twin (-f -ttt -y), cut down."""
from pathlib import Path

from edgetune_dev.faults import strace_log, writepoints

FIXTURES = Path(__file__).with_name("fixtures") / "strace"

# edge_files replacing a record: the temporary written and fsynced, renamed, its directory fsynced; tempfile's
# probe of /tmp (made and removed: scratch); Ansible's payload (ignored); a call split by another thread.
EDGE_FILES = (FIXTURES / "edge_files.strace").read_text()
# A `shell` task: a sysfs value written by sh's redirection, systemctl asked to restart a unit; then the
# builtin copy's rename without any fsync (relative path through a directory descriptor).
COMMAND = (FIXTURES / "command.strace").read_text()


def lines(text):
    return text.splitlines(True)


def test_the_state_changes_of_a_module_run_in_order_failed_calls_left_out():
    events = list(strace_log.events(lines(EDGE_FILES)))
    assert [(e["kind"], e["path"]) for e in events] == [
        ("mkdir", "/tmp/ansible_edgetune.fleet.edge_files_payload_x1y2z3"),
        ("write", "/tmp/ab1cd2ef"),
        ("remove", "/tmp/ab1cd2ef"),
        ("write", "/etc/edgetune/applied/.edge_cpu.json.kyug5q2x.tmp"),
        ("fsync", "/etc/edgetune/applied/.edge_cpu.json.kyug5q2x.tmp"),
        ("attr", "/etc/edgetune/applied/.edge_cpu.json.kyug5q2x.tmp"),
        ("rename", "/etc/edgetune/applied/edge_cpu.json"),
        ("fsync", "/etc/edgetune/applied"),
    ]
    rename = events[6]
    assert rename["source"] == "/etc/edgetune/applied/.edge_cpu.json.kyug5q2x.tmp"
    assert rename["time"] == 1796656700.0013  # the time the call began, not its resumption
    assert rename["argv"][1].endswith("AnsiballZ_edge_files.py")


def test_a_shells_redirection_systemctls_verb_netlink_and_a_rename_through_directory_descriptors():
    events = list(strace_log.events(lines(COMMAND)))
    assert [(e["kind"], e["path"]) for e in events] == [
        ("write", "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor"),
        ("unit", "systemctl restart edgetune-runtime.service"),
        ("netlink", "rtnetlink RTM_NEWQDISC eth0"),
        ("rename", "/etc/systemd/system/ai-infer.slice"),
    ]
    assert events[0]["argv"][:2] == ["/bin/sh", "-c"]
    assert events[3]["source"] == "/root/.ansible/tmp/ansible-tmp-2/source"


def test_argument_splitting_keeps_strings_and_structures_whole():
    assert strace_log.split_args('AT_FDCWD</>, "a, \\"b\\"", {x=1, y=[2, 3]}, 0') == [
        "AT_FDCWD</>", '"a, \\"b\\""', "{x=1, y=[2, 3]}", "0"]
    assert strace_log.unquote('"tab\\there\\n"') == "tab\there\n"
    assert strace_log.unquote('"cut..."...') == "cut..."
    assert strace_log.resolve("3</etc/x>", "y/../z") == "/etc/x/z"
    assert strace_log.resolve("AT_FDCWD</root>", "/abs") == "/abs"


def write_traces(directory):
    (directory / "1796656700000000000-2100-edge_files.strace").write_text(EDGE_FILES)
    (directory / "1796656701000000000-2200-command.strace").write_text(COMMAND)
    return directory


def test_write_points_are_grouped_by_module_kind_and_pattern_scratch_and_ansibles_own_left_out(tmp_path):
    events = writepoints.read_traces(write_traces(tmp_path))
    rows = [(g["module"], g["kind"], g["pattern"], g["count"]) for g in writepoints.groups(events)]
    assert rows == [
        ("edge_files", "write", "/etc/edgetune/applied/edge_cpu.json (staged)", 1),
        ("edge_files", "attr", "/etc/edgetune/applied/edge_cpu.json (staged)", 1),
        ("edge_files", "rename", "/etc/edgetune/applied/edge_cpu.json", 1),
        ("command", "write", "/sys/devices/system/cpu/cpufreq/policy*/scaling_governor", 1),
        ("command", "unit", "systemctl restart edgetune-runtime.service", 1),
        ("command", "netlink", "rtnetlink RTM_NEWQDISC eth*", 1),
        ("command", "rename", "/etc/systemd/system/ai-infer.slice", 1),
    ]
    sysfs = next(g for g in writepoints.groups(events) if g["kind"] == "write" and g["module"] == "command")
    assert sysfs["via"] == ["sh"] and sysfs["first"] == sysfs["last"]


def test_renames_are_judged_as_a_power_cut_tests_them(tmp_path):
    judged = writepoints.renames(writepoints.read_traces(write_traces(tmp_path)))
    assert [(r["module"], r["target"], r["file_fsync"], r["directory_fsync"]) for r in judged] == [
        ("edge_files", "/etc/edgetune/applied/edge_cpu.json", True, True),
        ("command", "/etc/systemd/system/ai-infer.slice", False, False),
    ]
    assert writepoints.unsynced(judged) == [
        ("command", "/etc/systemd/system/ai-infer.slice", "file fsync and directory fsync")]


def test_a_symlink_switched_by_rename_needs_only_its_directorys_fsync(tmp_path):
    (tmp_path / "1-3000-edge_release.strace").write_text(
        '3000  1796656702.000001 symlinkat("releases/b2", AT_FDCWD</>, "/opt/edgetune/.current.3000.tmp") = 0\n'
        '3000  1796656702.000002 rename("/opt/edgetune/.current.3000.tmp", "/opt/edgetune/current") = 0\n'
        '3000  1796656702.000003 fsync(4</opt/edgetune>) = 0\n')
    judged = writepoints.renames(writepoints.read_traces(tmp_path))
    assert [(r["target"], r["file_fsync"], r["directory_fsync"]) for r in judged] == [
        ("/opt/edgetune/current", None, True)]
    assert writepoints.unsynced(judged) == []


def test_path_patterns_make_what_differs_between_runs_a_star():
    pattern = writepoints.path_pattern
    assert pattern("/proc/irq/123/smp_affinity_list") == "/proc/irq/*/smp_affinity_list"
    assert pattern("/sys/fs/cgroup/system.slice/docker-" + "ab12" * 16 + ".scope/cpu.max") == \
        "/sys/fs/cgroup/system.slice/docker-*.scope/cpu.max"
    assert pattern("/etc/.ansible_tmpq1w2e3r4ai-infer.slice") == "/etc/.ansible_tmp*ai-infer.slice"


def test_each_instance_says_where_a_cut_finds_it_again(tmp_path):
    # The second run of edge_files in the apply; its process 0; the rename is its first rename call, the record's
    # fsync its second fsync (failed calls count too: strace's inject counts every call of the name).
    (tmp_path / "1796656699000000000-2000-edge_files.strace").write_text(
        '2000  1796656699.000001 openat(AT_FDCWD</>, "/etc/a", O_RDONLY) = -1 ENOENT (No such file or directory)\n')
    write_traces(tmp_path)
    events = writepoints.read_traces(tmp_path)
    rename = next(g for g in writepoints.groups(events) if g["kind"] == "rename" and g["module"] == "edge_files")
    assert {key: rename["first"][key] for key in ("run", "process", "call", "nth")} == {
        "run": 2, "process": 0, "call": "rename", "nth": 1}
    written = next(e for e in events if e["kind"] == "write" and e["path"].startswith("/etc/edgetune"))
    assert (written["call"], written["nth"]) == ("openat", 2)   # the probe of /tmp was the first openat
    shell = next(e for e in events if e["via"] == "sh")
    assert (shell["run"], shell["process"], shell["nth"]) == (1, 1, 1)   # sh: the run's second process
