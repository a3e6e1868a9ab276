"""Workloads for servesim: trace loaders, synthetic generators, transforms, bundled samples.

The simulator consumes `RequestSpec` / `Workload` (traces.workload). Entry points:

- `load_workload(path, fmt="auto", **options)`, `available_formats()`, `register_format(...)`
- `save_workload(workload, path)` (canonical JSONL / CSV / Parquet)
- `make_workload(generator, params, rng)`, `generate(config, rng)`, `available_generators()`
- `rate_scale`, `time_limit`, `request_limit`, `time_window`
- `load_bundled(name)`, `bundled_trace_path(name)`, `DEFAULT_TRACE`

Names are imported lazily (PEP 562): `from servesim.traces.errors import InputError`, which every package
uses, must not pull in numpy/pandas (the vLLM-oracle venv may not have them).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "DEFAULT_TRACE": "servesim.traces.bundled",
    "available_bundled_traces": "servesim.traces.bundled",
    "bundled_trace_path": "servesim.traces.bundled",
    "load_bundled": "servesim.traces.bundled",
    "save_workload": "servesim.traces.canonical",
    "InputError": "servesim.traces.errors",
    "available_formats": "servesim.traces.formats",
    "load_workload": "servesim.traces.formats",
    "register_format": "servesim.traces.formats",
    "sniff_format": "servesim.traces.formats",
    "available_generators": "servesim.traces.synthetic",
    "generate": "servesim.traces.synthetic",
    "make_workload": "servesim.traces.synthetic",
    "register_generator": "servesim.traces.synthetic",
    "ArrivalConfig": "servesim.traces.synthetic_config",
    "ChoiceConfig": "servesim.traces.synthetic_config",
    "DistConfig": "servesim.traces.synthetic_config",
    "PrefixConfig": "servesim.traces.synthetic_config",
    "SessionConfig": "servesim.traces.synthetic_config",
    "SyntheticConfig": "servesim.traces.synthetic_config",
    "config_from_dict": "servesim.traces.synthetic_config",
    "config_to_dict": "servesim.traces.synthetic_config",
    "rate_scale": "servesim.traces.transforms",
    "request_limit": "servesim.traces.transforms",
    "time_limit": "servesim.traces.transforms",
    "time_window": "servesim.traces.transforms",
    "RequestSpec": "servesim.traces.workload",
    "Workload": "servesim.traces.workload",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'traces' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
