"""The docs' benchmark pages (tools/edgetune_dev/bench_pages.py): generated from the committed raw
results, every table under its host, date and commit; a result that cannot say where it came from
is refused with one line."""
import json
import subprocess
import sys

import pytest

from edgetune_dev import CHECKOUT, bench_pages

pytestmark = pytest.mark.controller  # the harness, on the controller
RESULTS = CHECKOUT / "docs" / "benchmarks" / "results"


def pages_of(results_dir, dest):
    return subprocess.run([sys.executable, "-m", "edgetune_dev.bench_pages", str(results_dir), str(dest)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)


def test_every_committed_result_is_published_under_its_host_date_and_commit(tmp_path):
    done = pages_of(RESULTS, tmp_path)
    assert done.returncode == 0, done.stderr
    pages = {path.name: path.read_text() for path in tmp_path.glob("*.md")}
    assert set(pages) == {name + ".md" for name, _title in bench_pages.PAGES.values()}
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        name = bench_pages.PAGES[result["bench"]][0] + ".md"
        text = pages[name]
        assert "results/%s" % path.name in text
        assert result["measured_at"] in text and str(result["commit"])[:12] in text
        assert "Host **%s**" % bench_pages._host_name(result["host"]) in text
        assert "|---|" in text  # a table, not only its heading


def test_the_committed_results_are_each_a_run_of_a_clean_checkout():
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        assert len(str(result["commit"]).split("-", maxsplit=1)[0]) == 40, path
        assert not str(result["commit"]).endswith("-dirty"), "%s measured a checkout with changes" % path.name


@pytest.mark.parametrize("drop", bench_pages.REQUIRED)
def test_a_result_without_host_date_commit_or_kind_is_refused_in_one_line(tmp_path, drop):
    result = dict(bench_pages.stamp("netqos-echo"), settings={}, summary={}, phases=[])
    del result[drop]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text(json.dumps(result))
    done = pages_of(tmp_path / "results", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and drop in done.stderr and "run.json" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_result_of_an_unknown_kind_or_not_json_is_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(dict(bench_pages.stamp("astrology"))))
    done = pages_of(tmp_path, tmp_path / "out")
    assert done.returncode == 2 and "astrology" in done.stderr and done.stderr.count("\n") == 1
    (tmp_path / "a.json").write_text("{ half")
    done = pages_of(tmp_path, tmp_path / "out")
    assert done.returncode == 2 and "not a readable JSON result" in done.stderr


def test_the_stamp_names_this_host_now_and_the_checkouts_commit():
    stamp = bench_pages.stamp("audit")
    assert set(bench_pages.REQUIRED) <= set(stamp)
    assert stamp["host"]["cpu_count"] >= 1 and stamp["host"]["hostname"]
    head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                          universal_newlines=True, check=True).stdout.strip()
    assert stamp["commit"].split("-")[0] == head
