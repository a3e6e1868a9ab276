"""Whisper (an encoder-decoder model) in the simulator: its spec from config.json, vLLM's KV layout
and forced settings, the roofline's cross-attention, the `asr` generator, and a whole replay."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.overrides import apply_overrides
from servesim.scheduler.step_shape import StepShape
from servesim.simulator.config import SimConfig
from servesim.simulator.cost_model.roofline import RooflineCostModel
from servesim.simulator.specs import resolve_model
from servesim.simulator.startup import resolve_cache, resolved
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload


def _cfg(**sets) -> SimConfig:
    return apply_overrides(SimConfig(), {"hardware.model": "whisper-large-v3", "hardware.gpu": "h100", **sets})


def test_the_spec_is_the_decoder_with_the_audio_encoder_as_its_tower():
    m = resolve_model("openai/whisper-large-v3")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (32, 1280, 20, 20, 64)
    assert (m.intermediate_size, m.max_position_embeddings, m.gated_mlp, m.cross_attention) == (5120, 448, False, True)
    enc = m.vision
    assert (enc.depth, enc.hidden_size, enc.patches_per_token, enc.max_tokens_per_item) == (32, 1280, 1, 1500)


def test_vllm_settings_are_forced_and_the_layout_has_a_cross_attention_group():
    r = resolved(_cfg())
    s = r.scheduler
    assert (s.enable_chunked_prefill, s.disable_chunked_mm_input, s.long_prefill_token_threshold) == (False, True, 0)
    assert (s.max_model_len, s.mm_max_tokens_per_item) == (448, 1500)
    cache, cap = resolve_cache(r)
    assert not cache.enable_prefix_caching
    assert [g.kind for g in cache.kv_cache_groups] == ["full", "cross_attention"]
    # one block spans the 32 layers of a group: 16 tokens x 2 (K, V) x 20 heads x 64 x 2 bytes x 32
    assert cap.kv_bytes_per_block == 16 * 2 * 20 * 64 * 2 * 32


@pytest.mark.parametrize("sets, field", [
    ({"engine": "sglang"}, "engine"),
    ({"kv_offload.enabled": True, "kv_offload.cpu_bytes": 2**30}, "kv_offload.enabled"),
])
def test_what_is_not_modelled_for_an_encoder_decoder_model_is_refused(sets, field):
    with pytest.raises(InputError) as e:
        resolved(_cfg(**sets))
    assert e.value.field == field


def test_cross_attention_is_priced_per_request_encoder_states_and_once_for_new_states():
    cm = RooflineCostModel("whisper-large-v3", "h100")
    cross = cm._cross
    few, many = StepShape((1,) * 8, (50,) * 8, 8), StepShape((1,) * 64, (50,) * 64, 64)
    # attention reads each request's 1500 cached states: more requests, more cross time
    assert cross.step_s(many.num_new_tokens, ()) > cross.step_s(few.num_new_tokens, ()) > 0
    # a step that encodes a clip also projects its 1500 states to K and V
    assert cross.step_s((4,), (1500,)) > cross.step_s((4,), ())
    assert cm.step_time_s(StepShape((4,), (0,), 1, (1500,))) > cm.step_time_s(StepShape((4,), (0,), 1))
    assert cm.decode_step_times_s([50] * 8, 3) is None  # step by step: the bulk decode prices lack it
    parts = cm.breakdown(StepShape((4,), (0,), 1, (1500,)))
    assert parts["cross_attention"] > 0 and parts["vision_encoder"] > 0


def test_the_asr_generator_gives_each_request_one_encoder_input_outside_its_prompt():
    wl = make_workload("asr", {"num_requests": 5, "prompt_len": 4, "output_len": 90,
                               "arrival": {"rate_per_s": 10}}, np.random.default_rng(0))
    for spec in wl.requests:
        assert spec.prompt_len == 4
        (item,) = spec.mm_items
        assert (item.offset, item.length, item.in_prompt, item.modality) == (0, 1500, False, "audio")
    with pytest.raises(InputError, match="audio"):
        make_workload("asr", {"num_requests": 5, "images": {}}, np.random.default_rng(0))


def test_a_replay_runs_every_request_through_the_encoder_and_the_fast_path_declines():
    from servesim.running import run
    from servesim.traces.asr import add_audio
    from servesim.traces.synthetic_config import AudioConfig
    from servesim.traces.workload import RequestSpec, Workload

    # 40 clips at once; a budget of 4096 takes two 1500-state clips a step (4096 // 1500)
    specs = [RequestSpec(request_id=f"r{i:02d}", arrival_time_s=0.0, prompt_len=4, output_len=20) for i in range(40)]
    wl = Workload.from_unsorted(add_audio(specs, AudioConfig()), name="burst", source="test")
    res = run(_cfg(**{"scheduler.max_num_batched_tokens": 4096}), wl)
    assert res.summary["num_finished"] == 40
    first = res.requests["ttft_s"].round(9).value_counts()
    assert len(first) == 20 and set(first) == {2}  # pairs: each encoder step admits exactly two
    assert "multimodal" in str(res.summary)  # the fast path says why it stepped


def test_a_trace_of_the_wrong_kind_is_refused_at_start_by_request():
    from servesim.running import load_trace, run

    with pytest.raises(InputError, match="needs exactly one encoder input per request"):
        run(_cfg(), load_trace(None, max_requests=3))  # the bundled text trace
    wl = make_workload("asr", {"num_requests": 2, "prompt_len": 4}, np.random.default_rng(0))
    with pytest.raises(InputError, match="only an encoder-decoder model takes"):
        run(apply_overrides(SimConfig(), {"scheduler.mm_max_tokens_per_item": 2000}), wl)
