"""P/D disaggregation: KV accounting on both sides, TTFT decomposition, the link model, the connector."""

from __future__ import annotations

import dataclasses

import pytest
import simpy

from servesim.scheduler.request import RequestStatus
from servesim.simulator.cluster import (
    Cluster, ClusterConfig, KVLink, LinkConfig, PDConfig, ReplicaGroup, RouterConfig, sim_config_from_dict,
)
from servesim.simulator.specs import kv_bytes_per_token, resolve_model
from servesim.traces.bundled import load_bundled
from servesim.traces.transforms import rate_scale, request_limit
from servesim.traces.workload import RequestSpec, Workload

PARTS = ["prefill_queue_s", "prefill_s", "transfer_s", "first_decode_s"]


def workload(n: int = 40, scale: float = 4.0) -> Workload:
    wl = rate_scale(request_limit(load_bundled(), n), scale)
    return Workload([dataclasses.replace(r, output_len=min(r.output_len, 24)) for r in wl.requests], wl.name, "t")


def pd_config(n_prefill=1, n_decode=2, pre=None, dec=None, **pd_kw) -> ClusterConfig:
    return ClusterConfig(
        replicas=[ReplicaGroup(n_prefill, sim_config_from_dict(pre or {}), role="prefill"),
                  ReplicaGroup(n_decode, sim_config_from_dict(dec or {}), role="decode")],
        pd=PDConfig(**pd_kw))


def run_checked(cfg: ClusterConfig, wl: Workload):
    c = Cluster(cfg, wl)
    res = c.run()
    for rep in c.replicas:  # no leaks: every usable block is free again, structures consistent
        sched = rep.engine.scheduler
        sched.check_invariants()
        pool = sched.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, rep.name
        assert not sched.requests and not getattr(sched, "sending", {}), rep.name
    return c, res


# 4160 tokens: prompts queue for blocks on both sides (max_model_len within the pool: vLLM's start-up check)
SMALL = {"cache.num_gpu_blocks": 260, "scheduler.max_model_len": 4160}


@pytest.mark.parametrize("kw", [
    {},
    {"link": LinkConfig(sharing="lanes", lanes=2, bandwidth_bytes_per_s=4e9)},
    {"link": LinkConfig(scope="shared", bandwidth_bytes_per_s=4e9), "handoff_latency_s": 0.005,
     "decode_router": RouterConfig("least_kv")},
    {"pre": SMALL, "dec": SMALL, "n_prefill": 2, "n_decode": 1},
    {"pre": {**SMALL, "scheduler.async_scheduling": True}, "dec": {**SMALL, "scheduler.async_scheduling": True}},
], ids=["fair", "lanes", "shared-handoff", "small-pools", "small-pools-async"])
def test_transfers_leak_no_blocks_and_ttft_decomposes(kw):
    wl = workload()
    c, res = run_checked(pd_config(**kw), wl)
    df = res.requests
    assert res.summary["num_finished"] == len(wl.requests)
    assert (df["output_len"] == df["output_len_target"]).all()  # decode side generates the whole output
    assert df[PARTS].sum(axis=1).to_numpy() == pytest.approx(df["ttft_s"].to_numpy(), abs=1e-9)
    assert (df[PARTS + ["kv_link_s"]] >= -1e-12).all().all()
    assert (df["kv_link_s"] <= df["transfer_s"] + 1e-12).all()
    assert sum(link.num_transfers for link in c.links) == len(wl.requests)
    # Prefill replicas ran one token per request; decode replicas got every request once.
    pre = [r for r in res.replicas if r.role == "prefill"]
    assert sum(r.num_routed for r in pre) == len(wl.requests)
    assert all(r.result.metrics.requests_frame()["output_len"].eq(1).all() for r in pre)


def test_kv_bytes_and_link_time_follow_the_model():
    wl = Workload([RequestSpec("a", 0.0, prompt_len=1000, output_len=3)], "one", "t")
    bw, lat = 1e9, 1e-3
    c, res = run_checked(pd_config(1, 1, link=LinkConfig(bandwidth_bytes_per_s=bw, latency_s=lat)), wl)
    row = res.requests.iloc[0]
    per_token = kv_bytes_per_token(resolve_model("llama-3.1-8b"), 1)
    assert row.kv_tokens == 1000 and row.kv_bytes == 1000 * per_token
    assert row.kv_link_s == pytest.approx(lat + 1000 * per_token / bw)
    # The decode side recomputes only the last prompt token, then decodes: one token scheduled.
    dec = res.replicas[1].result.metrics.steps_frame()
    assert dec[dec.num_requests > 0].iloc[0][["num_prefill_tokens", "num_decode_tokens"]].sum() == 1
    assert res.summary["pd"]["kv_bytes_total"] == row.kv_bytes


def test_tp_mismatch_moves_the_larger_per_gpu_shard():
    wl = Workload([RequestSpec("a", 0.0, prompt_len=320, output_len=2)], "one", "t")
    _, res = run_checked(pd_config(1, 1, pre={"hardware.tp": 2}), wl)
    assert res.requests.iloc[0].kv_bytes == 320 * kv_bytes_per_token(resolve_model("llama-3.1-8b"), 1)


def test_decode_side_holds_preallocated_blocks_while_waiting_for_kv():
    wl = Workload([RequestSpec("a", 0.0, prompt_len=200, output_len=2)], "one", "t")
    cfg = pd_config(1, 1, link=LinkConfig(bandwidth_bytes_per_s=1e6, latency_s=0.0))  # a slow link: ~2.6 s
    c = Cluster(cfg, wl)
    seen = []
    dec = c.replicas[1].engine.scheduler

    def probe():
        yield c.env.timeout(1.0)
        req = dec.requests["a"]
        seen.append((req.status, dec.kv_cache_manager.num_blocks_held("a"), req.num_computed_tokens,
                     c.replicas[0].engine.scheduler.kv_cache_manager.num_blocks_held("a")))

    c.env.process(probe())
    c.run()
    status, held, computed, prefill_held = seen[0]
    assert status == RequestStatus.WAITING_FOR_REMOTE_KVS
    # ceil(200/16) blocks reserved; while parked the request counts every loaded token (as vLLM),
    # and steps back to 199 on promotion so the last one is recomputed.
    assert held == 13 and computed == 200
    assert prefill_held == 13  # the prefill side keeps its KV until the decode side has read it
    # ... through the connector's delayed free, released by finished_sending when the transfer completed.
    pre = c.replicas[0].engine.scheduler
    assert pre.kv_cache_manager.num_blocks_held("a") == 0 and "a" not in pre.requests


def test_a_prompt_too_big_for_the_decode_pool_is_ignored_and_releases_the_prefill_kv():
    # The decode pool (40 blocks, block 0 the null block) passes vLLM's start-up check for
    # max_model_len 640, but "big" needs 639 KV slots = all 40 blocks: rejected on the decode side.
    wl = Workload([RequestSpec("big", 0.0, prompt_len=636, output_len=4),
                   RequestSpec("ok", 0.1, prompt_len=100, output_len=4)], "two", "t")
    _, res = run_checked(pd_config(1, 1, dec={"cache.num_gpu_blocks": 40, "scheduler.max_model_len": 640}), wl)
    df = res.requests.set_index("request_id")
    assert df.loc["big", "output_len"] == 0 and df.loc["big", "status"] == "rejected"
    assert df.loc["big", "reject_reason"] == "exceeds_kv_pool"
    assert df.loc["ok", "output_len"] == 4
    assert res.summary["num_rejected"] == 1 and res.summary["rejected_by_reason"] == {"exceeds_kv_pool": 1}


def _link_times(cfg: LinkConfig, starts_bytes: list[tuple[float, int]]) -> list[float]:
    env = simpy.Environment()
    link = KVLink(env, cfg)
    done: dict[int, float] = {}

    def start(i, t, b):
        yield env.timeout(t)
        link.transfer(b, lambda: done.__setitem__(i, env.now))

    for i, (t, b) in enumerate(starts_bytes):
        env.process(start(i, t, b))
    env.run()
    return [done[i] for i in range(len(starts_bytes))]


def test_fair_sharing_splits_bandwidth_between_concurrent_transfers():
    cfg = LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.0)
    assert _link_times(cfg, [(0.0, 100), (0.0, 100)]) == pytest.approx([2.0, 2.0])
    # A alone for 0.5 s (50 B), then both at 50 B/s: A ends at 1.5, B has 50 B left alone: 2.0.
    assert _link_times(cfg, [(0.0, 100), (0.5, 100)]) == pytest.approx([1.5, 2.0])
    lat = LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.25)
    assert _link_times(lat, [(0.0, 50)]) == pytest.approx([0.75])


def test_lanes_queue_transfers_first_come_first_served():
    cfg = LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.0, sharing="lanes", lanes=1)
    assert _link_times(cfg, [(0.0, 100), (0.0, 100)]) == pytest.approx([1.0, 2.0])
    two = LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.0, sharing="lanes", lanes=2)
    assert _link_times(two, [(0.0, 100), (0.0, 100), (0.0, 100)]) == pytest.approx([2.0, 2.0, 4.0])


def _link_turns(cfg: LinkConfig) -> list[tuple[str, str, float]]:
    """Transfers and watchers whose instants coincide: the order in which everything happened."""
    env = simpy.Environment()
    link = KVLink(env, cfg)
    log: list[tuple[str, str, float]] = []

    def send(name, t, b):
        yield env.timeout(t)
        log.append(("start", name, env.now))
        link.transfer(b, lambda: log.append(("land", name, env.now)))

    def watch(name, t):
        yield env.timeout(t)
        log.append(("watch", name, env.now))

    for i, (t, b) in enumerate([(0.0, 100), (0.0, 100), (1.0, 50), (2.0, 100), (2.0, 0), (4.0, 100)]):
        env.process(send(f"t{i}", t, b))
    for j, t in enumerate([1.0, 1.25, 2.0, 3.0, 4.0, 5.0]):
        env.process(watch(f"w{j}", t))
    env.run()
    return [(k, n, round(t, 9)) for k, n, t in log]


def test_link_events_take_the_turns_a_process_would():
    """Same-instant order on the clock, pinned from the link as SimPy processes (a transfer per
    process, the fair server waiting on `timeout | changed`): its plain events and callbacks land
    each transfer at the same turn, before or after whatever else is due at that instant."""
    fair = _link_turns(LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.0))
    assert fair == [("start", "t0", 0.0), ("start", "t1", 0.0), ("start", "t2", 1.0), ("watch", "w0", 1.0),
                    ("watch", "w1", 1.25), ("start", "t3", 2.0), ("start", "t4", 2.0), ("watch", "w2", 2.0),
                    ("land", "t4", 2.0), ("land", "t0", 2.666666667), ("land", "t1", 2.666666667),
                    ("land", "t2", 2.666666667), ("watch", "w3", 3.0), ("land", "t3", 3.5), ("start", "t5", 4.0),
                    ("watch", "w4", 4.0), ("watch", "w5", 5.0), ("land", "t5", 5.0)]
    lanes = _link_turns(LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.0, sharing="lanes", lanes=2))
    assert lanes == [("start", "t0", 0.0), ("start", "t1", 0.0), ("start", "t2", 1.0), ("watch", "w0", 1.0),
                     ("watch", "w1", 1.25), ("start", "t3", 2.0), ("start", "t4", 2.0), ("watch", "w2", 2.0),
                     ("land", "t0", 2.0), ("land", "t1", 2.0), ("watch", "w3", 3.0), ("land", "t2", 3.0),
                     ("land", "t4", 3.0), ("start", "t5", 4.0), ("watch", "w4", 4.0), ("land", "t3", 4.0),
                     ("watch", "w5", 5.0), ("land", "t5", 6.0)]
    late = _link_turns(LinkConfig(bandwidth_bytes_per_s=100.0, latency_s=0.25))
    assert [e for e in late if e[0] == "land"] == [("land", "t4", 2.25), ("land", "t0", 2.916666667),
                                                   ("land", "t1", 2.916666667), ("land", "t2", 2.916666667),
                                                   ("land", "t3", 3.75), ("land", "t5", 5.25)]


@pytest.mark.parametrize("sets", [{}, {"cache.num_gpu_blocks": 200, "scheduler.max_model_len": 3200,
                                      "scheduler.long_prefill_token_threshold": 64},
                                  {"scheduler.async_scheduling": True, "scheduler.policy": "priority"}])
def test_decode_scheduler_without_a_connector_matches_the_plain_scheduler(sets):
    """A decode-side scheduler with no connector behaves exactly like the plain scheduler."""
    import pandas as pd

    from servesim.simulator.cluster.pd_schedulers import decode_scheduler
    from servesim.simulator.engine import Engine

    class Patched(Engine):
        def __init__(self, cfg, wl):
            super().__init__(cfg, wl)
            self.scheduler = decode_scheduler(cfg, self.cache, None)

    cfg = sim_config_from_dict(sets)
    wl = workload(30)
    plain, patched = Engine(cfg, wl).run(), Patched(cfg, wl).run()
    pd.testing.assert_frame_equal(plain.metrics.requests_frame(), patched.metrics.requests_frame())
    pd.testing.assert_frame_equal(plain.metrics.steps_frame(), patched.metrics.steps_frame())
