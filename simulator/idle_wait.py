"""What an engine with nothing to run waits for (the engine loop's and a DP lockstep group's idle wait).

An engine whose scheduler has nothing to run sleeps until something outside changes that: a
request submitted, close(), a KV transfer landing or blocks freed (Engine.notify). When it has
unfinished requests that nothing could run (a step that ran nothing and changed nothing), it also
wakes at its own next state change: a client deadline, the scheduler's next event (e.g. a policy
releasing KV), a copy of the CPU KV tier landing.
"""

from __future__ import annotations

import simpy

from servesim.scheduler.interface import SchedulerInterface
from servesim.simulator.deadlines import ClientDeadlines
from servesim.simulator.kv_offload import TimedOffloadWorker


class IdleWait:
    """Owns the event the idle engine waits for (a fresh one per wait, triggered at most once) and
    whether the engine is closed (`all_arrived`: no more requests will be submitted)."""

    def __init__(self, env: simpy.Environment, scheduler: SchedulerInterface, deadlines: ClientDeadlines,
                 kv_offload: TimedOffloadWorker | None) -> None:
        self.env = env
        self._scheduler = scheduler
        self._deadlines = deadlines
        self._kv_offload = kv_offload
        self._wake: simpy.Event | None = None  # what the idle loop waits for (an arrival, close(), notify())
        self.all_arrived = False

    def wake_up(self) -> None:
        """Something outside happened: the idle wait, if any, ends now."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def close(self) -> None:
        """No more requests will be submitted: the loop ends once the engine drains."""
        self.all_arrived = True
        self.wake_up()

    def wake_event(self) -> simpy.Event:
        """A fresh event the next submit, close() or notify() triggers (the loop's idle wait)."""
        wake = self._wake = self.env.event()
        return wake

    def idle_event(self) -> simpy.Event:
        """Nothing ran and nothing is in flight: what the loop waits for (an outside event, a
        client deadline, the scheduler's own next state change, e.g. a policy releasing KV, or a copy
        of the CPU KV tier landing)."""
        wake = self.wake_event()
        wakes: list[float] = []
        copy_s = None if self._kv_offload is None else self._kv_offload.next_event_s(self.env.now)
        for own in (self._scheduler.next_event_s(), copy_s):
            if own is not None:
                wakes.append(own)
        if self._deadlines:  # a client giving up frees KV: that can unblock the others
            wakes.append(self._deadlines.next_s)
        if wakes:
            return self.env.any_of([wake, self.env.timeout(max(min(wakes) - self.env.now, 0.0))])
        return wake
