"""The network bench in its smallest form, so that it cannot rot again (it did not run for three
releases after the loader moved): `edgetune-dev bench netqos` in namespaces of its own, one round
of a few probes, then its raw result rendered into the docs' benchmark page. (The LLM host bench's
smallest form runs in tests/unit/test_llm_bench_host.py against a stand-in server.)"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgetune_dev import bench_pages
from test_netqos import _REASON

pytestmark = [pytest.mark.controller, pytest.mark.netns]
if _REASON:
    pytestmark.append(pytest.mark.skip(reason=_REASON))


def test_the_network_bench_runs_and_its_result_makes_a_page(tmp_path):
    out = tmp_path / "results" / "netqos-echo-smoke.json"
    out.parent.mkdir()
    edgetune_dev = str(Path(sys.executable).parent / "edgetune-dev")
    done = subprocess.run([edgetune_dev, "bench", "netqos", "--rounds", "1", "--count", "20", "--warmup", "0.5",
                           "--settle", "0.2", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["bench"] == "netqos-echo" and result["summary"]["with"]["samples"] == 20
    # The bulk flow filled the shaped link in both phases: the bench measured a busy link.
    assert all(phase["link_mbit"] > 10 for phase in result["phases"]), result["phases"]
    pages = bench_pages.render(bench_pages.load(out.parent))
    assert "netqos-echo-smoke.json" in pages["network.md"] and "| without the classifier |" in pages["network.md"]
    # Nothing of the bench is left behind: its namespaces are gone.
    netns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, universal_newlines=True, check=True)
    assert "etqb-" not in netns.stdout
