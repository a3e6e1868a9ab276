"""Scale to zero: the activator that holds requests while a pool has no ready replica.

A pool with `min_replicas: 0` may drain its last replica. A request that reaches the router then
has nowhere to go: the activator holds it (in arrival order) and counts it as the pool's demand,
as Knative's activator and KEDA's HTTP interceptor do in front of a scaled-to-zero service. At the
next decision a pool at zero with held requests asks for at least one replica (KEDA's activation,
0 -> 1; the policy takes over from there); when the first replica is ready, every held request is
routed at that moment, in the order it arrived. Held time is part of TTFT (the request's arrival
is unchanged; its route time is the release). The run's arrivals are done only when nothing is
held, so the controller keeps deciding while requests wait.

Scale to zero needs the pool to be the only group the router picks from (else another group
serves instead, and nothing needs holding); P/D pools keep min_replicas >= 1.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from servesim.traces.workload import RequestSpec


class Activator:
    def __init__(self, env: simpy.Environment, dispatch: Callable[[RequestSpec], None]) -> None:
        self.env = env
        self._dispatch = dispatch
        self.held: list[tuple[float, RequestSpec]] = []  # (time held s, spec), in arrival order
        self._empty: simpy.Event | None = None
        self.num_held_total = 0  # requests that waited here at least once
        self.release_times_s: list[float] = []  # each release (a first replica ready with requests held)

    def hold(self, spec: RequestSpec) -> None:
        self.held.append((self.env.now, spec))
        self.num_held_total += 1

    def release(self) -> None:
        """A replica is ready: route every held request now, in arrival order."""
        if not self.held:
            return
        held, self.held = self.held, []
        self.release_times_s.append(self.env.now)
        for _, spec in held:
            self._dispatch(spec)
        if self._empty is not None and not self._empty.triggered:
            self._empty.succeed()

    def wait_empty(self):
        """A generator: returns once nothing is held (immediately when nothing is)."""
        if self.held:
            self._empty = self.env.event()
            yield self._empty

    def summary(self) -> dict:
        return {"num_held": self.num_held_total, "num_releases": len(self.release_times_s)}
