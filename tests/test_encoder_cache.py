"""Multimodal requests: the EncoderCacheManager, the encoder budget in schedule(), the config and
request validation (hand-built cases; tests/golden/encoder_* check the whole path against vLLM)."""

from __future__ import annotations

import pytest

from servesim.scheduler import Request, SamplingParams, SchedulerConfig
from servesim.scheduler.encoder_cache import EncoderCacheManager, compute_mm_encoder_budget
from servesim.scheduler.multimodal import MultiModalFeatureSpec
from tests.sched_helpers import make_sched, req, step


def _mm_req(rid: str, items: list[tuple[int, int, str]], num_tokens: int = 64) -> Request:
    base = 1000 * (1 + sum(map(ord, rid)))  # distinct text per request: no accidental prefix hits
    return Request(rid, list(range(base, base + num_tokens)), SamplingParams(max_tokens=4),
                   mm_features=[MultiModalFeatureSpec(o, n, h) for o, n, h in items])


# --- EncoderCacheManager ---------------------------------------------------------------------------
def test_cache_shares_by_hash_and_keeps_unreferenced_entries_until_space_is_needed():
    ecm = EncoderCacheManager(cache_size=100)
    a, b = _mm_req("a", [(0, 40, "x")]), _mm_req("b", [(8, 40, "x")])
    assert not ecm.check_and_update_cache(a, 0)
    assert ecm.can_allocate(a, 0, encoder_compute_budget=100, num_embeds_to_schedule=0)
    ecm.allocate(a, 0)
    assert (ecm.num_free_slots, ecm.num_freeable_slots) == (60, 60)
    assert ecm.check_and_update_cache(b, 0)  # b shares a's output: no slots taken
    assert ecm.cached["x"] == {"a", "b"} and ecm.num_free_slots == 60
    ecm.free(a)
    assert ecm.num_freeable_slots == 60  # b still references it
    ecm.free(b)
    assert (ecm.num_free_slots, ecm.num_freeable_slots) == (60, 100)
    assert list(ecm.freeable) == ["x"] and ecm.get_freed_mm_hashes() == []  # kept, not evicted
    assert ecm.check_and_update_cache(_mm_req("c", [(0, 40, "x")]), 0)  # revived from freeable
    assert ecm.num_freeable_slots == 60 and not ecm.freeable
    stats = ecm.take_stats()
    assert (stats.queries, stats.hits) == (120, 80)


def test_eviction_is_oldest_unreferenced_first_and_each_hash_is_reported_once():
    ecm = EncoderCacheManager(cache_size=100)
    reqs = [_mm_req(f"r{i}", [(0, 30, f"h{i}")]) for i in range(3)]
    for r in reqs:
        assert ecm.can_allocate(r, 0, 100, 0)
        ecm.allocate(r, 0)
    ecm.free(reqs[1])
    ecm.free(reqs[0])  # freeable order: h1, then h0
    big = _mm_req("big", [(0, 60, "big")])
    assert not ecm.can_allocate(big, 0, encoder_compute_budget=59, num_embeds_to_schedule=0)  # budget
    assert ecm.can_allocate(big, 0, 100, 0)  # 10 free + evict h1 (30) + h0 (30) >= 60
    assert ecm.get_freed_mm_hashes() == ["h1", "h0"] and ecm.get_freed_mm_hashes() == []
    assert ecm.num_free_slots == 70 and "h1" not in ecm.cached
    ecm.allocate(big, 0)
    assert not ecm.can_allocate(_mm_req("z", [(0, 20, "z")]), 0, 100, 0)  # h2 and big are referenced
    assert ecm.usage == pytest.approx(0.9)


def test_budget_derivation_is_vllms():
    cfg = SchedulerConfig(max_num_batched_tokens=2048)
    assert compute_mm_encoder_budget(cfg) == (0, 0)  # text-only model
    cfg = SchedulerConfig(max_num_batched_tokens=2048, mm_max_tokens_per_item=16384)
    assert compute_mm_encoder_budget(cfg) == (16384, 16384)
    cfg = SchedulerConfig(max_num_batched_tokens=8192, mm_max_tokens_per_item=1024, encoder_cache_size=20000)
    assert compute_mm_encoder_budget(cfg) == (8192, 20000)


@pytest.mark.parametrize("kw, match", [
    ({"mm_max_tokens_per_item": -1}, "mm_max_tokens_per_item"),
    ({"max_num_encoder_input_tokens": 0}, "max_num_encoder_input_tokens"),
    ({"encoder_cache_size": 0}, "encoder_cache_size"),
    ({"disable_chunked_mm_input": True, "mm_max_tokens_per_item": 4096}, "Chunked MM input disabled"),
])
def test_bad_encoder_config_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(max_num_batched_tokens=2048, **kw)


@pytest.mark.parametrize("items, match", [
    ([(60, 10, "x")], r"'bad'.*past the prompt's end \(64 tokens\)"),
    ([(0, 10, "x"), (5, 10, "y")], r"'bad'.*item 1 at offset 5 overlaps"),
])
def test_bad_items_name_the_request(items, match):
    with pytest.raises(ValueError, match=match):
        _mm_req("bad", items)


def test_an_item_larger_than_the_encoder_cache_is_refused_by_name():
    sched = make_sched(mm_max_tokens_per_item=32, encoder_cache_size=32, max_num_encoder_input_tokens=32)
    with pytest.raises(ValueError, match=r"'big'.*40 embeddings.*encoder cache \(32\)"):
        sched.add_request(_mm_req("big", [(0, 40, "x")]))


# --- schedule() --------------------------------------------------------------------------------
def _enc_sched(budget: int, cache: int, **kw):
    return make_sched(max_num_batched_tokens=256, mm_max_tokens_per_item=1, max_num_encoder_input_tokens=budget,
                      encoder_cache_size=cache, **kw)


def test_a_request_is_cut_before_an_item_the_budget_cannot_take():
    sched = _enc_sched(budget=60, cache=200)
    sched.add_request(_mm_req("a", [(4, 40, "x")], num_tokens=64))
    sched.add_request(_mm_req("b", [(10, 40, "y")], num_tokens=64))
    out = sched.schedule()
    # a's item takes 40 of 60; b's 40 does not fit: b runs its 10 text tokens before the item.
    assert out.num_scheduled_tokens == {"a": 64, "b": 10}
    assert out.scheduled_encoder_inputs == {"a": [0]}
    assert sched.encoder_cache_manager.num_free_slots == 160


def test_items_the_prompt_passed_are_freed_and_shared_items_are_not_encoded_twice():
    sched = _enc_sched(budget=100, cache=100)
    sched.add_request(_mm_req("a", [(0, 40, "x"), (50, 10, "y")], num_tokens=64))
    sched.add_request(_mm_req("b", [(4, 40, "x")], num_tokens=64))
    _, eco = step(sched)
    ecm = sched.encoder_cache_manager
    # Both prompts are through: a encoded x and y, b reused x; every reference is dropped. y became
    # unreferenced first (a dropped x while b still held it), so it is evicted first.
    assert ecm.cached == {"x": set(), "y": set()} and list(ecm.freeable) == ["y", "x"]
    stats = eco.scheduler_stats.encoder_cache_stats
    assert eco.scheduler_stats.encoder_cache_usage == pytest.approx(0.5)
    assert (stats.queries, stats.hits) == (90, 40)


def test_preemption_drops_the_victims_references():
    # 21 usable blocks of 4; chunks of at most 40 tokens; admission needs only the first chunk to fit.
    sched = _enc_sched(budget=100, cache=100, num_blocks=22, block_size=4, long_prefill_token_threshold=40,
                       scheduler_reserve_full_isl=False)
    sched.add_request(req(sched, "a", 40, max_tokens=20))
    sched.add_request(_mm_req("b", [(32, 20, "x")], num_tokens=60))
    out, _ = step(sched)  # a: 40 tokens (10 blocks); b: 40 tokens (10 blocks), half its image
    assert out.num_scheduled_tokens == {"a": 40, "b": 40} and out.scheduled_encoder_inputs == {"b": [0]}
    ecm = sched.encoder_cache_manager
    assert ecm.cached == {"x": {"b"}}  # b still needs the image's second half
    out, _ = step(sched)  # a's 11th block leaves 0 for b's 5 more: b (last in running) is preempted
    assert out.preempted_req_ids == {"b"} and out.num_scheduled_tokens == {"a": 1}
    assert ecm.cached == {"x": set()} and list(ecm.freeable) == ["x"] and ecm.num_free_slots == 80


def test_mm_hashes_key_the_prefix_cache_blocks():
    sched = make_sched(block_size=4, mm_max_tokens_per_item=16)
    tokens = [5] * 4 + [9] * 8 + [6] * 4  # two blocks of placeholders between text

    def mm(rid: str, mm_hash: str) -> Request:
        return Request(rid, tokens, SamplingParams(max_tokens=1), block_hasher=sched.block_hasher,
                       mm_features=[MultiModalFeatureSpec(4, 8, mm_hash)])

    a, b, c = mm("a", "img1"), mm("b", "img2"), mm("c", "img1")
    assert a.block_hashes[0] == b.block_hashes[0]  # the text block before the image
    assert a.block_hashes[1] != b.block_hashes[1]  # same placeholder ids, different image
    assert a.block_hashes == c.block_hashes
    plain = Request("p", tokens, SamplingParams(max_tokens=1), block_hasher=sched.block_hasher)
    assert plain.block_hashes[1] != a.block_hashes[1]


# --- CrossAttentionManager -----------------------------------------------------------------------
def test_cross_attention_manager_allocates_per_request_and_never_shares():
    from servesim.scheduler.kv.block_pool import BlockPool
    from servesim.scheduler.kv.cross_attention import CrossAttentionManager
    from servesim.scheduler.kv.kinds import MANAGERS
    from servesim.scheduler.kv.single_type import KVCacheGroupSpec

    assert MANAGERS.get("cross_attention") is CrossAttentionManager
    pool = BlockPool(10, enable_caching=False)
    mgr = CrossAttentionManager(KVCacheGroupSpec("cross_attention", 4), pool, False, 0)
    # Whisper-style: 1500 encoder tokens would need 375 blocks; here 10 encoder tokens -> 3 blocks.
    assert mgr.get_num_blocks_to_allocate("a", 10, [], 0, 10) == 3
    mgr.allocate_new_computed_blocks("a", [], 0, 0)
    assert len(mgr.allocate_new_blocks("a", 10, 10)) == 3
    assert mgr.get_num_common_prefix_blocks("a") == 0
    with pytest.raises(ValueError, match="never cached"):
        mgr.cache_blocks(_mm_req("a", []), 8)
    with pytest.raises(NotImplementedError):
        CrossAttentionManager.find_longest_cache_hit([], 8, [0], pool, mgr.spec, False, 4)
    mgr.free("a")
    assert pool.get_num_free_blocks() == 9


def test_step_trace_refuses_items_beyond_the_encoder_flags(tmp_path):
    import json as _json

    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    w = tmp_path / "w.jsonl"
    w.write_text(_json.dumps({"req_id": "r1", "prompt_token_ids": list(range(100, 140)), "max_tokens": 2,
                              "arrival_step": 0, "mm_items": [{"offset": 4, "length": 30, "mm_hash": "x"}]}) + "\n")
    res = CliRunner().invoke(app, ["step-trace", str(w), "--out", str(tmp_path / "t.jsonl")])
    assert res.exit_code == 2 and "'r1': multimodal item 0 has 30 embeddings" in res.output
    res = CliRunner().invoke(app, ["step-trace", str(w), "--out", str(tmp_path / "t.jsonl"),
                                   "--encoder-budget", "64", "--encoder-cache-size", "64"])
    assert res.exit_code == 0, res.output
    line = _json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert line["scheduled_encoder_inputs"] == {"r1": [0]} and line["encoder_num_free_slots"] == 34


@pytest.mark.parametrize("seed", range(8))
def test_random_multimodal_workloads_finish_and_keep_the_invariants(seed):
    import random

    rng = random.Random(seed)
    budget, cache = rng.choice([24, 48]), rng.choice([24, 60])
    sched = make_sched(num_blocks=rng.choice([30, 80]), block_size=4, max_num_batched_tokens=rng.choice([32, 64]),
                       policy=rng.choice(["fcfs", "priority"]), mm_max_tokens_per_item=1,
                       max_num_encoder_input_tokens=budget, encoder_cache_size=cache,
                       long_prefill_token_threshold=rng.choice([0, 16]), max_model_len=128)
    pending = []
    sizes = [rng.randint(4, min(budget, cache)) for _ in range(5)]  # an image has one size
    for i in range(24):
        n = rng.randint(20, 80)
        items, pos = [], rng.randint(0, 8)
        for _ in range(rng.randint(0, 2)):
            k = rng.randint(0, 4)
            length = sizes[k]
            if pos + length > n:
                break
            items.append((pos, length, f"img{k}"))
            pos += length + rng.randint(0, 6)
        pending.append((rng.randint(0, 30), Request(f"r{i}", [rng.randint(100, 105) for _ in range(n)],
                                                    SamplingParams(max_tokens=rng.randint(1, 6)),
                                                    priority=rng.randint(0, 2), block_hasher=sched.block_hasher,
                                                    mm_features=[MultiModalFeatureSpec(*it) for it in items])))
    finished = set()
    for t in range(3000):
        for _, r in [p for p in pending if p[0] == t]:
            sched.add_request(r)
        out, eco = step(sched)  # check_invariants after every step
        finished.update(eco.finished_req_ids)
        if len(finished) == 24:
            break
    assert len(finished) == 24
    assert all(not refs for refs in sched.encoder_cache_manager.cached.values())
