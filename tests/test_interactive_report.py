"""The report's interactive charts (plots/interactive.py, assets/charts.js): self-contained HTML, sane
chart data, and the script driven under node with a minimal DOM (tests/data/dom_stub.js): hover, drag-zoom,
double-click and legend clicks with exact values. tests/test_report_browser.py opens whole pages in
headless Chromium where one is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from servesim.plots.interactive import MAX_POINTS, charts_html, latency_specs, run_charts
from servesim.plots.report import write_report

STUB = Path(__file__).parent / "data" / "dom_stub.js"


@pytest.fixture(scope="module")
def res():
    from servesim.running import load_trace, run
    from servesim.simulator.config import SimConfig

    return run(SimConfig(), load_trace(None, max_requests=20))


def _blocks(page: str) -> tuple[dict, str]:
    specs = {m[0]: json.loads(m[1].replace("<\\/", "</"))
             for m in re.findall(r"<script type='application/json' id='(\w+)-data'>(.*?)</script>", page)}
    return specs, re.findall(r"<script>(.*?)</script>", page, re.S)[-1]


def test_charts_are_self_contained_with_sane_data(res, tmp_path):
    page = write_report(tmp_path, "t", "d", "<table></table>", [], charts_html(run_charts(res, "r"))).read_text()
    assert not re.search(r"""(src|href)=['"](?!data:)""", page)
    specs, script = _blocks(page)
    # nothing to fetch: the one URL is SVG's namespace name, and no fetch/XHR/import
    assert re.findall(r"https?://[^\s\"']+", script) == ["http://www.w3.org/2000/svg"]
    assert not re.search(r"fetch\(|XMLHttpRequest|import\(", script)
    assert [s["title"] for s in specs.values()] == ["TTFT CDF", "TPOT CDF", "E2E latency CDF",
                                                    "Engine state over time", "Tokens computed per second"]
    for spec in specs.values():
        for series in spec["series"]:
            x = np.array(series["x"])
            assert len(x) == len(series["y"]) <= MAX_POINTS and np.all(np.diff(x) >= 0)
    ttft = specs["chart0"]["series"][0]
    assert len(ttft["x"]) == 20 and ttft["y"][-1] == 1.0
    assert ttft["x"][0] == pytest.approx(1e3 * np.nanmin(res.requests["ttft_s"]))


def test_long_series_keep_their_peaks_and_runs_overlay():
    class Fake:
        def __init__(self, values):
            self.requests = {"ttft_s": values, "tpot_s": values, "e2e_s": values}

    specs = latency_specs({"a": Fake(np.linspace(0, 1, 10_000)), "b": Fake(np.array([0.5, np.nan]))})
    a, b = specs[0]["series"]
    assert len(a["x"]) == MAX_POINTS and a["x"][-1] == pytest.approx(1e3) and b["x"] == [500.0]
    from servesim.plots.interactive import _pooled

    x, y = _pooled(np.arange(4000.0), np.where(np.arange(4000) == 1234, 99.0, 1.0))
    assert len(x) <= MAX_POINTS and max(y) == 99.0


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_script_hovers_zooms_and_hides_series(res, tmp_path):
    page = write_report(tmp_path, "t", "", "", [], charts_html(run_charts(res, "r"))).read_text()
    specs, script = _blocks(page)
    out = subprocess.run(["node", str(STUB)], input=json.dumps({"specs": specs, "script": script}),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    drawn = json.loads(out.stdout)
    state = drawn["chart3"]
    assert state["title"] == "Engine state over time" and state["paths"] == 3 and state["afterHide"] == 2
    assert state["tip"].startswith("simulated time (s): ") and "running: " in state["tip"] and "waiting: " in state["tip"]
    assert drawn["chart0"]["paths"] == 1 and drawn["chart0"]["afterHide"] == 0
    full = [float(t) for t in drawn["chart3"]["zoomedTicks"][1:4]]
    assert full == sorted(full)
