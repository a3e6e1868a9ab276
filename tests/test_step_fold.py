"""Step rows folded as the run goes (step_rows: false; simulator/step_fold.py): the same summary and
series, byte for byte, as a run that keeps its rows; the fold itself against direct computations."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.simulator.cluster.results import write_cluster_results
from servesim.simulator.columns import Columns
from servesim.simulator.metrics import timeseries_from_steps
from servesim.simulator.step_fold import FOLD_BLOCK, StepFold, fold_columns, step_figures
from servesim.simulator.step_table import FOLD_LAG, StepTable
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload
from inner_loop import share  # tests/inner_loop.py


def _rows(n: int, seed: int) -> dict[str, np.ndarray]:
    """n step rows in start order: bursts of back-to-back (and overlapping) steps between idle gaps."""
    rng = np.random.default_rng(seed)
    gaps = np.where(rng.random(n) < 0.05, rng.exponential(3.0, n), rng.choice([0.0, 0.004, 0.02], n))
    start = np.cumsum(gaps)
    return {"start_s": start, "duration_s": rng.choice([0.0, 0.01, 0.03], n),
            "num_prefill_tokens": rng.integers(0, 500, n), "num_decode_tokens": rng.integers(0, 64, n),
            "num_running": rng.integers(0, 64, n), "num_waiting": rng.integers(0, 9, n),
            "kv_usage": rng.random(n), "num_preemptions": rng.integers(0, 2, n)}


def _naive_series(rows: dict[str, np.ndarray], ticks: np.ndarray) -> dict[str, list]:
    """Per tick, by definition: the last step started at or before it; tokens of [t, t + 1)."""
    out: dict[str, list] = {k: [] for k in ("running", "waiting", "kv_cache_pct", "prefill", "decode")}
    start = rows["start_s"]
    for t in ticks:
        before = np.flatnonzero(start <= t)
        i = before[-1] if len(before) else None
        out["running"].append(0 if i is None else int(rows["num_running"][i]))
        out["waiting"].append(0 if i is None else int(rows["num_waiting"][i]))
        out["kv_cache_pct"].append(0.0 if i is None else 100.0 * rows["kv_usage"][i])
        inside = (np.floor(start) == t)
        out["prefill"].append(float(rows["num_prefill_tokens"][inside].sum()))
        out["decode"].append(float(rows["num_decode_tokens"][inside].sum()))
    return out


def _naive_busy_s(intervals: list[tuple[float, float]]) -> float:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return math.fsum(b - a for a, b in merged)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fold_equals_the_definitions_whatever_the_blocks(seed):
    rows = _rows(3000, seed)
    ticks = np.arange(0.0, math.floor(rows["start_s"][-1]) + 3)
    whole = fold_columns(rows)
    rng = np.random.default_rng(seed + 10)
    cuts = np.sort(rng.choice(np.arange(1, 3000), 40, replace=False))
    pieces = StepFold()
    for a, b in zip([0, *cuts], [*cuts, 3000]):
        pieces.fold({k: v[a:b] for k, v in rows.items()})
    naive = _naive_series(rows, ticks)
    for fold in (whole, pieces):
        got = fold.series(ticks)
        assert got["running"].tolist() == naive["running"]
        assert got["waiting"].tolist() == naive["waiting"]
        assert got["kv_cache_pct"].tolist() == naive["kv_cache_pct"]
        assert got["prefill_tokens_per_s"].tolist() == naive["prefill"]
        assert got["decode_tokens_per_s"].tolist() == naive["decode"]
        assert fold.num_steps == 3000 and fold.num_preemptions == int(rows["num_preemptions"].sum())
        busy = step_figures([fold]).busy_s
        ends = rows["start_s"] + rows["duration_s"]
        assert busy == _naive_busy_s(list(zip(rows["start_s"].tolist(), ends.tolist())))


def test_a_groups_busy_time_is_the_union_over_engines():
    a, b = _rows(800, 5), _rows(900, 6)
    both = step_figures([fold_columns(a), fold_columns(b)])
    intervals = [(s, s + d) for r in (a, b) for s, d in zip(r["start_s"].tolist(), r["duration_s"].tolist())]
    assert both.busy_s == _naive_busy_s(intervals)
    assert both.num_steps == 1700
    assert both.kv_usage_mean == pytest.approx((a["kv_usage"].sum() + b["kv_usage"].sum()) / 1700, rel=1e-12)


def test_rows_out_of_start_order_are_refused():
    rows = _rows(10, 0)
    rows["start_s"] = rows["start_s"][::-1].copy()
    with pytest.raises(ValueError, match="start order"):
        fold_columns(rows)


def _fill(table: StepTable, n: int, complete: bool = True) -> None:
    for i in range(n):
        row = table.append(i, 0.01 * i, 2, 0, 2, 0.5, 2, 0, 0)
        if complete:
            table.set_update(row, 0.01 * i + 0.008, 0, 0)


def test_a_table_that_drops_its_rows_folds_the_same_blocks():
    kept, dropped = StepTable(), StepTable(keep_rows=False)
    n = 3 * FOLD_BLOCK + 1000
    _fill(kept, n)
    _fill(dropped, n)
    assert len(dropped) == n
    # rows are dropped as they are folded: the arrays hold at most a block and the lag past a chunk
    assert len(dropped._packed_arrays()["step"]) < 2 * FOLD_BLOCK + FOLD_LAG
    a, b = kept.finish_fold(), dropped.finish_fold()
    assert step_figures([a]) == step_figures([b])
    ticks = np.arange(0.0, 0.01 * n + 2)
    for col, values in a.series(ticks).items():
        assert values.tolist() == b.series(ticks)[col].tolist()
    with pytest.raises(RuntimeError, match="step_rows: false"):
        dropped.columns()
    with pytest.raises(RuntimeError, match="folded"):
        dropped.append(n, 99.0, 1, 0, 1, 0.1, 1, 0, 0)


def test_completing_a_row_already_folded_fails_loudly():
    t = StepTable(keep_rows=False)
    first = t.append(0, 0.0, 1, 0, 1, 0.1, 1, 0, 0)  # never completed: in flight "forever"
    _fill(t, 2 * FOLD_BLOCK + FOLD_LAG + 10)
    with pytest.raises(RuntimeError, match="FOLD_LAG"):
        t.set_update(first, 1.0, 0, 0)


def test_the_series_of_step_rows_is_the_folds():
    rows = _rows(500, 3)
    cols = Columns({"step": np.arange(500), **rows})
    ts = timeseries_from_steps(cols, float(rows["start_s"][-1]) + 1)
    ticks = ts["t_s"]
    naive = _naive_series(rows, ticks)
    assert ts["running"].tolist() == naive["running"] and ts["prefill_tokens_per_s"].tolist() == naive["prefill"]


# --- whole runs: rows kept vs folded -------------------------------------------------------------
def _workload(n: int, rate: float, seed: int, out_median: int = 400):
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 600, "sigma": 0.6, "max_value": 4000},
        "output_len": {"dist": "lognormal", "median": out_median, "sigma": 0.5, "max_value": 1500},
    }, np.random.default_rng(seed))


def _cluster(step_rows: bool, sets: dict, replicas: int = 3, autoscale: dict | None = None) -> ClusterConfig:
    sim = sim_config_from_dict({"step_rows": step_rows, **sets})
    return ClusterConfig(replicas=[ReplicaGroup(replicas, sim)], router=RouterConfig("least_outstanding"))


def _series(res) -> pd.DataFrame:
    """A result's 1-second series (a replay's Results has it; a cluster's from its merged collector)."""
    if hasattr(res, "metrics"):
        return res.metrics.timeseries_frame(res.summary["sim_duration_s"])
    return res.timeseries


def _same_results(kept, folded) -> None:
    s_kept, s_folded = dict(kept.summary), dict(folded.summary)
    assert s_folded.pop("step_rows_kept") is False and "step_rows_kept" not in s_kept
    for s in (s_kept, s_folded):
        s.pop("wall_time_s"), s.pop("sim_speedup_x", None)
    assert json.dumps(s_kept, sort_keys=True) == json.dumps(s_folded, sort_keys=True)
    pd.testing.assert_frame_equal(kept.requests, folded.requests, check_exact=True)
    pd.testing.assert_frame_equal(_series(kept), _series(folded), check_exact=True)
    assert len(folded.steps) == 0 and len(kept.steps) == kept.summary["num_steps"]


@pytest.mark.parametrize("sets", share([
    {"scheduler.async_scheduling": True},
    {"scheduler.async_scheduling": False, "cache.num_gpu_blocks": 600, "scheduler.max_model_len": 8192},  # preemptions
    {"hardware.pp": 2, "hardware.gpu": "h100", "scheduler.async_scheduling": True},
], [0]))
def test_a_cluster_that_folds_its_rows_reports_the_same_bytes(sets, tmp_path):
    wl = _workload(200, 6.0, seed=4)
    kept = run_cluster(_cluster(True, sets), wl)
    folded = run_cluster(_cluster(False, sets), wl)
    assert kept.summary["num_steps"] > 3 * (FOLD_BLOCK + FOLD_LAG)  # folded during the run, not only after
    _same_results(kept, folded)
    out_kept = write_cluster_results(tmp_path / "kept", kept, {"name": "t"})
    out_folded = write_cluster_results(tmp_path / "folded", folded, {"name": "t"})
    assert (out_kept / "steps.parquet").exists() and not (out_folded / "steps.parquet").exists()
    assert (out_kept / "timeseries.csv").read_bytes() == (out_folded / "timeseries.csv").read_bytes()


def test_step_rows_is_one_setting_for_a_cluster():
    with pytest.raises(InputError, match="step_rows"):
        ClusterConfig(replicas=[ReplicaGroup(1, sim_config_from_dict({"step_rows": False})),
                                ReplicaGroup(1, sim_config_from_dict({}))])
    with pytest.raises(InputError, match="step_rows"):
        sim_config_from_dict({"step_rows": "no"})


def test_a_replay_that_folds_its_rows_writes_the_same_folder_but_steps(tmp_path):
    from servesim.api import load_results
    from servesim.perfetto import write_chrome_trace
    from servesim.running import run
    from servesim.simulator.config import SimConfig

    wl = _workload(40, 0.3, seed=7, out_median=300)  # mostly one request at a time: a step per token
    kept = run(SimConfig(), wl, out_dir=tmp_path / "kept")
    folded = run(SimConfig(step_rows=False), wl, out_dir=tmp_path / "folded")
    assert kept.summary["num_steps"] > FOLD_BLOCK + FOLD_LAG
    _same_results(kept, folded)
    a, b = tmp_path / "kept", tmp_path / "folded"
    assert sorted(p.name for p in a.iterdir() if p.name != "steps.parquet") == sorted(p.name for p in b.iterdir())
    for name in ("requests.parquet", "timeseries.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    back = load_results(b)
    assert back.steps.empty and list(back.steps.columns) == list(load_results(a).steps.columns)
    with pytest.raises(InputError, match="step_rows: false"):
        write_chrome_trace(b, tmp_path / "trace.json")
