"""MoE cost: measured FusedMoE tables where they cover the deployment, roofline otherwise; EP."""

import pytest

from servesim.simulator.cost_model import decode_shape, make_cost_model, prefill_shape
from servesim.simulator.cost_model.moe_tables import moe_curve
from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.traces.errors import InputError

SCOUT = "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"


def test_measured_table_covers_scout_fp8_on_h100_tp2():
    spec, h100 = resolve_model(SCOUT), resolve_gpu("h100")
    curve = moe_curve(spec, h100, moe_tp=2, moe_ep=1)
    assert curve is not None
    # aiconfigurator H100 vLLM 0.24 fp8 Triton MoE, (5120, 8192, 16 experts, top-1), moe_tp 2:
    # ~0.4 ms from 16 to 512 tokens (every expert's weights read once), growing past 2k tokens.
    assert 0.2e-3 < curve(64) < 0.8e-3
    assert curve(8192) > 3 * curve(64)
    cm = make_cost_model("roofline", model=SCOUT, gpu="h100", tp=2)
    assert cm.moe_source.startswith("measured")


def test_roofline_fallback_and_expected_active_experts():
    cm = make_cost_model("roofline", model="qwen3-30b-a3b", gpu="l40s", tp=1)  # no L40S table
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
