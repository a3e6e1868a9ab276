"""Planned reads (simulator/fastpath/planned_reads.py): behind least_kv and prefix_aware a replica's
runs are deferred, and what the router reads of a replica whose run is pending (KV usage, prefix
cache, load) is answered from the plan. Whole outputs (requests with their replica, steps,
summary) stay byte-identical to plain stepping, and so does every key the router reads."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.simulator.cluster.routers import LeastKv, PrefixAware
from servesim.simulator.fastpath.planned_reads import PlannedReads, _first_at_or_after
from servesim.traces.synthetic import make_workload
from inner_loop import share  # tests/inner_loop.py

_LENS = {"prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
         "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max_value": 400}}
_TIGHT = {"cache.num_gpu_blocks": 600, "scheduler.max_model_len": 4096}  # evicts cached prefixes


def _plain(n: int, rate: float, seed: int):
    return make_workload("poisson", {"num_requests": n, "arrival": {"rate_per_s": rate}, **_LENS},
                         np.random.default_rng(seed))


def _prefixed(n: int, rate: float, seed: int):
    """Four shared system prompts of 500 tokens, on 80 % of the requests."""
    return make_workload("poisson", {"num_requests": n, "arrival": {"rate_per_s": rate}, **_LENS,
                                     "prefix": {"num_groups": 4, "prefix_len": {"dist": "fixed", "value": 500},
                                                "fraction": 0.8}}, np.random.default_rng(seed))


def _evicting(n: int, rate: float, seed: int):
    """Ten shared prefixes of 160 tokens picked by Zipf popularity: on a small pool (_EVICTING) a
    rarely used prefix's blocks reach the front of the free queue while cached, and a pending
    run's allocations evict them before a read that would hit them."""
    return make_workload("poisson", {"num_requests": n, "arrival": {"rate_per_s": rate}, **_LENS,
                                     "prefix": {"num_groups": 10, "prefix_len": {"dist": "fixed", "value": 160},
                                                "popularity": "zipf", "fraction": 0.9}}, np.random.default_rng(seed))


_EVICTING = {"cache.num_gpu_blocks": 300, "scheduler.max_model_len": 2048}


def _grouped(n: int, rate: float, seed: int):
    """Twenty shared prefixes of 200 tokens on every request: a prefix's first request on a
    replica often joins its pending run just before the next request of that prefix reads it."""
    return make_workload("poisson", {"num_requests": n, "arrival": {"rate_per_s": rate}, **_LENS,
                                     "prefix": {"num_groups": 20, "prefix_len": {"dist": "fixed", "value": 200},
                                                "fraction": 1.0}}, np.random.default_rng(seed))


def _sessions(n: int, rate: float, seed: int):
    """Multi-turn sessions with short think times: a turn's prompt is the previous turn's prompt and
    output, often sent while that turn's replica still decodes it (its run caches the blocks the
    new prompt would hit)."""
    return make_workload("sessions", {"num_requests": n, "arrival": {"rate_per_s": rate}, **_LENS,
                                      "sessions": {"think_time_s": {"dist": "exponential", "mean": 0.2}}},
                         np.random.default_rng(seed))


def _config(router: str, macro: bool, replicas: int, **sim) -> ClusterConfig:
    cfg = sim_config_from_dict({"macro_steps": macro, **sim})
    return ClusterConfig(replicas=[ReplicaGroup(replicas, cfg)], router=RouterConfig(router), routing_latency_s=0.001)


def _assert_same(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert _comparable(a.summary) == _comparable(b.summary)


def _comparable(summary: dict) -> dict:
    """The summary but the wall clock and the fast path's own note (macro_steps on vs off)."""
    out = {k: v for k, v in summary.items() if k not in ("wall_time_s", "sim_speedup_x")}
    out["replicas"] = [{k: v for k, v in r.items() if k != "fast_path_declined"} for r in summary["replicas"]]
    return out


def _counts(cluster: Cluster) -> tuple[int, int]:
    """(deferred runs planned, prefix reads that applied a pending run first)."""
    planners = [r.engine.planner for r in cluster.replicas]
    return (sum(p.num_deferred_runs for p in planners),
            sum(p.reads.num_reads_applied for p in planners if p.reads is not None))


CASES = [  # (name, router, workload, replicas, sim settings)
    ("light", "least_kv", lambda: _plain(200, 100.0, 1), 12, {}),
    ("overloaded", "least_kv", lambda: _plain(200, 400.0, 3), 6, {}),
    ("prefix", "least_kv", lambda: _prefixed(200, 100.0, 5), 6, {}),
    ("prefix-tight", "least_kv", lambda: _prefixed(200, 100.0, 5), 4, _TIGHT),
    ("evicting", "least_kv", lambda: _evicting(200, 40.0, 1), 2, _EVICTING),
    ("light", "prefix_aware", lambda: _plain(200, 100.0, 1), 12, {}),
    ("overloaded", "prefix_aware", lambda: _plain(200, 400.0, 3), 6, {}),
    ("prefix", "prefix_aware", lambda: _prefixed(200, 100.0, 5), 6, {}),
    ("prefix-tight", "prefix_aware", lambda: _prefixed(200, 100.0, 5), 4, _TIGHT),
    ("evicting", "prefix_aware", lambda: _evicting(250, 40.0, 1), 2, _EVICTING),
    ("sessions", "prefix_aware", lambda: _sessions(200, 30.0, 6), 6, {}),
]


@pytest.mark.parametrize("name,router,workload,replicas,sim", share(CASES, [2, 4, 8, 10],
                                                                   ids=[f"{c[1]}-{c[0]}" for c in CASES]))
def test_state_reading_routers_defer_and_stay_identical(name, router, workload, replicas, sim):
    wl = workload()
    cluster = Cluster(_config(router, True, replicas, **sim), wl)
    macro = cluster.run()
    assert _counts(cluster)[0] > 0  # runs were deferred
    _assert_same(run_cluster(_config(router, False, replicas, **sim), wl), macro)


def test_prefix_reads_apply_a_run_whose_steps_change_the_answer():
    """A small pool where a pending run's allocations evict cached prefix blocks before a read
    (and session turns sent while their previous turn still decodes, whose blocks a run caches):
    some reads apply the pending run first, and the results stay identical."""
    applied = 0
    for wl, replicas, sim in ((_evicting(250, 40.0, 1), 2, _EVICTING), (_sessions(200, 30.0, 6), 6, {})):
        cluster = Cluster(_config("prefix_aware", True, replicas, **sim), wl)
        macro = cluster.run()
        applied += _counts(cluster)[1]
        _assert_same(run_cluster(_config("prefix_aware", False, replicas, **sim), wl), macro)
    assert applied > 0


def _keys_seen(monkeypatch, router_cls, cfg: ClusterConfig, wl) -> list:
    """Every (replica, KV usage, load, prefix hit) the router reads, in decision order."""
    seen: list = []
    if router_cls is LeastKv:
        def spy(self, spec, candidates, now_s):
            seen.append([(c.engine.kv_usage, c.engine.num_outstanding) for c in candidates])
            return choose(self, spec, candidates, now_s)
    else:
        def spy(self, spec, candidates, now_s):
            tokens = tuple(spec.token_ids())
            seen.append([(c.engine.prefix_hits(spec, tokens, True), c.engine.num_outstanding) for c in candidates])
            return choose(self, spec, candidates, now_s)
    choose = router_cls.choose
    monkeypatch.setattr(router_cls, "choose", spy)
    run_cluster(cfg, wl)
    monkeypatch.setattr(router_cls, "choose", choose)
    return seen


@pytest.mark.parametrize("router_cls,router,wl,replicas,sim", [
    (LeastKv, "least_kv", lambda: _prefixed(200, 120.0, 8), 6, {}),  # shared blocks freed by finishes
    (LeastKv, "least_kv", lambda: _sessions(200, 40.0, 9), 4, _TIGHT),
    (PrefixAware, "prefix_aware", lambda: _evicting(250, 40.0, 1), 2, _EVICTING),
    (PrefixAware, "prefix_aware", lambda: _sessions(200, 30.0, 6), 6, {}),
    (PrefixAware, "prefix_aware", lambda: _grouped(200, 100.0, 5), 6, {}),  # joiners caching a read's prefix
])
def test_every_read_is_what_stepping_shows(monkeypatch, router_cls, router, wl, replicas, sim):
    """The KV usage, load and prefix hit of every replica at every decision, answered from
    pending runs, equal plain stepping's exactly (floats included)."""
    w = wl()
    macro = _keys_seen(monkeypatch, router_cls, _config(router, True, replicas, **sim), w)
    plain = _keys_seen(monkeypatch, router_cls, _config(router, False, replicas, **sim), w)
    assert macro == plain and len(macro) == len(w.requests)


class _NeverChanged(PlannedReads):  # (test doubles are subclasses: a compiled class's methods cannot be patched)
    def _unchanged(self, *args):
        return True


class _JoinersNeverCache(PlannedReads):
    def _joiners_may_cache(self, *args):
        return False


class _UnappliedUsage(PlannedReads):
    def kv_usage(self):
        return self.engine.scheduler.kv_cache_manager.usage


def _with_reads(monkeypatch, cls: type[PlannedReads]) -> None:
    """Every cluster built from now on answers its reads with a `cls`."""
    init = Cluster.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for r in self.replicas:
            p = r.engine.planner
            if p is not None and p.reads is not None:
                p.reads = cls(r.engine, p.deferred, p.reads.kv, p.reads.sched)

    monkeypatch.setattr(Cluster, "__init__", patched)


def test_the_prefix_check_is_what_keeps_reads_exact(monkeypatch):
    """Without the check (a pending run's steps never change a lookup) the evicting case's reads
    differ from stepping's: the differential tests above can fail."""
    _with_reads(monkeypatch, _NeverChanged)
    w = _evicting(250, 40.0, 1)
    macro = _keys_seen(monkeypatch, PrefixAware, _config("prefix_aware", True, 2, **_EVICTING), w)
    plain = _keys_seen(monkeypatch, PrefixAware, _config("prefix_aware", False, 2, **_EVICTING), w)
    assert macro != plain


def test_the_joiner_check_is_what_keeps_reads_of_joined_runs_exact(monkeypatch):
    """A prompt joining a pending run caches its prompt's blocks at the run's first schedule: a
    read that ignored them (the first request of a shared prefix on a replica joins, the next
    one reads) differs from stepping's."""
    _with_reads(monkeypatch, _JoinersNeverCache)
    w = _grouped(200, 100.0, 5)
    macro = _keys_seen(monkeypatch, PrefixAware, _config("prefix_aware", True, 6), w)
    plain = _keys_seen(monkeypatch, PrefixAware, _config("prefix_aware", False, 6), w)
    assert macro != plain


def test_reads_of_runs_a_distinct_prompt_joins_apply_nothing():
    """Distinct prompts (no shared block): a read of a replica whose pending run a prompt joins is
    answered from the unapplied state, since the joiner's blocks are not the prompt's; no read
    applies a run, and the results stay identical."""
    wl = _plain(200, 100.0, 1)
    cluster = Cluster(_config("prefix_aware", True, 12), wl)
    macro = cluster.run()
    assert _counts(cluster)[0] > 0 and _counts(cluster)[1] == 0
    _assert_same(run_cluster(_config("prefix_aware", False, 12), wl), macro)


def test_kv_usage_from_the_plan_is_what_keeps_least_kv_exact(monkeypatch):
    """Reading the scheduler's own (unapplied) usage instead of the plan's differs from stepping."""
    _with_reads(monkeypatch, _UnappliedUsage)
    w = _plain(150, 100.0, 1)
    macro = _keys_seen(monkeypatch, LeastKv, _config("least_kv", True, 6), w)
    plain = _keys_seen(monkeypatch, LeastKv, _config("least_kv", False, 6), w)
    assert macro != plain


@pytest.mark.parametrize("router", ["least_kv", "prefix_aware"])
def test_sync_scheduling_stays_eager_and_identical(router):
    """Sync replicas have no step in flight at a loop top: nothing is deferred, the eager runs stop
    at every dispatch, as without a proof."""
    wl = _prefixed(150, 100.0, 7)
    sim = {"scheduler.async_scheduling": False}
    cluster = Cluster(_config(router, True, 6, **sim), wl)
    macro = cluster.run()
    assert _counts(cluster) == (0, 0)
    _assert_same(run_cluster(_config(router, False, 6, **sim), wl), macro)


def test_sglang_replicas_do_not_defer_behind_state_readers():
    """The planned reads answer from vLLM's bulk path only: SGLang replicas behind least_kv keep the
    eager path (runs cut at every dispatch) and stay identical."""
    wl = _plain(120, 80.0, 2)
    sim = {"engine": "sglang"}
    cluster = Cluster(_config("least_kv", True, 4, **sim), wl)
    macro = cluster.run()
    assert all(r.engine.planner is None or r.engine.planner.reads is None for r in cluster.replicas)
    assert _counts(cluster)[0] == 0
    _assert_same(run_cluster(_config("least_kv", False, 4, **sim), wl), macro)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.0]) | st.floats(0, 3), max_size=40),
       st.sampled_from([-1.0, 0.0, 0.25, 1.0, 2.0, 5.0]) | st.floats(0, 3))
def test_the_reads_search_is_bisect_left(times, t):
    """A read counts the plan's updates strictly before now as bisect_left does (ties included)."""
    times.sort()
    assert _first_at_or_after(times, t) == bisect_left(times, t)
