"""Prefix-aware routing over both KV tiers: the schedulers' CPU-tier lookup (vLLM's
OffloadingConnector, SGLang's HiCache), the tier prices, and the router's exact scores."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.scheduler.interface import SchedulerCapabilities
from servesim.scheduler.output import ModelRunnerOutput
from servesim.scheduler.request import Request, SamplingParams
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.hicache_config import HiCacheConfig
from servesim.simulator.cluster.cluster import Replica
from servesim.simulator.cluster.routers import make_router
from servesim.simulator.cluster.tier_prices import TierPrices, cpu_tier_link, tier_prices
from servesim.simulator.config import CostModelConfig, SimConfig
from servesim.simulator.cost_model import register_cost_model
from servesim.simulator.engine import Engine
from servesim.simulator.kv_offload import KvOffloadConfig
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


class _LinearCost:
    """step = 5 ms + 1 ms per scheduled token."""

    name = "test-tier-linear"

    def step_time_s(self, shape) -> float:
        return 0.005 + 0.001 * sum(shape.num_new_tokens)


register_cost_model("test-tier-linear")(lambda **kw: _LinearCost())

GPU_BLOCK_BYTES = 4 * 131072  # llama-3.1-8b: 128 KiB of KV per token, 4-token blocks


def _vllm_cfg(offload: bool) -> SimConfig:
    # A link of 1000 GPU blocks per second: 4 tokens per ms.
    ko = KvOffloadConfig(num_cpu_blocks=100, host_link_bytes_per_s=GPU_BLOCK_BYTES * 1000.0) if offload \
        else KvOffloadConfig()
    return SimConfig(scheduler=SchedulerConfig(max_model_len=48, max_num_batched_tokens=64, max_num_seqs=8),
                     cache=CacheConfig(block_size=4, num_gpu_blocks=12), derive_num_gpu_blocks=False,
                     cost_model=CostModelConfig(name="test-tier-linear"), kv_offload=ko)


# a's 16-token prefix (4 blocks) is evicted from the GPU by b, all but its first block.
_A = RequestSpec("a", 0.0, 20, 1, prefix_group=1, prefix_len=16)
_B = RequestSpec("b", 5.0, 40, 1)
_C = RequestSpec("c", 10.0, 20, 1, prefix_group=1, prefix_len=16)


# --- the schedulers' lookups -----------------------------------------------------------------------
@pytest.mark.parametrize("offload", [False, True])
def test_vllm_cpu_lookup_counts_the_offload_blocks_past_the_gpu_hit(offload):
    engine = Engine(_vllm_cfg(offload), Workload([_A, _B], name="t", source="test"))
    engine.run()
    sched, tokens, prov = engine.scheduler, _C.token_ids(), engine.requests_in.provenance(_C)
    gpu = sched.cached_prefix_tokens(tokens, None, prov)
    assert gpu == 4  # one of a's prefix blocks survived b on the GPU
    # a's stores were reported at 5.0; its blocks 1..3 are in the tier, c's own 5th block is not.
    assert sched.cpu_cached_prefix_tokens(tokens, None, prov, gpu) == (12 if offload else 0)
    if offload:
        assert sched.cpu_cached_prefix_tokens(tokens, None, prov, 0) == 16  # from the first block
        assert sched.cpu_cached_prefix_tokens(tokens, 7, prov, gpu) == 0  # another adapter's hashes
        assert sched.cpu_cached_prefix_tokens(tokens[:3], None, prov, 0) == 0  # under one offload block
        # Read-only: the same answer again, and c itself then loads exactly those 3 blocks.
        assert sched.cpu_cached_prefix_tokens(tokens, None, prov, gpu) == 12


def test_vllm_cpu_lookup_matches_what_the_request_then_loads():
    engine = Engine(_vllm_cfg(True), Workload([_A, _B, _C], name="t", source="test"))
    engine.run()
    assert engine.kv_offload.totals.bytes_loaded == 3 * GPU_BLOCK_BYTES  # c's load: the 12 tokens above


PS, BPT, LINK = 4, 1000, 1e9


BASE = dict(max_running_requests=8, chunked_prefill_size=64, enable_chunked_prefill=True, page_size=PS,
            max_total_tokens=48, enable_radix_cache=True, overlap_schedule=False, seed=0)


def _sglang_after_eviction() -> SGLangScheduler:
    hc = HiCacheConfig(True, kv_bytes_per_token=BPT, host_link_bytes_per_s=LINK)
    sched = SGLangScheduler(SGLangConfig(**BASE, hicache=hc), 4096)
    sched.add_request(Request("a", list(range(21)), SamplingParams(max_tokens=1)), now_s=0.0)
    while sched.has_unfinished_requests():
        so = sched.schedule(now_s=0.0)
        ids = list(so.num_scheduled_tokens)
        sampled = [[] if sched.requests[r].is_prefill_chunk else [7] for r in ids]
        sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled), now_s=0.0)
    sched.hicache.now_s = 1.0
    sched.kv_cache_manager.check_hicache_events()  # the write-through copies landed
    sched.kv_cache_manager.tree.evict(48)  # a's 20 cached tokens are on the host only
    return sched


def test_sglang_cpu_lookup_is_the_host_part_of_the_radix_match():
    sched = _sglang_after_eviction()
    prompt = list(range(20)) + [50, 51, 52, 53, 54]
    assert sched.cached_prefix_tokens(prompt) == 0
    assert sched.cpu_cached_prefix_tokens(prompt, None, None, 0) == 20
    assert sched.cpu_cached_prefix_tokens(prompt) == 20  # read-only: asked again, the same
    assert sched.cpu_cached_prefix_tokens(prompt, lora_id=3) == 0
    # 8 host tokens: below SGLang's load_back threshold (10), so nothing would be loaded.
    assert sched.cpu_cached_prefix_tokens(list(range(8)) + [99, 98, 97]) == 0
    assert sched.cpu_cached_prefix_tokens([]) == 0


def test_schedulers_without_a_tier_answer_zero():
    sched = SGLangScheduler(SGLangConfig(**BASE), 4096)
    sched.add_request(Request("a", list(range(21)), SamplingParams(max_tokens=1)), now_s=0.0)
    sched.schedule(now_s=0.0)
    assert sched.cpu_cached_prefix_tokens(list(range(30))) == 0


# --- prices ---------------------------------------------------------------------------------------
def test_tier_prices_come_from_the_cost_model_and_the_link():
    p = tier_prices(_vllm_cfg(True))
    # One 64-token prefill chunk: 5 + 64 ms; a token's KV (GPU_BLOCK_BYTES / 4) at 1000 blocks/s: 0.25 ms.
    assert p == TierPrices(prefill_s_per_token=0.069 / 64, cpu_load_latency_s=0.0, cpu_load_s_per_token=0.00025)
    assert tier_prices(_vllm_cfg(False)).cpu_load_s_per_token == 0.0 and cpu_tier_link(_vllm_cfg(False)) is None
    hi = SimConfig(engine="sglang", sglang=SGLangConfig(hicache=HiCacheConfig(
        True, kv_bytes_per_token=BPT, host_link_bytes_per_s=LINK, transfer_efficiency=0.5, transfer_latency_s=1e-5)))
    assert cpu_tier_link(hi) == (1e-5, BPT / (LINK * 0.5))


def test_a_cpu_hit_is_worth_its_tokens_less_the_copy():
    p = TierPrices(prefill_s_per_token=1e-4, cpu_load_latency_s=1e-4, cpu_load_s_per_token=1e-5)
    assert p.cpu_load_s(64) == pytest.approx(1e-4 + 64e-5)
    assert p.cpu_hit_worth_tokens(64) == pytest.approx(64 - 7.4)  # (0.1 + 0.64 ms) / 0.1 ms a token
    assert p.cpu_hit_worth_tokens(0) == 0.0
    # A copy slower than recomputing: the load is made anyway, so the hit is worse than a miss.
    assert TierPrices(1e-5, 0.0, 2e-5).cpu_hit_worth_tokens(64) == pytest.approx(-64.0)


# --- the router, on hand-built replicas ----------------------------------------------------------------
class _Sched:
    capabilities = SchedulerCapabilities(max_steps_in_flight=1, idle_is_stable=True, prefix_cache="block_hash")

    def __init__(self, gpu: int, cpu: int) -> None:
        self.gpu, self.cpu = gpu, cpu

    def cached_prefix_tokens(self, token_ids, lora_id=None, provenance=None) -> int:
        return self.gpu

    def cpu_cached_prefix_tokens(self, token_ids, lora_id=None, provenance=None, num_gpu_cached_tokens=0) -> int:
        assert num_gpu_cached_tokens == self.gpu  # asked past the GPU hit
        return self.cpu


def _replicas(*tiers: tuple[int, int], outstanding: tuple[int, ...] | None = None) -> list[Replica]:
    cfg = SimConfig(scheduler=SchedulerConfig(max_num_seqs=8))
    loads = outstanding or (0,) * len(tiers)
    scheds = [_Sched(g, c) for g, c in tiers]
    # the router reads both hits through the engine (Engine.prefix_hits: the GPU cache's, then the
    # CPU tier's past it)
    return [Replica(i, f"r{i}", "both", cfg, SimpleNamespace(scheduler=s, num_outstanding=n, cfg=cfg,
                                                             prefix_hits=partial(_hits, s)))
            for i, (s, n) in enumerate(zip(scheds, loads))]


def _hits(sched: _Sched, spec, token_ids, with_cpu: bool) -> tuple[int, int]:
    gpu = sched.cached_prefix_tokens(token_ids)
    return gpu, sched.cpu_cached_prefix_tokens(token_ids, num_gpu_cached_tokens=gpu) if with_cpu else 0


SPEC = RequestSpec("q", 0.0, 128, 1)
PRICES = TierPrices(prefill_s_per_token=1e-4, cpu_load_latency_s=0.0, cpu_load_s_per_token=1e-5)


def _router(**params):
    router = make_router("prefix_aware", params)
    for i in range(4):
        router._prices[i] = PRICES  # hand-set prices: the replicas are stubs
    return router


def test_a_cpu_hit_beats_nothing_and_loses_to_a_gpu_hit_at_equal_load():
    nothing, cpu, gpu = (0, 0), (0, 64), (64, 0)
    router = _router()
    d = router.choose(SPEC, _replicas(nothing, cpu, gpu), 0.0)
    assert (d.candidate, d.reason, d.score) == (2, "prefix", 0.5)  # 64 / 128
    d = router.choose(SPEC, _replicas(nothing, cpu), 0.0)
    # 64 CPU tokens save 64 x 0.1 ms of prefill and cost 64 x 0.01 ms of copy: 57.6 tokens' worth.
    assert (d.candidate, d.reason) == (1, "cpu_prefix") and d.score == pytest.approx(57.6 / 128)
    d = router.choose(SPEC, _replicas(nothing, nothing), 0.0)
    assert (d.candidate, d.reason, d.score) == (0, "load", 0.0)


def test_gpu_and_cpu_hits_add_and_load_still_counts():
    router = _router()
    # 32 on the GPU and 64 more in CPU (89.6 tokens' worth) with 2 of 8 seqs busy, against 64 on an idle GPU.
    d = router.choose(SPEC, _replicas((32, 64), (64, 0), outstanding=(2, 0)), 0.0)
    assert d.candidate == 1 and d.score == 0.5
    d = router.choose(SPEC, _replicas((32, 64), (64, 0), outstanding=(1, 0)), 0.0)
    assert (d.candidate, d.reason) == (0, "prefix") and d.score == pytest.approx((32 + 57.6) / 128 - 1 / 8)


def test_a_fixed_cpu_weight_replaces_the_prices():
    d = make_router("prefix_aware", {"cpu_hit_weight": 0.8}).choose(SPEC, _replicas((0, 0), (0, 64)), 0.0)
    assert d.candidate == 1 and d.score == pytest.approx(0.4)  # llm-d's CPU weight: 64 x 0.8 / 128
    with pytest.raises(InputError, match="cpu_hit_weight"):
        make_router("prefix_aware", {"cpu_hit_weight": 1.5})


def test_a_copy_slower_than_recompute_makes_the_cpu_hit_lose_to_a_miss():
    router = _router()
    router._prices[1] = TierPrices(1e-5, 0.0, 2e-5)
    d = router.choose(SPEC, _replicas((0, 0), (0, 64)), 0.0)
    assert d.candidate == 0 and d.score == 0.0
