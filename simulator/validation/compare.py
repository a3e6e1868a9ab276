"""Pair simulated with measured requests and compute the error statistics of validation.json.

Errors are fractions (0.05 = 5 %):

* per request, for TTFT / TPOT / E2E: ``ape = |sim - meas| / meas``; reported as the mean (MAPE)
  and the median. Queueing time is often ~0 when measured (a request admitted at once), where a
  relative error means nothing, so it gets the mean absolute error in seconds instead.
* aggregate, per metric and statistic (mean, p50, p90, p99): measured, simulated and the signed
  relative error ``(sim - meas) / meas`` (positive: the simulator is slower).
* time series (1-s ticks): mean absolute error of running / waiting / kv_cache_pct over the
  measured ticks (the simulator's value past its own end is its idle state, 0).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from servesim.traces.errors import InputError

METRICS = ("ttft", "tpot", "e2e", "queueing")
RELATIVE_METRICS = ("ttft", "tpot", "e2e")
STATS = ("mean", "p50", "p90", "p99")
TIMESERIES = ("running", "waiting", "kv_cache_pct")


def pair_requests(measured: pd.DataFrame, simulated: pd.DataFrame, workload_ids: list[str] | None = None,
                  ) -> tuple[pd.DataFrame, dict]:
    """One row per request present on both sides: ``<metric>_meas`` / ``<metric>_sim`` columns.

    Matching: by ``request_id`` when the two sides share ids; otherwise through the workload
    order: a measured request's ``workload_index`` i pairs with ``workload_ids[i]`` (the id our
    loader gave the i-th workload request). Prompt and output lengths are compared on every pair.
    """
    sim = simulated.set_index("request_id", drop=False)
    meas = measured.copy()
    shared = meas["request_id"].isin(sim.index).sum()
    if shared == len(meas) and len(meas):
        how = "request_id"
        meas["sim_id"] = meas["request_id"]
    elif workload_ids is not None and meas["workload_index"].notna().all():
        how = "workload order (measured id's trailing number = line of the workload file)"
        idx = meas["workload_index"].astype(int)
        if (idx < 0).any() or (idx >= len(workload_ids)).any():
            raise InputError(f"measured request numbers run {idx.min()}..{idx.max()} but the workload has "
                             f"{len(workload_ids)} requests", field="workload")
        meas["sim_id"] = [workload_ids[i] for i in idx]
    else:
        raise InputError("cannot pair measured and simulated requests: no shared ids and no workload "
                         "order to map through", field="pairing")
    found = meas["sim_id"].isin(sim.index)
    meas = meas[found]
    s = sim.loc[meas["sim_id"]].reset_index(drop=True)
    m = meas.reset_index(drop=True)
    paired = pd.DataFrame({"request_id": m["request_id"], "sim_request_id": s["request_id"]})
    for col in ("prompt_len", "output_len"):
        paired[f"{col}_meas"] = m[col].to_numpy()
        paired[f"{col}_sim"] = s[col].to_numpy()
    for metric in METRICS:
        paired[f"{metric}_meas"] = pd.to_numeric(m[f"{metric}_s"], errors="coerce").to_numpy(float)
        paired[f"{metric}_sim"] = pd.to_numeric(s[f"{metric}_s"], errors="coerce").to_numpy(float)
    paired["arrival_meas"] = m["arrival_s"].to_numpy(float)
    paired["arrival_sim"] = s["arrival_s"].to_numpy(float)
    mismatch = ((paired["prompt_len_meas"] != paired["prompt_len_sim"])
                | (paired["output_len_meas"] != paired["output_len_sim"]))
    info = {
        "method": how,
        "num_measured": int(len(measured)), "num_simulated": int(len(simulated)),
        "num_paired": int(len(paired)), "num_unpaired_measured": int((~found).sum()),
        "num_length_mismatch": int(mismatch.sum()),
        "max_arrival_offset_s": float(np.nanmax(np.abs(paired["arrival_meas"] - paired["arrival_sim"])))
        if len(paired) else None,
    }
    return paired, info


def _pct(values: np.ndarray, q: float) -> float | None:
    v = values[np.isfinite(values)]
    return float(np.percentile(v, q)) if v.size else None


def _stat(values: np.ndarray, name: str) -> float | None:
    v = values[np.isfinite(values)]
    if not v.size:
        return None
    return float(v.mean()) if name == "mean" else _pct(v, float(name[1:]))


def rel_error(sim: float | None, meas: float | None) -> float | None:
    if sim is None or meas is None or not math.isfinite(sim) or not math.isfinite(meas) or meas == 0:
        return None
    return (sim - meas) / meas


def per_request_errors(paired: pd.DataFrame) -> dict:
    out: dict = {}
    for metric in RELATIVE_METRICS:
        m, s = paired[f"{metric}_meas"].to_numpy(float), paired[f"{metric}_sim"].to_numpy(float)
        ok = np.isfinite(m) & np.isfinite(s) & (m > 0)
        ape = np.abs(s[ok] - m[ok]) / m[ok]
        signed = (s[ok] - m[ok]) / m[ok]
        out[metric] = {
            "mape": float(ape.mean()) if ape.size else None,
            "median_ape": float(np.median(ape)) if ape.size else None,
            "p90_ape": float(np.percentile(ape, 90)) if ape.size else None,
            "median_signed_error": float(np.median(signed)) if signed.size else None,
            "within_10pct": float((ape <= 0.10).mean()) if ape.size else None,
            "n": int(ok.sum()),
        }
    out["ttft_by_admission"] = ttft_by_admission(paired)
    m, s = paired["queueing_meas"].to_numpy(float), paired["queueing_sim"].to_numpy(float)
    ok = np.isfinite(m) & np.isfinite(s)
    queued = ok & (m >= 0.05)
    ape_q = np.abs(s[queued] - m[queued]) / m[queued]
    out["queueing"] = {"mae_s": float(np.abs(s[ok] - m[ok]).mean()) if ok.any() else None,
                       "median_abs_error_s": float(np.median(np.abs(s[ok] - m[ok]))) if ok.any() else None,
                       "n": int(ok.sum()),
                       "mape_queued": float(ape_q.mean()) if ape_q.size else None,
                       "median_ape_queued": float(np.median(ape_q)) if ape_q.size else None,
                       "n_queued": int(queued.sum()),
                       "note": "absolute error in seconds (measured queueing is ~0 for requests admitted at "
                               "once); the *_queued APEs cover requests that waited >= 50 ms"}
    return out


def ttft_by_admission(paired: pd.DataFrame, threshold_s: float = 0.05) -> dict:
    """TTFT error split by measured queueing: requests admitted at once (TTFT = prefill, a test of
    the cost model) vs requests that waited (TTFT = queueing, a test of the whole engine)."""
    out = {}
    q = paired["queueing_meas"].to_numpy(float)
    for name, sel in (("admitted_at_once", q < threshold_s), ("queued", q >= threshold_s)):
        m, s = paired["ttft_meas"].to_numpy(float)[sel], paired["ttft_sim"].to_numpy(float)[sel]
        ok = np.isfinite(m) & np.isfinite(s) & (m > 0)
        e = (s[ok] - m[ok]) / m[ok]
        out[name] = {"n": int(ok.sum()), "median_ape": float(np.median(np.abs(e))) if e.size else None,
                     "median_signed_error": float(np.median(e)) if e.size else None,
                     "measured_median_s": float(np.median(m[ok])) if e.size else None}
    out["threshold_s"] = threshold_s
    return out


def aggregate_errors(paired: pd.DataFrame) -> dict:
    out: dict = {}
    for metric in METRICS:
        m, s = paired[f"{metric}_meas"].to_numpy(float), paired[f"{metric}_sim"].to_numpy(float)
        out[metric] = {}
        for st in STATS:
            mv, sv = _stat(m, st), _stat(s, st)
            out[metric][st] = {"measured": mv, "simulated": sv, "error": rel_error(sv, mv)}
    return out


def timeseries_errors(measured: pd.DataFrame | None, simulated: pd.DataFrame | None,
                      notes: list[str] | None = None) -> dict:
    """MAE per series over the measured ticks. Both frames use the measured convention (``t_s``)."""
    out: dict = {}
    if measured is None or simulated is None or measured.empty:
        return {name: {"mae": None, "note": "no measured time series"} for name in TIMESERIES}
    sim = simulated.set_index(simulated["t_s"].round(6))
    ticks = measured["t_s"].round(6).to_numpy()
    cols = list(TIMESERIES) + [c for c in ("prompt_tokens_per_s", "gen_tokens_per_s")
                               if c in measured and c in simulated]
    for name in cols:
        mv = measured[name].to_numpy(float)
        sv = sim[name].reindex(ticks).fillna(0.0).to_numpy(float) if name in sim else np.full(len(ticks), np.nan)
        ok = np.isfinite(mv) & np.isfinite(sv)
        entry = {
            "mae": float(np.abs(sv[ok] - mv[ok]).mean()) if ok.any() else None,
            "measured_mean": float(mv[ok].mean()) if ok.any() else None,
            "simulated_mean": float(sv[ok].mean()) if ok.any() else None,
            "num_ticks": int(ok.sum()),
            "measured_valid": bool(ok.any() and np.nanmax(np.abs(mv)) > 0),
        }
        if not entry["measured_valid"]:
            entry["note"] = "measured series is constant 0: not a usable reference"
        out[name] = entry
    return out


def makespan(paired: pd.DataFrame) -> dict:
    m = float(np.nanmax(paired["arrival_meas"] + paired["e2e_meas"]))
    s = float(np.nanmax(paired["arrival_sim"] + paired["e2e_sim"]))
    return {"measured": m, "simulated": s, "error": rel_error(s, m)}
