"""The decode-attention imbalance term (cost_model/decode_skew.py) on every kind of attention pricing:
exact values on hand-built steps with and without it, where alpha comes from, and bad alphas."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest

from servesim.simulator.cost_model import StepShape, make_cost_model
from servesim.simulator.cost_model.decode_skew import (CARRIED_SKEW_ALPHA, CARRIED_SKEW_ALPHA_VALUES,
                                                       CARRIED_SKEW_SOURCE, GIVEN_SKEW_SOURCE,
                                                       MEASURED_SKEW_SOURCE, NO_SKEW_SOURCE,
                                                       check_skew_alpha, max_decode_context)
from servesim.simulator.cost_model.fitted import FORMAT, VERSION, FittedCostModel
from servesim.simulator.cost_model.interp import NestedGrid
from servesim.traces.errors import InputError

A = CARRIED_SKEW_ALPHA
LAYERS = 2
# 4 decodes at 16, 16, 16, 1000: mean 262, max 1000, sum 1048
SKEWED = StepShape((1, 1, 1, 1), (16, 16, 16, 1000), 4)
UNIFORM = StepShape((1,) * 4, (262,) * 4, 4)
# 2 decodes (16, 1000) and a 256-token chunk on 5000 cached tokens: only the decodes count
MIXED_STEP = StepShape((1, 1, 256), (16, 1000, 5000), 3)


def _fitted(attention: dict, frameworks=("vllm 0.14.0",)) -> FittedCostModel:
    """A two-layer fit with nothing but attention, so a step's time is 2 x the attention's."""
    return FittedCostModel({"format": FORMAT, "version": VERSION, "model": "tiny-llama", "gpu": "h100", "tp": 1,
                            "num_layers": LAYERS, "hidden_size": 64, "dtype_bytes": 2, "ops": {},
                            "attention": attention, "metadata": {"frameworks": list(frameworks)}})


def _decode_grid() -> dict:
    """Decode attention of n requests at context k: 1 us + 1 ns per (request x context token)
    (bilinear, so the grid interpolates it exactly)."""
    pts = np.array([(n, k) for n in (1, 8) for k in (16, 2048)], dtype=float)
    return NestedGrid.from_points(("n_decode", "context"), pts, 1e-6 + 1e-9 * pts[:, 0] * pts[:, 1]).to_dict()


def _mixed_grid() -> dict:
    pts = np.array([(c, p, n, k) for c in (0, 256) for p in (0, 8192) for n in (1, 8) for k in (16, 2048)],
                   dtype=float)
    y = 2e-6 + 1e-9 * pts[:, 0] * (pts[:, 0] / 2 + pts[:, 1]) + 1e-9 * pts[:, 2] * pts[:, 3]
    return NestedGrid.from_points(("chunk", "prefix", "n_decode", "context"), pts, y).to_dict()


def _decode_s(n: int, k: float) -> float:
    return 1e-6 + 1e-9 * n * k


def test_split_table_decodes_move_alpha_of_the_way_to_the_longest():
    carried = _fitted({"kind": "split", "decode": _decode_grid()})
    assert (carried.skew_alpha, carried.skew_alpha_source) == (A, CARRIED_SKEW_SOURCE)
    t_mean, t_max = _decode_s(4, 262), _decode_s(4, 1000)
    assert carried.step_time_s(SKEWED) == pytest.approx(LAYERS * (t_mean + A * (t_max - t_mean)), rel=1e-12)
    assert carried.step_time_s(UNIFORM) == pytest.approx(LAYERS * t_mean, rel=1e-12)  # the table point
    off = _fitted({"kind": "split", "decode": _decode_grid()})
    off.set_skew_alpha(0)
    assert (off.skew_alpha, off.skew_alpha_source) == (0.0, GIVEN_SKEW_SOURCE)
    assert off.step_time_s(SKEWED) == pytest.approx(LAYERS * t_mean, rel=1e-12)
    # a chunk in the batch (the split table has no prefill rows here: 0 s): decodes 16 and 1000
    t_mean, t_max = _decode_s(2, 508), _decode_s(2, 1000)
    assert carried.step_time_s(MIXED_STEP) == pytest.approx(LAYERS * (t_mean + A * (t_max - t_mean)), rel=1e-12)
    one = StepShape((1,), (5000,), 1)  # a lone decode has no imbalance
    assert carried.step_time_s(one) == off.step_time_s(one)


def test_mixed_table_keeps_its_measured_alpha_and_carries_one_where_none_was_measured():
    measured = _fitted({"kind": "mixed", "grid": _mixed_grid(), "skew_alpha": 0.25})
    assert (measured.skew_alpha, measured.skew_alpha_source) == (0.25, MEASURED_SKEW_SOURCE)
    t_mean, t_max = 2e-6 + 1e-9 * 4 * 262, 2e-6 + 1e-9 * 4 * 1000
    assert measured.step_time_s(SKEWED) == pytest.approx(LAYERS * (t_mean + 0.25 * (t_max - t_mean)), rel=1e-12)
    unmeasured = _fitted({"kind": "mixed", "grid": _mixed_grid()})  # a vLLM profile without the sweep
    assert (unmeasured.skew_alpha, unmeasured.skew_alpha_source) == (A, CARRIED_SKEW_SOURCE)
    assert unmeasured.step_time_s(SKEWED) == pytest.approx(LAYERS * (t_mean + A * (t_max - t_mean)), rel=1e-12)
    other = _fitted({"kind": "mixed", "grid": _mixed_grid()}, frameworks=("vidur (sarathi)",))
    assert (other.skew_alpha, other.skew_alpha_source) == (0.0, NO_SKEW_SOURCE)
    assert other.step_time_s(SKEWED) == pytest.approx(LAYERS * t_mean, rel=1e-12)


def test_fitted_roofline_attention_gets_the_term():
    spp, spk, spq, o = 1e-12, 1e-9, 1e-10, 1e-6
    cm = _fitted({"kind": "roofline", "coefficients": {"s_per_pair": spp, "s_per_kv_token": spk,
                                                       "s_per_q_token": spq, "overhead_s": o}})
    assert cm.skew_alpha == A
    # pairs = kd + nd = 1052 = KV tokens read; all at 1000: 4004 (2952 more)
    t = max(1052 * spp, 1052 * spk + 4 * spq) + o
    t_max = max(4004 * spp, 4004 * spk + 4 * spq) + o
    assert cm.step_time_s(SKEWED) == pytest.approx(LAYERS * (t + A * (t_max - t)), rel=1e-12)
    cm.set_skew_alpha(0.0)
    assert cm.step_time_s(SKEWED) == pytest.approx(LAYERS * t, rel=1e-12)


def _roofline_attention_s(cm, pairs: float, kv: int, tokens: int) -> float:
    c = cm.attention_coefficients()
    return max(pairs * c["s_per_pair"], kv * c["s_per_kv_token"] + tokens * c["s_per_q_token"]) + c["overhead_s"]


def test_roofline_attention_gets_the_carried_term_in_every_path():
    on = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100")
    off = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", skew_alpha=0)
    assert (on.skew_alpha_source, off.skew_alpha_source) == (CARRIED_SKEW_SOURCE, GIVEN_SKEW_SOURCE)
    layers = on.model.num_layers
    t = _roofline_attention_s(on, 1052.0, 1052, 4)
    t_max = _roofline_attention_s(on, 4004.0, 4004, 4)
    assert on.breakdown(SKEWED)["attention"] == pytest.approx(layers * (t + A * (t_max - t)), rel=1e-12)
    assert off.breakdown(SKEWED)["attention"] == pytest.approx(layers * t, rel=1e-12)
    gap = on.step_time_s(SKEWED) - off.step_time_s(SKEWED)
    assert gap == pytest.approx(layers * A * (t_max - t), rel=1e-9) and gap > 0
    assert on.step_time_s(UNIFORM) == off.step_time_s(UNIFORM)
    # the compiled-style pricer, the reference path and the bulk decode prices: the same floats
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        ctx = [int(c) for c in rng.integers(1, 20_000, n)]
        new = tuple(int(x) if rng.random() < 0.05 else 1 for x in rng.integers(2, 600, n))
        shape = StepShape(new, tuple(ctx), n)
        assert on.step_time_s(shape) == on.reference_step_time_s(shape)
        bulk = on.decode_step_times_s(ctx, 5)
        assert bulk == [on.step_time_s(StepShape((1,) * n, tuple(c + j for c in ctx), n)) for j in range(5)]


def test_fitted_bulk_decode_prices_are_step_time_s_float_for_float():
    """A run of plain decode steps is priced from the first step's sums and longest context (each
    grows by one a step): the very floats step_time_s gives on each step's shape."""
    rng = np.random.default_rng(3)
    fits = [make_cost_model("calibrated", model="llama-3.1-8b", gpu="rtx-pro-6000", tp=1),  # mixed, measured
            make_cost_model("calibrated", model="llama-3.1-70b", gpu="h100", tp=4),  # split, carried
            make_cost_model("calibrated", model="qwen2.5-7b", gpu="h100", tp=1),  # roofline coefficients
            make_cost_model("calibrated", model="llama-3.1-70b", gpu="h100", tp=4, skew_alpha=0)]
    fits[1].set_cudagraph_sizes([1, 2, 4, 8, 16, 32, 64, 128, 256])
    for cm in fits:
        for n in (1, 2, 37, 256):
            ctx = [int(c) for c in rng.integers(0, 9000, n)]
            bulk = cm.decode_step_times_s(ctx, 6)
            assert bulk == [cm.step_time_s(StepShape((1,) * n, tuple(c + j for c in ctx), n)) for j in range(6)]
    assert fits[0].decode_step_times_s([], 3) is None


def test_roofline_mla_has_no_carried_alpha_but_takes_a_given_one():
    mla = make_cost_model("roofline", model="deepseek-v3", gpu="h200", tp=8)
    assert mla.skew_alpha_source.startswith("none: MLA")
    given = make_cost_model("roofline", model="deepseek-v3", gpu="h200", tp=8, mla_table=True, skew_alpha=0.1)
    plain = make_cost_model("roofline", model="deepseek-v3", gpu="h200", tp=8, mla_table=True)
    skewed = StepShape((1,) * 8, (100, 100, 100, 100, 100, 100, 100, 3000), 8)
    t_mean, t_max = plain._mla_decode.pair(8, (700 + 3000) / 8, 3000)
    layers = plain.model.num_layers
    assert given.step_time_s(skewed) - plain.step_time_s(skewed) == pytest.approx(
        layers * 0.1 * (t_max - t_mean), rel=1e-9)
    assert given.step_time_s(StepShape((1,) * 8, (400,) * 8, 8)) == \
        plain.step_time_s(StepShape((1,) * 8, (400,) * 8, 8))


def test_calibrated_fits_keep_the_measured_alpha_and_carry_it_elsewhere():
    rtx = make_cost_model("calibrated", model="llama-3.1-8b", gpu="rtx-pro-6000", tp=1)
    assert (rtx.skew_alpha, rtx.skew_alpha_source) == (0.0543, MEASURED_SKEW_SOURCE)
    for model, gpu, tp in (("llama-3.1-70b", "h100", 4), ("qwen2.5-7b", "h100", 1), ("llama-3.1-8b", "rtx4090", 1)):
        cm = make_cost_model("calibrated", model=model, gpu=gpu, tp=tp)
        assert (cm.skew_alpha, cm.skew_alpha_source) == (A, CARRIED_SKEW_SOURCE)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "x", [0.1], float("nan"), float("inf")])
def test_bad_alphas_are_refused_the_same_way_everywhere(bad):
    for make in (lambda: make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", skew_alpha=bad),
                 lambda: make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", tp=1, skew_alpha=bad),
                 lambda: check_skew_alpha(bad)):
        with pytest.raises(InputError) as err:
            make()
        assert err.value.field == "skew_alpha"
    # as YAML hands it over: a numeric string is a number
    assert make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", skew_alpha="0.1").skew_alpha == 0.1


def test_a_fit_without_decode_attention_refuses_an_alpha():
    cm = _fitted({"kind": "split", "prefill": _decode_grid()})  # prefill rows only
    assert (cm.skew_alpha, cm.skew_alpha_source) == (0.0, "none: this fit prices no decode attention")
    cm.set_skew_alpha(0)  # off is always allowed
    with pytest.raises(InputError, match="without decode rows"):
        cm.set_skew_alpha(0.1)


def test_max_decode_context():
    assert max_decode_context((1, 1, 1), (5, 9, 2), 0) == 9
    assert max_decode_context((1, 300, 1), (5, 9000, 7), 1) == 7  # the chunk's context is not a decode's
    assert max_decode_context((300, 1), (9, 9), 1) == 9  # a decode ties the chunk's


SHARED = Path("/work/shared/data/gpu_profiles/llmservingsim/vllm_0.19_profiler")


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs the shared GPU profiles")
def test_the_carried_alpha_is_the_median_of_the_profiles_per_tp_alphas():
    yaml = pytest.importorskip("yaml")
    found = []
    for meta in sorted(SHARED.glob("*/*/*/bf16/meta.yaml")):
        fit = yaml.safe_load(meta.read_text()).get("skew_fit") or {}
        found += [float(v["alpha_default"]) for v in (fit.get("per_tp") or {}).values()]
    assert sorted(found) == sorted(CARRIED_SKEW_ALPHA_VALUES)
    assert statistics.median(found) == pytest.approx(CARRIED_SKEW_ALPHA, abs=1e-12)
