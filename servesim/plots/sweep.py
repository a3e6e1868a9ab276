"""Figures of a sweep: metrics against the swept axis with percentile bands, and a small-multiples
page of every variant's engine state."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from servesim.plots import style
from servesim.scenario.model import short_label

BAND = (10, 50, 90)  # percentiles: band low, line, band high


@dataclass(slots=True)
class SweepView:
    """The variants that completed, where each sits on the x axis, and which series it belongs to."""

    x_name: str  # axis label
    x_labels: list[str]  # tick label per x position
    x_values: list[float]  # numeric positions (the values themselves, or 0..n-1 for categories)
    numeric: bool
    rows: pd.DataFrame  # completed variants, with columns "_x" (position) and "_series" (label)
    series: list[str]


def view(sweep) -> SweepView:
    ok = sweep.table[sweep.table["status"] == "ok"].copy()
    axes = sweep.info.get("axes", [])
    params = {v["name"]: v["params"] for v in sweep.info.get("variants", [])}
    if not axes:
        ok["_x"], ok["_series"] = 0.0, ""
        return SweepView("", ["base"], [0.0], False, ok, [""])
    main = max(axes, key=lambda a: (len(a["points"]), _numeric(a)))
    numeric = _numeric(main)
    labels = [_point_label(main, p) for p in main["points"]]
    positions = [float(p[0]) for p in main["points"]] if numeric else list(map(float, range(len(labels))))
    others = [a for a in axes if a is not main]

    def place(name: str) -> tuple[float, str]:
        p = params.get(name, {})
        idx = next((i for i, pt in enumerate(main["points"]) if [p.get(k) for k in main["keys"]] == list(pt)), 0)
        series = ", ".join(short_label({k: p.get(k) for k in a["keys"]}) for a in others)
        return positions[idx], series

    placed = [place(n) for n in ok["variant"]]
    ok["_x"] = [x for x, _ in placed]
    ok["_series"] = [s for _, s in placed]
    name = main["keys"][0] if len(main["keys"]) == 1 else " / ".join(k.rsplit(".", 1)[-1] for k in main["keys"])
    return SweepView(name, labels, positions, numeric, ok, list(dict.fromkeys(ok["_series"])))


def _numeric(axis: dict) -> bool:
    return len(axis["keys"]) == 1 and all(isinstance(p[0], (int, float)) and not isinstance(p[0], bool)
                                          for p in axis["points"])


def _point_label(axis: dict, point: list) -> str:
    """Tick label: the values only (the axis title names the keys), one line per zipped key."""
    return "\n".join(_compact(v) for v in point)


def _compact(value) -> str:
    if isinstance(value, (list, tuple)):
        if not value:
            return "none"
        if len(value) > 1 and all(v == value[0] for v in value):
            return f"{_compact(value[0])}×{len(value)}"
        return ",".join(_compact(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1000 and value % 1000 == 0:
        return f"{value // 1000}k"  # "6k 8k" fit side by side on a log axis where "6000 8000" collide
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def request_bands(sweep, v: SweepView, column: str) -> pd.DataFrame:
    """p10/p50/p90 of a per-request metric for every completed variant (from requests.parquet)."""
    out = []
    for name in v.rows["variant"]:
        vals = sweep.variant(name).requests[column].dropna().to_numpy(dtype=float)
        out.append(np.percentile(vals, BAND) if vals.size else [np.nan] * 3)
    return pd.DataFrame(out, columns=["lo", "mid", "hi"], index=v.rows.index)


def job_bands(sweep, v: SweepView) -> pd.DataFrame | None:
    """p10/p50/p90 of multi-turn job completion time (first arrival to last finish), if any jobs."""
    out, any_jobs = [], False
    for name in v.rows["variant"]:
        folder = sweep.out_dir / "variants" / name
        meta = folder / "request_meta.parquet"
        if not meta.is_file():
            out.append([np.nan] * 3)
            continue
        df = sweep.variant(name).requests.merge(pd.read_parquet(meta), on="request_id")
        df = df[df["session_id"].notna()]
        g = df.groupby("session_id")
        jct = (g["finish_s"].max() - g["arrival_s"].min())[g["finish_s"].count() == g.size()]
        any_jobs |= len(jct) > 0
        out.append(np.percentile(jct, BAND) if len(jct) else [np.nan] * 3)
    return pd.DataFrame(out, columns=["lo", "mid", "hi"], index=v.rows.index) if any_jobs else None


def _draw(ax, v: SweepView, mid: pd.Series, lo: pd.Series | None = None, hi: pd.Series | None = None) -> None:
    """One line (numeric axis) or one row of points (categories) per series, band around it."""
    n = len(v.series)
    for i, series in enumerate(v.series):
        sel = v.rows["_series"] == series
        x = v.rows.loc[sel, "_x"].to_numpy(dtype=float)
        order = np.argsort(x)
        x, y = x[order], mid[sel].to_numpy(dtype=float)[order]
        label = series or None
        if v.numeric:
            ax.plot(x, y, marker="o", ms=4, lw=1.6, color=style.color(i), label=label)
            if lo is not None:
                ax.fill_between(x, lo[sel].to_numpy(dtype=float)[order], hi[sel].to_numpy(dtype=float)[order],
                                color=style.color(i), alpha=0.18, lw=0)
        else:
            dx = (i - (n - 1) / 2) * min(0.6 / max(n, 1), 0.18)
            err = None
            if lo is not None:
                low, high = lo[sel].to_numpy(dtype=float)[order], hi[sel].to_numpy(dtype=float)[order]
                err = np.vstack([y - low, high - y])
            ax.errorbar(x + dx, y, yerr=err, fmt="o", ms=5, capsize=3, color=style.color(i), label=label)
    _x_axis(ax, v)


def _x_axis(ax, v: SweepView) -> None:
    if v.numeric:
        vals = [x for x in v.x_values if x > 0]
        if len(vals) == len(v.x_values) and len(vals) > 2 and max(vals) / min(vals) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(v.x_values, v.x_labels)
        ax.minorticks_off()
    else:
        wide = max(len(line) for label in v.x_labels for line in label.split("\n")) > 10
        ax.set_xticks(v.x_values, v.x_labels, rotation=20 if wide else 0, ha="right" if wide else "center")
        ax.set_xlim(-0.5, len(v.x_values) - 0.5)
    ax.set_xlabel(v.x_name)


def metrics_vs_axis(sweep, title: str | None = None):
    """TTFT/TPOT/E2E (p50, p10–p90 band), throughput, preemptions, hit rate (+ jobs, priorities,
    tenants, SLO classes)."""
    v = view(sweep)
    panels = [("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency")]
    jobs = job_bands(sweep, v)
    groups = [(panel, g) for panel in GROUP_PANELS if (g := _groups(v, panel[0], panel[1]))]
    n = 6 + (jobs is not None) + len(groups)
    ncols = 3
    fig = style.figure(12, 3.3 * math.ceil(n / ncols) + 0.4)
    axes = list(style.subplots(fig, math.ceil(n / ncols), ncols).ravel())
    for ax, (col, name) in zip(axes, panels):
        b = request_bands(sweep, v, col)
        _band_panel(ax, v, b, name)
    scalars = [("throughput.output_tokens_per_s", "Output throughput", "tokens/s", 1.0),
               ("num_preemptions", "Preemptions", "preemptions (whole run)", 1.0),
               ("prefix_cache_hit_rate", "Prefix-cache hit rate", "prompt tokens hit (%)", 100.0)]
    for ax, (col, name, unit, scale) in zip(axes[3:], scalars):
        values = v.rows[col].astype(float) * scale
        _draw(ax, v, values)
        ax.set_title(name)
        ax.set_ylabel(unit)
        if values.fillna(0).eq(0).all():  # say "none" instead of a 0..0.05 axis of nothing
            ax.set_ylim(0, 1)
            ax.set_yticks([0, 1])
            ax.text(0.5, 0.55, "0 in every variant", transform=ax.transAxes, ha="center", color="0.4")
        else:
            ax.set_ylim(bottom=0)
    k = 6
    if jobs is not None:
        _band_panel(axes[k], v, jobs, "Job completion time")
        k += 1
    for panel, names in groups:
        _group_panel(axes[k], v, panel, names)
        k += 1
    for ax in axes[k:]:
        ax.set_visible(False)
    if len(v.series) > 1 or v.series[0]:
        axes[0].legend(frameon=False, fontsize=8, title=None)
    fig.suptitle(title or f"{sweep.info.get('scenario', 'sweep')}: metrics vs {v.x_name} "
                          f"(line: p50, band: p{BAND[0]}–p{BAND[2]} of requests)")
    return fig


def _band_panel(ax, v: SweepView, b: pd.DataFrame, name: str) -> None:
    unit = style.time_unit([b["mid"].max()])  # the largest p50 decides: no "25000 ms" ticks
    _draw(ax, v, b["mid"], b["lo"], b["hi"])
    style.seconds_axis(ax, unit, "y")
    ax.set_title(name)
    ax.set_ylabel(f"{name} ({unit[0]})")
    ax.set_ylim(bottom=0)


# Per-group panels: (column prefix, suffix, series label, title, y label of a seconds axis or None). Priority classes come
# from a sweep's breakdown.json; tenants and SLO classes from the summary's `classes` block.
GROUP_PANELS = (("by_priority.", ".ttft_s.p50", "priority {}", "TTFT p50 by priority class", "TTFT p50"),
                ("classes.by_tenant.", ".ttft_s.p50", "{}", "TTFT p50 by tenant", "TTFT p50"),
                ("classes.by_slo_class.", ".goodput.fraction_meeting_slo", "{}",
                 "Share meeting its SLO class's targets", None))


def _groups(v: SweepView, prefix: str, suffix: str) -> list[str]:
    cols = v.rows.columns
    return sorted({c[len(prefix):-len(suffix)] for c in cols if c.startswith(prefix) and c.endswith(suffix)})


def _group_panel(ax, v: SweepView, panel: tuple, groups: list[str]) -> None:
    """One metric per group (priority class, tenant, SLO class), a series per group."""
    prefix, suffix, label, title, seconds_label = panel
    frames = []
    for c in groups:
        r = v.rows.copy()
        r["_series"] = [label.format(c) + (f", {s}" if s else "") for s in r["_series"]]
        r["_y"] = r[f"{prefix}{c}{suffix}"].astype(float)
        frames.append(r)
    rows = pd.concat(frames, ignore_index=True)
    sub = SweepView(v.x_name, v.x_labels, v.x_values, v.numeric, rows, list(dict.fromkeys(rows["_series"])))
    _draw(ax, sub, rows["_y"])
    ax.set_title(title)
    if seconds_label is not None:
        unit = style.time_unit([rows["_y"].max()])
        style.seconds_axis(ax, unit, "y")
        ax.set_ylabel(f"{seconds_label} ({unit[0]})")
        ax.set_ylim(bottom=0)
    else:
        ax.set_ylabel("fraction of completed requests")
        ax.set_ylim(0, 1.05)
    ax.legend(frameon=False, fontsize=7.5)


def small_multiples(sweep, max_panels: int = 24):
    """One panel per variant: running and waiting requests, KV usage shaded behind (shared axes)."""
    v = view(sweep)
    rows = v.rows.head(max_panels)  # sweep order: the first axis varies slowest, as in the table
    n = max(len(rows), 1)
    ncols = 3 if n in (3, 6, 9) else min(4, n)  # a 2x3 sweep reads best as two rows of three
    nrows = math.ceil(n / ncols)
    fig = style.figure(3.2 * ncols + 0.6, 2.5 * nrows + 0.7)
    axes = style.subplots(fig, nrows, ncols, sharex=True, sharey=True).ravel()
    labels = {x["name"]: short_label(x["params"]) for x in sweep.info.get("variants", [])}
    peak = 1.0
    for ax, name in zip(axes, rows["variant"]):
        ts = sweep.variant(name).timeseries
        kv = ax.twinx()
        kv.fill_between(ts["t_s"], ts["kv_cache_pct"], step="post", color=style.KV, alpha=0.25, lw=0)
        kv.set_ylim(0, 100)
        kv.set_yticks([0, 50, 100])
        kv.tick_params(labelsize=7, colors="0.45")
        kv.grid(False)
        ax.set_zorder(kv.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.step(ts["t_s"], ts["running"], where="post", color=style.RUNNING, lw=1.2)
        ax.step(ts["t_s"], ts["waiting"], where="post", color=style.WAITING, lw=1.2)
        peak = max(peak, float(ts[["running", "waiting"]].to_numpy().max(initial=0)))
        ax.set_title(labels.get(name, name) or "base", fontsize=8.5)
    for ax in axes[len(rows):]:
        ax.set_visible(False)
    axes[0].set_ylim(0, peak * 1.08)
    for i, ax in enumerate(axes[:len(rows)]):
        if i + ncols >= len(rows):  # the lowest panel of its column: it carries the time axis
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("simulated time (s)")
    for ax in axes[::ncols]:
        ax.set_ylabel("requests")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig.legend(handles=[Line2D([], [], color=style.RUNNING, label="running"),
                        Line2D([], [], color=style.WAITING, label="waiting"),
                        Patch(color=style.KV, alpha=0.25, label="KV cache used (%, right axis)")],
               loc="outside lower center", ncols=3, frameon=False)
    more = f" (first {max_panels} of {len(v.rows)})" if len(v.rows) > max_panels else ""
    fig.suptitle(f"{sweep.info.get('scenario', 'sweep')}: engine state per variant{more}")
    return fig


def latency_overlay(sweep, max_lines: int = 8):
    """TTFT/TPOT/E2E CDFs of up to `max_lines` variants (evenly spread along the sweep)."""
    from servesim.plots.run import latency_cdfs

    v = view(sweep)
    rows = v.rows.sort_values(["_series", "_x"])
    if len(rows) > max_lines:
        rows = rows.iloc[np.linspace(0, len(rows) - 1, max_lines).round().astype(int)]
    labels = {x["name"]: short_label(x["params"]) for x in sweep.info.get("variants", [])}
    runs = {labels.get(n) or n: sweep.variant(n) for n in rows["variant"]}
    return latency_cdfs(runs, title=f"{sweep.info.get('scenario', 'sweep')}: latency CDFs per variant")
