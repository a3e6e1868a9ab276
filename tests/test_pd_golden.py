"""Whole P/D cluster outputs pinned to golden digests: the requests and steps tables and the summary
of small P/D runs (prefill and decode replicas, sync and async scheduling, a pool tight enough that
requests wait and preempt, shared prefixes), stepped and on the fast path, hashed byte for byte.

The digests were computed on the interpreted P/D classes before they became native compiled
classes (simulator/cluster/pd*.py); they hold in the pure-Python build and the compiled one."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from servesim.simulator.cluster import (
    Cluster, ClusterConfig, LinkConfig, PDConfig, ReplicaGroup, RouterConfig, sim_config_from_dict,
)
from servesim.traces.synthetic import make_workload

_RUN_ONLY = {"wall_time_s", "sim_speedup_x", "fast_path_declined"}  # how the run went, not what it simulated


def _drop_run_only(x):
    if isinstance(x, dict):
        return {k: _drop_run_only(v) for k, v in x.items() if k not in _RUN_ONLY}
    if isinstance(x, list):
        return [_drop_run_only(v) for v in x]
    return x


def _workload(prefix: bool):
    spec = {
        "num_requests": 90, "arrival": {"rate_per_s": 20.0},
        "prompt_len": {"dist": "lognormal", "median": 400, "sigma": 0.6, "max_value": 3000},
        "output_len": {"dist": "lognormal", "median": 90, "sigma": 0.6, "max_value": 400},
    }
    if prefix:
        spec["prefix"] = {"num_groups": 3, "prefix_len": {"dist": "fixed", "value": 200}, "fraction": 0.7}
    return make_workload("poisson", spec, np.random.default_rng(11))


# (async scheduling, shared prefixes, pool blocks or None, decode router, prefill replicas)
CASES = {
    "async": (True, False, None, "least_outstanding", 2),
    "sync": (False, False, None, "least_outstanding", 2),
    "async-tight-prefix": (True, True, 300, "least_kv", 1),
    "sync-tight-prefix": (False, True, 300, "prefix_aware", 1),
}

# Computed at 73b0848 (interpreted P/D classes), pure Python and compiled alike. The tight cases stall
# both sides (a prefill pool full of unsent KV, decode requests all waiting for theirs) and preempt.
GOLDEN = {
    "async": "294cd7e0abc4b9d4afba147420c5487baf293507e5194c60a99db55bbb4e768b",
    "sync": "8913f0cc29bf9bdac35452acc23967c219fb3c7c90a21882be93c3814a1b3631",
    "async-tight-prefix": "53bd78bdfc56857972320c98127250bc4d3f881e2eab2af3533d3117881ef427",
    "sync-tight-prefix": "c386d270419d1f3a4dcdcdbfdc56bc1c2c3949438a1a54df6fbe3a3bea32cf26",
}


def _digest(case: str, macro: bool) -> str:
    async_, prefix, blocks, router, n_prefill = CASES[case]
    sim = {"scheduler.async_scheduling": async_, "macro_steps": macro}
    if blocks is not None:
        sim.update({"cache.num_gpu_blocks": blocks, "scheduler.max_model_len": 4160})
    s = sim_config_from_dict(sim)
    cfg = ClusterConfig(replicas=[ReplicaGroup(n_prefill, s, role="prefill"), ReplicaGroup(2, s, role="decode")],
                        pd=PDConfig(decode_router=RouterConfig(router), handoff_latency_s=0.002,
                                    link=LinkConfig(bandwidth_bytes_per_s=4e9)),
                        routing_latency_s=0.001)
    res = Cluster(cfg, _workload(prefix)).run()
    h = hashlib.sha256()
    h.update(res.requests.to_csv(index=False).encode())
    h.update(res.steps.to_csv(index=False).encode())
    h.update(json.dumps(_drop_run_only(res.summary), sort_keys=True, default=str).encode())
    return h.hexdigest()


@pytest.mark.parametrize("macro", [False, True], ids=["stepped", "fast-path"])
@pytest.mark.parametrize("case", list(CASES))
def test_pd_outputs_match_the_golden_digest(case, macro):
    assert _digest(case, macro) == GOLDEN[case]
