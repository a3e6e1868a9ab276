"""The roofline's hybrid layers (GDN / Mamba mixers, chunked local attention, MLP-only layers) and
its vision encoder, on hand-computed shapes (simulator/cost_model/roofline_hybrid.py, roofline_vision.py)."""

import pytest

from servesim.scheduler.step_shape import StepShape
from servesim.simulator.cost_model import decode_shape, make_cost_model, prefill_shape
from servesim.simulator.cost_model.roofline_hybrid import HybridLayers, chunked_work
from servesim.simulator.cost_model.roofline_vision import VisionCost
from servesim.simulator.specs import ModelSpec, resolve_model
from servesim.simulator.specs.layer_kinds import LinearAttentionSpec, VisionSpec


def test_chunked_attention_sees_only_its_chunk():
    # chunk 4; a chunk of 6 tokens after 2 cached: positions 2..7 see 3, 4, 1, 2, 3, 4 keys
    assert chunked_work(4, (6,), (2,)) == (17.0, 2 + 6)
    # a decode at position 9 sees 9 mod 4 + 1 = 2 keys and reads 1 cached + itself
    assert chunked_work(4, (1,), (9,)) == (2.0, 2)
    # summed over requests; a whole chunk from its start: 1 + 2 + 3 + 4
    assert chunked_work(4, (4, 1), (0, 9)) == (12.0, 4 + 2)


def _gdn_model(**kw) -> ModelSpec:
    lin = LinearAttentionSpec("gdn_attention", 4, num_heads=2, head_dim=8, state_size=4, num_k_heads=1,
                              chunk_size=2)
    base = dict(name="tiny-gdn", hf_id="x/tiny", num_layers=4, hidden_size=32, num_attention_heads=2,
                num_kv_heads=1, head_dim=16, intermediate_size=64, vocab_size=100, max_position_embeddings=64,
                layer_kinds=("mamba", "mamba", "mamba", "full"), linear_attention=lin)
    return ModelSpec(**{**base, **kw})


def test_gdn_mixer_seconds_by_hand():
    """conv channels 2*1*4 + 2*8 = 24, kernel 4: conv state (3, 24) bf16 = 144 bytes, temporal state
    (2, 8, 4) bf16 = 128 bytes. A decode (1 token) and a 3-token chunk, chunk size C = 2:
    FLOPs = conv 2*4*24*4 = 768, decode 2 heads * 6*4*8 = 384, prefill 2 heads * 3 tokens *
    (6*2*4 + 4*2*8 + 4/3 + 6*4*8) = 6 * (48 + 64 + 4/3 + 192); bytes = 2 requests * 2 * (144 + 128)
    + 4 * 4 tokens * 24 channels * 2 + the chunk states 2 * 4 * 8 * 2 * 3 / 2."""
    hyb = HybridLayers(_gdn_model(), 1, ac=1e-15, am=1e-12, ko=1e-6)
    flops = 768 + 384 + 6 * (48 + 64 + 4 / 3 + 192)
    nbytes = 2 * 2 * (144 + 128) + 4 * 4 * 24 * 2 + 2 * 4 * 8 * 2 * 3 / 2
    assert hyb.mixer_s((1, 3)) == pytest.approx(max(flops * 1e-15, nbytes * 1e-12) + 3e-6, rel=1e-12)
    assert (hyb.attn_frac, hyb.lin_frac) == (0.25, 0.75)
    # the average layer's token mixing: a quarter attention, three quarters mixer
    assert hyb.layer_attention_s(2e-3, (1, 3), (5, 0)) == pytest.approx(0.25 * 2e-3 + 0.75 * hyb.mixer_s((1, 3)))


def test_mamba2_and_mamba1_mixers_count_their_own_flops():
    m2 = LinearAttentionSpec("mamba2", 4, num_heads=4, head_dim=2, state_size=8, n_groups=2, chunk_size=4)
    model = _gdn_model(linear_attention=m2)
    hyb = HybridLayers(model, 1, ac=1.0, am=0.0, ko=0.0)  # FLOPs only, 1 s per FLOP
    channels = 4 * 2 + 2 * 2 * 8  # conv_dim 24
    decode = 4 * 4.0 * 8 * 2  # heads x 4 N P
    prefill = 4 * 2 * (2.0 * 4 * 2 + 4.0 * 8 * 2 + 2.0 * 4 * 8 * 2 / 4)  # heads x tokens x SSD
    assert hyb.mixer_s((1, 2)) == 2.0 * 4 * channels * 3 + decode + prefill
    m1 = LinearAttentionSpec("mamba1", 4, num_heads=1, head_dim=16, state_size=4, dt_rank=2)
    hyb1 = HybridLayers(_gdn_model(linear_attention=m1), 1, ac=1.0, am=0.0, ko=0.0)
    assert hyb1.mixer_s((2,)) == 2.0 * 4 * 16 * 2 + 6.0 * 4 * 16 * 2


def test_vision_encoder_by_hand():
    """2 images of 2 and 1 tokens at 4 patches a token (8 and 4 patches), h 8, I 16, gated MLP,
    2 layers of which 1 windowed over 4 patches; merger from 32 to 10."""
    v = VisionSpec(2, 8, 16, 2, 4, gated_mlp=True, window_patches=4, num_full_layers=1, out_hidden_size=10)
    cost = VisionCost(v, 1, (1.0, 0.0, 1.0, 0.0, 0.0, 0.0), 2)  # FLOPs at 1 s each, nothing else
    layer_w = 4 * 8 * 8 + 3 * 8 * 16
    gemm = 2.0 * 12 * layer_w
    full = 4.0 * (8 * 8 + 4 * 4) * 8
    window = 4.0 * (8 * 4 + 4 * 4) * 8
    merger = 2.0 * 3 * (32 * 32 + 32 * 10)
    assert cost.step_s((2, 1)) == 2 * gemm + full + window + merger
    assert cost.step_s(()) == 0.0


def test_a_vlm_step_adds_its_images_to_the_language_model():
    cm = make_cost_model("roofline", model="qwen2.5-vl-7b", gpu="h100", tp=1)
    text, image = StepShape((1024,), (0,), 1), StepShape((1024,), (0,), 1, (1024,))
    assert cm.step_time_s(image) == cm.step_time_s(text) + cm._vision.step_s((1024,))
    assert cm.reference_step_time_s(image) == pytest.approx(cm.step_time_s(image), rel=1e-12)
    assert sum(cm.breakdown(image).values()) == pytest.approx(cm.step_time_s(image), rel=1e-12)
    # Qwen2.5-VL's 28 windowed layers see 64 patches each: a bigger image costs less than quadratically
    one, four = cm._vision.step_s((1024,)), cm._vision.step_s((4096,))
    assert 4 * one < four < 16 * one


@pytest.mark.parametrize("model,tp", [("qwen3-next-80b-a3b", 4), ("nemotron-h-8b", 1), ("jamba-1.5-mini", 2),
                                      ("llama-4-scout-17b-16e", 4)])
def test_hybrid_models_price_every_step_shape_consistently(model, tp):
    cm = make_cost_model("roofline", model=model, gpu="h100", tp=tp)
    for shape in (decode_shape(32, 5000), prefill_shape(4096, 1000), StepShape((1, 1, 512), (100, 9000, 0), 3)):
        t = cm.step_time_s(shape)
        assert t == cm.reference_step_time_s(shape)
        assert sum(cm.breakdown(shape).values()) == pytest.approx(t, rel=1e-12)
    assert cm.decode_step_times_s([100] * 8, 4) is None  # hybrid work: step by step
    assert cm.step_time_s(decode_shape(64, 8000)) < cm.step_time_s(prefill_shape(8192))


def test_recurrent_layers_do_not_grow_with_context_but_attention_does():
    cm = make_cost_model("roofline", model="qwen3-next-80b-a3b", gpu="h100", tp=4, skew_alpha=0)
    short = cm.breakdown(decode_shape(16, 1000))["attention"]
    long = cm.breakdown(decode_shape(16, 100000))["attention"]
    # 12 of the 48 layers read the context; the GDN layers' state is the same at any length
    growth_per_attention_layer = (cm._layer_parts(16, *cm._work(decode_shape(16, 100000))[1:])[1]
                                  - cm._layer_parts(16, *cm._work(decode_shape(16, 1000))[1:])[1])
    assert long - short == pytest.approx(48 * 0.25 * growth_per_attention_layer, rel=1e-9)
    assert make_cost_model("roofline", model="qwen3-30b-a3b", gpu="h100", tp=4)._hybrid is None


def test_chunked_layers_read_at_most_a_chunk():
    """Llama 4: decodes at 8191 and 8192 + 8191 tokens read the same in the 36 chunked layers;
    only the 12 full layers' reads grow, so the attention grows by a quarter of a full-attention
    model's growth."""
    m = resolve_model("llama-4-scout-17b-16e")
    hyb = HybridLayers(m, 4, 1e-15, 1e-12, 0.0)
    _, _, kv_a, _ = hyb.work((1,), (8191,), 0.0)
    _, _, kv_b, _ = hyb.work((1,), (8192 + 8191,), 0.0)
    assert kv_b - kv_a == pytest.approx(0.25 * 8192)
