"""Workloads for servesim: trace loaders, synthetic generators, transforms, bundled samples.

The simulator consumes `RequestSpec` / `Workload` (traces.workload). Entry points:

- `load_workload(path, fmt="auto", **options)`, `available_formats()`, `register_format(...)`
- `save_workload(workload, path)` (canonical JSONL / CSV / Parquet)
- `make_workload(generator, params, rng)`, `generate(config, rng)`, `available_generators()`
- `rate_scale`, `time_limit`, `request_limit`, `time_window`
- `load_bundled(name)`, `bundled_trace_path(name)`, `DEFAULT_TRACE`

Names are imported lazily (PEP 562): `from traces.errors import InputError`, which every package
uses, must not pull in numpy/pandas (the vLLM-oracle venv may not have them).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "DEFAULT_TRACE": "traces.bundled",
    "available_bundled_traces": "traces.bundled",
    "bundled_trace_path": "traces.bundled",
    "load_bundled": "traces.bundled",
    "save_workload": "traces.canonical",
    "InputError": "traces.errors",
    "available_formats": "traces.formats",
    "load_workload": "traces.formats",
    "register_format": "traces.formats",
    "sniff_format": "traces.formats",
    "available_generators": "traces.synthetic",
    "generate": "traces.synthetic",
    "make_workload": "traces.synthetic",
    "register_generator": "traces.synthetic",
    "ArrivalConfig": "traces.synthetic_config",
    "ChoiceConfig": "traces.synthetic_config",
    "DistConfig": "traces.synthetic_config",
    "PrefixConfig": "traces.synthetic_config",
    "SessionConfig": "traces.synthetic_config",
    "SyntheticConfig": "traces.synthetic_config",
    "config_from_dict": "traces.synthetic_config",
    "config_to_dict": "traces.synthetic_config",
    "rate_scale": "traces.transforms",
    "request_limit": "traces.transforms",
    "time_limit": "traces.transforms",
    "time_window": "traces.transforms",
    "RequestSpec": "traces.workload",
    "Workload": "traces.workload",
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
