"""The one contract between the reference engine and a fast path: `RunPlanner`.

The engine (simulator/engine.py) steps one schedule / execute / update at a time and is complete
without a planner. A planner, when the engine has one (simulator/build.py attaches what
`simulator.fastpath.planner_for` returns), may apply several steps at once: at the loop's top,
with one step fewer in flight than the loop's depth, the engine asks it to `advance`. Whatever a
planner applies must leave the engine, its scheduler, its executor and its book exactly as plain
stepping would at the time the engine resumes (same state, same rows, same floats: the
differential tests compare whole outputs of engines with and without a planner). A planner that
cannot prove a run exact declines it (returns None) and the engine steps.

The engine never imports an implementation: it holds its planner by this Protocol, and an engine
built without one (`Engine(...)` alone) imports nothing of the fast path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import simpy

from servesim.scheduler.hashing import TokenProvenance
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput

# The loop's steps in flight, oldest first: (schedule, its output, GPU end s, step-trace record, steps row)
InFlight = deque[tuple[SchedulerOutput, ModelRunnerOutput, float, "dict | None", int]]


class RunPlanner(Protocol):
    """A fast path for one engine (it is built for that engine and holds it)."""

    def advance(self, now: float, in_flight: InFlight) -> list[float] | None:
        """At the loop's top (time `now`, one step fewer in flight than the loop's depth): apply a
        run of steps and return the delays the loop waits, one after the other, before it goes
        on (the clock then reads exactly what stepping would have reached; the run may leave
        steps in flight as stepping would); None: nothing applied, step normally. After a call,
        `has_pending_run` says whether the run was planned but not yet applied."""
        ...

    def has_pending_run(self) -> bool:
        """A run was planned and is applied later (a cluster replica's deferred run)."""
        ...

    def apply_update(self, so: SchedulerOutput, mro: ModelRunnerOutput, row: int, now: float) -> bool:
        """Apply a step's output at `now` (`row`: its steps row; no step-trace record) exactly as
        Engine.apply_output would, in bulk where the planner proves it simple (nobody stops);
        False: nothing done, the engine applies it."""
        ...

    def await_pending_run(self, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        """The loop's wait through the pending run: to its end, where it is applied, or to where
        an arrival that applied it early leaves the loop (a generator the loop yields from)."""
        ...

    def before_submit(self, now: float) -> None:
        """A request is about to be added at `now`: apply whatever of a pending run precedes it.
        Raises AssertionError if `now` lies inside a run already applied (its proof was wrong)."""
        ...

    def load_drop(self) -> int:
        """How far the load a router should read (Engine.num_outstanding) is below the
        scheduler's count now: the requests a pending run's updates before now have finished."""
        ...

    def expect_next_arrival(self, t_s: float) -> None:
        """The next request from outside arrives no earlier than t_s, and nothing outside reads
        the engine before then."""
        ...

    def expect_arrivals_by_load(self, bound: Callable[[int], float] | None) -> None:
        """A router's proof: bound(load) is the earliest time a request can reach the engine while
        its num_outstanding stays >= load."""
        ...

    def defer_runs(self, collides: Callable[[Sequence[float]], int] | None, reads_state: bool = False) -> None:
        """Runs may be applied when a request is routed here (a router that reads only the load;
        `reads_state`: its KV usage and prefix cache too, through planned_kv_usage and
        planned_prefix_tokens). collides(times): index of the first of the ascending `times`
        that is a dispatch time."""
        ...

    def planned_kv_usage(self) -> float:
        """KV usage as stepping shows it now, while a run is pending (has_pending_run)."""
        ...

    def planned_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None,
                              provenance: TokenProvenance | None) -> int:
        """The scheduler's cached_prefix_tokens as stepping shows it now, while a run is pending
        (has_pending_run); may apply the run's steps before now first."""
        ...
