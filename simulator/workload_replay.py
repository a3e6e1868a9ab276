"""An engine replaying its own workload to the end (Engine.run: single-engine use).

The workload's requests are sent by the engine's clients (simulator/client.py: max_concurrency,
the frontend); its closed-loop session turns (simulator/sessions.py) are sent after their parent's
answer. Once all are sent no more requests arrive: the engine is told so and closed, and the run
ends when its loop does. A cluster replica or a closed loop has no workload of its own: its owner
submits each request (Engine.submit) and runs the clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import simpy

from servesim.simulator.engine_result import EngineResult
from servesim.simulator.sessions import SessionTurns, hook_engine, plan_turns
from servesim.traces.workload import Workload

if TYPE_CHECKING:
    from servesim.simulator.engine import Engine


class WorkloadReplay:
    """Owns the engine's workload as a replay and its closed-loop turns (None when no request of
    the workload waits for another); drives the engine it was built for."""

    def __init__(self, engine: Engine, workload: Workload, on_finish: Callable[[str, str | None], None] | None
                 ) -> None:
        self.engine = engine
        self.workload = workload
        # (columns read first: a workload without closed-loop turns is not read spec by spec)
        plan = plan_turns(workload.requests) if workload.columns.any_set("parent_request_id") else None
        self.turns = None if plan is None else SessionTurns(engine.env, plan, engine.clients.send)
        if self.turns is not None:
            engine.on_finish = hook_engine(self.turns, engine, on_finish)

    def arrivals(self) -> Generator[simpy.Event, Any, None]:
        """The replay's arrival process: every request sent, then no more arrive."""
        engine = self.engine
        if self.turns is None:
            yield from engine.clients.send_all(self.workload.requests)
        else:
            yield from engine.clients.send_all(self.turns.first_requests)
            yield from self.turns.wait_all_sent()
            yield from engine.clients.drain()
        engine.expect_next_arrival(float("inf"))
        engine.close()

    def run(self) -> EngineResult:
        """Replay the workload to the end: the engine's result."""
        engine, env = self.engine, self.engine.env
        t0 = time.perf_counter()
        env.process(self.arrivals())
        proc = engine.start()
        # The run ends with an event the loop's end triggers, not the process itself: SimPy's
        # error for a run out of events names its `until` by the generator's __name__, which a
        # compiled generator has not. (A failed loop still raises its own error.)
        done = env.event()

        def end(_event: simpy.Event) -> None:
            done.succeed()

        proc.callbacks.append(end)
        try:
            env.run(until=done)
        except RuntimeError:
            if proc.triggered:
                raise
            # SimPy ran out of events with the loop still waiting: nothing could ever wake it.
            engine.ends.raise_stall("the engine is idle with requests unfinished and nothing left that could wake "
                                    "it (no arrival, no KV transfer, no pin expiry)")
        return engine.result(time.perf_counter() - t0)
