"""An autoscaled run's fleet over time (scale_timeline.csv and scale_events.csv of a cluster run):
replicas ready / starting / draining with the scale events, the queue, and TTFT against SLO attainment."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def fleet_timeline(timeline: pd.DataFrame, events: pd.DataFrame, title: str = "Autoscaled fleet over time"):
    """Three panels sharing the time axis (hours): replica counts per pool (stacked ready, starting,
    draining; cold starts and drains marked), waiting and outstanding requests, and each decision's
    window TTFT percentile with its SLO attainment."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    for pool, t in timeline.groupby("pool", sort=False):
        h = t["time_s"] / 3600
        axes[0].stackplot(h, t["num_ready"], t["num_starting"], t["num_draining"], step="post", alpha=0.7,
                          labels=[f"{pool} ready", f"{pool} starting", f"{pool} draining"])
        axes[1].step(h, t["num_waiting"], where="post", label=f"{pool} waiting")
        axes[1].step(h, t["num_outstanding"], where="post", label=f"{pool} outstanding", alpha=0.6)
        axes[2].plot(h, 1e3 * t["ttft_s"], label=f"{pool} TTFT (window percentile)")
    for kind, marker in (("cold_start", "^"), ("drain", "v")):
        at = events[events["event"] == kind]["time_s"] / 3600
        if len(at):
            axes[0].plot(at, [0] * len(at), marker, linestyle="none", label=kind.replace("_", " "))
    axes[0].set_ylabel("replicas")
    axes[1].set_ylabel("requests")
    axes[2].set_ylabel("TTFT (ms)")
    slo = axes[2].twinx()
    for pool, t in timeline.groupby("pool", sort=False):
        slo.step(t["time_s"] / 3600, 100 * t["slo_attainment"], where="post", color="grey", alpha=0.6,
                 label=f"{pool} SLO met (%)")
    slo.set_ylabel("SLO met (%)")
    slo.set_ylim(0, 105)
    axes[2].set_xlabel("time (h)")
    for ax in axes:
        ax.legend(loc="upper left", fontsize=7)
    fig.suptitle(title)
    return fig


def fleet_figure(folder: Path) -> object | None:
    """The figure of a cluster run folder, or None when it was not autoscaled."""
    tl, ev = folder / "scale_timeline.csv", folder / "scale_events.csv"
    if not tl.exists():
        return None
    timeline = pd.read_csv(tl)
    if timeline.empty:
        return None
    events = pd.read_csv(ev) if ev.exists() and ev.stat().st_size > 1 else pd.DataFrame(columns=["event", "time_s"])
    return fleet_timeline(timeline, events)
