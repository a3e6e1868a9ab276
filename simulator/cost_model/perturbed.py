"""Cost-model uncertainty: a step-time model scaled per kind of step, and the error it is drawn from.

A replicate that perturbs the cost model (servesim/replicates.py) runs the `perturbed` model: its
base model's step time times one factor per kind of step (prefill-only, decode-only, mixed), fixed
for the whole run. The factors are exp(sigma_kind * z) with z standard normal, drawn once per
replicate from the replicate's own generator; sigma_kind comes from the base model's measured error:

* a fitted model (`profiled`, `calibrated`: `servesim fit` on kernel measurements): its held-out
  MAPE per op (metadata.fit_error), over the ops a step of that kind runs (attention of that kind,
  and every measured non-attention op), as the root mean square, turned into the standard deviation
  of a normal error with that mean absolute value: sigma = MAPE * sqrt(pi / 2).
* the roofline: its log error against the measured tables of GPUs of the same generation
  (data/roofline_residuals.json, tools/roofline_residuals.py), the root-mean-square log error
  (bias and spread together, centred on the roofline's own answer: the model is not corrected).

Factors are fixed per run, not per step: a per-step draw would average out over the thousands of
steps of a run, while the question is "which machine is this really" (a systematic error).
The factors are written into the replicate's config.yaml (cost_model.params: base, factors), so any
replicate reruns byte for byte from its folder alone.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import StepShape, make_cost_model, register_cost_model
from servesim.traces.errors import InputError

STEP_KINDS = ("prefill", "decode", "mixed")
RESIDUALS_PATH = Path(__file__).resolve().parent / "data" / "roofline_residuals.json"
# E|X| = sigma * sqrt(2 / pi) for X ~ N(0, sigma^2): a MAPE turned into a log-normal sigma.
MAPE_TO_SIGMA = math.sqrt(math.pi / 2)


def step_kind(shape: StepShape) -> str:
    """decode: every request computes one token (an empty step too); prefill: none does; mixed: both."""
    new = shape.num_new_tokens
    n_decode = new.count(1)
    if n_decode == len(new):
        return "decode"
    return "prefill" if n_decode == 0 else "mixed"


class PerturbedCostModel:
    """The base model's step time times the factor of the step's kind. Bulk decode pricing scales
    the base's floats by the same factor, so macro-steps stay exact (the same float per step)."""

    __slots__ = ("name", "base", "factors", "_decode")

    def __init__(self, base, factors: dict[str, float]) -> None:
        self.name = "perturbed"
        self.base = base
        self.factors = dict(factors)
        self._decode = self.factors["decode"]

    def step_time_s(self, shape: StepShape) -> float:
        return self.base.step_time_s(shape) * self.factors[step_kind(shape)]

    def decode_step_times_s(self, num_context_tokens: list[int], num_steps: int) -> list[float] | None:
        from .base import decode_step_times_s

        f = self._decode
        return [t * f for t in decode_step_times_s(self.base, num_context_tokens, num_steps)]

    def verify_step_times_s(self, num_new_tokens: int, num_requests: int, context_sums: list[int]) -> list[float] | None:
        """The base's bulk verify prices (None where it has none) scaled as step_time_s scales
        them: no request of a verify step computes a single token, so its kind is prefill."""
        from .base import bulk_verify_pricer

        bulk = bulk_verify_pricer(self.base)
        times = None if bulk is None else bulk(num_new_tokens, num_requests, context_sums)
        if times is None:
            return None
        f = self.factors["prefill"]
        return [t * f for t in times]

    def wave_correction_s(self, num_tokens: int, wave_tokens: int) -> float:
        """The base's data-parallel wave correction (0.0 when it has none), scaled as a decode."""
        from .base import wave_corrector

        fix = wave_corrector(self.base)
        return 0.0 if fix is None else fix(num_tokens, wave_tokens) * self._decode


@register_cost_model("perturbed")
def make_perturbed(model: Any = None, gpu: Any = None, tp: int | None = None, **params: Any) -> PerturbedCostModel:
    """``base`` (the perturbed model's registry name), ``factors`` ({prefill, decode, mixed}:
    positive multipliers of the step time); every other parameter is the base model's, so
    `--set cost_model.name=perturbed --set cost_model.params.base=calibrated ...` keeps the
    base's own parameters where they were."""
    base_name = params.pop("base", None)
    factors = check_factors(params.pop("factors", None))
    if not isinstance(base_name, str) or not base_name:
        raise InputError(f"got {base_name!r}", field="cost_model.params.base",
                         allowed="the name of the cost model to perturb, e.g. roofline or calibrated")
    if base_name.strip().lower() == "perturbed":
        raise InputError("a perturbed model cannot perturb another", field="cost_model.params.base")
    return PerturbedCostModel(make_cost_model(base_name, model=model, gpu=gpu, tp=tp, **params), factors)


def check_factors(factors: Any) -> dict[str, float]:
    if not isinstance(factors, dict) or set(factors) != set(STEP_KINDS) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf for v in factors.values()):
        raise InputError(f"got {factors!r:.120}", field="cost_model.params.factors",
                         allowed="{prefill: F, decode: F, mixed: F} with each F a number > 0")
    return {k: float(factors[k]) for k in STEP_KINDS}


# --- the error each model carries ------------------------------------------------------------------

def residual_sigmas(cfg) -> tuple[dict[str, float], str]:
    """(sigma of the log step-time error per step kind, where it comes from) for a SimConfig's cost model."""
    from .base import run_cost_model

    if cfg.cost_model.name == "perturbed":
        raise InputError("the config's cost model is perturbed already", field="cost_model.name",
                         allowed="the base model (replicates perturb it)")
    from .fitted import FittedCostModel

    model = run_cost_model(cfg)
    if isinstance(model, FittedCostModel):
        return (fitted_sigmas(model.fit_error),
                f"{cfg.cost_model.name}: held-out MAPE per op of its fit (metadata.fit_error)")
    if cfg.cost_model.name == "roofline":
        from servesim.simulator.specs import resolve_gpu
        from servesim.simulator.specs.gpu_generation import gpu_generation

        return roofline_sigmas(gpu_generation(resolve_gpu(cfg.hardware.gpu)))
    raise InputError(f"the {cfg.cost_model.name!r} cost model carries no measured error to perturb with",
                     field="cost_model.name", allowed="roofline, calibrated or profiled, or --no-perturb-cost-model")


def fitted_sigmas(fit_error: dict) -> dict[str, float]:
    """Per step kind: sqrt(pi/2) x the RMS held-out MAPE of the measured ops that kind runs."""
    def measured(op: str) -> float | None:
        e = fit_error.get(op) or {}
        mape = e.get("mape_holdout")
        return None if e.get("origin") == "roofline" or mape is None else float(mape)

    attention = {"decode": ("attn_decode", "attn_mixed"), "prefill": ("attn_prefill", "attn_mixed"),
                 "mixed": ("attn_decode", "attn_prefill", "attn_mixed")}
    common = [m for op in fit_error if not op.startswith("attn_") and (m := measured(op)) is not None]
    out = {}
    for kind in STEP_KINDS:
        values = common + [m for op in attention[kind] if (m := measured(op)) is not None]
        out[kind] = MAPE_TO_SIGMA * math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0
    return out


@lru_cache(maxsize=1)
def _roofline_residuals() -> dict:
    return json.loads(RESIDUALS_PATH.read_text())


def roofline_sigmas(generation: str) -> tuple[dict[str, float], str]:
    data = _roofline_residuals()
    table = data["generations"].get(generation)
    where = f"roofline vs measured {generation} tables"
    if table is None:  # no measured tables of this generation: every generation's probes together
        table, where = data["pooled"], f"roofline vs measured tables of all generations (none of {generation})"
    return {k: float(table[k]["rms_log_error"]) for k in STEP_KINDS}, f"{where} (data/roofline_residuals.json)"


def draw_factors(sigmas: dict[str, float], rng) -> dict[str, float]:
    """One factor per step kind, exp(sigma * z), drawn in STEP_KINDS order (rounded to 6 significant
    digits so config.yaml holds them exactly)."""
    z = rng.standard_normal(len(STEP_KINDS))
    return {k: float(f"{math.exp(sigmas[k] * zk):.6g}") for k, zk in zip(STEP_KINDS, z.tolist())}
