"""site.yml on the VM twin: what a real kernel booted by a real bootloader shows.

Runs after molecule's converge (site.yml, one reboot through syslinux). The
recovery test comes last: it restores the converged state and ends with a
whole `site.yml --check --diff` after that reboot, which must report no change
and no failure: check mode clean after a reboot and, since check mode reports
what a real run changes (the container twins compare the two), idempotence.
One run for both, because each whole run costs minutes under emulation.
"""
import json
import re
import time
import urllib.request

from conftest import (BOOTARGS, HOUSEKEEPING, INFERENCE, cpulist, edgetune_vm, extlinux_labels, fstype, read,
                      recap, run_site, vm_status)

SLICE = "ai-infer.slice"
RUNTIME = "edgetune-runtime.service"
EXTLINUX = "/boot/extlinux/extlinux.conf"
RUNTIME_TAGS = "edge_facts,edge_runtime"
BOOTARGS_TAGS = "edge_facts,edge_bootargs"


# ------------------------------------------------------------------ identity
def test_the_vm_is_an_orin_nx_on_the_real_kernel(host):
    assert host.file("/sys/firmware/devicetree/base/model").content_string.rstrip("\0") == \
        "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
    assert "R36 (release), REVISION: 4.3" in host.file("/etc/nv_tegra_release").content_string
    assert read(host, "/sys/devices/system/cpu/cpufreq/policy0/related_cpus") == "0 1 2 3"
    assert read(host, "/sys/devices/system/cpu/cpufreq/policy4/related_cpus") == "4 5 6 7"
    # ... while the kernel is the VM's own: x86, 8 CPUs, no fake in /proc.
    assert host.system_info.arch == "x86_64"
    assert cpulist(read(host, "/sys/devices/system/cpu/online")) == list(range(8))
    mounts = []
    for line in host.file("/proc/self/mountinfo").content_string.splitlines():
        left, _, right = line.partition(" - ")
        mounts.append((left.split()[4], right.split()[0]))
    for path in ("/proc/cmdline", "/proc/irq", "/proc/interrupts", "/proc/sys", "/sys/fs/cgroup",
                 "/sys/devices/system/cpu/isolated"):
        faked = [(m, t) for m, t in mounts if (m == path or m.startswith(path + "/")) and t == "tmpfs"]
        assert not faked, faked


# ------------------------------------------------------------------ boot args
def test_bootloader_file_holds_the_args_in_the_default_entry(host):
    labels, default = extlinux_labels(host.file(EXTLINUX).content_string)
    assert default == "primary"
    for arg in BOOTARGS:
        assert arg in labels["primary"], arg
    # The previous arguments stay bootable from the menu.
    assert labels["edgetune-fallback"] is not None
    assert not set(BOOTARGS) & set(labels["edgetune-fallback"])
    assert [t for t in labels["primary"] if t.startswith("root=")] == \
        [t for t in labels["edgetune-fallback"] if t.startswith("root=")]


def test_kernel_booted_the_args_and_honours_them(host):
    assert fstype(host, "/proc/cmdline") == "proc"
    running = read(host, "/proc/cmdline").split()
    for arg in BOOTARGS:
        assert arg in running, arg
    # syslinux passed the DEFAULT entry's APPEND line as it is in the file,
    # between its own BOOT_IMAGE= (the LINUX path) and initrd= (INITRD).
    labels, _ = extlinux_labels(host.file(EXTLINUX).content_string)
    assert running[0].startswith("BOOT_IMAGE=/boot/vmlinuz-") and running[-1].startswith("initrd=/boot/initrd.img-")
    assert running[1:-1] == labels["primary"]
    # The kernel's own files, not a twin's fakes.
    for path, value in (("/sys/devices/system/cpu/isolated", INFERENCE),
                        ("/sys/devices/system/cpu/nohz_full", INFERENCE)):
        assert fstype(host, path) == "sysfs", path
        assert read(host, path) == value, path
    assert int(read(host, "/proc/irq/default_smp_affinity"), 16) == 0x0F   # irqaffinity=0-3
    kernel_log = host.check_output("dmesg")
    assert re.search(r"Offload RCU callbacks from CPUs: %s\.?$" % INFERENCE, kernel_log, re.M)   # rcu_nocbs


# ------------------------------------------------------------------ cgroup v2
def test_slice_cgroup_files_hold_the_configured_values(host, config):
    assert fstype(host, "/sys/fs/cgroup") == "cgroup2fs"
    unit = config["edge_cgroups_slice"]
    cgroup = "/sys/fs/cgroup" + host.check_output("systemctl show -p ControlGroup --value %s" % unit)
    assert read(host, cgroup + "/cpuset.cpus.effective") == INFERENCE
    assert read(host, "/sys/fs/cgroup/system.slice/cpuset.cpus.effective") == HOUSEKEEPING
    quota = config["edge_cgroups_cpu_quota"]
    if quota == "auto":   # the role's auto: every inference CPU, and no more
        assert read(host, cgroup + "/cpu.max") == "%d 100000" % (100000 * len(cpulist(INFERENCE)))
    assert read(host, cgroup + "/cpu.weight") == str(config["edge_cgroups_cpu_weight"])
    memtotal = int(re.search(r"^MemTotal:\s+(\d+) kB", host.file("/proc/meminfo").content_string, re.M).group(1)) * 1024
    for key in ("max", "high"):
        wanted = str(config["edge_cgroups_memory_" + key])
        assert wanted.endswith("%"), wanted
        limit = int(read(host, "%s/memory.%s" % (cgroup, key)))
        assert abs(limit - memtotal * int(wanted[:-1]) / 100) < memtotal * 0.001, (key, limit)


# ------------------------------------------------------------------ runtime
def runtime_threads(host):
    """[comm, policy, rt_priority, last CPU, allowed CPUs] of every llama-server thread, from /proc."""
    pid = int(host.check_output("systemctl show -p MainPID --value %s" % RUNTIME))
    assert pid > 0
    code = ("import os, json, re\n"
            "out = []\n"
            "for tid in sorted(os.listdir('/proc/%d/task'), key=int):\n"
            "    stat = open('/proc/%d/task/%%s/stat' %% tid).read()\n"
            "    fields = stat[stat.rindex(')') + 2:].split()\n"
            "    status = open('/proc/%d/task/%%s/status' %% tid).read()\n"
            "    cpus = re.search(r'Cpus_allowed_list:\\s*(\\S+)', status).group(1)\n"
            "    out.append([stat[stat.index('(') + 1:stat.rindex(')')], int(fields[38]), int(fields[37]),\n"
            "                int(fields[36]), cpus])\n"
            "print(json.dumps(out))\n" % (pid, pid, pid))
    threads = json.loads(host.check_output("python3 -c %s" % quote(code)))
    assert len(threads) >= 3, threads
    return threads


def assert_threads(host, config, policy, rt_priority):
    for comm, seen_policy, seen_priority, last_cpu, cpus in runtime_threads(host):
        assert (seen_policy, seen_priority) == (policy, rt_priority), comm
        assert cpus == INFERENCE, comm
        assert last_cpu in cpulist(INFERENCE), comm                       # where it last ran
    answer = host.run("python3 -c %s" % quote(
        "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:%d/health', timeout=10).status)"
        % config["edge_runtime_port"]))
    assert answer.stdout.strip() == "200", answer.stdout + answer.stderr


def test_fifo_deployed_on_purpose_reaches_every_thread_under_rt_throttling(host, config):
    """SCHED_FIFO, deployed on purpose over the default (pinned SCHED_OTHER, which the container twins
    deploy: the scenario's extra vars), reaches every llama-server thread with the configured priority
    and the inference CPUs, under the real kernel's RT throttling."""
    assert (config["edge_runtime_sched_policy"], config["edge_runtime_require_fifo"]) == ("fifo", True)
    assert read(host, "/proc/sys/kernel/sched_rt_runtime_us") != "-1"    # real RT throttling is on
    assert_threads(host, config, 1, config["edge_runtime_sched_priority"])


def quote(text):
    return "'" + text.replace("'", "'\"'\"'") + "'"


# ------------------------------------------------------------------ eBPF classifier
def htb_counters(host, interface):
    """{class id: packets sent} from `tc -s class show`, as a user reads it."""
    counters, current = {}, None
    for line in host.check_output("tc -s class show dev %s" % interface).splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            current = words[2]
        elif words[:1] == ["Sent"] and current:
            counters[current] = int(words[3])
            current = None
    return counters


def test_ebpf_classifier_is_attached_and_moves_the_htb_counters(host, config):
    interface = config["edge_netqos_interfaces"][0]
    filters = host.check_output("tc filter show dev %s egress" % interface)
    assert "bpf" in filters and "direct-action" in filters, filters
    high, default = config["edge_netqos_high_class"], config["edge_netqos_default_class"]
    before = htb_counters(host, interface)

    # Answers of the runtime (its port, through qemu's forward from the host's loopback).
    port = vm_status()["forwards"][str(config["edge_runtime_port"])]
    for _ in range(20):
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=30) as answer:
            assert answer.status == 200
    after_port = htb_counters(host, interface)
    assert after_port[high] - before[high] >= 20, (before, after_port)

    # A process in the ai-infer slice sending to a port that is not an inference port:
    # classified by its cgroup. The same datagrams from outside the slice are not.
    send = ("python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "[s.sendto(b\"x\" * 100, (\"10.0.2.2\", 9)) for _ in range(50)]'")
    host.check_output("systemd-run --quiet --wait --slice=%s %s" % (config["edge_cgroups_slice"], send))
    after_slice = htb_counters(host, interface)
    assert after_slice[high] - after_port[high] >= 50, (after_port, after_slice)
    host.check_output("systemd-run --quiet --wait --slice=system.slice %s" % send)
    after_other = htb_counters(host, interface)
    assert after_other[default] - after_slice[default] >= 50, (after_slice, after_other)
    assert after_other[high] - after_slice[high] < 50, (after_slice, after_other)


# ------------------------------------------------------------------ recovery
def wait_ssh(timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if vm_status().get("ssh"):
            return True
        time.sleep(5)
    return False


def test_bad_root_is_caught_and_the_fallback_label_brings_the_vm_back(host):
    """The user's recovery, end to end. Runs about boot arguments only use
    --tags edge_facts,edge_bootargs (the reboot and its verification run with any tags)."""
    name = host.backend.host
    good = read(host, "/proc/cmdline").split()
    root = [t for t in good if t.startswith("root=")]
    assert len(root) == 1

    # 1. A boot file change that makes the kernel fail to boot: the post-reboot
    #    wait fails the host (it never comes back on SSH, so the wait lasts its whole timeout:
    #    kept short, the time a good boot takes here).
    out = run_site(host, "--tags", BOOTARGS_TAGS, "-e", json.dumps({
        "edge_bootargs_extra": ["root=/dev/nonexistent"], "edge_reboot_timeout": 60}))
    stats = recap(out.stdout, name)
    assert stats["failed"] + stats["unreachable"] == 1, out.stdout[-4000:]
    assert "Reboot once to apply boot-time settings" in out.stdout
    assert not vm_status().get("ssh")

    # 2. As a user at the serial console: reset, type the fallback label at
    #    syslinux's boot: prompt. The VM comes back with the previous arguments.
    edgetune_vm("console", "--reset", "--boot-label", "edgetune-fallback", "--timeout", "180")
    assert wait_ssh(600), edgetune_vm("status").stdout   # slow under a loaded CI machine
    assert read(host, "/proc/cmdline").split() == good
    labels, default = extlinux_labels(host.file(EXTLINUX).content_string)
    assert default == "primary" and "root=/dev/nonexistent" in labels["primary"]
    assert [t for t in labels["edgetune-fallback"] if t.startswith("root=")] == root

    # 3. The user drops the bad argument from the inventory and runs again: the
    #    entry gets its own root= back (recorded when the extra replaced it), so
    #    it is the entry that booted, and no reboot is due.
    boot_id = read(host, "/proc/sys/kernel/random/boot_id")
    out = run_site(host, "--tags", BOOTARGS_TAGS)
    stats = recap(out.stdout, name)
    assert stats["failed"] == 0 and stats["unreachable"] == 0, out.stdout[-4000:]
    assert read(host, "/proc/sys/kernel/random/boot_id") == boot_id      # not rebooted
    labels, _ = extlinux_labels(host.file(EXTLINUX).content_string)
    assert labels["primary"] == labels["edgetune-fallback"] == good[1:-1], labels

    # 4. After that reboot, the whole site.yml in check mode reports no change: check mode clean
    #    after a reboot, and idempotence (check mode lists what a real run changes).
    out = run_site(host, "--check", "--diff")
    stats = recap(out.stdout, name)
    assert stats["changed"] == 0 and stats["failed"] == 0 and stats["unreachable"] == 0, out.stdout[-4000:]
