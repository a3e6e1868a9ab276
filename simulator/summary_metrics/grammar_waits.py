"""Structured output: how many finished requests waited for their grammar to compile, and how long
(the requests table's grammar_wait_s; simulator/structured_output.py)."""

from __future__ import annotations

import numpy as np

from servesim.simulator.metrics import stats
from servesim.simulator.summary_metrics import register_metric


@register_metric("grammar_waits")
def grammar_waits(requests, steps, sim_duration_s):
    # A requests table from elsewhere (a measured run's) may lack the column: no request waited.
    waits = np.asarray(requests["grammar_wait_s"] if "grammar_wait_s" in requests else [], dtype=float)
    waits = waits[~np.isnan(waits)]
    return {"num_requests": int(len(waits)), "wait_s": stats(waits)}
