"""Summary metrics by name: every module of this folder registers one or more, and summary.json
reports each under "metrics" (so do the sweep table and `servesim.api` results, which read the
summary). A new metric is one new file here (docs/ARCHITECTURE.md has a worked example).

A metric is `metric(requests, steps, sim_duration_s) -> value`: `requests` is the table of
finished, non-empty requests (simulator/metrics.py's columns: ttft_s, tpot_s, e2e_s, queueing_s,
prompt_len, output_len, ...), `steps` the run's StepFigures (simulator/step_fold.py: steps,
preemptions, mean KV usage, busy time: what is known of the steps whether their rows were kept
or folded as the run went); the value is a number or a JSON-able dict (`simulator.metrics.stats`
gives mean/p50/p90/p99). `requests` is `Columns` (simulator/columns.py): `requests["ttft_s"]` is
a numpy array, `requests[mask]` keeps rows, and `requests.frame()` is the pandas DataFrame for a
metric that wants pandas (a summary otherwise never imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servesim.scheduler.registry import Registry
from servesim.simulator.columns import Columns
from servesim.simulator.step_fold import StepFigures

Metric = Callable[[Columns, StepFigures, float], Any]

METRICS: Registry[Metric] = Registry("metric", plugins="servesim.simulator.summary_metrics")


def register_metric(name: str) -> Callable[[Metric], Metric]:
    return METRICS.register(name)


def compute_metrics(requests: Columns, steps: StepFigures, sim_duration_s: float) -> dict[str, Any]:
    """Every registered metric's value, by name (sorted, so summaries diff cleanly)."""
    return {name: METRICS.get(name)(requests, steps, sim_duration_s) for name in METRICS.names()}
