"""How a request is done with on an engine, and the liveness that watches for progress.

A request ends here by finishing in a step (its last token applied), by being refused at arrival
(the frontend's or the scheduler's rule, or the gateway's HTTP 429), by its client giving up (its
deadline passed, or it gave up in the gateway's queue: vLLM's abort between engine steps), or, with
liveness.stranded_requests "abort", by being aborted as the scheduler's stranded head (it can never
be admitted and blocks every request behind it). Each end is recorded in the engine's book, frees its
client's slot and is told to the engine's owner (`on_finish`: a router, the gateway, session
turns); an end outside a step is progress for the watchdog (a step's outputs are marked by the
engine when it applies them: Engine.apply_output).
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from servesim.scheduler import RequestStatus
from servesim.scheduler.interface import SchedulerInterface
from servesim.simulator.client import Clients
from servesim.simulator.deadlines import ClientDeadlines
from servesim.simulator.step_book import StepBook
from servesim.simulator.watchdog import Watchdog


class RequestEnds:
    """Owns who hears that a request is done (`on_finish`: (request_id, finish_reason or None when
    refused) -> None) and the stranded-head policy; ends requests through the engine's scheduler,
    book, clients, watchdog and client deadlines (the engine's, handed over once)."""

    def __init__(self, name: str, env: simpy.Environment, scheduler: SchedulerInterface, book: StepBook,
                 clients: Clients, watchdog: Watchdog, deadlines: ClientDeadlines, stranded_policy: str,
                 on_finish: Callable[[str, str | None], None] | None) -> None:
        self.name = name
        self.env = env
        self.scheduler = scheduler
        self.book = book
        self.clients = clients
        self.watchdog = watchdog
        self.deadlines = deadlines
        self.stranded_policy = stranded_policy  # liveness.stranded_requests: "abort" or "wait"
        self.on_finish = on_finish

    def finished(self, request_id: str, now: float, reason: str | None, num_cached: int) -> None:
        """A request finished at `now` (its last token already recorded)."""
        self.book.record_finish(request_id, now, reason, num_cached)
        self.clients.on_done(finished=True)
        if self.on_finish is not None:
            self.on_finish(request_id, reason)

    def rejected(self, request_id: str, reason: str) -> None:
        """A recorded arrival refused: it never reaches (or never stays in) the scheduler."""
        self.book.record_reject(request_id, reason)
        self.clients.on_done()
        self.mark_progress(self.env.now)
        if self.on_finish is not None:
            self.on_finish(request_id, None)

    def gone(self, request_id: str) -> None:
        """A client gave up: the request is done for the run (and that is progress)."""
        self.book.record_gone(request_id)
        self.clients.on_done()
        self.mark_progress(self.env.now)
        if self.on_finish is not None:
            self.on_finish(request_id, "abort")

    def expire_due_deadlines(self, now: float) -> None:
        """Abort the requests whose client gave up by now (the loop does it before scheduling)."""
        if self.deadlines.is_due(now):
            self.expire_deadlines(now)

    def expire_deadlines(self, now: float) -> None:
        """Clients whose deadline passed disconnect; the server aborts their requests (vLLM's
        abort between engine steps: blocks are freed, the request never runs again)."""
        rid = self.deadlines.pop_due(now)
        while rid is not None:
            if self.scheduler.finish_requests([rid], RequestStatus.FINISHED_ABORTED, now_s=now):
                self.gone(rid)
            rid = self.deadlines.pop_due(now)

    # --- liveness --------------------------------------------------------------------------------
    def mark_progress(self, now: float) -> None:
        """Something advanced (a token, a finish, a rejection): restart the watchdog's window."""
        self.watchdog.mark(now, self.book.num_steps, self.book.num_preemptions)

    def abort_stranded(self, now: float) -> bool:
        """Abort the scheduler's stranded head (SchedulerInterface.stranded_request: it can never be
        admitted, and it blocks every request behind it) unless liveness.stranded_requests is
        "wait" (vLLM's behaviour: the watchdog then stops the run). True when one was aborted."""
        if self.stranded_policy != "abort":
            return False
        stranded = self.scheduler.stranded_request()
        if stranded is None:
            return False
        rid = stranded.request_id
        self.scheduler.finish_requests([rid], RequestStatus.FINISHED_ABORTED, now_s=now)
        self.book.record_stranded(rid, f"stranded_{stranded.reason}", stranded.detail)
        self.clients.on_done()
        self.mark_progress(now)
        if self.on_finish is not None:
            self.on_finish(rid, "abort")
        return True

    def raise_stall(self, why: str, limit: str = "") -> None:
        """Stop the run with the watchdog's diagnosis of the scheduler's state (why: what was seen)."""
        raise self.watchdog.error(self.name, self.scheduler, why, self.book.num_preemptions, limit)
