"""Step-time models: the GPU time of one engine step, plus the engine's CPU overhead model."""

from .base import (
    CostModel,
    StepShape,
    available_cost_models,
    decode_shape,
    make_cost_model,
    prefill_shape,
    register_cost_model,
)
from .cpu_overhead import CpuOverheadConfig, cpu_overhead_s
from .roofline import RooflineCostModel, RooflineParams

__all__ = [
    "CostModel", "CpuOverheadConfig", "RooflineCostModel", "RooflineParams", "StepShape",
    "available_cost_models", "cpu_overhead_s", "decode_shape", "make_cost_model", "prefill_shape",
    "register_cost_model",
]
