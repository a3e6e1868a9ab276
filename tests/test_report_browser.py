"""The interactive report in a real headless browser (Debian's `chromium`): the page `servesim plot`
writes for a run and for a two-run comparison loads offline with no JS error, every chart draws an
SVG with its series, hover shows a tooltip and a legend click hides a series. A screenshot of each
page is kept in the test's folder (and copied to $SERVESIM_TEST_ARTIFACTS when set).

Skipped where no Chromium is installed (`apt-get install chromium`); the same script is also driven
under node with a DOM stub in tests/test_interactive_report.py, which runs everywhere node does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = [pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed (apt-get install chromium)"),
              pytest.mark.slow]  # a browser start per test: make test only

# Injected first in <head>: collects errors from the page's own scripts, then (after load and one
# tick, so charts.js has drawn) hovers and legend-clicks the first chart and writes what it saw into
# <pre id="probe">, which --dump-dom prints.
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
window.addEventListener("unhandledrejection", function (e) { window.__errors.push(String(e.reason)); });
var __ce = console.error; console.error = function () { window.__errors.push([].join.call(arguments, " ")); __ce.apply(console, arguments); };
window.addEventListener("load", function () { setTimeout(function () {
  var charts = [].map.call(document.querySelectorAll("div.sschart"), function (d) {
    var svg = d.querySelector("svg");
    return {id: d.id, svg: !!svg, width: svg ? svg.getBoundingClientRect().width : 0,
            paths: svg ? svg.querySelectorAll("path").length : 0,
            title: svg ? svg.querySelector("text").textContent : ""};
  });
  var probe = {errors: window.__errors, charts: charts, images: [].map.call(document.images, function (i) {
    return {complete: i.complete, width: i.naturalWidth}; })};
  var first = document.querySelector("div.sschart");
  if (first) {
    var svg = first.querySelector("svg"), r = svg.getBoundingClientRect();
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, bubbles: true}));
    probe.tip = first.querySelector(".sstip").textContent;
    probe.tipShown = getComputedStyle(first.querySelector(".sstip")).display !== "none";
    var before = first.querySelectorAll("svg path").length;
    first.querySelector(".sslegend span").click();
    probe.legendHides = [before, first.querySelectorAll("svg path").length];
  }
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(probe);
  document.body.appendChild(pre);
}, 0); });
</script>"""


def _browse(page: Path, shot: Path) -> dict:
    probed = page.with_name("probed-" + page.name)
    probed.write_text(page.read_text().replace("<head>", "<head>" + PROBE, 1))
    # no network at all: the report must be self-contained (a fetched asset would fail to load)
    common = [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--no-first-run", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
              f"--user-data-dir={page.parent / 'chromium-profile'}", "--window-size=1280,2400",
              "--virtual-time-budget=10000"]
    dom = subprocess.run([*common, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"the probe never ran (page did not load?): {dom.stderr[-2000:]}"
    if art := os.environ.get("SERVESIM_TEST_ARTIFACTS"):
        Path(art).mkdir(parents=True, exist_ok=True)
        if shot.exists():
            shutil.copy(shot, Path(art) / shot.name)
    return json.loads(found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def _check(probe: dict, titles: list[str]) -> None:
    assert probe["errors"] == []
    assert [c["title"] for c in probe["charts"]] == titles
    for c in probe["charts"]:
        assert c["svg"] and c["width"] >= 480 and c["paths"] >= 1, c
    assert all(i["complete"] and i["width"] > 0 for i in probe["images"]), probe["images"]
    assert probe["tipShown"] and probe["tip"].count("\n") >= 1
    assert probe["legendHides"][1] == probe["legendHides"][0] - 1


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from servesim.api import replay

    base = tmp_path_factory.mktemp("runs")
    a = replay(None, out_dir=base / "a", max_requests=30)
    b = replay(None, out_dir=base / "b", max_requests=30, scheduler__max_num_seqs=8)
    return base, a, b


def test_one_run_report_loads_and_its_charts_draw_and_react(runs, tmp_path):
    from servesim.api import plot_results

    base, _, _ = runs
    _, page = plot_results(base / "a", tmp_path / "report")
    shot = tmp_path / "report-one-run.png"
    probe = _browse(Path(page), shot)
    _check(probe, ["TTFT CDF", "TPOT CDF", "E2E latency CDF", "Engine state over time", "Tokens computed per second"])
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


def test_two_run_comparison_overlays_in_the_browser(runs, tmp_path):
    from servesim.api import compare

    base, _, _ = runs
    compare([base / "a", base / "b"], tmp_path / "compare")
    probe = _browse(tmp_path / "compare" / "report.html", tmp_path / "report-compare.png")
    _check(probe, ["TTFT CDF", "TPOT CDF", "E2E latency CDF", "KV-cache usage over time"])
    assert all(c["paths"] == 2 for c in probe["charts"])  # both runs overlaid on every chart
