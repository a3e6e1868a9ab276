"""report.html: one self-contained page (PNG images embedded as base64, the interactive charts'
script and data inline; no external files) with the summary table and every figure, to attach to a
design review or a ticket."""

from __future__ import annotations

import base64
import datetime as _dt
import html
from pathlib import Path

import pandas as pd

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:.9em} figure{margin:1.2em 0} img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em} table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right} th{background:#f6f6f6}
td:first-child,th:first-child{text-align:left} .err{color:#b00;text-align:left;max-width:40em}
details{margin:.6em 0} summary{cursor:pointer;font-weight:600}
"""

# (column, header, scale, decimals)
SWEEP_COLUMNS = (("ttft_s.p50", "TTFT p50 (ms)", 1e3, 1), ("ttft_s.p99", "TTFT p99 (ms)", 1e3, 1),
                 ("tpot_s.p50", "TPOT p50 (ms)", 1e3, 2), ("e2e_s.p50", "E2E p50 (s)", 1.0, 2),
                 ("throughput.output_tokens_per_s", "output tok/s", 1.0, 0),
                 ("goodput.fraction_meeting_slo", "meet SLO (%)", 100.0, 1),
                 ("num_preemptions", "preemptions", 1.0, 0), ("prefix_cache_hit_rate", "hit rate (%)", 100.0, 1),
                 ("jobs.completion_s.p50", "job p50 (s)", 1.0, 2), ("num_gpu_blocks", "KV blocks", 1.0, 0))


def _num(x, scale: float, digits: int) -> str:
    try:
        if x is None or pd.isna(x):
            return "–"
        return f"{float(x) * scale:,.{digits}f}"
    except (TypeError, ValueError):
        return html.escape(str(x))


def sweep_table(table: pd.DataFrame, labels: dict[str, str]) -> str:
    cols = [c for c in SWEEP_COLUMNS if c[0] in table.columns]
    head = "<tr><th>variant</th>" + "".join(f"<th>{html.escape(h)}</th>" for _, h, _, _ in cols) + "</tr>"
    body = []
    for _, row in table.iterrows():
        name = html.escape(labels.get(row["variant"]) or "base")
        if row["status"] != "ok":
            body.append(f"<tr><td>{name}</td><td class='err' colspan='{len(cols)}'>failed: "
                        f"{html.escape(str(row.get('error')))}</td></tr>")
            continue
        body.append(f"<tr><td>{name}</td>" + "".join(f"<td>{_num(row.get(c), s, d)}</td>" for c, _, s, d in cols)
                    + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def run_table(summary: dict) -> str:
    rows = []
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queueing_s", "queueing")):
        st = summary.get(key) or {}
        rows.append(f"<tr><td>{label} (ms)</td>" + "".join(f"<td>{_num(st.get(p), 1e3, 1)}</td>"
                                                            for p in ("mean", "p50", "p90", "p99")) + "</tr>")
    head = "<tr><th>metric</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th></tr>"
    tp = summary.get("throughput", {})
    facts = [("requests finished", f"{summary.get('num_finished')} / {summary.get('num_requests')}"),
             ("requests rejected (never ran)", _rejected(summary)),
             ("simulated duration (s)", _num(summary.get("sim_duration_s"), 1, 1)),
             ("output throughput (tok/s)", _num(tp.get("output_tokens_per_s"), 1, 0)),
             ("preemptions", str(summary.get("num_preemptions"))),
             ("prefix-cache hit rate (%)", _num(summary.get("prefix_cache_hit_rate"), 100, 1)),
             ("KV blocks", f"{summary.get('num_gpu_blocks')} ({summary.get('num_gpu_blocks_source')})")]
    extra = "".join(f"<tr><td>{html.escape(k)}</td><td colspan='4'>{html.escape(v)}</td></tr>" for k, v in facts)
    return f"<table>{head}{''.join(rows)}{extra}</table>"


def image(path: Path, caption: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return (f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def write_report(out: Path, title: str, description: str, table_html: str,
                 sections: list[tuple[str, list[tuple[Path, str]], bool]], interactive_html: str = "") -> Path:
    """sections: (heading, [(png, caption)], collapsed); interactive_html: the charts of
    plots/interactive.py (charts_html), shown after the summary."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    parts.append(f"<p class='meta'>servesim report, generated {stamp}</p>")
    if description:
        parts.append(f"<p>{html.escape(description)}</p>")
    parts.append("<h2>Summary</h2>" + table_html)
    if interactive_html:
        parts.append("<h2>Interactive figures</h2><p class='meta'>Hover for values; drag across a chart to zoom "
                     "into that range, double-click to zoom out; click a legend entry to hide or show it.</p>"
                     + interactive_html)
    for heading, images, collapsed in sections:
        body = "".join(image(p, c) for p, c in images)
        if collapsed:
            parts.append(f"<details><summary>{html.escape(heading)}</summary>{body}</details>")
        else:
            parts.append(f"<h2>{html.escape(heading)}</h2>{body}")
    parts.append("</body></html>")
    path = Path(out) / "report.html"
    path.write_text("\n".join(parts))
    return path


def _rejected(summary: dict) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in (summary.get("rejected_by_reason") or {}).items())
    return f"{summary.get('num_rejected', 0)}" + (f" ({reasons})" if reasons else "")
