"""`edgetune bench latency` (tools/edgetune/bench.py): nearest-rank percentiles (the
deploy gate's own code), exit codes, standalone use on a device, against a real local runtime."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgetune import bench
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
    from edgetune import artifacts
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
    from edgetune import cli
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


@pytest.mark.controller
def test_png_histogram(runtime, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed on this controller")
    result = bench.measure("http://127.0.0.1:%d" % runtime.port, requests=40, warmup=2)
    path = bench.write_histogram_png(str(tmp_path / "h.png"), {"a": result["samples_ms"]}, "t", 50)
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


PIPED_SOURCE = "\n".join((REPO / src).read_text()
                         for src in ("plugins/module_utils/edge_latency.py", "tools/edgetune/bench.py"))


def test_runs_standalone_from_stdin_with_the_system_python(runtime):
    """As tools/bench-runtime runs it on a device: edge_latency.py then bench.py on stdin, no edgetune installed."""
    proc = subprocess.run([sys.executable, "-I", "-", "latency", "--url", "http://127.0.0.1:%d" % runtime.port,
                           "--requests", "20", "--warmup", "0", "--json", "--samples"],
                          input=PIPED_SOURCE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert len(result["samples_ms"]) == 20 and result["p99_ms"] == max(result["samples_ms"])
