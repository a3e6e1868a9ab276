"""Pure workload transforms: each returns a new Workload and leaves its input untouched.

Step-indexed workloads (the vLLM oracle format, `arrival_step` set) refuse transforms that
would move arrival times, because their steps could no longer agree with the times.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


def _check_finite(value: float, field: str, allowed: str, *, positive: bool) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (
        value > 0 if positive else value >= 0)
    if not ok:
        raise InputError(f"got {value!r}", field=field, allowed=allowed)


def _refuse_steps(workload: Workload, what: str) -> None:
    if workload.columns.any_set("arrival_step"):
        raise InputError(f"{what} would move arrivals of a step-indexed workload "
                         f"({workload.name!r})", field="arrival_step",
                         allowed="workloads without arrival_step")


def _derived(workload: Workload, requests: Sequence[RequestSpec], note: str) -> Workload:
    return Workload(requests, name=workload.name, source=f"{workload.source} | {note}",
                    attribution=workload.attribution)


def rate_scale(workload: Workload, factor: float) -> Workload:
    """Scale the traffic rate: factor 2.0 = twice the traffic (arrival times divided by 2)."""
    _check_finite(factor, "rate_scale", "a finite number > 0", positive=True)
    if factor == 1.0:
        return _derived(workload, list(workload.requests), "rate x1")
    _refuse_steps(workload, "rate_scale")
    # On the columns, not per spec: a spec rebuilt per request (dataclasses.replace and its
    # validation) was ~10 us each. Division by one factor > 0 keeps the order, and a time >= 0
    # stays >= 0, so each spec is what replace(r, arrival_time_s=r.arrival_time_s / factor) gives.
    columns = workload.columns
    scaled = columns.with_arrival_times([t / factor for t in columns.arrival_times_s])
    return _derived(workload, scaled, f"rate x{factor:g}")


def time_limit(workload: Workload, limit_s: float) -> Workload:
    """Keep requests that arrive strictly before `limit_s` seconds."""
    _check_finite(limit_s, "limit_s", "a finite number >= 0", positive=False)
    columns = workload.columns  # sorted by arrival: the kept requests are a prefix
    kept = columns.rows(slice(bisect_left(columns.arrival_times_s, limit_s)))
    return _derived(workload, kept, f"arrivals < {limit_s:g} s")


def request_limit(workload: Workload, num_requests: int) -> Workload:
    """Keep the first `num_requests` requests (in arrival order)."""
    if not isinstance(num_requests, int) or isinstance(num_requests, bool) or num_requests < 0:
        raise InputError(f"got {num_requests!r}", field="num_requests", allowed="an integer >= 0")
    return _derived(workload, workload.columns.rows(slice(num_requests)), f"first {num_requests}")


def time_window(workload: Workload, start_s: float, end_s: float, *, rebase: bool = True
                ) -> Workload:
    """Keep arrivals in [start_s, end_s); with `rebase`, shift them so the window starts at 0."""
    _check_finite(start_s, "start_s", "a finite number >= 0", positive=False)
    _check_finite(end_s, "end_s", "a finite number >= 0", positive=False)
    if end_s < start_s:
        raise InputError(f"end_s {end_s} < start_s {start_s}", field="end_s",
                         allowed="end_s >= start_s")
    columns = workload.columns  # sorted by arrival: the kept requests are one slice
    times = columns.arrival_times_s
    kept = columns.rows(slice(bisect_left(times, start_s), bisect_left(times, end_s)))
    if rebase and start_s > 0:
        _refuse_steps(workload, "time_window(rebase=True)")
        kept = kept.with_arrival_times([max(t - start_s, 0.0) for t in kept.arrival_times_s])
    note = f"window [{start_s:g}, {end_s:g}) s" + (" rebased" if rebase else "")
    return _derived(workload, kept, note)
