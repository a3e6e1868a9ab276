"""Cost-model registry, StepShape, the shared batch statistics and the CPU overhead model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.simulator.cost_model import (
    CostModel,
    CpuOverheadConfig,
    StepShape,
    available_cost_models,
    cpu_overhead_s,
    decode_shape,
    make_cost_model,
    register_cost_model,
)
from servesim.simulator.cost_model.base import batch_sums
from servesim.traces.errors import InputError


def test_registry_lists_builtin_models():
    assert {"roofline", "profiled"} <= set(available_cost_models())


def test_unknown_model_lists_valid_names():
    with pytest.raises(InputError) as err:
        make_cost_model("vidur", model="llama-3.1-8b", gpu="h100")
    assert "roofline" in str(err.value) and "profiled" in str(err.value)


def test_unknown_parameter_is_rejected_with_the_allowed_ones():
    with pytest.raises(InputError) as err:
        make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", compute_eff=0.5)
    assert "kernel_overhead_s" in str(err.value)


def test_roofline_needs_model_and_gpu_and_valid_params():
    with pytest.raises(InputError):
        make_cost_model("roofline", gpu="h100")
    with pytest.raises(InputError):
        make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", memory_efficiency=0)
    with pytest.raises(InputError):
        make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=3)  # 32 heads


def test_profiled_needs_a_path():
    with pytest.raises(InputError) as err:
        make_cost_model("profiled", model="llama-3.1-8b", gpu="h100")
    assert err.value.field == "path"


def test_register_custom_model_and_protocol():
    @register_cost_model("constant-test")
    class Constant:
        def __init__(self, model=None, gpu=None, tp=None, seconds=1e-3):
            self.name = "constant-test"
            self.seconds = seconds

        def step_time_s(self, shape):
            return self.seconds

    cm = make_cost_model("Constant-Test", seconds=2e-3)
    assert isinstance(cm, CostModel)
    assert cm.step_time_s(decode_shape(1, 1)) == 2e-3
    with pytest.raises(ValueError):
        register_cost_model("constant-test")(lambda **kw: None)


def test_stepshape_validate():
    StepShape((3, 1), (0, 10), 2).validate()
    for bad in (StepShape((1,), (0, 1), 1), StepShape((0,), (0,), 0), StepShape((1,), (-1,), 1),
                StepShape((1,), (4,), 2)):
        with pytest.raises(InputError):
            bad.validate()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 1, 1, 2, 3, 17, 512]),
                          st.integers(min_value=0, max_value=5000)), max_size=40))
def test_batch_sums_matches_brute_force(reqs):
    new = tuple(n for n, _ in reqs)
    ctx = tuple(c for _, c in reqs)
    dec = [(n, c) for n, c in reqs if n == 1]
    pre = [(n, c) for n, c in reqs if n != 1]
    assert batch_sums(new, ctx) == (
        sum(new), sum(ctx), len(dec), sum(c for _, c in dec), len(pre),
        sum(n for n, _ in pre), sum(n * c for n, c in pre), sum(n * n for n, _ in pre))


def test_cpu_overhead_defaults_reproduce_the_blog_split():
    # vLLM v0.6.0 blog: 29 % of a ~13 ms light-load decode step is scheduling/input prep.
    cfg = CpuOverheadConfig()
    light = cpu_overhead_s(cfg, decode_shape(8, 300))
    assert light == pytest.approx(0.29 * 13e-3, rel=0.05)
    assert cpu_overhead_s(cfg, StepShape((2048,), (0,), 1)) > light - cfg.per_request_s * 7
    assert cpu_overhead_s(CpuOverheadConfig.zero(), decode_shape(64, 10)) == 0.0


@pytest.mark.parametrize("bad", [{"fixed_s": -1e-3}, {"per_request_s": float("nan")},
                                 {"per_token_s": "1us"}, {"fixed_s": True}])
def test_cpu_overhead_validation(bad):
    with pytest.raises(InputError):
        CpuOverheadConfig(**bad)
