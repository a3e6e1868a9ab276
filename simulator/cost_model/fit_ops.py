"""Per-op regressions used by :func:`simulator.cost_model.fit.fit`, each with its fit error.

Every fitter returns ``(model_object, error)`` where ``error`` holds the MAPE on all profile rows
(``mape_fit``) and on points held out of the fit (``mape_holdout``): a random ``holdout`` fraction
of the interior grid points is removed, the interpolator rebuilt without them and evaluated on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .interp import Curve, NestedGrid, mape

if TYPE_CHECKING:
    import pandas as pd


def aggregate(df: pd.DataFrame, keys: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One latency per shape: median over repeats of a kernel, then the fastest kernel (the
    engine picks the quickest backend available, e.g. vLLM's custom all-reduce over NCCL).

    Returns the per-shape table and the raw rows of the chosen kernels (for the fit error)."""
    keys = list(keys)
    df = df.assign(kernel=df["kernel"].fillna(""))
    per_kernel = df.groupby(keys + ["kernel"], as_index=False)["latency_s"].median()
    best = per_kernel.loc[per_kernel.groupby(keys)["latency_s"].idxmin()]
    raw = df.merge(best[keys + ["kernel"]], on=keys + ["kernel"])
    return best.reset_index(drop=True), raw


def monotone_clean(agg: pd.DataFrame, axes: Sequence[str]) -> tuple[pd.DataFrame, int]:
    """Make latency non-decreasing along every axis: each point takes the minimum of itself and
    the larger points on the same line (a suffix minimum, one axis at a time, two sweeps).

    A GEMM is never slower than a strictly larger one -- padding would run the larger kernel --
    so such points are kernel-heuristic outliers (e.g. the aiconfigurator H100 bf16 GEMM at
    m=2048, n=12288, k=8192 takes 3.4x its n=16384 neighbour)."""
    out = agg.copy()
    before = out["latency_s"].to_numpy().copy()
    for _ in range(2):  # a second sweep settles interactions between axes
        for axis in axes:
            others = [a for a in axes if a != axis]
            out = out.sort_values(others + [axis], ascending=[True] * len(others) + [False])
            out["latency_s"] = out.groupby(others)["latency_s"].cummin() if others \
                else out["latency_s"].cummin()
    out = out.sort_index()
    # Count only real corrections, not the sub-percent jitter at the launch-latency floor.
    return out, int((out["latency_s"].to_numpy() < 0.95 * before).sum())


def _error(n_points: int, fit_err: float, holdout_err: float | None, origin: str) -> dict:
    return {"origin": origin, "n_points": int(n_points), "mape_fit": round(fit_err, 5),
            "mape_holdout": None if holdout_err is None or np.isnan(holdout_err)
            else round(holdout_err, 5)}


def _hold_out(candidates: np.ndarray, holdout: float, rng: np.random.Generator) -> np.ndarray:
    """A random ``holdout`` fraction of the candidate indices."""
    n_hold = int(round(holdout * len(candidates)))
    return rng.choice(candidates, size=n_hold, replace=False) if n_hold else candidates[:0]


def fit_curve(df: pd.DataFrame, x: str, rng: np.random.Generator, holdout: float,
              origin: str) -> tuple[Curve, dict]:
    """Piecewise-linear latency(x) through the per-x medians."""
    agg, raw = aggregate(df, [x])
    agg = agg.sort_values(x)
    xs, ys = agg[x].to_numpy(float), agg["latency_s"].to_numpy(float)
    curve = Curve(xs, ys)
    held_err = None
    hold = _hold_out(np.arange(1, len(xs) - 1), holdout, rng)  # interior points only
    if len(hold):
        keep = np.setdiff1d(np.arange(len(xs)), hold)
        partial = Curve(xs[keep], ys[keep])
        held_err = mape([partial(v) for v in xs[hold]], ys[hold])
    raw_err = mape([curve(v) for v in raw[x].to_numpy(float)], raw["latency_s"].to_numpy(float))
    return curve, _error(len(xs), raw_err, held_err, origin)


def fit_grid(df: pd.DataFrame, axes: Sequence[str], rng: np.random.Generator, holdout: float,
             origin: str, monotone: bool = False) -> tuple[NestedGrid, dict]:
    """Multilinear interpolation over the (possibly irregular) nested grid of ``axes``."""
    axes = list(axes)
    agg, raw = aggregate(df, axes)
    cleaned = 0
    if monotone:
        agg, cleaned = monotone_clean(agg, axes)
    points, y = agg[axes].to_numpy(float), agg["latency_s"].to_numpy(float)
    grid = NestedGrid.from_points(axes, points, y)
    held_err = None
    # Hold out only points strictly inside their line along the last axis that varies, so every
    # branch of the tree survives and held-out points are interpolated, not extrapolated.
    live = [a for a in axes if agg[a].nunique() > 1] or axes[-1:]
    line, along = live[:-1], live[-1]
    rank = agg.groupby(line)[along].rank(method="first") if line else agg[along].rank()
    size = agg.groupby(line)[along].transform("size") if line else len(agg)
    hold = _hold_out(np.flatnonzero(((rank > 1) & (rank < size)).to_numpy()), holdout, rng)
    if len(hold):
        keep = np.setdiff1d(np.arange(len(y)), hold)
        partial = NestedGrid.from_points(axes, points[keep], y[keep])
        held_err = mape([partial(*p) for p in points[hold]], y[hold])
    sample = raw if len(raw) <= 5000 else raw.sample(5000, random_state=0)
    raw_err = mape([grid(*p) for p in sample[axes].to_numpy(float)],
                   sample["latency_s"].to_numpy(float))
    err = _error(len(y), raw_err, held_err, origin)
    if monotone:
        err["monotone_adjusted_points"] = cleaned
    return grid, err


def gemm_curve(grid: NestedGrid, n: int, k: int) -> Curve:
    """Latency over tokens (m) of an ``m x k @ k x n`` GEMM, read off the (m, n, k) kernel grid;
    n and k off the measured grid are interpolated (or extrapolated: time is ~linear in n, k)."""
    ms = grid.root[0]
    return Curve(ms, [grid(m, float(n), float(k)) for m in ms])


def roofline_curve(fn, xs: Sequence[float]) -> Curve:
    """Tabulate an analytic op on a grid so fitted files stay self-contained."""
    return Curve(list(xs), [fn(x) for x in xs])


def fit_step_regression(df: pd.DataFrame) -> tuple[dict, dict]:
    """Whole-step linear models from coarse whole-request data (Splitwise).

    prefill step = a0 + a1 * tokens + a2 * causal_pairs;  decode step = b0 + b1 * batch +
    b2 * kv_tokens. Coefficients are least squares, refitted without any term that came out
    negative (a negative per-token cost is never physical)."""
    coef, err = {}, {}
    pre = df[df["op"] == "model_prefill"]
    if len(pre):
        b, c = pre["batch_size"].to_numpy(float), pre["chunk_len"].to_numpy(float)
        x = np.column_stack([np.ones_like(b), b * c, b * c * (c + 1) / 2])
        coef["prefill"], err["model_prefill"] = _nonneg_lstsq(x, pre["latency_s"].to_numpy(float))
    dec = df[df["op"] == "model_decode"]
    if len(dec):
        b, k = dec["batch_size"].to_numpy(float), dec["context_len"].to_numpy(float)
        x = np.column_stack([np.ones_like(b), b, b * (k + 1)])
        coef["decode"], err["model_decode"] = _nonneg_lstsq(x, dec["latency_s"].to_numpy(float))
    return coef, err


def _nonneg_solve(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Relative least squares (rows weighted by 1/y) so small batches matter as much as big ones;
    # a term whose coefficient comes out negative is dropped and the rest refitted.
    w = 1.0 / y
    active = list(range(x.shape[1]))
    while True:
        sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(sol)))
    beta = np.zeros(x.shape[1])
    beta[active] = np.maximum(sol, 0)
    return beta


def _leave_one_shape_out(x: np.ndarray, y: np.ndarray, shape_id: np.ndarray,
                         use: np.ndarray) -> np.ndarray:
    """Relative error of each row when its whole shape (all repeats) is left out of the fit."""
    err = np.full_like(y, np.nan)
    for sid in np.unique(shape_id[use]):
        out = shape_id == sid
        train = use & ~out
        if train.sum() >= x.shape[1]:
            err[out] = np.abs(x[out] @ _nonneg_solve(x[train], y[train]) - y[out]) / y[out]
    return err


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[list[float], dict]:
    import pandas as pd
    shape_id = pd.factorize(pd.Series([tuple(r) for r in x.round(6)]))[0]
    use = np.ones(len(y), dtype=bool)
    loso = _leave_one_shape_out(x, y, shape_id, use)
    # One round of outlier rejection: a shape the others predict far worse than is typical is a
    # measurement anomaly (e.g. Splitwise's TP2 batch-64 prefills, faster than batch 32), and
    # with a dozen shapes one such point would drag every coefficient.
    finite = loso[np.isfinite(loso)]
    if len(finite):
        bad = np.isfinite(loso) & (loso > max(1.0, 5 * float(np.median(finite))))
        if (~bad).sum() >= 2 * x.shape[1] and bad.any():
            use = ~bad
            loso = _leave_one_shape_out(x, y, shape_id, use)
    beta = _nonneg_solve(x[use], y[use])
    held = loso[use & np.isfinite(loso)]
    err = _error(int(use.sum()), mape(x[use] @ beta, y[use]),
                 float(held.mean()) if len(held) else None, "linear regression")
    err["outliers_dropped"] = int((~use).sum())
    return beta.tolist(), err
