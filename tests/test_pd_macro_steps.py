"""P/D decode replicas on the fast path (simulator/fastpath/pd_runs.py, scheduler/bulk/pd.py):
whole outputs byte-identical to plain stepping (requests, steps, the summary with its P/D TTFT
split and link stats), across link sharing modes and scopes, hand-off latencies, decode routers,
sync and async scheduling and pools tight enough that requests wait for blocks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import simpy

from servesim.simulator.cluster import (
    Cluster, ClusterConfig, KVLink, LinkConfig, PDConfig, ReplicaGroup, RouterConfig, sim_config_from_dict,
)
from servesim.traces.synthetic import make_workload
from inner_loop import slow_unless  # tests/inner_loop.py


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
    # requests wait for blocks on both sides, decode replicas preempt (recomputing locally)
    "tight-pools": {"sim": {"cache.num_gpu_blocks": 270, "scheduler.max_model_len": 4160},
                    "decode_router": RouterConfig("least_kv"), "n_prefill": 1},
    # paced runs behind the other decode routers: the prefix cache read from the plan (applied
    # first where the run could change the answer), the load of two drawn replicas, nothing read
    "prefix-aware-3": {"decode_router": RouterConfig("prefix_aware"), "n_decode": 3},
    "jsq-slow": {"decode_router": RouterConfig("jsq_power_of_two"), "n_decode": 3,
                 "link": LinkConfig(bandwidth_bytes_per_s=1e9)},
    "least-kv-tight-slow": {"sim": {"cache.num_gpu_blocks": 400, "scheduler.max_model_len": 4160},
                            "decode_router": RouterConfig("least_kv"), "n_prefill": 1,
                            "link": LinkConfig(sharing="lanes", lanes=1, bandwidth_bytes_per_s=3e9)},
}


@pytest.mark.parametrize("case", slow_unless(CASES, ["fair", "least-kv", "tight-pools", "prefix-aware-3"]))
@pytest.mark.parametrize("async_", [True, False])
def test_pd_macro_steps_identical(case, async_):
    cluster, _ = _both(_workload(120, 12.0, seed=7), async_=async_, **CASES[case])
    assert _macro_fraction(cluster) > 0.3  # the decode replicas did run in bulk
    # and applied their stepped updates in bulk too: more than one per request (each hand-off
    # step's, then a run's last step's)
    decoders = [r.engine.planner for r in cluster.replicas if r.role == "decode"]
    assert sum(p.num_bulk_updates for p in decoders) > 120
    # async: most landed requests joined a run at its first schedule (the rest were stepped:
    # preempted, or landed with a request waiting); sync loops run no joins
    joined = sum(p.num_joined for p in decoders)
    assert joined > 0.6 * 120 if async_ else joined == 0


def test_tight_pools_preempt_on_the_decode_side():
    """The tight-pools case exercises what it claims: decode replicas preempt and requests wait."""
    cluster, res = _both(_workload(120, 30.0, seed=7, output_median=150), **CASES["tight-pools"])
    assert sum(r.engine.num_preemptions for r in cluster.replicas if r.role == "decode") > 20
    assert _macro_fraction(cluster) > 0.15  # preemptions and waits for blocks cut runs short


def test_link_next_event_is_when_the_clock_next_calls_done():
    """KVLink.next_event_s: a transfer in its latency counts from its join, one on the wire from
    the server's next wake (fair) or its lane's landing (lanes); exact floats, as the clock reads them."""
    env = simpy.Environment()
    link = KVLink(env, LinkConfig(bandwidth_bytes_per_s=1e9, latency_s=0.001))
    landed: list[float] = []
    assert link.next_event_s() == float("inf")
    link.transfer(1_000_000, lambda: landed.append(env.now))
    assert link.next_event_s() == 0.001  # joins at 0.001
    env.run(until=0.0015)
    assert link.next_event_s() == 0.001 + 1_000_000 / 1e9  # the server's wake
    env.process(_later(env, 0.0015, lambda: link.transfer(1_000_000, lambda: landed.append(env.now))))
    env.run(until=0.0016)
    assert link.next_event_s() == 0.001 + 1_000_000 / 1e9  # the second joins at 0.0025, later
    env.run(until=0.0021)
    assert landed == [0.001 + 1_000_000 / 1e9] and link.next_event_s() == 0.0015 + 0.001
    env.run()
    assert len(landed) == 2 and link.next_event_s() == float("inf")
    lanes = KVLink(env, LinkConfig(bandwidth_bytes_per_s=2e9, latency_s=0.0, sharing="lanes", lanes=2))
    t0 = env.now
    lanes.transfer(1_000_000, lambda: None)
    assert lanes.next_event_s() == t0  # not yet on its lane: it joins now
    env.run(until=t0 + 0.0001)
    assert lanes.next_event_s() == t0 + ((t0 + 0.001) - t0)  # its landing as the timeout reads it


def _later(env, t, fn):
    yield env.timeout(t - env.now)
    fn()


def test_parked_requests_are_passed_over_and_a_new_one_stops_runs():
    """The decode side's bulk path: a request parked for its transfer lets runs go on (no waiting
    head, no admissible waiter); a request not yet parked, or one whose KV landed, stops them."""
    from servesim.scheduler.bulk import decode_runs_for
    from servesim.scheduler.request import RequestStatus
    from servesim.simulator.cluster.pd_connectors import RemotePrefillConnector
    from servesim.simulator.cluster.pd_schedulers import decode_scheduler
    from servesim.simulator.startup import resolve_cache
    from tests.sched_helpers import req, step

    cfg = sim_config_from_dict({"scheduler.async_scheduling": False})
    started: list[str] = []
    conn = RemotePrefillConnector(lambda r, n: started.append(r.request_id))
    sched = decode_scheduler(cfg, resolve_cache(cfg)[0], conn)
    runs = decode_runs_for(sched)
    for i in range(3):  # three requests decoding locally (no connector: their prompts run here)
        sched.add_request(req(sched, f"r{i}", 64, max_tokens=50))
    step(sched)  # prefill + first token
    assert runs.decode_run_horizon(100, 0) > 2
    conn.expect("p")
    sched.add_request(req(sched, "p", 300, max_tokens=20))
    assert runs.decode_run_horizon(100, 0) == 0  # its first schedule reserves blocks and starts the transfer
    step(sched)
    assert started == ["p"] and sched.requests["p"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert runs._waiting_head(3) is None and not runs.anyone_admissible_waits()
    h = runs.decode_run_horizon(100, 0)
    assert h > 2
    sched.mark_kv_received("p")
    assert runs.decode_run_horizon(100, 0) == 0  # the landed request is admitted at the next schedule


def test_what_the_bound_does_not_cover_declines_with_a_reason():
    """Gateways, session turns, autoscaling and lockstep groups: the decode replicas step, and the
    summary says why (pd_runs.pd_declined); a plain P/D cluster's decode replicas keep their planner."""
    from types import SimpleNamespace

    from servesim.simulator.fastpath.pd_runs import pd_declined

    def fake(**kw):
        base = {"gateway": None, "turns": None, "cfg": SimpleNamespace(autoscale=None), "lockstep_groups": []}
        return SimpleNamespace(**{**base, **kw})

    assert pd_declined(fake()) is None
    assert "gateway" in pd_declined(fake(gateway=object()))
    assert "session turns" in pd_declined(fake(turns=object()))
    assert "autoscaler" in pd_declined(fake(cfg=SimpleNamespace(autoscale=object())))
    assert "lockstep" in pd_declined(fake(lockstep_groups=[[0, 1]]))
    cluster = Cluster(_config(True), _workload(4, 10.0, seed=1))
    for r in cluster.replicas:
        assert (r.engine.planner is not None) == (r.role == "decode"), r.name
        assert (r.engine.planner_declined is None) == (r.role == "decode"), r.name


def test_paced_runs_go_on_through_hand_offs_to_other_decoders():
    """Behind a decode router whose reads a plan answers (least_kv here: KV usage), an async
    decode replica's runs are paced (fastpath/deferred.py): planned, applied only when a hand-off
    or a landing reaches that replica (or whole at their end), so most hand-offs routed
    elsewhere leave them alone; behind a router with no proof they stay eager (bounded)."""
    cluster, _ = _both(_workload(200, 20.0, seed=3), decode_router=RouterConfig("least_kv"))
    planners = [r.engine.planner for r in cluster.replicas if r.role == "decode"]
    assert all(p.deferred.paced for p in planners)
    num_routed = sum(r.num_routed for r in cluster.replicas if r.role == "decode")
    assert sum(p.num_deferred_runs for p in planners) > 100
    # a run is applied early only for this replica's own hand-offs and landings (two per request)
    assert sum(p.num_deferred_routed for p in planners) <= 2 * num_routed
    # most early applications take the next update with them (it finishes nobody: pd_runs.py)
    assert sum(p.num_runs_past_arrival for p in planners) > sum(p.num_deferred_routed for p in planners) // 2
    assert _macro_fraction(cluster) > 0.6
    sync = Cluster(_config(True, async_=False, decode_router=RouterConfig("least_kv")), _workload(4, 10.0, seed=1))
    assert not any(r.engine.planner.deferred.paced for r in sync.replicas if r.role == "decode")


class _DyadicCost:
    """Every step takes 2**-7 s: with no CPU time, dyadic arrivals and a link whose transfers
    take only its dyadic latency, every update, hand-off and landing falls on one grid, so
    outside events land on the very instants of decode updates (SimPy orders them by creation)."""

    name = "test-pd-dyadic"

    def step_time_s(self, shape) -> float:
        return 2.0 ** -7


def test_paced_runs_meet_events_on_an_update_instant_as_stepping_does():
    from servesim.simulator.cost_model import register_cost_model
    from servesim.traces.workload import RequestSpec, Workload

    register_cost_model("test-pd-dyadic")(lambda **kw: _DyadicCost())
    rng = np.random.default_rng(11)
    t, specs = 0.0, []
    for i in range(160):
        t += int(rng.integers(0, 6)) * 2.0 ** -7
        specs.append(RequestSpec(f"r{i}", t, prompt_len=int(rng.integers(16, 600)),
                                 output_len=int(rng.integers(2, 120))))
    wl = Workload(specs, name="dyadic", source="test")
    sim = {"cost_model.name": "test-pd-dyadic", "cost_model.cpu_overhead.fixed_s": 0.0,
           "cost_model.cpu_overhead.per_request_s": 0.0, "cost_model.cpu_overhead.per_token_s": 0.0}
    # bytes / 2**90 B/s vanish against the clock: a transfer lands 3 x 2**-7 s after it starts
    link = LinkConfig(sharing="lanes", lanes=2, bandwidth_bytes_per_s=2.0 ** 90, latency_s=3 * 2.0 ** -7)
    # a hand-off latency on the grid too: its timeout, set at the prefill's update, meets a decode
    # update set at another instant (creation order decides)
    for router, handoff_s in (("least_kv", 0.0), ("least_outstanding", 0.0), ("least_kv", 2 * 2.0 ** -7)):
        kw = {"sim": sim, "link": link, "decode_router": RouterConfig(router), "handoff_latency_s": handoff_s}
        runs = []
        for macro in (False, True):
            cfg = _config(macro, **kw)
            cfg.routing_latency_s = 0.0
            c = Cluster(cfg, wl)
            runs.append((c, c.run()))
        (_, plain), (cluster, res) = runs
        pd.testing.assert_frame_equal(plain.requests, res.requests)
        pd.testing.assert_frame_equal(plain.steps, res.steps)
        assert _summary(plain) == _summary(res)
        decode = [r.engine for r in cluster.replicas if r.role == "decode"]
        assert sum(e.planner.num_deferred_routed for e in decode) > 20
        assert sum(e.planner.num_runs_past_arrival for e in decode) > 10  # with the next update
        # the case is what it claims: hand-offs and landings on a decode replica's update instants
        starts = {rep: set(g.start_s) for rep, g in res.steps.groupby("replica")}
        ties = sum((tl.decode.time_s in starts[tl.decode.replica]) + (tl.transfer_end_s in starts[tl.decode.replica])
                   for tl in cluster.handoffs.timelines.values() if tl.decode is not None)
        assert ties > 50


def _prefixed_workload(n: int, rate: float, seed: int):
    """Four 320-token system prompts on 80 % of the requests: decode replicas hit them in their
    prefix cache, so requests hold shared prompt blocks (ref_cnt > 1) when they finish."""
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max_value": 400},
        "prefix": {"num_groups": 4, "prefix_len": {"dist": "fixed", "value": 320}, "fraction": 0.8},
    }, np.random.default_rng(seed))


@pytest.mark.parametrize("sim", [{}, {"cache.num_gpu_blocks": 500, "scheduler.max_model_len": 2400}],
                         ids=["roomy", "tight"])
def test_least_kv_reads_through_finishers_holding_shared_blocks(sim):
    """least_kv reads a paced run's KV usage from its plan (planned_reads.py _RunBlocks): a
    finisher's blocks free only where it held the last reference. With shared system prompts the
    decode replicas hold prompt blocks together; outputs stay stepping's, and the planned reads
    did count finishers' shared blocks."""
    from servesim.simulator.fastpath import planned_reads

    shared_seen = []
    frees = planned_reads._RunBlocks._frees
    refs_by_run: dict[int, tuple[object, dict[int, int]]] = {}  # by _RunBlocks (kept alive: ids stay unique)

    def counting(self, r, new):
        # the reference count: every block of the finisher in a dict, shared or not
        mgr = self.sched.kv_cache_manager._single_full
        blocks = [b for b in mgr.req_to_blocks.get(r.request_id, ()) if not b.is_null]
        shared_seen.append(sum(b.ref_cnt > 1 for b in blocks))
        refs = refs_by_run.setdefault(id(self), (self, {}))[1]
        freed = new
        for b in blocks:
            refs[b.block_id] = left = refs.get(b.block_id, b.ref_cnt) - 1
            freed += left == 0
        got = frees(self, r, new)
        assert got == freed
        return got

    planned_reads._RunBlocks._frees = counting
    try:
        cluster, res = _both(_prefixed_workload(160, 25.0, seed=4), sim=sim, decode_router=RouterConfig("least_kv"))
    finally:
        planned_reads._RunBlocks._frees = frees
    assert res.summary["prefix_cache_hit_tokens"] > 0
    if planned_reads.__file__.endswith(".py"):  # interpreted: the patch above is what ran
        assert sum(1 for n in shared_seen if n) > 5  # reads walked finishers holding shared blocks
    assert _macro_fraction(cluster) > 0.3
