"""The console report of a cluster run's cost and autoscaling: totals, then the fleet over time
(one row per timeline bucket: replicas ready / starting / draining, queue, TTFT and SLO attainment)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def cost_line(summary: dict) -> str | None:
    c = summary.get("cost")
    if c is None:
        return None
    if c["usd"] is None:
        return f"cost: {c['gpu_hours']:.2f} GPU-hours ({c.get('note', 'no price')})"
    per_m = c["usd_per_million_tokens"]
    return (f"cost: {c['gpu_hours']:.2f} GPU-hours, ${c['usd']:,.2f} over {c['duration_s'] / 3600:.2f} h "
            f"(${c['usd_per_day']:,.0f}/day, " + ("-" if per_m is None else f"${per_m:.3f}") + " per M tokens)")


def autoscale_line(summary: dict) -> str | None:
    a = summary.get("autoscale")
    if a is None:
        return None
    cold = "-" if a["cold_start_s"] is None else f"{a['cold_start_s']:.0f} s each"
    return (f"autoscale: {a['num_decisions']} decisions, {a['num_cold_starts']} cold starts ({cold}), "
            f"{a['num_ready']} ready, {a['num_cancelled']} cancelled, {a['num_drained']} drained, "
            f"{a['num_removed']} removed; at most {a['max_replicas_alive']} replicas alive")


def timeline_buckets(timeline: pd.DataFrame, bucket_s: float) -> pd.DataFrame:
    """The decisions' timeline per bucket: replicas (mean), queue (mean), TTFT (max of the
    decisions' window percentiles), SLO attainment (min)."""
    if timeline.empty:
        return timeline
    t = timeline.copy()
    t["bucket_s"] = (t["time_s"] // bucket_s) * bucket_s
    return t.groupby(["bucket_s", "pool"], as_index=False).agg(
        num_ready=("num_ready", "mean"), num_starting=("num_starting", "mean"),
        num_draining=("num_draining", "mean"), num_waiting=("num_waiting", "mean"),
        ttft_s=("ttft_s", "max"), slo_attainment=("slo_attainment", "min"))


def print_autoscale(console, res) -> None:
    """Cost and autoscaling lines, and the fleet over time (hourly for runs of a few hours or more)."""
    for line in (cost_line(res.summary), autoscale_line(res.summary)):
        if line is not None:
            console.print(line)
    timeline = res.tables.get("scale_timeline")
    if timeline is None or timeline.empty:
        return
    import pandas as pd  # (an autoscaled run's tables are frames: loaded already)
    from rich.table import Table

    span = float(timeline["time_s"].max())
    bucket = 3600.0 if span >= 4 * 3600 else 600.0 if span >= 3600 else 60.0
    t = Table(title=f"fleet over time (per {bucket / 60:.0f} min)")
    for c in ("from (h)", "pool", "ready", "starting", "draining", "waiting", "TTFT p (ms)", "SLO met (min)"):
        t.add_column(c, justify="left" if c == "pool" else "right")
    for row in timeline_buckets(timeline, bucket).itertuples(index=False):
        t.add_row(f"{row.bucket_s / 3600:.2f}", row.pool, f"{row.num_ready:.1f}", f"{row.num_starting:.1f}",
                  f"{row.num_draining:.1f}", f"{row.num_waiting:.1f}",
                  "-" if pd.isna(row.ttft_s) else f"{1e3 * row.ttft_s:.0f}",
                  "-" if pd.isna(row.slo_attainment) else f"{100 * row.slo_attainment:.0f} %")
    console.print(t)
