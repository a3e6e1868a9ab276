"""Calibrated cost models shipped with servesim: ``profiled`` fits of real GPU measurements.

Each file in this folder is a fitted model (``servesim fit``, compacted and gzipped) for one
(model, GPU, TP) combination; ``index.json`` lists them with their sources and per-op fit error.
``python -m servesim.simulator.cost_model.calibrated.build`` regenerates everything from
``/work/shared/data/gpu_profiles`` (see README.md in this folder).

    from servesim.simulator.cost_model.calibrated import find_calibrated, load_calibrated
    find_calibrated("llama-3.1-8b", "h100", 1)      # Path or None
    make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", tp=1)

Importing this module registers the ``calibrated`` cost-model name.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from servesim.traces.errors import InputError

from ...specs import resolve_gpu, resolve_model
from ..base import check_params, register_cost_model

HERE = Path(__file__).resolve().parent
INDEX_PATH = HERE / "index.json"

__all__ = ["INDEX_PATH", "available_calibrated", "find_calibrated", "load_calibrated",
           "make_calibrated", "read_fitted_data"]


@lru_cache(maxsize=1)
def _index() -> tuple[dict, ...]:
    if not INDEX_PATH.exists():
        return ()
    return tuple(json.loads(INDEX_PATH.read_text())["entries"])


def available_calibrated() -> list[dict]:
    """The index entries: model, gpu, tp, file, sources, framework, fit_error summary."""
    return [dict(e) for e in _index()]


def _canon(model: Any, gpu: Any) -> tuple[str, str]:
    return resolve_model(model).name, resolve_gpu(gpu).name


def find_calibrated(model: Any, gpu: Any, tp: int = 1) -> Path | None:
    """The shipped fitted file for (model, gpu, tp), or None when there is none.

    ``model`` and ``gpu`` are ids or aliases (``meta-llama/Llama-3.1-8B``, ``h100_sxm``, ...).
    Unknown names raise InputError (from the spec registries)."""
    m, g = _canon(model, gpu)
    for e in _index():
        if e["model"] == m and e["gpu"] == g and int(e["tp"]) == int(tp):
            return HERE / e["file"]
    return None


def read_fitted_data(path: str | Path) -> dict:
    """The fitted model's JSON content from a ``.json`` or ``.json.gz`` file."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def load_calibrated(model: Any, gpu: Any, tp: int = 1, **host: Any):
    """The FittedCostModel shipped for (model, gpu, tp); InputError listing what exists if none.
    ``host`` keywords (host, disable_custom_all_reduce, collectives_profile) as FittedCostModel's."""
    from ..fitted import FittedCostModel

    path = find_calibrated(model, gpu, tp)
    if path is None:
        m, g = _canon(model, gpu)
        have = "; ".join(f"{e['model']} {e['gpu']} tp={e['tp']}" for e in _index()) or "none"
        raise InputError(f"no calibrated cost model for model={m} gpu={g} tp={tp}",
                         field="cost_model", allowed=have)
    try:
        data = read_fitted_data(path)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"cannot read calibrated cost model ({exc!r})", path=str(path)) from None
    try:
        return FittedCostModel(data, **host)
    except InputError:
        raise
    except (ValueError, KeyError) as exc:
        raise InputError(f"cannot read calibrated cost model ({exc!r})", path=str(path)) from None


@register_cost_model("calibrated")
def make_calibrated(model: Any = None, gpu: Any = None, tp: int | None = None, host: Any = None,
                    disable_custom_all_reduce: bool = False, **params: Any):
    """The shipped profiled fit for the run's (model, gpu, tp); ``skew_alpha=`` overrides the
    decode-skew factor (cost_model/decode_skew.py: the profile's measured one, else the one carried
    from the vLLM FlashAttention profiles; 0 turns the term off); ``cudagraph_capture_sizes=`` pads
    each step to vLLM's next CUDA-graph size (cost_model/cudagraph.py; default: no padding);
    ``host`` / ``disable_custom_all_reduce`` / ``collectives_profile=`` (this host's measured
    collectives) price the TP collectives the fit did not measure on this host."""
    check_params("calibrated", params, {"skew_alpha", "cudagraph_capture_sizes", "collectives_profile"})
    if model is None or gpu is None:
        raise InputError("the calibrated cost model needs model= and gpu=", field="cost_model")
    fitted = load_calibrated(model, gpu, 1 if tp is None else tp, host=host,
                             disable_custom_all_reduce=disable_custom_all_reduce,
                             collectives_profile=params.get("collectives_profile"))
    if params.get("skew_alpha") is not None:
        fitted.set_skew_alpha(params["skew_alpha"])
    fitted.set_cudagraph_sizes(params.get("cudagraph_capture_sizes"))
    return fitted
