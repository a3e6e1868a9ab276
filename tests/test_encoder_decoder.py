"""Encoder-decoder models (Whisper's layout): the EncoderDecoderCacheManager, cross-attention groups
sized by the encoder input, the scheduler's enc-dec branches and refusals (hand-built cases;
tests/golden/encoder_decoder* check the whole path against vLLM 0.19.1 step by step)."""

from __future__ import annotations

import pytest

from servesim.scheduler import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from servesim.scheduler.encoder_decoder_cache import EncoderDecoderCacheManager
from servesim.scheduler.invariants import check_invariants
from servesim.scheduler.multimodal import MultiModalFeatureSpec

GROUPS = ({"kind": "full", "block_size": 4}, {"kind": "cross_attention", "block_size": 4})


def _sched(num_blocks: int = 60, budget: int = 64, cache: int = 64, **kw) -> Scheduler:
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False,
                         disable_chunked_mm_input=True, mm_max_tokens_per_item=16,
                         max_num_encoder_input_tokens=budget, encoder_cache_size=cache, **kw)
    cc = CacheConfig(block_size=4, num_gpu_blocks=num_blocks, attention="groups", enable_prefix_caching=False,
                     kv_cache_groups=GROUPS)
    return Scheduler(sc, cc)


def _audio(rid: str, prompt_len: int, encoder_len: int, max_tokens: int = 3) -> Request:
    base = 1000 * (1 + sum(map(ord, rid)))
    return Request(rid, list(range(base, base + prompt_len)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   mm_features=[MultiModalFeatureSpec(0, encoder_len, f"audio-{rid}", "audio", in_prompt=False)])


def _step(sched: Scheduler):
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sched.update_from_output(out, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[7] for _ in ids]))
    check_invariants(sched)
    return out


def test_the_cross_group_gets_blocks_for_the_encoder_input_once_at_admission():
    sched = _sched()
    sched.add_request(_audio("a", prompt_len=5, encoder_len=14, max_tokens=5))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"a": 5}
    assert out.scheduled_encoder_inputs == {"a": [0]}
    self_blocks, cross_blocks = sched.kv_cache_manager.get_block_ids("a")
    assert (len(self_blocks), len(cross_blocks)) == (2, 4)  # ceil(5/4) decoder, ceil(14/4) encoder
    for _ in range(2):  # decode steps: the decoder grows, the cross group does not
        out = _step(sched)
        assert out.scheduled_encoder_inputs == {} and out.num_scheduled_tokens == {"a": 1}
    assert [len(b) for b in sched.kv_cache_manager.get_block_ids("a")] == [2, 4]  # 7 tokens: still 2 blocks


def test_slots_come_back_unconditionally_after_the_first_decoder_token_as_in_vllm():
    # vLLM 0.19.1's EncoderDecoderCacheManager.free_encoder_input adds the embeddings back on
    # every call, and _free_encoder_inputs calls it after each step once a token is computed.
    sched = _sched(cache=64)
    ecm = sched.encoder_cache_manager
    assert isinstance(ecm, EncoderDecoderCacheManager)
    sched.add_request(_audio("a", prompt_len=4, encoder_len=10, max_tokens=4))
    out = sched.schedule()
    # _update_after_schedule already ran: 4 computed tokens, so the input was given back once.
    assert ecm.num_free_slots == 64 - 10 + 10
    ids = list(out.num_scheduled_tokens)
    sched.update_from_output(out, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[7]]))
    sched.schedule()  # a decode step: given back again
    assert ecm.num_free_slots == 74 and ecm.usage == 0.0


def test_freed_hashes_are_reported_at_the_second_report_after_the_allocation():
    ecm = EncoderDecoderCacheManager(cache_size=100)
    a = _audio("a", 4, 10)
    ecm.allocate(a, 0)
    assert ecm.get_freed_mm_hashes() == []
    assert ecm.get_freed_mm_hashes() == ["audio-a"]
    assert ecm.get_freed_mm_hashes() == []
    assert not ecm.check_and_update_cache(a, 0)  # never shared


def test_the_encoder_budget_and_cache_limit_admissions_in_one_step():
    sched = _sched(budget=20, cache=40)
    for rid in ("a", "b", "c"):
        sched.add_request(_audio(rid, prompt_len=4, encoder_len=12))
    out = _step(sched)
    # 12 + 12 > 20: the second request's encoder input waits for the next step (budget).
    assert out.scheduled_encoder_inputs == {"a": [0]} and set(out.num_scheduled_tokens) == {"a"}
    out = _step(sched)
    assert "b" in out.scheduled_encoder_inputs


def test_a_request_that_needs_more_blocks_than_the_pool_is_ignored():
    sched = _sched(num_blocks=8)  # 7 usable blocks
    sched.add_request(_audio("big", prompt_len=8, encoder_len=16))  # 2 + 4 blocks: fits
    sched.add_request(_audio("huge", prompt_len=16, encoder_len=16))  # 4 + 4 blocks: never
    assert [o.request_id for o in sched.take_ignored_outputs()] == ["huge"]


@pytest.mark.parametrize("kw, match", [
    ({"enable_chunked_prefill": True}, "enable_chunked_prefill must be false"),
    ({"disable_chunked_mm_input": False}, "disable_chunked_mm_input must be true"),
    ({"long_prefill_token_threshold": 8}, "long_prefill_token_threshold must be 0"),
    ({"mm_max_tokens_per_item": 0}, "mm_max_tokens_per_item must be"),
])
def test_what_vllm_forces_for_an_encoder_decoder_model_is_required(kw, match):
    base = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False,
                disable_chunked_mm_input=True, mm_max_tokens_per_item=16)
    cc = CacheConfig(block_size=4, num_gpu_blocks=50, attention="groups", enable_prefix_caching=False,
                     kv_cache_groups=GROUPS)
    with pytest.raises(ValueError, match=match):
        Scheduler(SchedulerConfig(**{**base, **kw}), cc)


def test_prefix_caching_is_refused_with_cross_attention_groups():
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False,
                         disable_chunked_mm_input=True, mm_max_tokens_per_item=16)
    with pytest.raises(ValueError, match="prefix_caching"):
        Scheduler(sc, CacheConfig(block_size=4, num_gpu_blocks=50, attention="groups", kv_cache_groups=GROUPS))


def test_items_of_the_wrong_kind_for_the_model_are_refused_by_request():
    sched = _sched()
    text = Request("t", list(range(100, 108)), SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="'t': an encoder-decoder model needs exactly one encoder input"):
        sched.add_request(text)
    image = Request("i", list(range(100, 108)), SamplingParams(max_tokens=2),
                    mm_features=[MultiModalFeatureSpec(2, 4, "img")])
    with pytest.raises(ValueError, match="'i': an encoder-decoder model"):
        sched.add_request(image)
    from tests.sched_helpers import make_sched

    with pytest.raises(ValueError, match="needs an encoder-decoder model"):
        make_sched(mm_max_tokens_per_item=16).add_request(_audio("x", 4, 10))


def test_an_encoder_input_must_be_alone_and_at_offset_zero():
    with pytest.raises(ValueError, match="exactly one encoder input"):
        Request("r", [1, 2, 3], SamplingParams(max_tokens=1),
                mm_features=[MultiModalFeatureSpec(1, 10, "a", in_prompt=False)])
