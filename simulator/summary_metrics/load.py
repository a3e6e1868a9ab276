"""Offered load against what the engine served: is this run overloaded, and by how much?

A queue that grows while requests arrive is the signature of overload. In the fluid picture of a
server offered lambda requests/s that can serve mu < lambda, the backlog at time t is
(lambda - mu) t and a request arriving then waits backlog / mu = (lambda / mu - 1) t: its queueing
delay grows with its arrival time at slope lambda / mu - 1. So

    queueing_growth   least-squares slope of each finished request's queueing delay against its
                      arrival time (seconds of waiting per second of trace)
    overload_factor   1 + queueing_growth when the queue grows (lambda / mu: 5 means the trace
                      offers five times what the engine serves), else 1
    served_requests_per_s  offered_requests_per_s / overload_factor (mu)
    overloaded        queueing_growth > 0.1 and queueing is most of the mean TTFT
    busy_fraction     the share of the simulated time the engine was computing (the union of its
                      steps' intervals: asynchronous steps overlap their neighbours)
    drain_s           from the last arrival to the last finish (where a backlog drains)

A stable run has growth near 0 whatever its utilisation; a short trace whose requests decode long
after the last arrival is not called overloaded (its queueing stays flat).
"""

from __future__ import annotations

import numpy as np

from servesim.simulator.summary_metrics import register_metric

GROWTH_THRESHOLD = 0.1  # s of waiting per s of trace: below this, noise and end-of-trace bursts
MIN_REQUESTS = 10  # fewer finished requests give no trend worth fitting


@register_metric("load")
def load(requests, steps, sim_duration_s):
    if any(c not in requests for c in ("arrival_s", "queueing_s", "ttft_s", "finish_s")):
        return None  # a table without the timings (a metric called on a few columns)
    arrival = np.asarray(requests["arrival_s"], dtype=float)
    if len(arrival) < MIN_REQUESTS or not steps.num_steps:
        return None
    span_s = float(arrival.max() - arrival.min())
    if span_s <= 0:
        return None
    queueing, ttft = np.asarray(requests["queueing_s"], dtype=float), np.asarray(requests["ttft_s"], dtype=float)
    keep = np.isfinite(queueing)
    growth = float(np.polyfit(arrival[keep], queueing[keep], 1)[0]) if keep.sum() >= MIN_REQUESTS else 0.0
    factor = 1.0 + growth if growth > GROWTH_THRESHOLD else 1.0
    mean_ttft = float(np.nanmean(ttft))
    queue_share = float(np.nanmean(queueing)) / mean_ttft if mean_ttft > 0 else 0.0
    offered = (len(arrival) - 1) / span_s
    busy_s = steps.busy_s
    return {"offered_requests_per_s": offered, "served_requests_per_s": offered / factor,
            "arrival_span_s": span_s, "queueing_growth": growth, "overload_factor": factor,
            "queueing_share_of_ttft": queue_share,
            "overloaded": bool(growth > GROWTH_THRESHOLD and queue_share > 0.5),
            "busy_fraction": busy_s / sim_duration_s if sim_duration_s > 0 else None,
            "drain_s": float(np.nanmax(np.asarray(requests["finish_s"], dtype=float)) - arrival.max())}

