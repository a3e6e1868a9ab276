"""MoE cost: measured FusedMoE tables where they cover the deployment, roofline otherwise; EP."""

import pytest

from servesim.simulator.cost_model import decode_shape, make_cost_model, prefill_shape
from servesim.simulator.cost_model.moe_tables import moe_curve
from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.traces.errors import InputError

SCOUT = "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"


def test_measured_table_covers_scout_fp8_on_h100_tp2():
    spec, h100 = resolve_model(SCOUT), resolve_gpu("h100")
    measured = moe_curve(spec, h100, moe_tp=2, moe_ep=1)
    assert measured is not None and measured.engine_version == "vllm 0.24.0"
    curve = measured.curve
    # aiconfigurator H100 vLLM 0.24 fp8 Triton MoE, (5120, 8192, 16 experts, top-1), moe_tp 2:
    # ~0.4 ms from 16 to 512 tokens (every expert's weights read once), growing past 2k tokens.
    assert 0.2e-3 < curve(64) < 0.8e-3
    assert curve(8192) > 3 * curve(64)
    cm = make_cost_model("roofline", model=SCOUT, gpu="h100", tp=2)
    assert cm.moe_source.startswith("measured table h100 vllm 0.24.0")


def test_roofline_fallback_and_expected_active_experts():
    cm = make_cost_model("roofline", model="qwen3-30b-a3b", gpu="l40s", tp=1, moe_table=False)
    assert cm.moe_source == "roofline"
    # uniform top-k: E[active] = E (1 - (1 - k/E)^T): 1 token reads 8 of 128 experts, 1k tokens all
    one, many = cm.breakdown(decode_shape(1, 100))["gemm"], cm.breakdown(decode_shape(1024, 100))["gemm"]
    assert many > 5 * one


def test_expert_parallel_splits_experts_not_width():
    tp_only = make_cost_model("roofline", model="mixtral-8x7b", gpu="l40s", tp=4)
    ep = make_cost_model("roofline", model="mixtral-8x7b", gpu="l40s", tp=4, expert_parallel_size=4)
    s = prefill_shape(2048)
    # Same total expert FLOPs per rank under uniform routing: the times stay close.
    assert ep.step_time_s(s) == pytest.approx(tp_only.step_time_s(s), rel=0.25)
    with pytest.raises(InputError):
        make_cost_model("roofline", model="mixtral-8x7b", gpu="h100", tp=2, expert_parallel_size=3)


def test_dense_first_layers_and_shared_experts_cost_something():
    ds = make_cost_model("roofline", model="deepseek-v3", gpu="h200", tp=8, moe_table=False)
    b = ds.breakdown(decode_shape(32, 2000))
    assert b["gemm"] > 0 and b["attention"] > 0


def test_balanced_table_moved_to_uniform_routing():
    """aiconfigurator's balanced rows touch min(T k, E) experts; uniform top-k routing touches
    E (1 - (1 - k/E)^T). Each expert fewer saves the table's own per-expert slope
    s = (t(E/k) - t(1)) / (E - k), on every MoE layer (Scout: 48, E = 16, k = 1)."""
    u = make_cost_model("roofline", model=SCOUT, gpu="h100", tp=2)
    b = make_cost_model("roofline", model=SCOUT, gpu="h100", tp=2, moe_uniform_routing=False)
    curve, _, experts, p_pick, s = u._moe.table
    assert (experts, p_pick) == (16.0, 1 / 16)
    assert s == pytest.approx((curve(16.0) - curve(1.0)) / 15, rel=1e-12)
    assert s == pytest.approx(21.148e-6, rel=1e-4)  # ~63 MB of fp8 expert weights per rank at ~3 TB/s
    for batch in (1, 11, 30, 64, 512):
        shape = decode_shape(batch, 700)
        saved = b.breakdown(shape)["gemm"] - u.breakdown(shape)["gemm"]
        assert saved == pytest.approx(48 * s * (min(batch, 16) - 16 * (1 - (15 / 16) ** batch)),
                                      rel=1e-9, abs=1e-12)
    assert b.step_time_s(decode_shape(1, 700)) == u.step_time_s(decode_shape(1, 700))  # 1 token: 1 expert
    # 11 decodes: 8.2 experts expected instead of 11, 2.9 ms less per step
    assert b.step_time_s(decode_shape(11, 700)) - u.step_time_s(decode_shape(11, 700)) == \
        pytest.approx(2.910e-3, rel=1e-3)
    # EP and the power-law table are used as measured
    p = make_cost_model("roofline", model=SCOUT, gpu="h100", tp=2, moe_distribution="power_law_1.01")
    assert p._moe.table is None or p._moe.table[4] == 0.0


def test_mla_decode_attention_from_the_measured_table():
    from servesim.simulator.cost_model import StepShape
    from servesim.simulator.cost_model.mla_tables import mla_decode_grid

    ds, h200 = resolve_model("deepseek-v3"), resolve_gpu("h200")
    grid = mla_decode_grid(ds, h200, 8)  # 16 query heads per GPU, bf16 KV: FlashAttention-MLA rows
    assert grid is not None and mla_decode_grid(resolve_model("llama-3.1-8b"), h200, 1) is None
    # on measured points: (batch 32, context 1024) and (256, 4096)
    assert 5e-6 < grid(32, 1024) < grid(256, 4096) < 5e-3
    table = make_cost_model("roofline", model="deepseek-v3", gpu="h200", tp=8, mla_table=True)
    roof = make_cost_model("roofline", model="deepseek-v3", gpu="h200", tp=8)  # default: roofline attention
    assert table.attention_source.startswith("MLA decode: measured") and roof.attention_source == "roofline"
    layers = ds.num_layers
    for batch, ctx in ((1, 1000), (32, 1024), (256, 4096)):
        s = decode_shape(batch, ctx)
        assert table.breakdown(s)["attention"] == pytest.approx(layers * grid(batch, ctx), rel=1e-12)
        b, r = table.breakdown(s), roof.breakdown(s)
        assert {k: v for k, v in b.items() if k != "attention"} == \
            pytest.approx({k: v for k, v in r.items() if k != "attention"}, rel=1e-12)
        assert table.step_time_s(s) == pytest.approx(sum(b.values()), rel=1e-12)
    assert table.step_time_s(prefill_shape(2048)) == roof.step_time_s(prefill_shape(2048))
    # a mixed step: the chunk's attention on the roofline, the decodes' from the table
    mixed = StepShape((512,) + (1,) * 31, (0,) + (2000,) * 31, 32)
    chunk_only = roof.breakdown(prefill_shape(512))["attention"]
    got = table.breakdown(mixed)["attention"]
    assert got == pytest.approx(chunk_only + layers * grid(31, 2000), rel=0.02)  # q bytes of the decodes
