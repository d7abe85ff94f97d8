"""`edgetune-dev bench latency` (tools/edgetune_dev/bench.py): nearest-rank percentiles (the
deploy gate's own code), exit codes, standalone use on a device, against a real local runtime."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgetune_dev import bench
from edgetune.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_runtime import Server  # noqa: E402


@given(st.lists(st.floats(min_value=0.001, max_value=1e4, allow_nan=False), min_size=1, max_size=300),
       st.sampled_from([50, 90, 99, 99.9, 100]))
def test_percentiles_are_nearest_rank(values, p):
    ordered = sorted(values)
    assert bench.percentile(ordered, p) in ordered
    # Nearest rank: at least p% of the samples are at or below it, and fewer than p% below it.
    below_or_at = sum(v <= bench.percentile(ordered, p) for v in ordered)
    assert below_or_at >= p / 100.0 * len(ordered)
    assert sum(v < bench.percentile(ordered, p) for v in ordered) < p / 100.0 * len(ordered)


@pytest.mark.parametrize("url", ["https://x:1", "ftp://h", "127.0.0.1:8470", "http://"])
def test_bad_urls(url):
    with pytest.raises(UsageError):
        bench.parse_url(url)
    assert bench.parse_url("http://127.0.0.1:8470") == ("127.0.0.1", 8470, "/infer")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    from edgetune_dev import artifacts
    import shutil
    out = tmp_path_factory.mktemp("bench")
    for item, sub in ((artifacts.package_engine(out), "engine"), (artifacts.package_runtime(out), "runtime")):
        shutil.unpack_archive(item["path"], str(out / sub), "gztar")
    srv = Server(out, "--warmup", "0")
    srv.wait_ready()
    yield srv
    srv.stop()


@pytest.mark.controller
def test_cli_reports_and_exits_by_the_limit(runtime, capsys):
    from edgetune_dev import cli
    url = "http://127.0.0.1:%d" % runtime.port
    assert cli.main(["bench", "latency", "--url", url, "--requests", "30", "--warmup", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["count"] == 30 and result["errors"] == 0 and "samples_ms" not in result
    assert result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert cli.main(["bench", "latency", "--url", url, "--requests", "10", "--p99-ms", "0.001"]) == 1
    assert "is over the limit of 0.001 ms" in capsys.readouterr().out
    assert cli.main(["bench", "latency", "--url", "http://127.0.0.1:1"]) == 2
    assert "nothing answers at 127.0.0.1:1" in capsys.readouterr().err
    assert cli.main(["bench", "latency", "--url", url, "--body", "{bad"]) == 2


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.controller
def test_png_histogram(runtime, tmp_path, capsys):
    from edgetune_dev import cli
    png = tmp_path / "h.png"
    assert cli.main(["bench", "latency", "--url", "http://127.0.0.1:%d" % runtime.port, "--requests", "40",
                     "--warmup", "2", "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC  # matplotlib is a dependency (requirements.txt): no skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].lstrip().startswith("P50 ") and lines[2] == "  histogram: %s" % png


@pytest.mark.controller
def test_numbers_are_printed_before_the_plot_and_survive_its_failure(runtime, tmp_path, capsys, monkeypatch):
    from edgetune_dev import cli
    url = "http://127.0.0.1:%d" % runtime.port
    printed_before_plot = []

    def plot_that_fails(path, series, title, limit_ms=None):
        printed_before_plot.append(capsys.readouterr().out)
        raise RuntimeError("Agg renderer out of memory")

    monkeypatch.setattr(bench, "write_histogram_png", plot_that_fails)
    assert cli.main(["bench", "latency", "--url", url, "--requests", "20", "--warmup", "0", "--json",
                     "--png", str(tmp_path / "h.png")]) == 1
    assert json.loads(printed_before_plot[0])["count"] == 20  # the whole JSON document, before the plot
    assert capsys.readouterr().err == "edgetune: no PNG written to %s: RuntimeError: Agg renderer out of memory\n" \
        % (tmp_path / "h.png")


@pytest.mark.controller
def test_a_plot_that_cannot_be_made_says_why_in_one_line(runtime, tmp_path, capsys, monkeypatch):
    from edgetune_dev import cli
    url = "http://127.0.0.1:%d" % runtime.port
    into_missing_dir = tmp_path / "no-such-dir" / "h.png"
    assert cli.main(["bench", "latency", "--url", url, "--requests", "20", "--warmup", "0",
                     "--png", str(into_missing_dir)]) == 1
    out = capsys.readouterr()
    assert "P50 " in out.out and "histogram:" not in out.out
    assert out.err.startswith("edgetune: no PNG written to %s: FileNotFoundError: " % into_missing_dir)
    assert len(out.err.splitlines()) == 1
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a controller without it
    assert cli.main(["bench", "latency", "--url", url, "--requests", "20", "--warmup", "0", "--json",
                     "--png", str(tmp_path / "h.png")]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["count"] == 20 and not (tmp_path / "h.png").exists()
    assert out.err == ("edgetune: no PNG written to %s: matplotlib is not installed on the controller "
                       "(pip install -r requirements.txt)\n" % (tmp_path / "h.png"))


PIPED_SOURCE = "\n".join((REPO / src).read_text()
                         for src in ("plugins/module_utils/device/edge_latency.py", "tools/edgetune_dev/bench.py"))


def test_runs_standalone_from_stdin_with_the_system_python(runtime):
    """As `edgetune-dev bench runtime` runs it on a device: edge_latency.py then bench.py on stdin, no edgetune
    installed."""
    proc = subprocess.run([sys.executable, "-I", "-", "latency", "--url", "http://127.0.0.1:%d" % runtime.port,
                           "--requests", "20", "--warmup", "0", "--json", "--samples"],
                          input=PIPED_SOURCE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert len(result["samples_ms"]) == 20 and result["p99_ms"] == max(result["samples_ms"])
