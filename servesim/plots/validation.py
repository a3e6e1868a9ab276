"""Plot pages for validation reports: PNG figures (matplotlib Agg) and one static HTML page."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.simulator.validation.compare import METRICS, STATS

LABELS = {"ttft": "TTFT (s)", "tpot": "TPOT (s)", "e2e": "E2E latency (s)", "queueing": "queueing time (s)"}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values, label, style):
    v = np.sort(np.asarray(values, float)[np.isfinite(values)])
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, style, label=label)


def plot_cdfs(paired: pd.DataFrame, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, metric in zip(axes, METRICS):
        _cdf(ax, paired[f"{metric}_meas"], "measured", "k-")
        _cdf(ax, paired[f"{metric}_sim"], "simulated", "C1--")
        ax.set_xlabel(LABELS[metric])
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_scatter(paired: pd.DataFrame, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, metric in zip(axes, ("ttft", "tpot", "e2e")):
        m, s = paired[f"{metric}_meas"].to_numpy(float), paired[f"{metric}_sim"].to_numpy(float)
        ax.scatter(m, s, s=6, alpha=0.6)
        hi = np.nanmax(np.concatenate([m, s])) if len(m) else 1.0
        ax.plot([0, hi], [0, hi], "k:", lw=1)
        ax.set_xlabel(f"measured {LABELS[metric]}")
        ax.set_ylabel("simulated")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_timeseries(measured: pd.DataFrame | None, simulated: pd.DataFrame, path: Path) -> None:
    plt = _plt()
    cols = ["running", "waiting", "kv_cache_pct", "gen_tokens_per_s"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, col in zip(axes, cols):
        if measured is not None and col in measured:
            ax.plot(measured["t_s"], measured[col], "k-", label="measured")
        if col in simulated:
            ax.plot(simulated["t_s"], simulated[col], "C1--", label="simulated")
        ax.set_xlabel("time (s)")
        ax.set_ylabel(col)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _fmt(v, pct=False):
    if v is None:
        return "–"
    return f"{100 * v:+.1f} %" if pct else f"{v:.4g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


CSS = ("body{font-family:sans-serif;max-width:1250px;margin:auto;padding:1em}"
       "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
       "text-align:right}th{background:#eee}img{max-width:100%}.note{color:#a40}")


def write_validation_page(out: Path, report: dict, paired: pd.DataFrame, measured_ts, simulated_ts) -> Path:
    plot_cdfs(paired, out / "cdf.png")
    plot_scatter(paired, out / "scatter.png")
    plot_timeseries(measured_ts, simulated_ts, out / "timeseries.png")
    pr = report["per_request"]
    rows = [[m.upper(), _fmt(pr[m]["median_ape"], True).lstrip("+"), _fmt(pr[m]["mape"], True).lstrip("+"),
             _fmt(pr[m]["median_signed_error"], True)] for m in ("ttft", "tpot", "e2e")]
    per_req = _table(["metric", "median APE", "MAPE", "median signed error"], rows)
    agg_rows = []
    for m in METRICS:
        for st in STATS:
            a = report["aggregate"][m][st]
            agg_rows.append([m, st, _fmt(a["measured"]), _fmt(a["simulated"]), _fmt(a["error"], True)])
    agg = _table(["metric", "stat", "measured (s)", "simulated (s)", "error"], agg_rows)
    ts_rows = [[k, _fmt(v.get("mae")), _fmt(v.get("measured_mean")), _fmt(v.get("simulated_mean")),
                html.escape(v.get("note", ""))] for k, v in report["timeseries"].items()]
    ts = _table(["series", "MAE", "measured mean", "simulated mean", "note"], ts_rows)
    s = report["settings"]
    settings = _table(["setting", "value", "source"],
                      [[k, html.escape(str(s[k])), html.escape(str(s["provenance"].get(k, "")))]
                       for k in s if k != "provenance"])
    notes = "".join(f"<p class=note>{html.escape(n)}</p>" for n in report["run"]["notes"])
    kv = report["kv_cache"]
    cm = report["cost_model"]
    name = html.escape(report["run"]["name"])
    page = f"""<!doctype html><html><head><meta charset=utf-8><title>validation: {name}</title>
<style>{CSS}</style></head><body>
<h1>servesim vs measured: {name}</h1>
<p>{report['pairing']['num_paired']} requests paired by {html.escape(report['pairing']['method'])};
cost model <b>{html.escape(str(cm.get('name')))}</b> {html.escape(str(cm.get('file', '')))}{_skew_text(cm)};
CPU overhead preset <b>{html.escape(report['cpu_overhead']['preset'])}</b>;
KV pool {kv['num_gpu_blocks']} blocks ({html.escape(kv['source'])}),
peak simulated usage {100 * kv['peak_usage_simulated']:.0f} %.</p>
{notes}
<h2>Per-request error</h2>{per_req}
<p>Targets: median E2E APE ≤ 5 % ({report['targets']['e2e_met']}),
median TTFT APE ≤ 10 % ({report['targets']['ttft_met']}).
Makespan: measured {report['makespan']['measured']:.2f} s, simulated {report['makespan']['simulated']:.2f} s.</p>
<h2>Distributions</h2><img src="cdf.png"><img src="scatter.png">
<h2>Aggregate statistics</h2>{agg}
<h2>1-second series</h2><img src="timeseries.png">{ts}
<h2>Engine settings used</h2>{settings}
<p>KV: {html.escape(kv['detail'])}</p>
</body></html>"""
    path = out / "index.html"
    path.write_text(page)
    return path


def write_closed_loop_page(out: Path, report: dict) -> Path:
    """closed_loop.png (measured vs simulated mean TTFT/TPOT per row) and closed_loop.html."""
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in report["rows"] if r["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, k in zip(axes, ("ttft", "tpot")):
        for j, tp in enumerate(sorted({r["tp"] for r in ok})):
            sub = [r for r in ok if r["tp"] == tp]
            ax.scatter([r[f"measured_{k}_ms"] for r in sub], [r[f"sim_{k}_ms"] for r in sub], s=14,
                       color=f"C{j}", label=f"TP{tp}")
        vals = [r[f"measured_{k}_ms"] for r in ok] + [r[f"sim_{k}_ms"] for r in ok]
        if vals:
            lo, hi = min(vals), max(vals)
            ax.plot([lo, hi], [lo, hi], "k:", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"measured mean {k.upper()} (ms)")
        ax.set_ylabel(f"simulated mean {k.upper()} (ms)")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "closed_loop.png", dpi=90)
    plt.close(fig)
    s = report["summary"]
    overall = _table(["metric", "median APE", "MAPE", "median signed", "rows"],
                     [[k, _fmt(v["median_ape"], True).lstrip("+"), _fmt(v["mape"], True).lstrip("+"),
                       _fmt(v["median_signed"], True), str(v["n"])] for k, v in s["overall"].items()])
    groups = _table(["group", "TTFT median APE", "TPOT median APE", "TTFT signed", "TPOT signed", "rows"],
                    [[html.escape(g), _fmt(v["ttft_error"]["median_ape"], True).lstrip("+"),
                      _fmt(v["tpot_error"]["median_ape"], True).lstrip("+"),
                      _fmt(v["ttft_error"]["median_signed"], True), _fmt(v["tpot_error"]["median_signed"], True),
                      str(v["ttft_error"]["n"])] for g, v in s["by_group"].items()])
    rows = _table(["model", "prec", "TP", "ISL", "OSL", "conc", "TTFT meas", "TTFT sim", "err", "TPOT meas",
                   "TPOT sim", "err", "peak KV", "status"],
                  [[html.escape(str(r["model"])), r["precision"], str(r["tp"]), str(r["isl"]), str(r["osl"]),
                    str(r["concurrency"]), f"{r['measured_ttft_ms']:.1f}",
                    f"{r['sim_ttft_ms']:.1f}" if r["status"] == "ok" else "–",
                    _fmt(r.get("ttft_error"), True), f"{r['measured_tpot_ms']:.2f}",
                    f"{r['sim_tpot_ms']:.2f}" if r["status"] == "ok" else "–", _fmt(r.get("tpot_error"), True),
                    f"{100 * r['peak_kv_usage']:.0f} %" if r["status"] == "ok" else "–", html.escape(r["status"])]
                   for r in report["rows"]])
    o = report["options"]
    page = f"""<!doctype html><html><head><meta charset=utf-8><title>closed-loop validation</title>
<style>{CSS}</style></head><body><h1>Closed-loop validation (aiconfigurator silicon, fixed concurrency)</h1>
<p>{s['num_ok']} rows simulated, {s['num_unsupported']} unsupported
({html.escape('; '.join(s['unsupported_reasons']))}).
{o['requests_per_client']} requests per client, first {o['warmup_requests_per_client']} excluded ("steady");
"_all" includes them. Cost model {html.escape(o['cost_model'])}, CPU overhead {html.escape(o['cpu_overhead'])}.</p>
<h2>Overall</h2>{overall}<h2>By model and TP</h2>{groups}<img src="closed_loop.png"><h2>Rows</h2>{rows}</body></html>"""
    path = out / "closed_loop.html"
    path.write_text(page)
    return path


def _skew_text(cm: dict) -> str:
    """The decode-skew factor the cost model used, and where it came from (calibrated/profiled)."""
    if "skew_alpha" not in cm:
        return ""
    alpha = cm["skew_alpha"]
    source = cm.get("skew_alpha_source", "")
    return html.escape(f" (decode-skew α {alpha if alpha is not None else 'none'}"
                       + (f", {source})" if source else ")"))
