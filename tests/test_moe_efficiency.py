"""MoE experts priced anywhere: measured tables (rtx-pro-6000 included), else the roofline scaled by
a measured efficiency curve of the GPU's part or generation (cost_model/moe_tables.py); the
engine version behind each table (cost_model/table_versions.py)."""

import pytest

from servesim.simulator.cost_model import make_cost_model
from servesim.simulator.cost_model import moe_tables
from servesim.simulator.cost_model.table_versions import MeasuredTable, path_engine_versions, version_warnings
from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.simulator.specs.gpu_generation import gpu_generation

# a hand-built data file: one efficiency curve per GPU, ratio 2 at 1 token per expert, 3 at 4
_CURVE = [[1.0, 4.0], [2.0, 3.0]]
_HAND = {"tables": {}, "engine_versions": {"h100": "vllm 0.24.0", "b200": "vllm 0.24.0", "l40s": "vllm 0.24.0"},
         "efficiency": {"h100|bfloat16": _CURVE, "b200|bfloat16": _CURVE, "l40s|bfloat16": _CURVE}}


@pytest.fixture
def hand_built(monkeypatch):
    monkeypatch.setattr(moe_tables, "_data", lambda: _HAND)


def test_efficiency_curve_scales_the_roofline_exactly(hand_built):
    """Qwen3-30B-A3B (E = 128, k = 8) on an H100 PCIe (no table): the roofline's expert time times
    the curve at T k / E tokens per expert, clamped at both ends."""
    bare = make_cost_model("roofline", model="qwen3-30b-a3b", gpu="h100-pcie", moe_table=False)._moe
    eff = make_cost_model("roofline", model="qwen3-30b-a3b", gpu="h100-pcie")._moe
    for tokens, ratio in ((16, 2.0), (32, 2.0 + 1.0 / 3.0), (64, 3.0), (8, 2.0), (4096, 3.0)):
        # 16 tokens: 1 per expert -> 2; 32: 2 per expert -> 2 + (2 - 1) / 3; 64 and more: 3; fewer: 2
        assert eff.parts(tokens, tokens)[0] == pytest.approx(ratio * bare.parts(tokens, tokens)[0], rel=1e-12)
    assert eff.source.startswith("roofline x efficiency curve from h100 (Hopper) bfloat16, vllm 0.24.0")
    assert eff.engine_version == "vllm 0.24.0"


@pytest.mark.parametrize("gpu, source", [
    ("h100", "h100 (Hopper)"),  # its own curve
    ("h200", "h100 (Hopper)"),  # same part (sm90)
    ("rtx-pro-6000", "b200 (Blackwell, sm100; this GPU is sm120, a different part)"),
    ("rtx4090", "l40s (Ada)"),
    ("a100-80gb", "l40s (Ada) [no Ampere curve measured: nearest generation]"),
])
def test_curve_source_by_part_then_generation_then_nearest(hand_built, gpu, source):
    got = moe_tables.moe_efficiency(resolve_model("qwen3-30b-a3b"), resolve_gpu(gpu))
    assert got.source.startswith(f"efficiency curve from {source} bfloat16")


def test_no_curve_for_the_format_is_the_bare_roofline(hand_built):
    cm = make_cost_model("roofline", model="qwen3-30b-a3b@fp8-kvauto", gpu="h100-pcie")
    assert cm.moe_source == "roofline" and cm.measured_tables() == []


def test_generations_from_compute_capability():
    assert [gpu_generation(resolve_gpu(g)) for g in ("a100-80gb", "rtx4090", "h100", "b200", "rtx-pro-6000")] == \
        ["Ampere", "Ada", "Hopper", "Blackwell", "Blackwell"]


def test_shipped_curves_are_above_roofline_where_measured_grouped_gemms_lag():
    """The shipped H100 bf16 curve (aiconfigurator vLLM 0.24 Triton fused MoE over the roofline):
    ~1.1-1.25x at a few hundred tokens of Qwen3-30B-A3B (2-16 tokens per expert), 1.5-2.3x at 2-4k (128-256)."""
    curve = moe_tables.moe_efficiency(resolve_model("qwen3-30b-a3b"), resolve_gpu("h100-pcie")).curve
    assert all(1.05 < curve(x) < 1.3 for x in (2, 4, 8, 16))
    assert all(1.5 < curve(x) < 2.3 for x in (128, 256))


def test_rtx_pro_6000_table_prices_qwen3_30b_a3b_ep2():
    """DP2 + expert parallelism on two RTX PRO 6000: each rank holds 64 of the 128 experts, priced by
    aiconfigurator's measured FlashInfer-CUTLASS FusedMoE (bf16, 2048 x 768, top-8, moe_ep 2)."""
    cm = make_cost_model("roofline", model="Qwen/Qwen3-30B-A3B-Instruct-2507", gpu="rtx-pro-6000",
                         expert_parallel_size=2, data_parallel_size=2)
    assert cm.moe_source == ("measured table rtx-pro-6000 vllm 0.24.0 (aiconfigurator moe_perf), "
                             "moe_tp=1 moe_ep=2, balanced")
    measured = moe_tables.moe_curve(cm.model, cm.gpu, 1, 2)
    curve, frac = cm._moe.table[:2]
    assert curve is measured.curve or curve(256) == measured.curve(256)
    assert frac == 1.0 and 5e-5 < curve(256) < 1e-3  # tens to hundreds of microseconds per layer
    assert cm.measured_tables() == [MeasuredTable(f"MoE experts ({cm.moe_source})", "vllm 0.24.0")]


def test_version_warnings_compare_engine_and_major_minor():
    tables = [MeasuredTable("MoE experts", "vllm 0.24.0"), MeasuredTable("fit", "vllm 0.19"),
              MeasuredTable("DeepEP", "sglang 0.5.12")]
    warned = version_warnings(tables, "vllm", "0.19.1")
    assert len(warned) == 2 and warned[0].startswith("MoE experts was measured on vllm 0.24.0; this run is vllm 0.19.1")
    assert "sglang 0.5.12" in warned[1]
    assert version_warnings(tables, "vllm", None) == []  # an unrecorded version: nothing to compare
    assert path_engine_versions(["aiconfigurator/h100_sxm/vllm_0.14.0", "aiconfigurator/h100_sxm/nccl_2.29.2",
                                 "llmservingsim/vllm_0.19_profiler/RTXPRO6000/x"]) == ["vllm 0.14.0", "vllm 0.19"]


def test_every_shipped_table_file_names_its_engine_versions():
    from servesim.simulator.cost_model.table_versions import table_engine_version

    assert table_engine_version("moe_tables.json.gz", "rtx-pro-6000") == "vllm 0.24.0"
    assert table_engine_version("mla_tables.json.gz", "h100") == "vllm 0.14.0"
    assert table_engine_version("deepep_tables.json.gz", "h100") == "sglang 0.5.12"
