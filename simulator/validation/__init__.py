"""Validation against real serving runs: replay a measured run, pair requests, report errors.

    from servesim.simulator.validation import ValidateOptions, validate_run
    report = validate_run(RUN_DIR, WORKLOAD, ValidateOptions(), out_dir="runs/validate")
    report["per_request"]["e2e"]["median_ape"]

Also: closed-loop checks against fixed-concurrency benchmarks (``closed_loop.py``), run adapters
(``runs.py``), KV-capacity choice (``kv.py``), CPU-overhead presets (``cpu.py``).
See docs/FIDELITY.md.
"""

from .compare import aggregate_errors, pair_requests, per_request_errors, timeseries_errors
from .runs import (
    EngineSettings,
    MeasuredRun,
    available_run_formats,
    load_run,
    register_run_format,
)
from .replay import ValidateOptions, build_config, validate_run

__all__ = [
    "EngineSettings", "MeasuredRun", "ValidateOptions", "aggregate_errors", "available_run_formats",
    "build_config", "load_run", "pair_requests", "per_request_errors", "register_run_format",
    "timeseries_errors", "validate_run",
]
