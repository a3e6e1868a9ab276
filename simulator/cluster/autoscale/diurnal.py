"""A daily shape on a workload's arrivals: the traffic of a day, for autoscaling studies.

    workload:
      generator: poisson                    # any stationary workload at the day's MEAN rate
      duration_s: 86400
      arrival: {rate_per_s: 6}
      daily_shape: {peak_to_trough: 4, peak_s: 50400, period_s: 86400}
      # optional: only the arrivals in [from, to) s of the shaped day, moved to start at 0
      # (an hour of a day whose every step does not fit in memory); window_s: [32400, 36000]

The rate follows rate(t) = mean x (1 + a cos(2 pi (t - peak_s) / period_s)) with
a = (peak_to_trough - 1) / (peak_to_trough + 1), so its peak is peak_to_trough times its trough
and its mean over a period is the input's. Arrivals are moved by the time change that turns a
process of constant rate into one of this rate: the request at time u goes to the t with
Lambda(t) = mean x u, Lambda the integral of rate(t) (for a Poisson input, the output is exactly
the inhomogeneous Poisson process of rate(t)). Requests keep their lengths and order; only their
arrival times move. Deterministic: no draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from servesim.traces.errors import InputError
from servesim.traces.workload import Workload

SECONDS_PER_DAY = 86400.0


@dataclass(slots=True)
class DailyShape:
    peak_to_trough: float = 4.0  # the rate's peak over its trough (a scenario input, not a measured figure)
    peak_s: float = 14 * 3600.0  # when in the period the rate peaks (s from the workload's start)
    period_s: float = SECONDS_PER_DAY
    window_s: tuple[float, float] | None = None  # keep [from, to) of the shaped arrivals, shifted to 0

    def __post_init__(self) -> None:
        if self.window_s is not None:
            w = self.window_s
            if not isinstance(w, (list, tuple)) or len(w) != 2 or any(
                    isinstance(x, bool) or not isinstance(x, (int, float)) for x in w) or not 0 <= w[0] < w[1]:
                raise InputError(f"got {w!r}", field="workload.daily_shape.window_s",
                                 allowed="[from_s, to_s] with 0 <= from_s < to_s")
            self.window_s = (float(w[0]), float(w[1]))
        for name, low in (("peak_to_trough", 1.0), ("period_s", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v >= low \
                    or (name == "period_s" and v == 0):
                raise InputError(f"got {v!r}", field=f"workload.daily_shape.{name}",
                                 allowed=f"a finite number {'>=' if name == 'peak_to_trough' else '>'} {low:g}")
        if isinstance(self.peak_s, bool) or not isinstance(self.peak_s, (int, float)) or not math.isfinite(self.peak_s):
            raise InputError(f"got {self.peak_s!r}", field="workload.daily_shape.peak_s", allowed="a finite number (s)")

    @property
    def amplitude(self) -> float:
        return (self.peak_to_trough - 1.0) / (self.peak_to_trough + 1.0)

    def relative_rate(self, t_s: np.ndarray) -> np.ndarray:
        """rate(t) / mean."""
        return 1.0 + self.amplitude * np.cos(2 * np.pi * (t_s - self.peak_s) / self.period_s)

    def cumulative(self, t_s: np.ndarray) -> np.ndarray:
        """Lambda(t) / mean: the integral of relative_rate from 0 to t."""
        w = 2 * np.pi / self.period_s
        return t_s + self.amplitude / w * (np.sin(w * (t_s - self.peak_s)) + np.sin(w * self.peak_s))


def daily_shape_from_dict(raw: Any) -> DailyShape:
    if not isinstance(raw, dict):
        raise InputError(f"got {raw!r}", field="workload.daily_shape", allowed="{peak_to_trough, peak_s, period_s}")
    from servesim.simulator.cluster.config import _known

    _known(raw, ("peak_to_trough", "peak_s", "period_s", "window_s"), "workload.daily_shape.", None)
    return DailyShape(**raw)


def apply_daily_shape(wl: Workload, shape: DailyShape) -> Workload:
    """wl with its arrivals moved onto the daily rate (module doc)."""
    if not wl.requests:
        return wl
    u = np.array([r.arrival_time_s for r in wl.requests])
    # Lambda is increasing (amplitude < 1): invert it on a grid fine enough that the linear
    # interpolation is within ~1 ms of the root at a 1-day period.
    end = float(u[-1]) * (1.0 + shape.amplitude) / (1.0 - shape.amplitude) + shape.period_s
    grid = np.linspace(0.0, end, max(int(end) * 4, 2))
    t = np.interp(u, shape.cumulative(grid), grid)
    t = np.maximum.accumulate(t)  # the order of the input, whatever the float rounding
    lo, hi = shape.window_s if shape.window_s is not None else (0.0, math.inf)
    keep = [replace(r, arrival_time_s=float(x) - lo) for r, x in zip(wl.requests, t) if lo <= x < hi]
    window = "" if shape.window_s is None else f", {lo:g}-{hi:g} s"
    return replace(wl, requests=keep, name=f"{wl.name} (daily shape x{shape.peak_to_trough:g}{window})", spec=None)
