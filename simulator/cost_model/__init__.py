"""Step-time models: the GPU time of one engine step, plus the engine's CPU overhead model.

The fitting side (``fit``, ``fit_main``, ``import_profile``, ``FittedCostModel``) pulls in pandas
and is loaded on first use, so the engine's import of the analytic models stays light.
"""

from importlib import import_module
from typing import Any

from .base import (
    CostModel,
    StepShape,
    available_cost_models,
    decode_shape,
    make_cost_model,
    prefill_shape,
    register_cost_model,
    run_cost_model,
)
from .cpu_overhead import CpuOverheadConfig, cpu_overhead_s
from .roofline import RooflineCostModel
from .roofline_params import RooflineParams

_LAZY = {"fit": ".fit", "fit_main": ".fit", "load_profiles": ".fit", "format_fit_report": ".fit",
         "import_profile": ".importers", "available_importers": ".importers",
         "FittedCostModel": ".fitted"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)


__all__ = [
    "CostModel", "CpuOverheadConfig", "FittedCostModel", "RooflineCostModel", "RooflineParams",
    "StepShape", "available_cost_models", "available_importers", "cpu_overhead_s", "decode_shape",
    "fit", "fit_main", "format_fit_report", "import_profile", "load_profiles", "make_cost_model",
    "prefill_shape", "register_cost_model", "run_cost_model",
]
