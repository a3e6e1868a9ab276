"""The time series of a data-parallel deployment (or any cluster): the group's counts summed over its
ranks, KV usage their mean, and each rank's running / waiting / KV usage beside."""

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster import run_cluster, write_cluster_results
from servesim.simulator.cluster.dp import dp_cluster_config
from servesim.simulator.columns import Columns
from servesim.simulator.config import CostModelConfig, HardwareConfig, SimConfig
from servesim.simulator.metrics import TIMESERIES_COLUMNS, timeseries_from_steps
from servesim.traces.bundled import load_bundled
from servesim.traces.transforms import rate_scale, request_limit

# Two ranks' steps: (replica, start_s, running, waiting, kv_usage, prefill tokens, decode tokens)
RANK0 = [(0, 0.0, 1, 4, 0.25, 100, 0), (0, 0.5, 2, 3, 0.5, 0, 1), (0, 1.25, 3, 2, 0.75, 0, 2)]
RANK1 = [(1, 0.25, 5, 0, 0.5, 50, 0), (1, 2.5, 6, 1, 0.25, 0, 5)]


def _steps(rows, with_replica: bool = True) -> Columns:
    rep, start, run, wait, kv, pre, dec = (np.array(c) for c in zip(*rows))
    data = {"start_s": start.astype(float), "num_running": run, "num_waiting": wait, "kv_usage": kv.astype(float),
            "num_prefill_tokens": pre, "num_decode_tokens": dec}
    return Columns({"replica": rep.astype(np.int64), **data} if with_replica else data)


def test_a_hand_built_two_rank_series_sums_the_ranks_and_keeps_each():
    ts = timeseries_from_steps(_steps(RANK0 + RANK1), 3.0)
    # ticks 0..3; rank 0's state at each tick: steps 0, 1, 2, 2; rank 1's: none, 0, 0, 1
    assert ts.columns == TIMESERIES_COLUMNS + ["running_rank0", "waiting_rank0", "kv_cache_pct_rank0",
                                               "running_rank1", "waiting_rank1", "kv_cache_pct_rank1"]
    assert ts["t_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ts["running_rank0"].tolist() == [1, 2, 3, 3] and ts["running_rank1"].tolist() == [0, 5, 5, 6]
    assert ts["running"].tolist() == [1, 7, 8, 9]
    assert ts["waiting_rank0"].tolist() == [4, 3, 2, 2] and ts["waiting_rank1"].tolist() == [0, 0, 0, 1]
    assert ts["waiting"].tolist() == [4, 3, 2, 3]
    assert ts["kv_cache_pct_rank0"].tolist() == [25.0, 50.0, 75.0, 75.0]
    assert ts["kv_cache_pct_rank1"].tolist() == [0.0, 50.0, 50.0, 25.0]
    assert ts["kv_cache_pct"].tolist() == [12.5, 50.0, 62.5, 50.0]  # the mean of the ranks'
    assert ts["prefill_tokens_per_s"].tolist() == [150.0, 0.0, 0.0, 0.0]  # over [t, t + 1), both ranks
    assert ts["decode_tokens_per_s"].tolist() == [1.0, 2.0, 5.0, 0.0]
    # the ranks' rows in any order (each rank's in its step order): the same series
    mixed = timeseries_from_steps(_steps([RANK1[0], *RANK0[:2], RANK1[1], RANK0[2]]), 3.0)
    for col in ts.columns:
        assert mixed[col].tolist() == ts[col].tolist()


def test_one_engines_steps_keep_the_plain_series():
    ts = timeseries_from_steps(_steps(RANK0, with_replica=False), 3.0)
    assert ts.columns == TIMESERIES_COLUMNS
    assert ts["running"].tolist() == [1, 2, 3, 3]


@pytest.fixture(scope="module")
def dp_run():
    sim = SimConfig(hardware=HardwareConfig(model="qwen3-30b-a3b", gpu="h100", tp=1),
                    cost_model=CostModelConfig(name="roofline"))
    return run_cluster(dp_cluster_config(sim, 2), rate_scale(request_limit(load_bundled(), 40), 4.0))


def test_a_dp_runs_series_is_the_sum_over_its_ranks(dp_run, tmp_path):
    end = dp_run.summary["sim_duration_s"]
    group = dp_run.metrics.timeseries_frame(end)  # what validate reads for a DP run
    ranks = [rr.result.metrics.timeseries_frame(end) for rr in dp_run.replicas]
    for col in ("running", "waiting", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert group[col].tolist() == (ranks[0][col] + ranks[1][col]).tolist()
    assert np.allclose(group["kv_cache_pct"], (ranks[0]["kv_cache_pct"] + ranks[1]["kv_cache_pct"]) / 2)
    for i, own in enumerate(ranks):
        assert group[f"running_rank{i}"].tolist() == own["running"].tolist()
    both = (ranks[0]["running"] > 0) & (ranks[1]["running"] > 0)
    assert both.any()  # the balancer kept both ranks busy: the sum exceeds either rank
    assert (group["running"][both] > ranks[0]["running"][both]).all()
    write_cluster_results(tmp_path / "out", dp_run, {"name": "bundled"})
    written = pd.read_csv(tmp_path / "out" / "timeseries.csv")
    assert written["running"].tolist() == group["running"].tolist()
    assert {"running_rank0", "running_rank1", "kv_cache_pct_rank1"} <= set(written.columns)
    assert len(written) == len(ranks[0])  # one row per tick, not one per rank and tick
