"""End state of a twin after site.yml, as a user would check it."""
import pytest
from conftest import recap, run_site


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


@pytest.mark.device
def test_bootloader_file_present(host, expected):
    assert host.file(expected["bootloader"]).is_file


@pytest.fixture(scope="module")
def check_run(host, expected):
    """One `site.yml --check --diff` for this file's tests, with the boot file's digest around it."""
    before = host.check_output("md5sum %s" % expected["bootloader"])
    result = run_site(host, "--check", "--diff")
    return result, before, host.check_output("md5sum %s" % expected["bootloader"])


def test_check_mode_reports_no_change_and_writes_nothing(host, check_run):
    result, before, after = check_run
    stats = recap(result.stdout, host.backend.host)
    assert stats["failed"] == 0 and stats["unreachable"] == 0, result.stdout[-3000:]
    assert stats["changed"] == 0, result.stdout[-3000:]
    assert after == before


def test_summary_names_board_and_release(host, expected, check_run):
    summary = check_run[0].stdout.split("EDGETUNE FLEET SUMMARY", 1)[1]
    line = next(line for line in summary.splitlines() if line.startswith(host.backend.host + " "))
    assert expected["profile"] in line and expected["release"] in line
