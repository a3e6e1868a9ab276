"""What an outside driver of an engine's steps uses: a DP lockstep group (simulator/cluster/dp.py)
schedules and applies its ranks' steps itself, wave by wave, instead of each engine's own loop.

Mixed into Engine (its own state stays its own: these are the engine's methods, the group calls
nothing private). Each call does what the engine's loop does at the same point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.simulator.engine_steps import EngineStepsMixin

if TYPE_CHECKING:
    from servesim.simulator.engine import Engine


class EngineRankMixin(EngineStepsMixin):
    @property
    def all_arrived(self: Engine) -> bool:
        """No more requests will be submitted (close() was called)."""
        return self._all_arrived

    def wake_event(self: Engine) -> simpy.Event:
        """A fresh event the next submit, close() or notify() triggers (the loop's idle wait)."""
        wake = self._wake = self.env.event()
        return wake

    def expire_due_deadlines(self: Engine, now: float) -> None:
        """Abort the requests whose client gave up by now (the loop does it before scheduling)."""
        if self._deadlines and self._deadlines[0][0] <= now:
            self._expire_deadlines(now)

    def record_schedule(self: Engine, so: SchedulerOutput, now: float) -> tuple[dict | None, int]:
        """Bookkeeping of a step just scheduled: (its step-trace record or None, its steps row)."""
        return self._on_schedule(so, now)

    def apply_output(self: Engine, so: SchedulerOutput, mro: ModelRunnerOutput, rec: dict | None, row: int) -> None:
        """Apply a step's output now (update_from_output, metrics, finishes)."""
        self._on_update(so, mro, rec, row)

    def idle_event(self: Engine) -> simpy.Event:
        """What the loop waits for when nothing ran and nothing changed (an arrival, a deadline, the
        scheduler's own next event)."""
        return self._idle_wait()
