"""The HPA's rate limits (autoscaling/v2 `behavior` policies), applied after stabilization.

Kubernetes (pkg/controller/podautoscaler/horizontal.go, convertDesiredReplicasWithBehaviorRate and
calculateScaleUp/DownLimit...): each policy looks back `period_s` at the replicas added and removed
by earlier decisions (events strictly after now - period_s) to find the count at the period's
start, and proposes a bound: start + value pods, ceil(start * (1 + value/100)) for percent going
up; start - value, int(start * (1 - value/100)) (truncated) going down. selectPolicy "max" takes
the bound that allows the biggest change, "min" the smallest, "disabled" none at all. The bound
never goes past the current count the other way, and min/max_replicas stay the outer limits.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from servesim.simulator.cluster.autoscale.config import PoolConfig, ScalingPolicy


@dataclass(slots=True)
class ScaleEvents:
    """The pool's earlier changes, by direction: (time s, replicas added or removed)."""

    up: deque[tuple[float, int]] = field(default_factory=deque)
    down: deque[tuple[float, int]] = field(default_factory=deque)

    def record(self, now: float, current: int, target: int) -> None:
        if target > current:
            self.up.append((now, target - current))
        elif target < current:
            self.down.append((now, current - target))

    def forget_before(self, cutoff_s: float) -> None:
        """Drop events no policy can see any more (at or before cutoff_s: the longest period back)."""
        for events in (self.up, self.down):
            while events and events[0][0] <= cutoff_s:
                events.popleft()


def _changed(events: deque[tuple[float, int]], now: float, period_s: float) -> int:
    cutoff = now - period_s
    return sum(n for t, n in events if t > cutoff)


def _period_start(current: int, events: ScaleEvents, now: float, p: ScalingPolicy) -> int:
    return current - _changed(events.up, now, p.period_s) + _changed(events.down, now, p.period_s)


def _up_limit(current: int, events: ScaleEvents, now: float, policies: tuple[ScalingPolicy, ...], select: str) -> float:
    if not policies:
        return math.inf
    if select == "disabled":
        return current
    bounds = []
    for p in policies:
        start = _period_start(current, events, now, p)
        bounds.append(start + p.value if p.type == "pods" else math.ceil(start * (1 + p.value / 100)))
    return min(bounds) if select == "min" else max(bounds)


def _down_limit(current: int, events: ScaleEvents, now: float, policies: tuple[ScalingPolicy, ...], select: str) -> float:
    if not policies:
        return -math.inf
    if select == "disabled":
        return current
    bounds = []
    for p in policies:
        start = _period_start(current, events, now, p)
        bounds.append(start - p.value if p.type == "pods" else int(start * (1 - p.value / 100)))
    return max(bounds) if select == "min" else min(bounds)


def rate_limited(pc: PoolConfig, events: ScaleEvents, now: float, desired: int, current: int) -> int:
    """The count this decision moves to: `desired` (already stabilized) within the rate limits and
    min/max_replicas; records the change for later decisions' periods."""
    if desired > current:
        allowed = min(pc.max_replicas, max(_up_limit(current, events, now, pc.scale_up_policies,
                                                     pc.scale_up_select_policy), current))
        target = int(min(desired, allowed))
    elif desired < current:
        allowed = max(pc.min_replicas, min(_down_limit(current, events, now, pc.scale_down_policies,
                                                       pc.scale_down_select_policy), current))
        target = int(max(desired, allowed))
    else:
        target = desired
    target = min(max(target, pc.min_replicas), pc.max_replicas)
    longest = max((p.period_s for p in (*pc.scale_up_policies, *pc.scale_down_policies)), default=0.0)
    events.forget_before(now - longest)
    events.record(now, current, target)
    return target
