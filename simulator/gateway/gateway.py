"""The gateway in front of the engines: admission rules, a queue with a discipline, a cap on
requests in flight, queue timeouts and priority mapping (docs/ADMISSION.md).

    client send --> [rules: first refusal rejects, HTTP 429] --> [queue (discipline)] --> dispatch
                                                                    |  queue_timeout_s
                                                                    v
                                                             rejected (timed out in the queue)

A request arriving at `now` is checked by the rules (gateway/rules.py) in order. If fewer than
`max_in_flight` requests are dispatched and not done, and nobody is waiting, it is dispatched at
once; otherwise it waits in the queue (gateway/queues.py) until a slot frees, and is rejected if
it is still waiting `queue_timeout_s` after it arrived; a queued request whose client gives up
(its `timeout_s`, else the clients' timeout) leaves the queue at that instant, counted as timed out.
A slot frees when the engine is done with
the request (finished, rejected by the engine or aborted; with P/D the last engine, normally the
decode side: cluster/request_done.py): the engine's finish, not the client's receipt of the last
chunk (the frontend's return trip, when modelled, is not held against the cap).
A slot freed inside an engine step dispatches at that same instant, after the step's update (a
zero-delay event: requests are never added to a scheduler in the middle of its update).

At dispatch a request takes its SLO class's priority, else its tenant's (GatewayConfig.dispatch_priority),
which vLLM's scheduler honours under `scheduler.policy: priority`.

The owner (simulator/gateway/wiring.py) gives the gateway two callbacks: dispatch(spec, sent_s)
(into the frontend or the router) and reject(spec, sent_s, reason) (record the request as rejected).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import simpy

from servesim.simulator.gateway.config import GatewayConfig
from servesim.simulator.gateway.queues import Queued, make_discipline
from servesim.simulator.gateway.rules import make_rules
from servesim.traces.workload import RequestSpec

QUEUE_TIMEOUT = "gateway_queue_timeout"


class Gateway:
    __slots__ = ("env", "cfg", "_dispatch", "_reject", "_gone", "client_timeout_s", "rules", "queue", "_in_flight",
                 "_seq", "_drained", "num_offered", "num_dispatched", "rejected", "gone", "queue_wait_s", "max_queued",
                 "_pending_release")

    def __init__(self, env: simpy.Environment, cfg: GatewayConfig, dispatch: Callable[[RequestSpec, float], None],
                 reject: Callable[[RequestSpec, float, str], None], gone: Callable[[RequestSpec, float], None],
                 client_timeout_s: float | None = None) -> None:
        self.env = env
        self.cfg = cfg
        self._dispatch = dispatch
        self._reject = reject
        self._gone = gone  # (spec, sent_s): its client gave up while it was queued
        self.client_timeout_s = client_timeout_s  # a request's own timeout_s wins
        self.rules = make_rules(cfg.rules)
        self.queue = make_discipline(cfg.queuing, cfg.tenants)
        self._in_flight: set[str] = set()  # dispatched, the engine not done with them
        self._seq = 0
        self._drained: simpy.Event | None = None
        self._pending_release = 0  # slots freed whose dispatch event has not run yet
        self.num_offered = 0
        self.num_dispatched = 0
        self.rejected: dict[str, str] = {}  # request_id -> reason, in rejection order
        self.gone: dict[str, float] = {}  # request_id -> when its client gave up while it was queued
        self.queue_wait_s: dict[str, float] = {}  # request_id -> time it waited in the gateway (dispatched ones)
        self.max_queued = 0

    # --- requests in ------------------------------------------------------------------------------
    def offer(self, spec: RequestSpec, sent_s: float) -> None:
        """A request reaches the gateway now (its client sent it at sent_s)."""
        now = self.env.now
        self.num_offered += 1
        num_queued = len(self.queue)
        must_queue = num_queued > 0 or self._pending_release > 0 or not self._has_slot()
        for rule in self.rules:
            reason = rule.admit(spec, now, num_queued, must_queue)
            if reason is not None:
                self._refuse(spec, sent_s, reason)
                return
        if not must_queue:
            self._send(spec, sent_s, 0.0)
            return
        self._seq += 1
        entry = Queued(spec, sent_s, now, self._seq)
        self.queue.push(entry)
        self.max_queued = max(self.max_queued, len(self.queue))
        if self.cfg.queue_timeout_s is not None:
            self.env.timeout(self.cfg.queue_timeout_s).callbacks.append(lambda _ev: self._expire(entry))
        timeout_s = spec.timeout_s if spec.timeout_s is not None else self.client_timeout_s
        if timeout_s is not None:  # the client disconnects at its deadline: the gateway drops it then
            delay_s = max(sent_s + timeout_s - now, 0.0)
            self.env.timeout(delay_s).callbacks.append(lambda _ev: self._client_gave_up(entry))

    def _has_slot(self) -> bool:
        cap = self.cfg.max_in_flight
        return cap is None or len(self._in_flight) < cap

    def _send(self, spec: RequestSpec, sent_s: float, waited_s: float) -> None:
        self._in_flight.add(spec.request_id)
        self.num_dispatched += 1
        self.queue_wait_s[spec.request_id] = waited_s
        priority = self.cfg.dispatch_priority(spec.tenant, spec.slo_class)
        if priority is not None and priority != spec.priority:
            spec = replace(spec, priority=priority)
        self._dispatch(spec, sent_s)

    def _refuse(self, spec: RequestSpec, sent_s: float, reason: str) -> None:
        self.rejected[spec.request_id] = reason
        self._reject(spec, sent_s, reason)

    def _expire(self, entry: Queued) -> None:
        if entry.removed:
            return  # dispatched before its timeout
        self.queue.remove(entry)
        self._refuse(entry.spec, entry.sent_s, QUEUE_TIMEOUT)
        self._check_drained()

    def _client_gave_up(self, entry: Queued) -> None:
        if entry.removed:
            return  # dispatched (the engine counts the timeout) or already rejected
        self.queue.remove(entry)
        self.gone[entry.spec.request_id] = self.env.now
        self._gone(entry.spec, entry.sent_s)
        self._check_drained()

    # --- requests done ----------------------------------------------------------------------------
    def done(self, request_id: str, _reason: str | None = None) -> None:
        """The engine is done with a request (an engine's on_finish): its slot frees. Ids the
        gateway never dispatched (its own rejections, recorded on an engine) are ignored."""
        if request_id not in self._in_flight:
            return
        self._in_flight.discard(request_id)
        if len(self.queue):
            self._pending_release += 1
            self.env.timeout(0).callbacks.append(self._release)

    def _release(self, _event: simpy.Event) -> None:
        self._pending_release -= 1
        while len(self.queue) and self._has_slot():
            entry = self.queue.pop()
            entry.removed = True  # out of the queue: its timeout, when it fires, finds it gone
            self._send(entry.spec, entry.sent_s, self.env.now - entry.queued_s)
        self._check_drained()

    # --- the end of the arrivals ------------------------------------------------------------------
    @property
    def num_queued(self) -> int:
        return len(self.queue)

    def drained(self) -> simpy.Event:
        """An event that triggers once nothing waits in the gateway (at once if nothing does)."""
        event = self.env.event()
        if not len(self.queue):
            event.succeed()
        else:
            self._drained = event
        return event

    def _check_drained(self) -> None:
        if not len(self.queue) and self._drained is not None and not self._drained.triggered:
            self._drained.succeed()
            self._drained = None

    # --- the summary --------------------------------------------------------------------------------
    def summary(self) -> dict:
        """summary.json's `gateway` block."""
        from servesim.simulator.metrics import stats

        by_reason: dict[str, int] = {}
        for reason in self.rejected.values():
            by_reason[reason] = by_reason.get(reason, 0) + 1
        waits = list(self.queue_wait_s.values())
        return {"num_offered": self.num_offered, "num_dispatched": self.num_dispatched,
                "num_rejected": len(self.rejected), "num_gone_while_queued": len(self.gone), "rejected_by_reason": dict(sorted(by_reason.items())),
                "max_in_flight": self.cfg.max_in_flight, "max_queued": self.max_queued,
                "queuing": self.cfg.queuing.name, "rules": [r.name for r in self.cfg.rules],
                "queue_wait_s": stats(waits) if waits else None}


def warn_unmapped_priority(cfg: GatewayConfig, policy: str) -> None:
    """Priorities mapped at dispatch do nothing under a policy other than vLLM's `priority`: say so."""
    if cfg.maps_priority and policy != "priority":
        logging.getLogger("servesim").warning(
            "WARNING: gateway tenants/slo_classes map priorities, but scheduler.policy is %r: "
            "vLLM orders by priority only under policy 'priority'", policy)
