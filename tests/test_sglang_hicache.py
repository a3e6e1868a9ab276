"""SGLang's HiCache host tier (scheduler/sglang/hiradix_cache.py, hicache.py): hand-built trees with
exact pages, bytes and copy times; the scheduler holding a request for its load; an engine run on a
multi-turn workload; config errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from servesim.scheduler import ModelRunnerOutput, Request, SamplingParams
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.hicache import HiCacheController
from servesim.scheduler.sglang.hicache_config import HiCacheConfig
from servesim.scheduler.sglang.hiradix_cache import HiRadixCache
from servesim.scheduler.sglang.radix_cache import TokenToKVPool
from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.simulator.build import attach_planner
from servesim.simulator.config import SimConfig
from servesim.simulator.config_values import apply_overrides
from servesim.simulator.engine import Engine
from servesim.simulator.outputs import build_summary
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload

PS = 4  # tokens per page
BPT = 1000  # KV bytes per token
LINK = 1e9  # host link bytes/s: a 12-token copy takes 12 us


def hc(policy: str = "write_through", **kw) -> HiCacheConfig:
    return HiCacheConfig(True, hicache_write_policy=policy, kv_bytes_per_token=BPT, host_link_bytes_per_s=LINK, **kw)


def tree(policy: str = "write_through", device_pages: int = 4, ratio: float = 2.0):
    pool = TokenToKVPool(device_pages, PS)
    ctl = HiCacheController(hc(policy, hicache_ratio=ratio), PS, device_pages * PS)
    return HiRadixCache(PS, pool, ctl, policy), pool, ctl


def insert_new(t: HiRadixCache, pool: TokenToKVPool, tokens: list[int]) -> list[int]:
    pages = pool.alloc(len(tokens) // PS)
    assert t.insert(tokens, pages) == 0
    return pages


# --- the tree ---------------------------------------------------------------------------------------
def test_write_through_backs_up_on_insert_and_locks_until_the_copy_ends():
    t, pool, ctl = tree()
    insert_new(t, pool, list(range(12)))
    (node,) = t.nodes()
    assert node.host_value == [1, 2, 3] and ctl.totals.write_bytes == 12 * BPT and ctl.totals.num_writes == 1
    assert t.protected_size() == 12 and t.evictable_size() == 0  # locked while the copy runs
    ctl.now_s = 11.9e-6
    t.writing_check()
    assert t.protected_size() == 12
    ctl.now_s = 12e-6  # 12 tokens x 1000 B / 1e9 B/s
    t.writing_check()
    assert t.protected_size() == 0 and t.evictable_size() == 12


def test_device_eviction_keeps_the_host_copy_and_a_match_reports_a_host_hit():
    t, pool, ctl = tree()
    insert_new(t, pool, list(range(12)))
    ctl.now_s = 1.0
    t.writing_check()
    assert t.evict(12) == 12
    (node,) = t.nodes()
    assert node.evicted and node.value == [] and node.host_value == [1, 2, 3]
    assert len(pool.free_pages) == 4 and t.evictable_size() == 0
    dev, dev_len, host_node, host_len = t.match_prefix_host(list(range(13)))
    assert dev is t.root and dev_len == 0 and host_node is node and host_len == 12
    assert t.match_prefix(list(range(13))) == (t.root, 0) and t.peek_prefix(list(range(13))) == 0


def test_load_back_allocates_device_pages_and_finishes_when_its_time_has_elapsed():
    t, pool, ctl = tree()
    insert_new(t, pool, list(range(12)))
    ctl.now_s = 1.0
    t.writing_check()
    t.evict(12)
    node = t.nodes()[0]
    assert t.load_back(node) == 12
    assert not node.evicted and node.loading and len(node.value) == 3 and t.protected_size() == 12
    assert ctl.totals.load_bytes == 12 * BPT and ctl.ongoing_loads[0][0] == pytest.approx(1.0 + 12e-6)
    ctl.now_s = 1.0 + 11e-6
    assert t.loading_check() == []
    ctl.now_s = 1.0 + 12e-6
    assert t.loading_check() == [node] and not node.loading and t.evictable_size() == 12
    assert t.peek_prefix(list(range(13))) == 12


def test_load_back_below_sglang_threshold_is_skipped():
    t, pool, ctl = tree()
    insert_new(t, pool, list(range(8)))  # 8 tokens < load_back_threshold (10)
    ctl.now_s = 1.0
    t.writing_check()
    t.evict(8)
    assert t.load_back(t.nodes()[0]) == 0 and ctl.totals.num_loads == 0


def test_write_back_copies_only_on_eviction():
    t, pool, ctl = tree("write_back")
    insert_new(t, pool, list(range(12)))
    t.match_prefix_host(list(range(12)))
    assert ctl.totals.num_writes == 0 and t.nodes()[0].host_value is None
    assert t.evict(4) == 12
    node = t.nodes()[0]
    assert node.evicted and node.host_value == [1, 2, 3] and ctl.totals.write_bytes == 12 * BPT
    assert ctl.ongoing_writes == []  # SGLang waits for write-back copies: nothing left to acknowledge


def test_write_through_selective_backs_up_after_two_hits():
    t, pool, ctl = tree("write_through_selective")
    insert_new(t, pool, list(range(8)))  # hit 1
    assert ctl.totals.num_writes == 0
    t.match_prefix_host(list(range(8)))  # hit 2: backed up
    assert ctl.totals.num_writes == 1 and t.nodes()[0].host_value == [1, 2]
    t.match_prefix_host(list(range(8)))  # hit 3: already backed up
    assert ctl.totals.num_writes == 1


def test_without_host_room_a_node_is_deleted_and_host_leaves_are_evicted_for_new_copies():
    t, pool, ctl = tree(device_pages=4, ratio=1.5)  # host: 6 pages
    insert_new(t, pool, list(range(16)))  # 4 pages on host
    ctl.now_s = 1.0
    t.writing_check()
    t.evict(16)  # host only now
    insert_new(t, pool, list(range(100, 116)))  # needs 4 host pages: the first node's copy goes
    assert ctl.totals.num_writes == 2 and len(t.nodes()) == 1 and t.nodes()[0].key[0] == 100
    assert len(ctl.host_pool.free_pages) == 2


def test_split_divides_the_host_copy():
    t, pool, ctl = tree()
    insert_new(t, pool, list(range(12)))
    t.match_prefix_host(list(range(4)) + [99] * 8)
    upper = t.root.children[(None, (0, 1, 2, 3))]
    (lower,) = upper.children.values()
    assert upper.host_value == [1] and lower.host_value == [2, 3]


# --- the scheduler ----------------------------------------------------------------------------------
BASE = dict(max_running_requests=8, chunked_prefill_size=64, enable_chunked_prefill=True, page_size=PS,
            max_total_tokens=48, enable_radix_cache=True, overlap_schedule=False, seed=0)


def step(sched: SGLangScheduler, now_s: float):
    so = sched.schedule(now_s=now_s)
    sched.check_invariants()
    ids = list(so.num_scheduled_tokens)
    sampled = [[] if sched.requests[r].is_prefill_chunk else [7] for r in ids]
    sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled), now_s=now_s)
    sched.check_invariants()
    return so


def test_a_host_hit_waits_for_its_load_then_runs_with_the_loaded_prefix_cached():
    sched = SGLangScheduler(SGLangConfig(**BASE, hicache=hc()), 4096)
    assert sched.capabilities.idle_is_stable
    a = Request("a", list(range(21)), SamplingParams(max_tokens=1))
    sched.add_request(a, now_s=0.0)
    while sched.has_unfinished_requests():
        step(sched, 0.0)
    sched.kv_cache_manager.check_hicache_events()  # copies at t=0 end by 20 us
    sched.hicache.now_s = 1.0
    sched.kv_cache_manager.check_hicache_events()
    sched.kv_cache_manager.tree.evict(48)  # a's 20 cached tokens move to host only
    b = Request("b", list(range(20)) + [50, 51, 52, 53, 54], SamplingParams(max_tokens=1))
    sched.add_request(b, now_s=1.0)
    so = step(sched, 1.0)
    assert so.num_scheduled_tokens == {} and sched.kv_cache_manager.is_loading("b")
    assert sched.next_event_s() == pytest.approx(1.0 + 20e-6)  # 20 tokens x 1000 B / 1e9 B/s
    so = step(sched, 1.0 + 10e-6)
    assert so.num_scheduled_tokens == {}  # the load is not done yet
    so = step(sched, 1.0 + 20e-6)
    assert so.num_scheduled_tokens == {"b": 5} and b.num_cached_tokens == 20
    totals = sched.hicache.totals  # each update_from_output's stats carry that step's share
    assert totals.host_hit_tokens == 20 and totals.load_bytes == 20 * BPT and totals.num_loads == 1


# --- config -----------------------------------------------------------------------------------------
def test_config_errors():
    with pytest.raises(ValueError, match="did you mean 'write_back'"):
        HiCacheConfig(hicache_write_policy="write_bak")
    with pytest.raises(ValueError, match="hicache_ratio must be > 0"):
        HiCacheConfig(hicache_ratio=0)
    with pytest.raises(ValueError, match="mutually exclusive"):
        SGLangConfig(**{**BASE, "enable_radix_cache": False}, hicache=hc())
    with pytest.raises(ValueError, match="larger than the device pool"):
        SGLangConfig(**BASE, hicache=hc(hicache_ratio=1.0))
    with pytest.raises(InputError, match="sglang.hicache.enable_hierarchical_cache"):
        apply_overrides(SimConfig(engine="sglang"), {"sglang.hicache.enable_hierarchical_cache": "true",
                                                     "cache.enable_prefix_caching": "false"})
    with pytest.raises(InputError, match="sglang.hicache.hicache_write_policy"):
        apply_overrides(SimConfig(engine="sglang"), {"sglang.hicache.hicache_write_policy": "lru"})
    cfg = apply_overrides(SimConfig(engine="sglang"), {"sglang.hicache.enable_hierarchical_cache": "true",
                                                       "sglang.hicache.hicache_size_gb": "64"})
    assert cfg.sglang.hicache.hicache_size_gb == 64.0


def test_host_pool_size_from_gb_uses_bytes_per_token():
    cfg = hc(hicache_size_gb=0.0001)  # 100 kB / 1000 B = 100 tokens -> 25 pages of 4
    assert cfg.host_num_pages(48, PS) == 25
    assert hc(hicache_ratio=2.5).host_num_pages(48, PS) == 30


# --- the engine -------------------------------------------------------------------------------------
def _sessions():
    return make_workload("sessions", {
        "num_requests": 40, "arrival": {"rate_per_s": 4.0}, "prompt_len": {"dist": "fixed", "value": 512},
        "output_len": {"dist": "fixed", "value": 16},
        "sessions": {"num_turns": {"dist": "fixed", "value": 4}, "think_time_s": {"dist": "fixed", "value": 3.0}}},
        np.random.default_rng(0))


class CheckedEngine(Engine):
    def apply_output(self, *args, **kw):
        super().apply_output(*args, **kw)
        self.scheduler.check_invariants()


def _run(hicache: HiCacheConfig) -> dict:
    cfg = SimConfig(engine="sglang", scheduler=SchedulerConfig(max_model_len=4096, async_scheduling=False),
                    cache=CacheConfig(block_size=16, num_gpu_blocks=450), derive_num_gpu_blocks=False,
                    sglang=SGLangConfig(hicache=hicache))
    res = attach_planner(CheckedEngine(cfg, _sessions())).run()
    return build_summary(cfg, res, 40)


def test_engine_multi_turn_run_hits_the_host_tier_deterministically():
    off = _run(HiCacheConfig())
    on = _run(HiCacheConfig(True, hicache_ratio=10))
    assert "hicache" not in off and off["fast_path"]["used"]
    h = on["hicache"]
    assert on["num_finished"] == 40 and h["host_hit_tokens"] > 0 and h["load_bytes"] > 0 and h["write_bytes"] > 0
    assert on["prefix_cache_hit_tokens"] > off["prefix_cache_hit_tokens"]
    assert h["host_hit_tokens"] + h["device_hit_tokens"] == on["prefix_cache_hit_tokens"]
    assert "HiCache" in on["fast_path"]["declined_reason"]
    # llama-3.1-8b KV: 131072 B/token on one GPU; every copy moves whole 16-token pages
    assert h["load_bytes"] % (16 * 131072) == 0 and h["write_bytes"] % (16 * 131072) == 0
    again = _run(HiCacheConfig(True, hicache_ratio=10))
    drop = ("wall_time_s", "sim_speedup_x")
    assert {k: v for k, v in on.items() if k not in drop} == {k: v for k, v in again.items() if k not in drop}


def test_a_load_keeps_its_host_copy_when_its_own_eviction_needs_host_room():
    t, pool, ctl = tree("write_back", device_pages=4, ratio=1.5)  # host: 6 pages
    insert_new(t, pool, list(range(12)))
    t.evict(12)  # A: written back (3 host pages), host only
    a = t.nodes()[0]
    insert_new(t, pool, list(range(100, 116)))  # B fills the device, no host copy yet
    assert t.load_back(a) == 12  # B cannot be written back (host is short, A is pinned): deleted
    assert not a.evicted and a.host_value == [1, 2, 3] and a.parent is t.root
    assert [n.key[0] for n in t.nodes()] == [0] and len(ctl.host_pool.free_pages) == 3


def test_hicache_off_changes_nothing_whatever_its_other_settings():
    plain = _run(HiCacheConfig())
    off = _run(HiCacheConfig(False, hicache_ratio=7, hicache_write_policy="write_back"))
    drop = ("wall_time_s", "sim_speedup_x")
    assert {k: v for k, v in plain.items() if k not in drop} == {k: v for k, v in off.items() if k not in drop}


def test_time_series_bins_hicache_figures_by_second():
    from servesim.simulator.columns import Columns
    from servesim.simulator.outputs import with_hicache_series

    ts = Columns({"t_s": np.arange(3.0), "running": np.zeros(3, dtype=np.int64)})
    out = with_hicache_series(ts, [(0.5, 16, 100, 7), (0.9, 0, 0, 5), (2.0, 32, 200, 0), (9.0, 0, 0, 1)])
    assert out.columns == ["t_s", "running", "hicache_host_hit_tokens", "hicache_load_bytes", "hicache_write_bytes"]
    assert out["hicache_host_hit_tokens"].tolist() == [16, 0, 32]
    assert out["hicache_load_bytes"].tolist() == [100, 0, 200]
    assert out["hicache_write_bytes"].tolist() == [12, 0, 1]  # past the last tick: in the last one


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_invariants_hold_every_step_under_pressure_with_client_timeouts(policy, async_scheduling):
    """A tight pool, a host pool 1.5x the device one (host evictions), clients giving up (aborts of
    waiting and loading requests): tree, pages, host pages and copy locks checked after each step."""
    from servesim.simulator.config import ClientConfig

    wl = make_workload("sessions", {
        "num_requests": 50, "arrival": {"rate_per_s": 12.0},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.6, "max_value": 1500},
        "output_len": {"dist": "lognormal", "median": 30, "sigma": 0.6, "max_value": 200},
        "sessions": {"num_turns": {"dist": "uniform", "low": 2, "high": 5},
                     "think_time_s": {"dist": "exponential", "mean": 2.0}}}, np.random.default_rng(2))
    cfg = SimConfig(engine="sglang", scheduler=SchedulerConfig(max_model_len=3000, async_scheduling=async_scheduling),
                    cache=CacheConfig(block_size=16, num_gpu_blocks=200), derive_num_gpu_blocks=False,
                    sglang=SGLangConfig(hicache=HiCacheConfig(True, hicache_write_policy=policy, hicache_ratio=1.5)),
                    client=ClientConfig(timeout_s=0.5))
    res = CheckedEngine(cfg, wl).run()
    status = list(res.metrics.columns().requests["status"])
    assert "timed_out" in status and "completed" in status
    assert res.hicache.num_loads > 0 and res.hicache.write_bytes > 0
