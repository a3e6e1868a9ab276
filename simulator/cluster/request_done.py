"""When a cluster is done with a request, and who hears it: the gateway (a slot frees) and the
closed-loop session turns (an answer releases the next turn, no answer abandons it).

The cluster is done with a request when

- colocated: its replica finishes, rejects or aborts it (the replica's on_finish);
- P/D: its decode replica finishes, rejects or aborts it, or its prefill replica ends it without
  the first token (never fit, or its client gave up), so no decode side ever sees it
  (PDHandoffs._final);
- either: the gateway rejects it (HTTP 429, a queue timeout) or its client gives up while it waits
  in the gateway's queue; no replica ever sees it.

A request is therefore outstanding at the gateway (it holds one of `max_in_flight`) from its
dispatch until the end of its last engine: with P/D, through prefill, the KV transfer and decode.
The turns read the answer's delivery to the client from the replica that produced it (its
frontend: simulator/sessions.py answer_delay_s).

Without a gateway or turns nothing here is hooked and the replicas' on_finish stays free. Hooked
replicas step one by one: a dispatch or a turn comes at the time of a finish, which no run's proof
bounds (the reason, the gateway's or the turns', is each replica's planner_declined; a P/D decode
replica's is fastpath/pd_runs.py pd_declined's).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from servesim.simulator.gateway.wiring import GATEWAY_DECLINED
from servesim.simulator.sessions import TURNS_DECLINED, SessionTurns, answer_delay_s

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster, Replica
    from servesim.simulator.gateway.gateway import Gateway


class RequestDone:
    """The cluster's one "done with a request" signal, fanned out to its gateway and turns."""

    __slots__ = ("cluster", "gateway", "turns")

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.gateway: Gateway | None = None
        self.turns: SessionTurns | None = None

    @property
    def hooked(self) -> bool:
        return self.gateway is not None or self.turns is not None

    def declined(self) -> str:
        """Why a hooked replica has no planner (the gateway's reason where there is one)."""
        if self.gateway is not None:
            return GATEWAY_DECLINED
        return TURNS_DECLINED

    def hook_all(self) -> None:
        """Hook every replica built so far (the cluster's constructor, once gateway and turns are set)."""
        for rep in self.cluster.replicas:
            self.hook(rep)

    def hook(self, rep: Replica) -> None:
        """Hook one replica (also one an autoscaler adds mid-run): its finishes (colocated: P/D
        finishes come through PDHandoffs._final), its serial loop's deliveries, and no planner."""
        if not self.hooked:
            return
        if rep.role != "decode":  # a decode replica's planner: fastpath/pd_runs.py declines it with its own reason
            rep.engine.set_planner(None, self.declined())
        if self.cluster.cfg.pd is None:
            assert rep.engine.on_finish is None  # a colocated replica's finish has no other listener
            rep.engine.on_finish = partial(self.done, rep.index)
        if self.turns is not None and answer_delay_s(rep.cfg.frontend) is None:
            rep.engine.clients.on_answer_delivered = self.turns.delivered

    def done(self, replica: int, request_id: str, reason: str | None) -> None:
        """Replica `replica` (the decode side, or the prefill side that ended it) is done with
        `request_id` now, with `reason` (None: rejected; "abort": its client gave up)."""
        if self.turns is not None:
            self.turns.on_answer(request_id, reason, answer_delay_s(self.cluster.replicas[replica].cfg.frontend))
        if self.gateway is not None:
            self.gateway.done(request_id)

    def refused(self, request_id: str, reason: str | None) -> None:
        """The gateway ended `request_id` before any replica (None: rejected; "abort": its client
        gave up in the queue): its session's later turns are never sent."""
        if self.turns is not None:
            self.turns.on_answer(request_id, reason, 0.0)
