"""End state of a twin after site.yml, as a user would check it, and what check mode said before."""
import json
import os
import re

import pytest
from conftest import converged_check_run, recap, run_site

from edgetune.checks.bootargs import test_bootloader_file_present  # noqa: F401

# Check mode cannot install the release: its tasks need the artifacts on the device, which a real
# run copies first. This task stands for them (a change), and the real run's deploy tasks follow it.
RUNTIME_PENDING = "edgetune.fleet.edge_runtime : Report the release a real run installs"


def test_board_identity_at_the_real_path(host, expected):
    model = host.file("/sys/firmware/devicetree/base/model").content.rstrip(b"\0").decode()
    assert model == expected["model"]


def test_cpu_clusters_as_the_soc_has_them(host, expected):
    clusters = sorted(
        (host.file(path).content_string.strip() for path in
         host.check_output("ls -d /sys/devices/system/cpu/cpufreq/policy*/related_cpus").split()),
        key=lambda cpus: int(cpus.split()[0]))
    as_ranges = ["%s-%s" % (c.split()[0], c.split()[-1]) for c in clusters]
    assert as_ranges == expected["clusters"]


@pytest.fixture(scope="module")
def check_run(host, expected):
    return converged_check_run(host, expected["bootloader"])


def test_check_mode_reports_no_change_and_writes_nothing(host, check_run):
    result, before, after = check_run
    stats = recap(result.stdout, host.backend.host)
    assert stats["failed"] == 0 and stats["unreachable"] == 0, result.stdout[-3000:]
    assert stats["changed"] == 0, result.stdout[-3000:]
    assert after == before


def test_a_run_that_changes_nothing_skips_every_role_that_is_current(host):
    """The converge path: the preflight read the apply records, the plan skips each role whose
    last apply is current and holds (the runtime too: its release serves as recorded); check mode
    decides the same way and changes nothing."""
    result = run_site(host, "--check", "-v")
    stats = recap(result.stdout, host.backend.host)
    assert stats["failed"] == 0 and stats["changed"] == 0, result.stdout[-3000:]
    text = " ".join(result.stdout.split())
    skipped = re.search(r"current, skipped: ([a-z_, ]+)", text)
    assert skipped, result.stdout[-3000:]
    roles = set(skipped.group(1).replace(",", " ").split())
    current = {"edge_bootargs", "edge_cpu", "edge_cgroups", "edge_package", "edge_boot", "edge_audit_timer",
               "edge_runtime"}
    assert current <= roles, roles
    # The facts the preflight reads (edge_applied, edge_autotune) are no unknown variables.
    assert "is not a variable of any edgetune role" not in text, result.stdout[-3000:]


def test_summary_names_board_and_release(host, expected, check_run):
    summary = check_run[0].stdout.split("EDGETUNE FLEET SUMMARY", 1)[1]
    line = next(line for line in summary.splitlines() if line.startswith(host.backend.host + " "))
    assert expected["profile"] in line and expected["release"] in line


# A board family's roles run the same tasks: the scenario of a covered family (agx-orin-r35) has no
# check step on its fresh twin.
@pytest.mark.one_per_family
def test_check_mode_on_the_fresh_twin_listed_every_change_of_the_first_converge(host):
    """Molecule ran `site.yml --check` on the twin never tuned, then converged it (the runs'
    summaries, by edge_summary): check mode exited cleanly and named every task the converge
    changed, in the converge's order, and no other but directories an earlier task creates."""
    name = host.backend.host
    with open(os.environ["EDGETUNE_SUMMARY_JSON"]) as handle:
        runs = [json.loads(line) for line in handle if name in json.loads(line)["hosts"]]
    check, converge = runs[0], runs[1]
    assert check["check_mode"] and not converge["check_mode"], runs[:2]
    assert check["hosts"][name]["state"] == converge["hosts"][name]["state"] == "ok", runs[:2]
    would, did = check["hosts"][name]["changed"], converge["hosts"][name]["changed"]
    missed = [task for task in did if task not in would and
              not (RUNTIME_PENDING in would and task.startswith("edgetune.fleet.edge_runtime : "))]
    assert not missed, (missed, would)
    assert [task for task in would if task in did] == [task for task in did if task in would]
    # A real run makes a shared directory once; check mode reports each task that would make it.
    extra = [task for task in would if task not in did and task != RUNTIME_PENDING]
    assert all(" : Create the director" in task for task in extra), extra
