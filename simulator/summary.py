"""A run's summary (summary.json's figures) from its columns, and the rejection report.

Reads a collector's columns (MetricsCollector.columns(): numpy arrays, no pandas). The functions
taking a requests table accept a pandas DataFrame as well (a cluster's frame, a measured run's
requests.parquet): they read each column through numpy (`np.asarray(t[name])`) and keep rows with
a boolean mask (`t[mask]`), which both kinds of table answer alike.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from servesim.simulator.bench_metrics import GoodputSlo, ItlOrder, bench_serve_result, concat_gaps
from servesim.simulator.columns import notna
from servesim.simulator.metrics import PERCENTILES, gap_stats, stats
from servesim.simulator.summary_metrics import compute_metrics

if TYPE_CHECKING:
    from servesim.simulator.metrics import MetricsCollector


def finished_requests(req):
    """The requests a summary's latency statistics cover: finished (not aborted), with output."""
    reason = np.asarray(req["finish_reason"])
    return req[notna(reason) & (reason != "abort") & (np.asarray(req["output_len"]) > 0)]


def _rejected(req) -> np.ndarray:
    return np.asarray(req["status"]) == "rejected"


def _reason_counts(req, rejected: np.ndarray) -> Counter:
    """Rejected requests per reason (a missing reason left out), in order of first appearance."""
    reasons = np.asarray(req["reject_reason"])[rejected]
    return Counter(r for r, present in zip(reasons.tolist(), notna(reasons).tolist()) if present)


def rejection_summary(req) -> dict:
    """summary.json's num_completed / num_rejected / rejected_by_reason from a requests table."""
    rejected = _rejected(req)
    return {"num_completed": int((np.asarray(req["status"]) == "completed").sum()),
            "num_rejected": int(rejected.sum()),
            "rejected_by_reason": {str(k): int(v) for k, v in sorted(_reason_counts(req, rejected).items())}}


def aborted_summary(req) -> dict:
    """summary.json's num_aborted / aborted_by_reason: requests the engine aborted because they could
    never be admitted (liveness.stranded_requests "abort"; their reason "stranded_<why>")."""
    aborted = np.asarray(req["status"]) == "aborted"
    return {"num_aborted": int(aborted.sum()),
            "aborted_by_reason": {str(k): int(v) for k, v in sorted(_reason_counts(req, aborted).items())}}


def rejection_warning(req, max_ids: int = 5) -> str | None:
    """One loud line for requests that could never run (None when there are none): the reasons
    by count (ties in order of first appearance), then the first ids."""
    rejected = _rejected(req)
    num = int(rejected.sum())
    if not num:
        return None
    reasons = ", ".join(f"{k}: {v}" for k, v in _reason_counts(req, rejected).most_common())
    ids = ", ".join(map(str, np.asarray(req["request_id"])[rejected][:max_ids].tolist()))
    more = ", ..." if num > max_ids else ""
    return (f"{num} of {len(req)} requests were rejected and never ran ({reasons}); "
            f"first ids: {ids}{more} (status 'rejected' in requests.parquet; see docs/LIVENESS.md)")


def warn_rejected(req) -> None:
    """Requests that could never run are never dropped silently: one warning on the "servesim" logger."""
    msg = rejection_warning(req)
    if msg is not None:
        logging.getLogger("servesim").warning("WARNING: %s", msg)


def step_rows_kept(summary: dict) -> bool:
    """Whether the run a summary describes kept its step rows (step_rows: false writes
    `step_rows_kept: false` and no steps.parquet; older summaries have no key: kept)."""
    return summary.get("step_rows_kept", True) is not False


def brief_summary(collector: MetricsCollector, prefix_hits: int, prefix_queries: int) -> dict:
    """A few of summarize()'s values, the same expressions on the same columns, without the
    latency statistics of every gap (a cluster's replica table: 32 replicas of 2 M gaps each)."""
    cols = collector.columns()
    req, steps = cols.requests, cols.folds.figures()
    ok = finished_requests(req)
    return {"num_finished": int(len(ok)), "num_rejected": int(_rejected(req).sum()),
            "num_steps": steps.num_steps, "ttft_p50_s": stats(ok["ttft_s"])["p50"],
            "tpot_p50_s": stats(ok["tpot_s"])["p50"],
            "prefix_cache_hit_rate": prefix_hits / prefix_queries if prefix_queries else 0.0,
            "kv_usage_mean": steps.kv_usage_mean, "num_preemptions": steps.num_preemptions}


def summarize(collector: MetricsCollector, sim_duration_s: float, wall_time_s: float, slo, num_requests: int,
              prefix_hits: int, prefix_queries: int) -> dict:
    cols = collector.columns()
    req, steps = cols.requests, cols.folds.figures()
    ok = finished_requests(req)
    # Every gap end to end is the summary's largest array (~65 M in a cluster hour): one partition
    # of it answers this summary's percentiles and bench_serve's (ItlOrder), where bench_serve's
    # completed requests have the very same buffer (every request finished: the table's own).
    gaps, scratch = concat_gaps(ok)
    itl_order = ItlOrder.of(gaps, scratch, PERCENTILES)
    itl_stats = stats(gaps, scratch) if itl_order is None else gap_stats(itl_order)
    del gaps
    out_tokens = int(ok["output_len"].sum())
    in_tokens = int(ok["prompt_len"].sum())
    dur = max(sim_duration_s, 1e-12)
    tpot = ok["tpot_s"]
    meets = (ok["ttft_s"] <= slo.ttft_s) & (np.where(np.isnan(tpot), 0.0, tpot) <= slo.tpot_s)
    if slo.e2e_s is not None:
        meets &= ok["e2e_s"] <= slo.e2e_s
    num_good = int(meets.sum())
    rejections = rejection_summary(req)
    return {
        "num_requests": num_requests,
        "num_finished": int(len(ok)),
        **rejections,
        "num_timed_out": int((req["status"] == "timed_out").sum()),
        **aborted_summary(req),
        "num_ignored": rejections["num_rejected"],  # the older name, kept for readers of old summaries
        "sim_duration_s": sim_duration_s,
        "wall_time_s": wall_time_s,
        "num_steps": steps.num_steps,
        "ttft_s": stats(ok["ttft_s"]),
        "tpot_s": stats(tpot),
        "itl_s": itl_stats,
        "e2e_s": stats(ok["e2e_s"]),
        "queueing_s": stats(ok["queueing_s"]),
        "throughput": {
            "requests_per_s": len(ok) / dur,
            "output_tokens_per_s": out_tokens / dur,
            "total_tokens_per_s": (out_tokens + in_tokens) / dur,
        },
        "goodput": {"slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s, "requests_per_s": num_good / dur,
                    "fraction_meeting_slo": num_good / max(len(ok), 1)},
        "num_preemptions": steps.num_preemptions,
        "prefix_cache_hit_rate": prefix_hits / prefix_queries if prefix_queries else 0.0,
        "prefix_cache_hit_tokens": prefix_hits,
        "prefix_cache_query_tokens": prefix_queries,
        "kv_usage_mean": steps.kv_usage_mean,
        # Only when the rows were folded and dropped as the run went (step_rows: false): no steps file.
        **({} if cols.folds.rows_kept else {"step_rows_kept": False}),
        # The same run in `vllm bench serve --save-result` terms (completed/failed, *_ms statistics).
        "bench_serve": bench_serve_result(req, GoodputSlo(ttft_ms=slo.ttft_s * 1e3, tpot_ms=slo.tpot_s * 1e3,
                                                          e2el_ms=None if slo.e2e_s is None else slo.e2e_s * 1e3),
                                          itl_order=itl_order),
        # The plug-in metrics (simulator/summary_metrics/: one file each).
        "metrics": compute_metrics(ok, steps, sim_duration_s),
    }
