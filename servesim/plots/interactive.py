"""The report's interactive figures: hover for values, drag to zoom, double-click to reset, click a
legend entry to hide a series. Drawn by assets/charts.js (small, no library), which is written into
the page with the data, so the page works offline with nothing to fetch.

    html = charts_html(run_charts(res, "replay"))       # a run
    html = charts_html(sweep_charts(sweep, labels))     # a sweep: every variant's curves overlaid

A chart spec: {"title", "xlabel", "ylabel", "step" (draw as steps), "series": [{"name", "color",
"x", "y"}]}, x ascending. Long series are cut to MAX_POINTS by taking each bin's largest value (a
peak stays visible); CDFs are read at MAX_POINTS evenly spaced quantiles.
"""

from __future__ import annotations

import html
import json
from importlib import resources

import numpy as np

from servesim.plots import style

MAX_POINTS = 1500
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency"))
CSS = """
.sschart{position:relative;margin:1em 0;border:1px solid #eee;user-select:none}
.sstip{position:absolute;top:28px;display:none;background:rgba(255,255,255,.95);border:1px solid #ccc;
padding:3px 6px;font-size:11px;white-space:pre;pointer-events:none}
.sslegend span{margin-right:1em;font-size:12px;cursor:pointer} .sslegend span.off{opacity:.35}
.sslegend i{display:inline-block;width:10px;height:10px;margin-right:4px}
"""


def _cdf(values) -> tuple[list[float], list[float]]:
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if not v.size:
        return [], []
    if v.size <= MAX_POINTS:
        return v.tolist(), (np.arange(1, v.size + 1) / v.size).tolist()
    q = np.linspace(0.0, 1.0, MAX_POINTS)
    return np.quantile(v, q).tolist(), q.tolist()


def _pooled(x, y) -> tuple[list[float], list[float]]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)  # JSON has no NaN, and a gap is better than a made-up value
    x, y = x[keep], y[keep]
    if x.size <= MAX_POINTS:
        return x.tolist(), y.tolist()
    k = -(-x.size // MAX_POINTS)
    n = x.size // k * k
    return x[:n:k].tolist(), y[:n].reshape(-1, k).max(axis=1).tolist()


def _series(name: str, i: int, xy: tuple[list, list]) -> dict:
    return {"name": name, "color": style.color(i), "x": xy[0], "y": xy[1]}


def latency_specs(runs: dict) -> list[dict]:
    """TTFT, TPOT and E2E CDFs (ms), one series per run (label -> Results)."""
    return [{"title": f"{name} CDF", "xlabel": f"{name} (ms)", "ylabel": "fraction of requests", "step": True,
             "series": [_series(label, i, _cdf(np.asarray(res.requests[col], dtype=float) * 1e3))
                        for i, (label, res) in enumerate(runs.items())]}
            for col, name in LATENCIES]


def run_charts(res, label: str = "run") -> list[dict]:
    """A run's latency CDFs and its engine state over time (timeseries.csv: per second)."""
    ts = res.timeseries
    t = np.asarray(ts["t_s"], dtype=float)
    state = {"title": "Engine state over time", "xlabel": "simulated time (s)", "ylabel": "requests / KV %",
             "step": True, "series": [_series("running", 0, _pooled(t, ts["running"])),
                                      _series("waiting", 1, _pooled(t, ts["waiting"])),
                                      _series("KV cache used (%)", 7, _pooled(t, ts["kv_cache_pct"]))]}
    tokens = {"title": "Tokens computed per second", "xlabel": "simulated time (s)", "ylabel": "tokens/s",
              "step": True, "series": [_series("prefill", 3, _pooled(t, ts["prefill_tokens_per_s"])),
                                       _series("decode", 0, _pooled(t, ts["decode_tokens_per_s"]))]}
    return latency_specs({label: res}) + [state, tokens]


def overlay_charts(runs: dict) -> list[dict]:
    """Runs overlaid (label -> Results, one series each): latency CDFs and KV usage over time."""
    kv = {"title": "KV-cache usage over time", "xlabel": "simulated time (s)", "ylabel": "KV cache used (%)",
          "step": True, "series": [_series(label, i, _pooled(res.timeseries["t_s"], res.timeseries["kv_cache_pct"]))
                                   for i, (label, res) in enumerate(runs.items())]}
    return latency_specs(runs) + [kv] if runs else []


def sweep_charts(sw, labels: dict[str, str]) -> list[dict]:
    """Every finished variant's latency CDFs and KV usage over time, overlaid (one series each)."""
    ok = sw.table[sw.table["status"] == "ok"]["variant"].tolist()
    return overlay_charts({labels.get(name) or name: sw.variant(name) for name in ok})


def charts_html(specs: list[dict], prefix: str = "chart") -> str:
    """The charts as one HTML fragment: a div and a JSON data block each, the styles and the script."""
    if not specs:
        return ""
    script = resources.files("servesim.plots").joinpath("assets/charts.js").read_text(encoding="utf-8")
    parts = [f"<style>{CSS}</style>"]
    for i, spec in enumerate(specs):
        data = json.dumps(spec, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
        parts.append(f"<div class='sschart' id='{prefix}{i}' data-spec='{prefix}{i}-data' "
                     f"aria-label='{html.escape(spec['title'])}'></div>"
                     f"<script type='application/json' id='{prefix}{i}-data'>{data}</script>")
    parts.append(f"<script>{script}</script>")
    return "\n".join(parts)
