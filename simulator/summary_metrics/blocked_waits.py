"""Blocked waits of finished requests: how many waited for their structured-output grammar to
compile (grammar_wait_s; simulator/structured_output.py) and for a streaming-input session's next
chunk (input_wait_s, summed over the session; simulator/streaming_input.py), and how long."""

from __future__ import annotations

import numpy as np

from servesim.simulator.metrics import stats
from servesim.simulator.summary_metrics import register_metric


def _waits(requests, column: str) -> dict:
    # A requests table from elsewhere (a measured run's) may lack the column: no request waited.
    waits = np.asarray(requests[column] if column in requests else [], dtype=float)
    waits = waits[~np.isnan(waits)]
    return {"num_requests": int(len(waits)), "wait_s": stats(waits)}


@register_metric("grammar_waits")
def grammar_waits(requests, steps, sim_duration_s):
    return _waits(requests, "grammar_wait_s")


@register_metric("input_waits")
def input_waits(requests, steps, sim_duration_s):
    return _waits(requests, "input_wait_s")
