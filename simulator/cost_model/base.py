"""The interface between the engine and the step-time models, and the cost-model registry.

The engine builds one :class:`StepShape` per simulated step and asks a :class:`CostModel` for the
GPU time of that forward pass. Models are created by name through :func:`make_cost_model`, so
scenario files and the CLI can choose one without importing it.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress
from typing import Any, Protocol, runtime_checkable

from servesim.scheduler.registry import Registry
from servesim.scheduler.step_shape import StepShape, decode_shape, prefill_shape  # re-exported: the model's input
from servesim.traces.errors import InputError, field_error


def batch_sums(new: tuple[int, ...], ctx: tuple[int, ...]
               ) -> tuple[int, int, int, int, int, int, int, int]:
    """Sufficient statistics of a step for the cost models, computed without a Python loop in
    the common cases (all decodes; decodes plus one prefill chunk).

    Returns ``(tokens, ctx_sum, n_decode, decode_ctx, n_prefill, prefill_tokens, prefill_cp,
    prefill_cc)``: decodes are requests computing exactly one token; every other request is
    "prefill-like" (a prompt chunk or a speculative verification), and for those
    ``prefill_cp = sum(chunk * cached)`` and ``prefill_cc = sum(chunk ** 2)``.
    """
    tokens, ctx_sum = sum(new), sum(ctx)
    n_decode = new.count(1)
    n_prefill = len(new) - n_decode
    if n_prefill == 0:
        return tokens, ctx_sum, n_decode, ctx_sum, 0, 0, 0, 0
    if n_prefill == 1:  # the only entry != 1 has the remaining tokens: find it in C
        chunk = tokens - n_decode
        cached = ctx[new.index(chunk)]
        return (tokens, ctx_sum, n_decode, ctx_sum - cached, 1, chunk, chunk * cached,
                chunk * chunk)
    cp = cc = pctx = 0
    for i in compress(range(len(new)), map(_ONE_NE, new)):
        n, c = new[i], ctx[i]
        cp += n * c
        cc += n * n
        pctx += c
    return (tokens, ctx_sum, n_decode, ctx_sum - pctx, n_prefill, tokens - n_decode, cp, cc)


_ONE_NE = (1).__ne__


@runtime_checkable
class CostModel(Protocol):
    name: str

    def step_time_s(self, shape: StepShape) -> float:
        """GPU time of the forward pass for this step, seconds (CPU overhead is modelled apart)."""
        ...


@runtime_checkable
class DecodeRunCostModel(Protocol):
    """Optional: a cost model that prices a run of plain decode steps in bulk (macro-steps).

    `decode_step_times_s(num_context_tokens, num_steps)` returns the floats step_time_s would
    return, bit for bit, for num_steps all-decode steps whose contexts start at
    num_context_tokens and grow by one a step; or None when it has no shortcut for this batch."""

    def decode_step_times_s(self, num_context_tokens: list[int], num_steps: int) -> list[float] | None: ...


@runtime_checkable
class WaveCostModel(Protocol):
    """Optional: a cost model for one rank of a data-parallel MoE deployment whose ranks step in
    lockstep (simulator/cluster/dp.py), where every rank's MoE layers see the whole wave's tokens.

    `wave_correction_s(num_tokens, wave_tokens)` is the seconds to add to step_time_s of this
    rank's step of num_tokens tokens when the wave's MoE layers hold wave_tokens tokens in all
    (the sum over the ranks); step_time_s alone cannot know the other ranks and assumes balanced
    ones. 0.0 when the model has no such layers."""

    def wave_correction_s(self, num_tokens: int, wave_tokens: int) -> float: ...


def wave_corrector(model: CostModel) -> Callable[[int, int], float] | None:
    """The model's wave correction method, or None: resolved once per model (the runtime
    Protocol check costs more than the correction)."""
    return model.wave_correction_s if isinstance(model, WaveCostModel) else None


def bulk_decode_pricer(model: CostModel) -> Callable[[list[int], int], list[float] | None] | None:
    """The model's bulk decode-run method, or None: resolved once per model, since the runtime
    Protocol check costs more than pricing a short run (a cluster asks at every loop top)."""
    return model.decode_step_times_s if isinstance(model, DecodeRunCostModel) else None


@runtime_checkable
class VerifyRunCostModel(Protocol):
    """Optional: a cost model that prices speculative decoding's verify steps in bulk (macro-steps).

    `verify_step_times_s(num_new_tokens, num_requests, context_sums)` returns the floats
    step_time_s would return, bit for bit, for steps of num_requests requests that each compute
    num_new_tokens (> 1) tokens and sample, on contexts summing to context_sums[j] at step j; or
    None when it has no shortcut for these steps (each is then priced on its exact StepShape)."""

    def verify_step_times_s(self, num_new_tokens: int, num_requests: int,
                            context_sums: list[int]) -> list[float] | None: ...


def bulk_verify_pricer(model: CostModel) -> Callable[[int, int, list[int]], list[float] | None] | None:
    """The model's bulk verify-step method, or None: resolved once per model (bulk_decode_pricer's reason)."""
    return model.verify_step_times_s if isinstance(model, VerifyRunCostModel) else None


def decode_step_times_s(model: CostModel, num_context_tokens: list[int], num_steps: int,
                        bulk: Callable[[list[int], int], list[float] | None] | None = None) -> list[float]:
    """GPU time of each step of a run of plain decode steps: the model's bulk method where it has
    one (``bulk``: bulk_decode_pricer(model), when the caller resolved it already), else one
    step_time_s call per step on the exact StepShape."""
    if bulk is None and isinstance(model, DecodeRunCostModel):
        bulk = model.decode_step_times_s
    if bulk is not None:
        times = bulk(num_context_tokens, num_steps)
        if times is not None:
            return times
    n = len(num_context_tokens)
    ones = (1,) * n
    step_time_s = model.step_time_s
    return [step_time_s(StepShape(ones, tuple([c + j for c in num_context_tokens]), n)) for j in range(num_steps)]


CostModelFactory = Callable[..., CostModel]


# Built-ins: every module of simulator/cost_model/ is imported on the first lookup (roofline.py,
# fitted.py, calibrated/ register themselves), so a new cost model is one new file there.
COST_MODELS: Registry[CostModelFactory] = Registry("cost model", plugins="servesim.simulator.cost_model",
                                                   error=field_error("cost_model"),
                                                   normalize=lambda s: s.strip().lower())


def register_cost_model(name: str) -> Callable[[CostModelFactory], CostModelFactory]:
    """Class/function decorator: make ``factory(model=, gpu=, tp=, **params)`` available by name.
    A model that prices collectives also takes ``host=`` (a host id or spec, specs/hosts.py) and
    ``disable_custom_all_reduce=``; they are passed only when a run sets them."""
    return COST_MODELS.register(name)


def available_cost_models() -> list[str]:
    return COST_MODELS.names()


def make_cost_model(name: str, *, model: Any = None, gpu: Any = None, tp: int | None = None,
                    host: Any = None, disable_custom_all_reduce: bool = False, **params: Any) -> CostModel:
    """Build a registered cost model. ``model``/``gpu`` are ids, aliases or specs; ``tp=None``
    means 1 for analytic models and "whatever the file was fitted for" for ``profiled``;
    ``host`` (default: the GPU's default host) and ``disable_custom_all_reduce`` (vLLM's flag)
    say how its collectives run. Those two reach the factory only when set, so a model that
    prices no collective need not take them."""
    given = {k: v for k, v in (("host", host), ("disable_custom_all_reduce", disable_custom_all_reduce)) if v}
    return COST_MODELS.get(name)(model=model, gpu=gpu, tp=tp, **given, **params)


def run_cost_model(cfg: Any) -> CostModel:
    """The cost model a SimConfig names, on its hardware (model, GPU, TP, host, vLLM's
    ``disable_custom_all_reduce``): the one place a run's config becomes its cost model."""
    hw = cfg.hardware
    return make_cost_model(cfg.cost_model.name, model=hw.model, gpu=hw.gpu, tp=hw.tp, host=hw.host,
                           disable_custom_all_reduce=hw.disable_custom_all_reduce, **cfg.cost_model.params)


def check_params(model_name: str, params: dict[str, Any], allowed: set[str]) -> None:
    """Reject unknown keyword parameters with the list of accepted ones."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise InputError(f"cost model '{model_name}': unknown parameter(s) {unknown}",
                         field=unknown[0], allowed=", ".join(sorted(allowed)) or "none")
