"""P/D decode replicas on the fast path (simulator/fastpath/pd_runs.py, scheduler/bulk/pd.py):
whole outputs byte-identical to plain stepping (requests, steps, the summary with its P/D TTFT
split and link stats), across link sharing modes and scopes, hand-off latencies, decode routers,
sync and async scheduling and pools tight enough that requests wait for blocks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster import (
    Cluster, ClusterConfig, LinkConfig, PDConfig, ReplicaGroup, RouterConfig, sim_config_from_dict,
)
from servesim.traces.synthetic import make_workload


def _workload(n: int, rate: float, seed: int, output_median: int = 80):
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 400, "sigma": 0.6, "max_value": 3000},
        "output_len": {"dist": "lognormal", "median": output_median, "sigma": 0.6, "max_value": 400},
    }, np.random.default_rng(seed))


def _config(macro: bool, async_: bool = True, n_prefill: int = 2, n_decode: int = 2, sim: dict | None = None,
            **pd_kw) -> ClusterConfig:
    s = sim_config_from_dict({"scheduler.async_scheduling": async_, "macro_steps": macro, **(sim or {})})
    return ClusterConfig(replicas=[ReplicaGroup(n_prefill, s, role="prefill"), ReplicaGroup(n_decode, s, role="decode")],
                         pd=PDConfig(**pd_kw), routing_latency_s=0.001)


_RUN_ONLY = {"wall_time_s", "sim_speedup_x", "fast_path_declined"}  # how the run went, not what it simulated


def _drop_run_only(x):
    if isinstance(x, dict):
        return {k: _drop_run_only(v) for k, v in x.items() if k not in _RUN_ONLY}
    if isinstance(x, list):
        return [_drop_run_only(v) for v in x]
    return x


def _summary(res) -> str:
    return json.dumps(_drop_run_only(res.summary), sort_keys=True, default=str)


def _both(wl, **kw):
    plain_c = Cluster(_config(False, **kw), wl)
    plain = plain_c.run()
    macro_c = Cluster(_config(True, **kw), wl)
    macro = macro_c.run()
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)
    assert _summary(plain) == _summary(macro)
    return macro_c, macro


def _macro_fraction(cluster: Cluster) -> float:
    decoders = [r.engine for r in cluster.replicas if r.role == "decode"]
    return sum(e.planner.num_macro_steps for e in decoders) / sum(e.book.num_steps for e in decoders)


CASES = {
    "fair": {},
    "fair-slow": {"link": LinkConfig(bandwidth_bytes_per_s=2e9)},
    "lanes": {"link": LinkConfig(sharing="lanes", lanes=2, bandwidth_bytes_per_s=4e9)},
    "shared-handoff": {"link": LinkConfig(scope="shared", bandwidth_bytes_per_s=8e9), "handoff_latency_s": 0.005},
    "least-kv": {"decode_router": RouterConfig("least_kv"), "handoff_latency_s": 0.002},
    "round-robin-lanes-shared": {"decode_router": RouterConfig("round_robin"),
                                 "link": LinkConfig(sharing="lanes", lanes=3, scope="shared", latency_s=0.0)},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("async_", [True, False])
def test_pd_macro_steps_identical(case, async_):
    cluster, _ = _both(_workload(120, 12.0, seed=7), async_=async_, **CASES[case])
    assert _macro_fraction(cluster) > 0.3  # the decode replicas did run in bulk
