"""Validation against real serving runs: replay a measured run, pair requests, report errors.

    from servesim.simulator.validation import ValidateOptions, compare_run
    report = compare_run(RUN_DIR, WORKLOAD, ValidateOptions()).report
    report["per_request"]["e2e"]["median_ape"]

Writing the result folder with its pages (validation.json, index.html) is one layer up, in
``servesim.validation_report`` (``validate_run``, ``closed_loop_report``): figures live in servesim/plots/.

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
from .replay import RunComparison, ValidateOptions, build_config, compare_run

__all__ = [
    "EngineSettings", "MeasuredRun", "ValidateOptions", "aggregate_errors", "available_run_formats",
    "build_config", "load_run", "pair_requests", "per_request_errors", "register_run_format",
    "timeseries_errors", "compare_run", "RunComparison",
]
