"""KV cache groups of vLLM 0.19.1's other kinds, by hand: MambaManager (each mamba_cache_mode),
ChunkedLocalAttentionManager, SinkFullAttentionManager, the hybrid coordinator's hit search over
them (a property test), _mamba_block_aligned_split, and the refusals. Exact block ids throughout.
The step-for-step parity with the real scheduler is tests/test_sched_golden.py (mamba_*,
chunked_local*, sink_full*)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from servesim.scheduler import CacheConfig, Request, SamplingParams, SchedulerConfig
from servesim.scheduler.kv.block_pool import BlockPool, make_block_hash_with_group_id
from servesim.scheduler.kv.coordinator import HybridKVCacheCoordinator, make_coordinator
from servesim.scheduler.kv.kinds import MANAGERS, group_specs_from_text, max_blocks_per_request
from servesim.scheduler.kv.local_attention import ChunkedLocalAttentionManager
from servesim.scheduler.kv.mamba import MambaManager, mamba_block_aligned_split
from servesim.scheduler.kv.single_type import KVCacheGroupSpec as G
from servesim.scheduler.kv.sink_full import SinkFullAttentionManager
from servesim.scheduler.scheduler import Scheduler

H = [bytes([i]) * 4 for i in range(64)]  # block hashes of one request, by block index


def cache(pool: BlockPool, index: int, group_id: int, block_id: int):
    """Put block `block_id` in the prefix cache as block `index` of the request's hashes for group_id."""
    blk = pool.blocks[block_id]
    key = make_block_hash_with_group_id(H[index], group_id)
    blk.block_hash = key
    pool.cached_block_hash_to_block.insert(key, blk)
    return blk


def ids(blocks):
    return [b.block_id for b in blocks]


# --- chunked local attention ----------------------------------------------------------------------------
def test_chunked_local_hit_marks_blocks_before_the_chunk_computed():
    # vLLM's docstring examples: chunk 8, block 4
    pool = BlockPool(20, True)
    spec = G("chunked_local", 4, attention_chunk_size=8)
    hit = ChunkedLocalAttentionManager.find_longest_cache_hit(H, 15, [0], pool, spec, False, 4)
    assert ids(hit[0]) == [0, 0]  # tokens 0-7 out of the window; block 2 (tokens 8-11) not cached
    cache(pool, 2, 0, 7)
    hit = ChunkedLocalAttentionManager.find_longest_cache_hit(H, 15, [0], pool, spec, False, 4)
    assert ids(hit[0]) == [0, 0, 7]
    hit = ChunkedLocalAttentionManager.find_longest_cache_hit(H, 16, [0], pool, spec, False, 4)
    assert ids(hit[0]) == [0, 0, 0, 0]  # the next token starts a new chunk: nothing to look up
    assert ChunkedLocalAttentionManager.find_longest_cache_hit(H, 0, [0], pool, spec, False, 4) == ([],)


@pytest.mark.parametrize("computed, skipped", [(13, 8), (8, 8), (7, 0), (0, 0), (24, 24)])
def test_chunked_local_skips_the_chunks_before_the_next_token(computed, skipped):
    m = ChunkedLocalAttentionManager(G("chunked_local", 4, attention_chunk_size=8), BlockPool(10, True), True, 0)
    assert m.get_num_skipped_tokens(computed) == skipped


def test_chunked_local_frees_blocks_of_past_chunks():
    pool = BlockPool(12, True)
    m = ChunkedLocalAttentionManager(G("chunked_local", 4, attention_chunk_size=8), pool, True, 0)
    assert ids(m.allocate_new_blocks("a", 14, 14)) == [1, 2, 3, 4]
    free_before = pool.get_num_free_blocks()
    m.remove_skipped_blocks("a", 13)  # tokens 0-7 (blocks 0, 1) out of the window
    assert ids(m.req_to_blocks["a"]) == [0, 0, 3, 4]
    assert pool.get_num_free_blocks() == free_before + 2
    assert m.get_num_common_prefix_blocks("a") == 0


# --- sink full attention --------------------------------------------------------------------------------
def test_sink_blocks_leave_the_pool_for_good_and_the_rest_is_full_attention():
    pool = BlockPool(10, True)
    m = SinkFullAttentionManager(G("sink_full", 4, sink_len=8), pool, True, 0)
    assert ids(m.sink_blocks) == [1, 2]
    assert pool.get_num_free_blocks() == 7  # 10 - null - 2 sink blocks
    assert ids(m.allocate_new_blocks("a", 5, 5)) == [3, 4]
    assert m.is_full_attention


def test_sink_len_must_be_whole_blocks():
    with pytest.raises(ValueError, match="sink_len"):
        SinkFullAttentionManager(G("sink_full", 4, sink_len=6), BlockPool(10, True), True, 0)


# --- Mamba -------------------------------------------------------------------------------------------
def test_mamba_hit_is_the_rightmost_cached_block_after_nulls():
    pool = BlockPool(20, True)
    spec = G("mamba", 4, mamba_cache_mode="all")
    cache(pool, 1, 0, 5)
    cache(pool, 3, 0, 9)
    hit = MambaManager.find_longest_cache_hit(H, 4 * 6, [0], pool, spec, False, 4)
    assert ids(hit[0]) == [0, 0, 0, 9]
    hit = MambaManager.find_longest_cache_hit(H, 4 * 3, [0], pool, spec, False, 4)  # block 3 beyond max
    assert ids(hit[0]) == [0, 5]
    # alignment 8 tokens: block 3 ends at 16 (aligned) but block 2 (12) would not be
    assert ids(MambaManager.find_longest_cache_hit(H, 4 * 6, [0], pool, spec, False, 8)[0]) == [0, 0, 0, 9]
    cache(pool, 2, 0, 11)
    assert ids(MambaManager.find_longest_cache_hit(H, 4 * 3, [0], pool, spec, False, 8)[0]) == [0, 5]


def test_mamba_all_mode_keeps_only_the_last_state_block():
    pool = BlockPool(20, True)
    m = MambaManager(G("mamba", 4, mamba_cache_mode="all", num_speculative_blocks=1), pool, True, 0)
    # 10 tokens + 1 speculative block of 4 -> cdiv(14, 4) = 4 blocks
    assert m.get_num_blocks_to_allocate("a", 10, [], 0, 10) == 4
    assert ids(m.allocate_new_blocks("a", 10, 10)) == [1, 2, 3, 4]
    # 10 computed: the state after token 9 is in block 2; minus num_speculative_blocks (1) -> 9
    # computed -> 8 tokens skipped -> blocks 0, 1 freed
    m.remove_skipped_blocks("a", 10)
    assert ids(m.req_to_blocks["a"]) == [0, 0, 3, 4]
    assert m.get_num_skipped_tokens(0) == -1 and m.get_num_common_prefix_blocks("a") == 0


def test_mamba_refuses_a_hit_cached_this_step_until_the_next():
    pool = BlockPool(20, True)
    m = MambaManager(G("mamba", 4, mamba_cache_mode="all"), pool, True, 0)
    req = Request("a", list(range(9)), SamplingParams(max_tokens=4))
    req.block_hashes = H[:2]
    m.allocate_new_blocks("a", 9, 9)
    m.cache_blocks(req, 8)  # blocks 0, 1 (ids 1, 2) enter the cache this step
    hit = MambaManager.find_longest_cache_hit(H, 8, [0], pool, m.spec, False, 4)
    assert ids(hit[0]) == [0, 2]
    assert m.get_num_blocks_to_allocate("b", 9, hit[0], 8, 9) == pool.num_gpu_blocks + 1
    m.new_step_starts()
    assert m.get_num_blocks_to_allocate("b", 9, hit[0], 8, 9) == 1  # cdiv(9,4) - 2 hit blocks; block 2 held


def test_mamba_align_mode_moves_the_state_forward_and_frees_the_block_of_two_steps_ago():
    pool = BlockPool(20, True)
    m = MambaManager(G("mamba", 4, mamba_cache_mode="align", num_speculative_blocks=1), pool, True, 0)
    # first prefill of 8 tokens: 1 state block + 1 speculative, after cdiv(8,4)-1 = 1 null
    assert m.get_num_blocks_to_allocate("a", 8, [], 0, 8) == 2
    assert ids(m.allocate_new_blocks("a", 8 + 3, 8)) == [0, 1, 2]  # lookahead (3) ignored in align mode
    # next chunk to 16 tokens: the speculative block (idx 2) moves to the end, one new block
    m.remove_skipped_blocks("a", 8)
    assert m.get_num_blocks_to_allocate("a", 16, [], 8, 16) == 1
    assert ids(m.allocate_new_blocks("a", 16, 16)) == [2, 3]  # from the old length on: moved + new
    assert ids(m.req_to_blocks["a"]) == [0, 1, 0, 2, 3]
    assert m.last_state_block_idx["a"] == 1
    # the step after: block idx 1 (two steps ago) is freed once 16 tokens are computed
    free = pool.get_num_free_blocks()
    m.remove_skipped_blocks("a", 16 + 1)  # +1: num_speculative_blocks is subtracted first
    assert ids(m.req_to_blocks["a"]) == [0, 0, 0, 2, 3]
    assert pool.get_num_free_blocks() == free + 1
    m.free("a")
    assert "a" not in m.last_state_block_idx and "a" not in m._allocated_block_reqs


def test_a_mamba_group_may_have_another_block_size_without_prefix_caching():
    cc = _cc((G("full", 16), G("mamba", 2048)), enable_prefix_caching=False)
    assert cc.kv_cache_groups[1].block_size == 2048


def test_mamba_group_holds_one_block_with_prefix_caching_off():
    cc = CacheConfig(attention="groups", enable_prefix_caching=False, num_gpu_blocks=10,
                     kv_cache_groups=(G("full", 4), G("mamba", 4)), block_size=4)
    sched = Scheduler(SchedulerConfig(max_model_len=64, max_num_batched_tokens=64), cc)
    mamba = sched.kv_cache_manager.coordinator.managers[1]
    assert mamba.block_size == 64  # vLLM: mamba_block_size = max_model_len without prefix caching
    assert sched.kv_cache_manager.blocks_needed(40) == 10 + 1


# --- _mamba_block_aligned_split ------------------------------------------------------------------------
def _req(num_prompt: int, num_computed: int = 0) -> Request:
    r = Request("r", list(range(num_prompt)), SamplingParams(max_tokens=4))
    r.num_computed_tokens = num_computed
    return r


@pytest.mark.parametrize("prompt, computed, new, eagle, want", [
    (100, 0, 50, False, 48),  # before the last boundary (96): whole blocks only
    (100, 0, 10, False, 0),  # less than a block and not reaching 96: nothing this step
    (100, 80, 20, False, 16),  # crosses 96: stop exactly there so that state is cached
    (100, 96, 4, False, 4),  # the tail after the last boundary: as is
    (100, 0, 100, False, 96),
    (100, 0, 100, True, 80),  # eagle: the last cached block is dropped, so the boundary is 80
    (100, 99, 1, False, 1),  # the last prompt token
])
def test_mamba_block_aligned_split(prompt, computed, new, eagle, want):
    assert mamba_block_aligned_split(_req(prompt, computed), new, block_size=16, use_eagle=eagle) == want


def test_mamba_block_aligned_split_leaves_decode_alone():
    r = _req(32, 32)
    r.append_output_token_ids([5, 6])
    r.num_computed_tokens = r.num_tokens - 1
    assert mamba_block_aligned_split(r, 1, block_size=16, use_eagle=False) == 1


def test_mamba_block_aligned_split_refuses_external_tokens():
    with pytest.raises(ValueError, match="KV connector"):
        mamba_block_aligned_split(_req(64), 16, 0, 16, block_size=16, use_eagle=False)


# --- configuration: vLLM's refusals ----------------------------------------------------------------------
def _cc(groups, **kw):
    return CacheConfig(attention="groups", kv_cache_groups=groups, **kw)


@pytest.mark.parametrize("kw, match", [
    ({"kv_cache_groups": (G("full", 16), G("mamba", 16))}, "'none' with prefix caching on"),
    ({"kv_cache_groups": (G("full", 16), G("mamba", 16, mamba_cache_mode="align")), "mamba_cache_mode": "align",
      "enable_prefix_caching": False}, "needs prefix caching"),
    ({"kv_cache_groups": (G("full", 16), G("mamba", 16, mamba_cache_mode="all")), "mamba_cache_mode": "align"},
     "differs from the cache's"),
    ({"kv_cache_groups": (G("full", 16), G("chunked_local", 32, attention_chunk_size=64))}, "block_size 32"),
    ({"kv_cache_groups": (G("full", 32),), "enable_prefix_caching": False}, "block_size 32"),
    ({"kv_cache_groups": (G("sink_full", 16, sink_len=20),)}, "sink_len"),
    ({"kv_cache_groups": (G("chunked_local", 16),)}, "attention_chunk_size"),
    ({"kv_cache_groups": (G("mambaa", 16),)}, "mamba"),  # did-you-mean
])
def test_cache_config_refuses_what_vllm_refuses(kw, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(attention="groups", **kw)


@pytest.mark.parametrize("sc, match", [
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}, "Chunked prefill is required"),
    ({"max_num_batched_tokens": 8, "max_num_seqs": 8}, "must be <= max_num_batched_tokens"),
    ({"long_prefill_token_threshold": 8}, "long_prefill_token_threshold"),
    ({"num_spec_tokens": 2, "spec_method": "eagle"}, "num_speculative_blocks"),
])
def test_scheduler_refuses_align_mode_misconfigurations(sc, match):
    cc = _cc((G("full", 16), G("mamba", 16, mamba_cache_mode="align")), mamba_cache_mode="align")
    with pytest.raises(ValueError, match=match):
        Scheduler(SchedulerConfig(**sc), cc)


def test_eagle_with_chunked_local_and_prefix_caching_is_refused():
    with pytest.raises(ValueError, match="eagle"):
        make_coordinator([G("full", 16), G("chunked_local", 16, attention_chunk_size=64)], 50, True, True, False)


def test_group_text_and_start_up_sizes():
    groups = group_specs_from_text("full,chunked_local:64,sink_full:32,mamba,sliding_window:48", 16, "align", 2)
    assert [g.kind for g in groups] == ["full", "chunked_local", "sink_full", "mamba", "sliding_window"]
    assert groups[3] == G("mamba", 16, mamba_cache_mode="align", num_speculative_blocks=2)
    # vLLM's max_memory_usage_bytes in pages: full cdiv(1000,16)=63; chunked cdiv(min(64+256,1000),16)=20;
    # mamba align 2+2; sliding cdiv(min(47+256,1000),16)+1 = 20
    assert [max_blocks_per_request(g, 1000, 256) for g in groups] == [63, 20, 63, 4, 20]
    with pytest.raises(ValueError, match="needs ':TOKENS'"):
        group_specs_from_text("chunked_local", 16, "none", 0)
    with pytest.raises(ValueError, match="did you mean"):
        group_specs_from_text("ful", 16, "none", 0)


# --- the hybrid coordinator's hit search (property) --------------------------------------------------------
KIND_SPECS = {
    "full": G("full", 4), "sink": G("sink_full", 4, sink_len=4), "sw": G("sliding_window", 4, sliding_window=7),
    "local": G("chunked_local", 4, attention_chunk_size=8), "mamba": G("mamba", 4, mamba_cache_mode="all"),
}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(KIND_SPECS)), min_size=2, max_size=4),
       st.sets(st.tuples(st.integers(0, 3), st.integers(0, 11)), max_size=40), st.integers(0, 48))
def test_hybrid_hit_is_a_fixed_point_every_group_accepts(kinds, cached, max_length):
    specs = [KIND_SPECS[k] for k in kinds]
    if len(set(specs)) < 2:
        return  # identical specs merge into one lookup: not a hybrid
    coord = HybridKVCacheCoordinator(specs, 200, True, False, False)
    pool = coord.block_pool
    free = iter(b.block_id for b in pool.free_block_queue.get_all_free_blocks())
    for gid, idx in sorted(cached):
        if gid < len(specs):
            cache(pool, idx, gid, next(free))
    hit, length = coord.find_longest_cache_hit(H, max_length)
    assert 0 <= length <= max_length and length % 4 == 0
    types = coord._manager_types
    first_full = coord.attention_groups[0][0] if types[coord.attention_groups[0][0].kind].is_full_attention else None
    for spec, group_ids in coord.attention_groups:
        for gid in group_ids:
            if types[spec.kind].is_full_attention and spec != first_full:
                # vLLM 0.19.1 truncates only the first full-attention spec's hit to the final length:
                # a second one (sink_full beside full) keeps its first-round blocks (PARITY.md)
                assert len(hit[gid]) >= length // 4, (kinds, gid)
            else:
                assert len(hit[gid]) == length // 4, (kinds, gid)
            for i, blk in enumerate(hit[gid]):  # every real block is the cached block of its position
                if not blk.is_null:
                    assert blk.block_hash == make_block_hash_with_group_id(H[i], gid)
        # a fixed point: searching again at the hit length finds at least it (vLLM stops there;
        # the simple full + one other hybrid stops after one round, where this holds as well)
        again = types[spec.kind].find_longest_cache_hit(H, length, group_ids, pool, spec, False, coord.lcm_block_size)
        assert len(again[0]) * 4 >= length


def test_a_second_full_attention_spec_keeps_its_first_round_hit_as_vllm():
    """vLLM 0.19.1's HybridKVCacheCoordinator trims only attention_groups[0]'s blocks to the final
    hit length; full + sink_full + chunked_local: the local group cuts the hit to 0, the full group
    is trimmed, the sink group keeps the block it found (the hypothesis search found this case)."""
    specs = [KIND_SPECS["full"], KIND_SPECS["local"], KIND_SPECS["sink"]]
    coord = HybridKVCacheCoordinator(specs, 200, True, False, False)
    free = iter(b.block_id for b in coord.block_pool.free_block_queue.get_all_free_blocks())
    for gid, idx in sorted({(2, 0), (0, 0)}):
        cache(coord.block_pool, idx, gid, next(free))
    hit, length = coord.find_longest_cache_hit(H, 4)
    assert length == 0 and [len(h) for h in hit] == [0, 0, 1]


def test_hybrid_search_puts_full_and_sink_attention_first():
    coord = HybridKVCacheCoordinator([G("mamba", 4, mamba_cache_mode="all"), G("sink_full", 4, sink_len=4),
                                      G("chunked_local", 4, attention_chunk_size=8)], 50, True, False, False)
    assert [s.kind for s, _ in coord.attention_groups] == ["sink_full", "mamba", "chunked_local"]
    assert set(MANAGERS.names()) >= {"full", "sliding_window", "chunked_local", "mamba", "sink_full"}


# --- simulated runs and YAML ------------------------------------------------------------------------------
def test_yaml_takes_groups_with_the_same_validation():
    from servesim.simulator.cluster.config import sim_config_from_dict
    from servesim.traces.errors import InputError

    base = {"scheduler": {"max_model_len": 4096}}
    groups = [{"kind": "full", "block_size": 16}, {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}]
    cfg = sim_config_from_dict({**base, "cache": {"attention": "groups", "mamba_cache_mode": "align",
                                                  "num_gpu_blocks": 500, "kv_cache_groups": groups}})
    assert cfg.cache.kv_cache_groups[1] == G("mamba", 16, mamba_cache_mode="align")
    with pytest.raises(InputError, match="did you mean 'mamba'"):
        sim_config_from_dict({**base, "cache": {"attention": "groups", "num_gpu_blocks": 500,
                                                "kv_cache_groups": [{"kind": "mambo", "block_size": 16}]}})


def test_a_simulated_run_with_mamba_groups_finishes_and_the_fast_path_declines():
    import numpy as np

    from servesim.simulator.build import attach_planner
    from servesim.simulator.config import SimConfig
    from servesim.simulator.engine import Engine
    from servesim.simulator.outputs import build_summary
    from servesim.traces.synthetic import make_workload

    wl = make_workload("sessions", {
        "num_requests": 24, "arrival": {"rate_per_s": 8.0}, "prompt_len": {"dist": "fixed", "value": 300},
        "output_len": {"dist": "fixed", "value": 12},
        "sessions": {"num_turns": {"dist": "fixed", "value": 3}, "think_time_s": {"dist": "fixed", "value": 1.0}}},
        np.random.default_rng(0))
    cc = _cc((G("full", 16), G("mamba", 16, mamba_cache_mode="all")), mamba_cache_mode="all", num_gpu_blocks=400)
    cfg = SimConfig(scheduler=SchedulerConfig(max_model_len=2048), cache=cc, derive_num_gpu_blocks=False)
    summary = build_summary(cfg, attach_planner(Engine(cfg, wl)).run(), 24)
    assert summary["num_finished"] == 24
    assert summary["prefix_cache_hit_tokens"] > 0  # later turns hit their earlier turns' Mamba states
    assert not summary["fast_path"]["used"] and "Mamba" in summary["fast_path"]["declined_reason"]


def test_step_trace_refuses_bad_groups_with_a_clear_error(tmp_path):
    from typer.testing import CliRunner

    from servesim.cli import _register, app
    from servesim.scheduler.oracle_trace import StepTraceConfig

    _register()
    w = tmp_path / "w.jsonl"
    w.write_text('{"req_id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 2, "arrival_step": 0}\n')
    res = CliRunner().invoke(app, ["step-trace", str(w), "--out", str(tmp_path / "t.jsonl"), "--groups", "full,mamab",
                                   "--mamba-cache-mode", "align"])
    assert res.exit_code != 0 and "did you mean 'mamba'" in res.output
    with pytest.raises(ValueError, match="without a KV connector"):
        StepTraceConfig(groups="full,mamba", mamba_cache_mode="align", kv_connector_rate=0.5)
