"""The liveness watchdog: the step count and clock past which a run without progress has stalled.

Progress is an output token, a finish or a rejection. Each one restarts the window: a stall is
due once the engine has scheduled more than `max_steps_without_progress` steps *or* passed
`max_sim_s_without_progress` simulated seconds since then (docs/LIVENESS.md). The engine asks
`due` before each step it schedules; the fast path asks `due` for the last step of a run before
planning it, so a run never carries the engine past the point where stepping would have stopped.
"""

from __future__ import annotations

from servesim.scheduler.interface import SchedulerInterface
from servesim.simulator.config import LivenessConfig
from servesim.simulator.liveness import StallError, diagnose


class Watchdog:
    """Owns the progress window. Invariant: the window's clock bound only moves forward (a run may
    apply an update due after an arrival before that arrival's rejection is marked, and stepping
    marks them in time order)."""

    def __init__(self, liveness: LivenessConfig) -> None:
        self.max_steps_idle: int = liveness.max_steps_without_progress
        self.max_s_idle: float = liveness.max_sim_s_without_progress
        self.stall_step: int = 0  # past this step count without progress: a stall ...
        self.stall_s: float = 0.0  # ... or past this simulated time
        self.preemptions_at_progress: int = 0  # the engine's preemption count at the last progress
        self.mark(0.0, 0, 0)  # the window opens at the start

    def mark(self, now: float, num_steps: int, num_preemptions: int) -> None:
        """Something advanced at `now`, with num_steps steps scheduled: restart the window."""
        self.stall_step = num_steps + self.max_steps_idle
        self.stall_s = max(self.stall_s, now + self.max_s_idle)
        self.preemptions_at_progress = num_preemptions

    def due(self, num_steps: int, now: float) -> bool:
        """Whether a step scheduled at `now`, making the count num_steps, finds the run stalled."""
        return num_steps > self.stall_step or now > self.stall_s

    def stall_error(self, name: str, scheduler: SchedulerInterface, num_steps: int, now: float,
                    num_preemptions: int) -> StallError:
        """The error of a stall found at `now` after num_steps steps (due() said so)."""
        steps = num_steps - (self.stall_step - self.max_steps_idle)
        since = now - (self.stall_s - self.max_s_idle)
        why = f"no progress for {steps} steps and {since:.1f} simulated s"
        limit = (f"Limits: liveness.max_steps_without_progress={self.max_steps_idle}, "
                 f"liveness.max_sim_s_without_progress={self.max_s_idle:g}.")
        return self.error(name, scheduler, why, num_preemptions, limit)

    def error(self, name: str, scheduler: SchedulerInterface, why: str, num_preemptions: int,
              limit: str = "") -> StallError:
        """A StallError with the diagnosis of `scheduler`'s state (why: what was seen)."""
        return StallError(diagnose(name, scheduler, why, num_preemptions - self.preemptions_at_progress, limit),
                          field="liveness")
