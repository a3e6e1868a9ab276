"""Closed-loop session turns: a turn is sent a think time (or a tool call's latency) after its client
has the answer it builds on, so its arrival depends on the simulated latencies.

A workload's requests with `parent_request_id` set (traces/workload.py) are *dependent turns*; all
others (session starts, plain requests) are sent at their `arrival_time_s` as before. When a parent
finishes at engine time f, each of its children is sent at

    f + answer_delay_s + think_time_s

where answer_delay_s is the frontend's constant output delay (0 without a frontend): the time the
client has the last token, which is the finish time the run's outputs record. With the frontend's
serial event loop (frontend.serial) that time is when the loop delivers the output job of the step
that finished the parent (simulator/frontend.py ApiServerLoop), which depends on the loop's queue:
the turn waits for that delivery (Clients.on_answer_delivered) and is sent think_time_s after it,
again the finish time the outputs record. A parent that got no
answer (rejected, or its client gave up) ends its session there: its descendants are never sent
and are counted as abandoned (summary `sessions.num_turns_abandoned`).

The context growth is in the specs themselves: a turn's prompt is its parent's prompt, the parent's
output and the new tokens (tool output, user message); the token streams (traces/tokens.py) make
the shared part identical ids, so the prefix cache really hits it.

`SessionTurns` is the one implementation both arrival processes use: a single engine's
(WorkloadReplay.arrivals, through its Clients, so client.max_concurrency and the frontend apply) and a
cluster's (Cluster._arrivals, through the router after routing_latency_s). Without dependent turns
neither builds one, and nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import simpy

from servesim.simulator.frontend import FrontendConfig
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec

# Why the fast path declines a run with closed-loop turns (simulator/fastpath/planner_for, and each
# cluster replica): a turn's arrival time is only known once its parent has finished, so no run's
# proof can bound the next arrival.
TURNS_DECLINED = ("closed-loop session turns: a turn is sent a think time after its parent's answer, an arrival "
                  "time no run's proof can bound")

# What a parent's finish reason means for its children: these got no answer to build on.
_NO_ANSWER = (None, "abort")

if TYPE_CHECKING:
    from servesim.simulator.engine import Engine

SendTurn = Callable[[RequestSpec], Generator[simpy.Event, Any, None]]


@dataclass(slots=True)
class TurnPlan:
    """A workload's dependency structure, computed once before the run."""

    first_requests: list[RequestSpec]  # sent at their arrival_time_s, in workload order
    children: dict[str, list[RequestSpec]]  # parent request id -> its dependent turns, in workload order
    num_dependent: int  # requests sent after a parent's answer


def plan_turns(requests: Sequence[RequestSpec]) -> TurnPlan | None:
    """The workload's closed-loop structure; None when no request waits for another (the common
    case: a run without sessions takes its usual path). A turn whose parent is not in the workload
    (cut by a time window) is sent at its arrival_time_s; a parent after its child in the workload
    order is refused (it could never be answered first)."""
    if all(r.parent_request_id is None for r in requests):
        return None
    index: dict[str, int] = {}
    for i, spec in enumerate(requests):
        if index.setdefault(spec.request_id, i) != i:
            raise InputError(f"request id {spec.request_id!r} appears twice", field="request_id",
                             allowed="unique ids in a workload with closed-loop session turns")
    first: list[RequestSpec] = []
    children: dict[str, list[RequestSpec]] = {}
    for i, spec in enumerate(requests):
        parent = spec.parent_request_id
        at = index.get(parent) if parent is not None else None
        if at is None:
            first.append(spec)
            continue
        if at > i:
            raise InputError(f"request {spec.request_id!r} waits for {parent!r}, which comes later in the workload",
                             field="parent_request_id",
                             allowed="a parent that arrives no later than its turn (arrival_time_s >= the parent's)")
        children.setdefault(parent, []).append(spec)
    return TurnPlan(first, children, len(requests) - len(first))


def answer_delay_s(frontend: FrontendConfig) -> float | None:
    """Engine finish -> the client has the last token: the frontend's constant output delay; None
    with the serial event loop, whose delivery depends on its queue (the turn waits for it)."""
    if not frontend.enabled:
        return 0.0
    if frontend.serial:
        return None
    return frontend.output_delay_s()


def hook_engine(turns: SessionTurns, engine: Engine, on_finish: Callable[[str, str | None], None] | None
                ) -> Callable[[str, str | None], None]:
    """Release turns on `engine`'s answers: returns its finish callback (chaining `on_finish`);
    with the serial loop its Clients also report when each answer reaches the client."""
    delay_s = answer_delay_s(engine.cfg.frontend)
    if delay_s is None:
        engine.clients.on_answer_delivered = turns.delivered
    return turns.chain(on_finish, delay_s)


class SessionTurns:
    """Sends each dependent turn its think time after its parent's answer (one SimPy process a
    turn, started when the parent finishes), and tells the arrival process when all are sent."""

    def __init__(self, env: simpy.Environment, plan: TurnPlan, send: SendTurn) -> None:
        self.env = env
        self.plan = plan
        self._send = send  # sends a turn now (a generator: it may wait for a client slot)
        self._num_unsent = plan.num_dependent  # neither sent nor abandoned yet
        self._all_sent: simpy.Event | None = None
        self.abandoned: set[str] = set()  # turns never sent: an ancestor got no answer
        # Answered parents whose answer the serial loop has not delivered yet -> their turns.
        self._awaiting_delivery: dict[str, list[RequestSpec]] = {}

    @property
    def first_requests(self) -> list[RequestSpec]:
        return self.plan.first_requests

    @property
    def num_abandoned(self) -> int:
        return len(self.abandoned)

    def on_answer(self, request_id: str, reason: str | None, delay_s: float | None) -> None:
        """Request `request_id` finished now with `reason` (None: rejected; "abort": its client gave
        up); its client has the answer `delay_s` later (None: when the serial loop delivers it,
        `delivered`)."""
        kids = self.plan.children.pop(request_id, None)
        if kids is None:
            return
        if reason in _NO_ANSWER:
            for spec in kids:
                self._abandon(spec)
        elif delay_s is None:
            self._awaiting_delivery[request_id] = kids
        else:
            for spec in kids:
                self.env.process(self._send_turn(spec, delay_s))

    def delivered(self, request_id: str, done_s: float) -> None:
        """The serial loop delivers `request_id`'s last output at done_s (>= now; the loop reads a
        job no earlier than its arrival). Invariant: on_answer saw the finish first (the engine
        records a finish before it posts the step's output job)."""
        kids = self._awaiting_delivery.pop(request_id, None)
        for spec in kids or ():
            # One wait lands on done_s exactly while the clock is at least half of it (Sterbenz),
            # that is whenever the loop's backlog is shorter than the run so far.
            self.env.process(self._send_turn(spec, done_s - self.env.now))

    def chain(self, on_finish: Callable[[str, str | None], None] | None, delay_s: float | None
              ) -> Callable[[str, str | None], None]:
        """An engine's finish callback that also releases the finished request's turns."""
        def finished(request_id: str, reason: str | None) -> None:
            self.on_answer(request_id, reason, delay_s)
            if on_finish is not None:
                on_finish(request_id, reason)
        return finished

    def _send_turn(self, spec: RequestSpec, delay_s: float) -> Generator[simpy.Event, Any, None]:
        # Two waits, not one of their sum: the turn leaves exactly think_time_s after the finish
        # time the outputs record (engine finish + delay_s), to the last bit of the float.
        if delay_s > 0:
            yield self.env.timeout(delay_s)
        assert spec.think_time_s is not None
        if spec.think_time_s > 0:
            yield self.env.timeout(spec.think_time_s)
        yield from self._send(replace(spec, arrival_time_s=self.env.now))
        self._settled()

    def _abandon(self, spec: RequestSpec) -> None:
        """`spec` and all its descendants are never sent (iterative: an agent's session may be
        deeper than Python's recursion limit)."""
        stack = [spec]
        while stack:
            turn = stack.pop()
            self.abandoned.add(turn.request_id)
            stack.extend(self.plan.children.pop(turn.request_id, ()))
            self._settled()

    def _settled(self) -> None:
        self._num_unsent -= 1
        if self._num_unsent == 0 and self._all_sent is not None:
            self._all_sent.succeed()

    def wait_all_sent(self) -> Generator[simpy.Event, Any, None]:
        """Wait until every dependent turn was sent or abandoned (the arrival process then closes)."""
        if self._num_unsent:
            self._all_sent = self.env.event()
            yield self._all_sent
