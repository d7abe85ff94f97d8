"""The deployed inference runtime: answering, scheduled as claimed, idempotent,
upgradable, and rolled back by its gates.

Expectations come from the runtime's contract (runtime/README.md) and the
boards' documented CPUs (conftest.EXPECTED), checked in /proc and systemd, not
from the role's variables. Twins share the host kernel: where it refuses
SCHED_FIFO (Docker gives a container's cgroup no RT budget) or the inference
CPUs (the host has fewer), the deploy must say so and must not claim them;
the FIFO assertions are then skipped with the kernel's reason. The device checks
are edgetune.checks.runtime's, collected here.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import recap

from edgetune.checks.runtime import (  # noqa: F401  (the device checks, collected here)
    PORT, ROOT, UNIT, cpulist, current_release, deployed, fifo_refusal, health, llm_completion, llm_health, main_pid,
    on_device, serves_llm, shell_quote, test_release_layout, test_runtime_answers_with_the_engines_golden_result,
    test_threads_run_with_the_policy_and_cpus_they_claim, thread_sched)

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
ENV_FILE = "/etc/edgetune/runtime.env"


def run_deploy(host, *extra):
    """playbooks/deploy.yml (it detects the board itself) against this one twin; one PLAY RECAP."""
    argv = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "-l", host.backend.host,
            str(PROJECT / "playbooks" / "deploy.yml")] + list(extra)
    result = subprocess.run(argv, cwd=str(PROJECT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True, check=False,
                            env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))
    return result.stdout


def flat(text):
    """Ansible's YAML output wraps long messages: compare with whitespace collapsed."""
    return " ".join(text.split())


def health_status(host):
    """The HTTP status of the current release's readiness endpoint (llama-server's /health, the
    fixture's /healthz)."""
    return (llm_health(host) if serves_llm(host) else health(host))[0]


@pytest.fixture
def runtime():
    """The runtime's settings: its contract's defaults (edgetune.checks.plugin has verify's, from the plan)."""
    return {"port": PORT, "policy": "other", "priority": 40, "require_fifo": None, "http_threads": 4,
            "infer_threads": 1, "cpus": None}


def test_service_runs_sandboxed_as_its_own_user(host):
    props = dict(line.split("=", 1) for line in host.check_output(
        "systemctl show %s -p User -p Type -p NoNewPrivileges -p ProtectSystem -p PrivateTmp -p Slice "
        "-p LimitRTPRIO -p LimitMEMLOCK -p Restart -p ReadWritePaths -p StateDirectory" % UNIT).splitlines())
    llm = serves_llm(host)
    assert props["User"] == "edgetune-rt" and props["Type"] == ("exec" if llm else "notify")
    assert props["NoNewPrivileges"] == "yes" and props["ProtectSystem"] == "strict" and props["PrivateTmp"] == "yes"
    assert props["Slice"] == "ai-infer.slice" and props["LimitRTPRIO"] == "40"
    assert props["LimitMEMLOCK"] == str(512 * 1024 * 1024) and props["Restart"] == "on-failure"
    limits = host.file("/proc/%d/limits" % main_pid(host)).content_string
    memlock = int(re.search(r"^Max locked memory\s+(\S+)", limits, re.M).group(1).replace("unlimited", "-1"))
    if llm:
        # llama-server maps the model and locks it (LLAMA_ARG_LOAD_MODE=mmap+mlock) where the limit allows.
        model = deployed(host)["manifests"]["engine"]["entry"]
        size = int(host.check_output("stat -c %%s %s/current/engine/%s" % (ROOT, model)))
        locked_kb = int(re.search(r"^VmLck:\s+(\d+) kB", host.file("/proc/%d/status" % main_pid(host)).content_string,
                                  re.M).group(1))
        if memlock == -1 or memlock >= 512 * 1024 * 1024:
            assert locked_kb * 1024 >= size * 0.9, (locked_kb, size)
    elif memlock == -1 or memlock >= 512 * 1024 * 1024:
        assert health(host)[1]["mlocked"] is True  # mlockall(MCL_CURRENT) fits in LimitMEMLOCK
    else:
        # systemd could not raise the hard limit (a container without CAP_SYS_RESOURCE): the runtime
        # must say it is not locked rather than pretend.
        assert health(host)[1]["mlocked"] is False
    assert props["ReadWritePaths"] == "/var/lib/edgetune-runtime" and props["StateDirectory"] == "edgetune-runtime"
    uid = host.user("edgetune-rt").uid
    status = host.file("/proc/%d/status" % main_pid(host)).content_string
    assert re.search(r"^Uid:\s+%d\s" % uid, status, re.M)
    assert host.user("edgetune-rt").shell == "/usr/sbin/nologin"
    # In the service's own mount namespace /opt is read-only even for root (ProtectSystem=strict),
    # its state directory is writable, and /tmp is its own (PrivateTmp).
    pid = main_pid(host)
    denied = host.run("nsenter -t %d -m touch %s/edgetune-rt-probe" % (pid, ROOT))
    assert denied.rc != 0 and "Read-only file system" in denied.stderr
    assert host.run("nsenter -t %d -m touch /var/lib/edgetune-runtime/probe" % pid).rc == 0
    host.run("nsenter -t %d -m touch /tmp/edgetune-private-probe" % pid)
    assert not host.file("/tmp/edgetune-private-probe").exists


def test_rerun_changes_nothing_and_reports_the_fallbacks(host, runtime):
    before = (current_release(host), main_pid(host))
    out = run_deploy(host)
    counts = recap(out, host.backend.host)
    assert counts["failed"] == 0 and counts["changed"] == 0, out[-3000:]
    assert (current_release(host), main_pid(host)) == before
    if runtime["policy"] == "fifo" and fifo_refusal(host) is not None:
        assert "[WARNING]: running SCHED_OTHER: SCHED_FIFO priority 40 refused" in flat(out)


# ------------------------------------------------------------------ upgrade, gates, bad input
@pytest.fixture(scope="module")
def releases():
    """Artifacts for an upgrade, a release that cannot warm up, and an engine built for TensorRT."""
    from edgetune_dev import artifacts
    out = Path(tempfile.mkdtemp(prefix="edgetune-runtime-test-"))
    # Releases are immutable: the test versions carry a digest of the sources, so a changed
    # runtime gets new versions and an unchanged one rebuilds the very same artifacts.
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((PROJECT / "runtime").rglob("*.py")))
                            + artifacts.DEFAULT_SPEC.read_bytes()).hexdigest()[:8]
    made = {}
    for version in ("0.9.1", "0.9.2", "0.9.3"):
        tagged = "%s-t%s" % (version, digest)
        made[version] = (artifacts.package_runtime(out, tagged), artifacts.package_engine(out, version=tagged))
    spec = json.loads(artifacts.DEFAULT_SPEC.read_text())
    broken = "0.9.4-t%s" % digest
    doc = artifacts.build_engine_document(spec, broken)
    doc["golden"][0]["class"] = (doc["golden"][0]["class"] + 1) % 10  # the runtime refuses it at warm-up (exit 4)
    made["broken"] = (made["0.9.1"][0], artifacts.package_engine(out / "broken", version=broken, document=doc))
    made["tensorrt"] = (made["0.9.1"][0], artifacts.package_engine(
        out / "trt", version="0.9.5-t%s" % digest, fmt="tensorrt-plan",
        compatibility={"socs": ["tegra234"], "l4t": ">=36.4,<37", "requires": {"tensorrt": {"version": "10.3"}}}))
    yield made
    shutil.rmtree(str(out), ignore_errors=True)


def release_args(pair):
    runtime, engine = pair
    return ["-e", "edge_runtime_runtime_src=%s" % runtime["path"], "-e", "edge_runtime_engine_src=%s" % engine["path"]]


@pytest.mark.one_board
def test_upgrade_then_a_failing_latency_gate_and_a_failing_health_gate_roll_back(host, releases):
    name = host.backend.host
    up, slow, broken = releases["0.9.1"], releases["0.9.2"], releases["broken"]
    up_release = "releases/%s+mlp-small-%s" % (up[0]["version"], up[1]["version"])
    out = run_deploy(host, *release_args(up))
    assert recap(out, name)["failed"] == 0, out[-3000:]
    assert current_release(host) == up_release
    assert health(host)[1]["runtime_version"] == up[0]["version"]
    assert "P99" in flat(out) and "measured on the device" in flat(out)

    env_before = host.file(ENV_FILE).content_string

    # Latency gate: an impossible P99 limit on the next release, whose environment file also changes.
    out = run_deploy(host, "-e", "edge_runtime_p99_ms=0.001", "-e", '{"edge_runtime_env": {"EDGETUNE_PROBE": "1"}}',
                     *release_args(slow))
    assert recap(out, name)["failed"] == 1, out[-3000:]
    assert re.search(r"latency gate: P99 [\d.]+ ms is over the limit of 0.001 ms", flat(out))
    assert "deploy of release %s+mlp-small-%s failed and was rolled back" % (
        slow[0]["version"], slow[1]["version"]) in flat(out)
    assert current_release(host) == up_release
    # The environment file is put back as it was, from the deploy's own result: no backup file is left.
    assert host.file(ENV_FILE).content_string == env_before and "EDGETUNE_PROBE" not in env_before
    assert host.run("ls /etc/edgetune /etc/systemd/system | grep -c '~$'").stdout.strip() == "0"
    status, body = health(host)
    assert status == 200 and body["runtime_version"] == up[0]["version"]

    # Health gate: an engine whose golden result is wrong never gets ready (exit 4).
    out = run_deploy(host, *release_args(broken))
    assert recap(out, name)["failed"] == 1, out[-3000:]
    assert "exit status 4: warm-up failed" in flat(out) and "failed and was rolled back" in flat(out)
    assert current_release(host) == up_release
    status, body = health(host)
    assert status == 200 and body["runtime_version"] == up[0]["version"]
    assert body["engine"]["version"] == up[1]["version"]


def snapshot(host):
    """What a refused deploy must leave as it was: the release, the process, the unit."""
    return current_release(host), main_pid(host), host.file("/etc/systemd/system/%s" % UNIT).content_string


def test_engine_for_another_board_is_refused_before_anything_changes(host, releases):
    name = host.backend.host
    before = snapshot(host)
    out = run_deploy(host, *release_args(releases["tensorrt"]))
    assert recap(out, name)["failed"] == 1 and "incompatible release:" in flat(out)
    assert "refused before role edge_runtime changed anything" in flat(out)
    facts_l4t = host.file("/etc/nv_tegra_release").exists
    if not facts_l4t:
        assert "this board is rk3588" in flat(out) and "runs no L4T" in flat(out)
    elif "R35" in host.file("/etc/nv_tegra_release").content_string:
        assert "which ships TensorRT 8.5.2" in flat(out)  # an engine for TensorRT 10 does not load on r35
    else:
        assert "not installed on this board" in flat(out)  # r36.4 ships TensorRT 10.3; the twin has no libnvinfer
    assert "loads engine formats edgetune-mlp-json/1, not tensorrt-plan" in flat(out)
    assert snapshot(host) == before and health_status(host) == 200


@pytest.mark.one_board
def test_bad_input_fails_before_anything_changes(host, releases):
    name = host.backend.host
    out = run_deploy(host, *release_args(releases["0.9.1"]))
    assert recap(out, name)["failed"] == 0, out[-3000:]
    state_before = snapshot(host)

    def unchanged():
        assert snapshot(host) == state_before
        assert health(host)[0] == 200

    out = run_deploy(host, "-e", "edge_runtime_engine_sha256=%s" % ("0" * 64), *release_args(releases["0.9.3"]))
    assert recap(out, name)["failed"] == 1 and "Checksum mismatch for the engine artifact" in flat(out)
    unchanged()

    out = run_deploy(host, "-e", "edge_runtime_runtime_src=/nonexistent/edgetune-runtime-9.tar.gz")
    assert recap(out, name)["failed"] == 1
    assert "Missing artifact: /nonexistent/edgetune-runtime-9.tar.gz" in flat(out)
    unchanged()

    squatter = host.run("systemd-run --unit edgetune-test-squatter python3 -m http.server 8479 --bind 127.0.0.1")
    assert squatter.rc == 0, squatter.stderr
    try:
        host.run("sleep 1")
        out = run_deploy(host, "-e", "edge_runtime_port=8479", *release_args(releases["0.9.3"]))
        assert recap(out, name)["failed"] == 1
        assert re.search(r"Port 8479 is in use by python3 \(pid \d+, unit edgetune-test-squatter.service\)",
                         flat(out))
        unchanged()
    finally:
        host.run("systemctl stop edgetune-test-squatter")


# ------------------------------------------------------------------ llama-server and a GGUF model
def llm_artifacts(host):
    """The packaged llama-server that runs on this twin (its machine, its glibc) and the GGUF engine."""
    from edgetune_dev import llm
    machine = host.check_output("uname -m")
    glibc = host.check_output("getconf GNU_LIBC_VERSION").split()[-1]
    return llm.deployable(PROJECT / ".cache" / "artifacts", machine, glibc)


def repackaged_engine(engine, out, version, flip_magic=False, compatibility=None):
    """The GGUF engine packaged again under another version: a byte of the model flipped (its
    manifest still consistent, as if the file had been damaged before packaging), or other
    compatibility declarations."""
    import tarfile
    from edgetune_dev import artifacts
    with tarfile.open(engine["path"], "r:gz") as tar:
        model = bytearray(tar.extractfile(engine["entry"]).read())
    if flip_magic:
        model[0] ^= 0x01  # "GGUF" becomes "FGUF"
    manifest = {k: v for k, v in engine.items() if k not in ("artifact", "files", "schema", "path")}
    manifest["version"] = version
    if compatibility is not None:
        manifest["compatibility"] = compatibility
    stem = "edgetune-engine-%s-%s" % (engine["name"], version)
    return artifacts.package(manifest, {engine["entry"]: (bytes(model), 0o644)}, out, stem, compresslevel=1)


@pytest.mark.one_board
def test_llama_server_serves_the_gguf_engine_gated_on_streamed_token_latency(host, releases):
    """llama-server in the slice with one thread per inference CPU, hardened, gated on the stream
    and the engine's first tokens; a damaged GGUF rolls back, an engine for another SoC is refused.
    The release the role's default (auto) picks, named here as a user would."""
    name = host.backend.host
    server, engine = llm_artifacts(host)
    release = "releases/%s+%s-%s" % (server["version"], engine["name"], engine["version"])
    if current_release(host) == release:  # start from the fixture's release, so that the gates run
        assert recap(run_deploy(host, *release_args(releases["0.9.1"])), name)["failed"] == 0
    out = run_deploy(host, *release_args((server, engine)))
    assert recap(out, name)["failed"] == 0, out[-3000:]
    text = flat(out)
    assert current_release(host) == release
    assert re.search(r"time to first token P50 [\d.]+ ms, P99 [\d.]+ ms \(limit 5000(\.0)? ms\); inter-token P50 "
                     r"[\d.]+ ms, P99 [\d.]+ ms \(limit 2000(\.0)? ms\); [\d.]+ tokens/s over 5 generations "
                     r"measured on the device; first tokens as recorded at packaging", text), text[-3000:]
    assert llm_health(host) == [200, {"status": "ok"}]

    unit_text = host.file("/etc/systemd/system/%s" % UNIT).content_string
    assert "ExecStart=%s/current/runtime/%s --model %s/current/engine/%s\n" % (
        ROOT, server["entry"], ROOT, engine["entry"]) in unit_text
    env = host.file("/etc/edgetune/runtime.env").content_string
    threads = thread_sched(host, main_pid(host))
    allowed = {t[3] for t in threads}
    assert len(allowed) == 1, threads
    # One compute thread per inference CPU the service is pinned to; unpinned (the kernel refused
    # the CPUs), one per two CPUs it shares with everything else. From the plan, not the inventory.
    cpus = len(cpulist(allowed.pop()))
    threads_wanted = cpus if "\nCPUAffinity=" in unit_text else max(1, cpus // 2)
    assert "LLAMA_ARG_THREADS=%d\n" % threads_wanted in env, env
    assert "LLAMA_ARG_LOAD_MODE=mmap+mlock\n" in env
    if "EDGETUNE_EXPECT_SCHED=fifo" in env:
        assert {(t[1], t[2]) for t in threads} == {(1, 40)}, threads
    else:
        assert {t[1] for t in threads} == {0} and "# SCHED_OTHER: " in unit_text

    security = host.run("systemd-analyze security --no-pager %s" % UNIT)
    score = re.search(r"Overall exposure level for %s: ([\d.]+)" % re.escape(UNIT), security.stdout)
    assert score and float(score.group(1)) <= 4.0, security.stdout[-2000:]

    out_dir = Path(tempfile.mkdtemp(prefix="edgetune-llm-test-"))
    try:
        digest = engine["artifact"]["sha256"][:8]
        damaged = repackaged_engine(engine, out_dir, "%s-damaged%s" % (engine["version"], digest), flip_magic=True)
        out = run_deploy(host, *release_args((server, damaged)))
        assert recap(out, name)["failed"] == 1, out[-3000:]
        assert "failed and was rolled back" in flat(out) and "health gate" in flat(out), flat(out)[-3000:]
        assert current_release(host) == release and llm_health(host)[0] == 200

        before = snapshot(host)
        other = "rk3588" if host.file("/etc/nv_tegra_release").exists else "tegra234"
        foreign = repackaged_engine(engine, out_dir, "%s-%s%s" % (engine["version"], other, digest),
                                    compatibility={"socs": [other]})
        out = run_deploy(host, *release_args((server, foreign)))
        assert recap(out, name)["failed"] == 1 and "incompatible release:" in flat(out), flat(out)[-3000:]
        assert "refused before role edge_runtime changed anything" in flat(out)
        assert snapshot(host) == before and llm_health(host)[0] == 200
    finally:
        shutil.rmtree(str(out_dir), ignore_errors=True)


@pytest.mark.one_board
def test_back_to_the_inventorys_release(host):
    """Leave the twin as converged: the role's default release (auto: the llama-server build this
    twin runs and the GGUF engine), unchanged on a rerun."""
    out = run_deploy(host)
    assert recap(out, host.backend.host)["failed"] == 0, out[-3000:]
    server, engine = llm_artifacts(host)
    assert current_release(host) == "releases/%s+%s-%s" % (server["version"], engine["name"], engine["version"])
    assert llm_health(host) == [200, {"status": "ok"}]
    assert recap(run_deploy(host), host.backend.host)["changed"] == 0
