"""Figures of one run: latency CDFs, queue/KV timeline, preemptions and prefix hits over time,
batch composition. Each function takes `servesim.api.Results` and returns a Figure."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from servesim.plots import style

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency"))


def latency_cdfs(runs: Mapping[str, object], title: str = "Latency distributions"):
    """TTFT, TPOT and E2E CDFs; one line per run (label -> Results)."""
    fig = style.figure(11, 3.4 + (0.25 * math.ceil(len(runs) / 3) if len(runs) > 1 else 0))
    axes = style.subplots(fig, 1, 3)[0]
    for ax, (col, name) in zip(axes, LATENCIES):
        columns = {label: res.requests[col].dropna() for label, res in runs.items()}
        unit = style.time_unit(pd.concat(list(columns.values())) if columns else [])
        for i, (label, values) in enumerate(columns.items()):
            x, y = style.ecdf(values)
            if len(x):
                ax.step(x, y, where="post", color=style.color(i), lw=1.6, label=label)
        if not ax.get_lines():
            style.note(ax, f"no {name} values")
            continue
        if _spread(ax):
            ax.set_xscale("log")
        style.seconds_axis(ax, unit)
        ax.set_xlabel(f"{name} ({unit[0]})")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(name)
    if len(runs) > 1:  # below the panels: inside, it would hide the tails that matter
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)), frameon=False)
    fig.suptitle(title)
    return fig


def _spread(ax) -> bool:
    """Use a log axis when the data span more than two decades."""
    xs = np.concatenate([ln.get_xdata() for ln in ax.get_lines()] or [np.array([])])
    xs = xs[xs > 0]
    return len(xs) > 1 and xs.max() / xs.min() > 100


def timeline(res, title: str = "Engine state over time"):
    """KV usage, running/waiting requests and token throughput, per second (timeseries.csv)."""
    ts = res.timeseries
    fig = style.figure(10, 6.2)
    ax_kv, ax_q, ax_tok = style.subplots(fig, 3, 1, sharex=True)[:, 0]
    t = ts["t_s"]
    ax_kv.fill_between(t, ts["kv_cache_pct"], step="post", color=style.KV, alpha=0.35, lw=0)
    ax_kv.step(t, ts["kv_cache_pct"], where="post", color=style.KV, lw=1.2)
    ax_kv.set_ylabel("KV cache used (%)")
    ax_kv.set_ylim(0, 105)
    ax_kv.set_title("KV-cache usage")
    ax_q.step(t, ts["running"], where="post", color=style.RUNNING, lw=1.4, label="running")
    ax_q.step(t, ts["waiting"], where="post", color=style.WAITING, lw=1.4, label="waiting")
    ax_q.set_ylabel("requests")
    ax_q.set_title("Running and waiting requests")
    ax_q.legend(loc="upper right", frameon=False, ncols=2)
    ax_tok.stackplot(t, ts["prefill_tokens_per_s"] / 1e3, ts["decode_tokens_per_s"] / 1e3,
                     colors=(style.PREFILL, style.DECODE), alpha=0.75, labels=("prefill", "decode"), step="post")
    ax_tok.set_ylabel("tokens/s (thousands)")
    ax_tok.set_xlabel("simulated time (s)")
    ax_tok.set_title("Tokens computed per second")
    ax_tok.legend(loc="upper right", frameon=False, ncols=2)
    fig.suptitle(title)
    return fig


def _bins(t_end: float, n: int = 40) -> np.ndarray:
    return np.linspace(0.0, max(t_end, 1e-6), n + 1)


def hit_rate_over_time(requests: pd.DataFrame, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token-weighted prefix-cache hit rate of the requests finishing in each time bin.

    Derived from requests (num_cached_tokens at first admission / prompt_len), because steps carry
    no per-step hit counters; NaN where no request finished."""
    done = requests.dropna(subset=["finish_s"])
    idx = np.clip(np.digitize(done["finish_s"], edges) - 1, 0, len(edges) - 2)
    hits = np.bincount(idx, weights=done["num_cached_tokens"], minlength=len(edges) - 1)
    prompt = np.bincount(idx, weights=done["prompt_len"], minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(prompt > 0, hits / prompt, np.nan)
    return (edges[:-1] + edges[1:]) / 2, rate


def step_hit_rate_over_time(steps: pd.DataFrame, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token-weighted hit rate of the prefix-cache lookups made in each time bin (per-step counters)."""
    idx = np.clip(np.digitize(steps["start_s"], edges) - 1, 0, len(edges) - 2)
    hits = np.bincount(idx, weights=steps["prefix_hit_tokens"], minlength=len(edges) - 1)
    queries = np.bincount(idx, weights=steps["prefix_query_tokens"], minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(queries > 0, hits / queries, np.nan)
    return (edges[:-1] + edges[1:]) / 2, rate


FOLDED_NOTE = "step rows not kept (step_rows: false)"


def _rows_kept(res) -> bool:
    """Whether the run kept its step rows (a run with step_rows: false has only their figures)."""
    from servesim.simulator.summary import step_rows_kept

    return step_rows_kept(res.summary)


def preemptions_and_hits(res, title: str = "Preemptions and prefix-cache hits over time"):
    steps, req = res.steps, res.requests
    end = float(max(res.summary.get("sim_duration_s") or 0.0, steps["start_s"].max() if len(steps) else 0.0))
    edges = _bins(end)
    width = edges[1] - edges[0]
    fig = style.figure(10, 4.8)
    ax_p, ax_h = style.subplots(fig, 2, 1, sharex=True)[:, 0]
    if not _rows_kept(res):  # the total is known, not when
        style.note(ax_p, f"{FOLDED_NOTE}: {int(res.summary.get('num_preemptions') or 0)} preemptions in all")
        ax_p.set_title("Preemptions")
    else:
        _preemption_bars(ax_p, steps, edges, width)
    per_step = _rows_kept(res) and "prefix_query_tokens" in steps and steps["prefix_query_tokens"].sum() > 0
    mid, rate = step_hit_rate_over_time(steps, edges) if per_step else hit_rate_over_time(req, edges)
    label = "lookups in bin" if per_step else "requests finishing in bin"
    ax_h.plot(mid, 100 * rate, marker="o", ms=3, color=style.PALETTE[2], label=label)
    overall = 100 * float(res.summary.get("prefix_cache_hit_rate") or 0.0)
    ax_h.axhline(overall, color="0.3", ls="--", lw=1, label=f"whole run (scheduler): {overall:.1f} %")
    ax_h.set_ylim(0, 100)
    ax_h.set_ylabel("prompt tokens hit (%)")
    ax_h.set_xlabel("simulated time (s)")
    ax_h.set_title("Prefix-cache hit rate (token-weighted" + (", per lookup time)" if per_step else ", by finish time)"))
    ax_h.legend(loc="upper left", frameon=False, ncols=2)
    fig.suptitle(title)
    return fig


def _preemption_bars(ax_p, steps, edges: np.ndarray, width: float) -> None:
    """Preemptions per bin and cumulative, from the step rows."""
    counts, _ = np.histogram(steps["start_s"], bins=edges, weights=steps["num_preemptions"])
    ax_p.bar(edges[:-1], counts, width=width, align="edge", color=style.PALETTE[3], alpha=0.8,
             label=f"per {width:.3g} s bin")
    ax_p.set_ylabel("preemptions")
    total = int(steps["num_preemptions"].sum())
    ax_p.set_title(f"Preemptions (total {total})")
    cum = ax_p.twinx()
    cum.plot(steps["start_s"], steps["num_preemptions"].cumsum(), color="0.2", lw=1.2, label="cumulative")
    cum.set_ylabel("cumulative")
    cum.spines["right"].set_visible(True)
    cum.grid(False)


def batch_composition(res, title: str = "Batch composition"):
    """What each step computed: prefill vs decode tokens over time, and the step-size histogram."""
    steps = res.steps
    fig = style.figure(11, 3.8)
    ax_t, ax_h = style.subplots(fig, 1, 2, width_ratios=(1.6, 1))[0]
    if steps.empty:
        why = "no steps" if _rows_kept(res) else FOLDED_NOTE
        style.note(ax_t, why)
        style.note(ax_h, why)
        return fig
    edges = _bins(float(steps["start_s"].max()) + 1e-9, 60)
    idx = np.clip(np.digitize(steps["start_s"], edges) - 1, 0, len(edges) - 2)
    n = np.bincount(idx, minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        pre = np.bincount(idx, weights=steps["num_prefill_tokens"], minlength=len(n)) / n
        dec = np.bincount(idx, weights=steps["num_decode_tokens"], minlength=len(n)) / n
    mid = (edges[:-1] + edges[1:]) / 2
    ax_t.stackplot(mid, np.nan_to_num(pre), np.nan_to_num(dec), colors=(style.PREFILL, style.DECODE),
                   alpha=0.75, labels=("prefill tokens", "decode tokens"))
    ax_t.set_xlabel("simulated time (s)")
    ax_t.set_ylabel("tokens per step (mean in bin)")
    ax_t.set_title("Tokens per step over time")
    ax_t.legend(loc="upper right", frameon=False)
    total = steps["num_prefill_tokens"] + steps["num_decode_tokens"]
    kinds = {"decode only": (steps["num_prefill_tokens"] == 0) & (total > 0),
             "prefill only": (steps["num_decode_tokens"] == 0) & (total > 0),
             "mixed": (steps["num_prefill_tokens"] > 0) & (steps["num_decode_tokens"] > 0)}
    bins = np.histogram_bin_edges(total[total > 0], bins=30) if (total > 0).any() else 10
    data = [total[m] for m in kinds.values()]
    ax_h.hist(data, bins=bins, stacked=True, color=(style.DECODE, style.PREFILL, style.PALETTE[4]),
              label=[f"{k} ({int(m.sum())})" for k, m in kinds.items()], alpha=0.85)
    ax_h.set_xlabel("tokens scheduled in the step")
    ax_h.set_yscale("log")  # thousands of small decode steps next to a few large prefill steps
    ax_h.set_ylabel("steps (log scale)")
    ax_h.set_title("Step sizes")
    ax_h.legend(frameon=False)
    fig.suptitle(title)
    return fig
