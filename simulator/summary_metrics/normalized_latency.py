"""Normalized latency (Orca, vLLM papers): end-to-end latency divided by output tokens, seconds per token."""

from __future__ import annotations

from servesim.simulator.metrics import stats
from servesim.simulator.summary_metrics import register_metric


@register_metric("normalized_latency_s")
def normalized_latency(requests, steps, sim_duration_s):
    return stats(requests["e2e_s"] / requests["output_len"])
