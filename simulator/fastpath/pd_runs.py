"""P/D decode replicas on the fast path: paced runs, or the earliest time anything from outside
can touch one.

A decode replica's steps between outside events are vLLM's plain decode steps, its parked
requests passed over (scheduler/bulk/pd.py), so its planner (MacroPlanner) runs them in bulk; the
step after a landing opens a run (async), its first schedule admitting the landed requests (joins).

Paced runs (async scheduling, a decode router with a proof: _decode_router_reads). The run is
deferred (fastpath/deferred.py, "Paced runs") and applied when a hand-off (Engine.submit) or a
landing (DecodeEngine.kv_received) reaches the replica, at whatever instant; the decode router
reads it from the plan (KV usage and the prefix cache: fastpath/planned_reads.py; the load:
DeferredRuns.load_drop). Nothing else reads a decode replica: the front router picks among the
prefill replicas, and transfers to this replica start only at its own schedules, which a run's
plain steps are not. Runs go on through finishes, heard when the run is applied (below).

An early application takes the update the clock reaches next too (the in-flight step's, at the
timeout already set: DeferredRuns.apply_at's past_arrival) where that update finishes nobody and
the decode router reads the load, KV usage or nothing (not the prefix cache: prefix_aware would
see the blocks the update caches early; a router with no proof is not paced). Whatever meets the
replica between the outside event and that update (at its instant too, before its timeout) is
then: a hand-off (add_request, which commutes with an update that finishes nobody:
VllmDecodeRuns.arrivals_commute_with_decode_updates), a landing (mark_kv_received adds the id to
finished_recving_kv_req_ids and opens the StallGate, which no update reads or writes), or a read of
its load (no finish: the same) or KV usage (the free count: an update that finishes nobody frees
no block, and caching moves none). So every event sees what stepping shows it, and the loop
resumes at the update's instant in stepping's state there.

Bounded runs (otherwise), by the next outside event instead of the next arrival. What reaches a
decode replica from outside, and the earliest time each can come (`PDBounds.bound_s`, recomputed at
every loop top where the planner may start a run: MacroPlanner.next_arrival_fn):

- A hand-off: the decode router's decision (least_kv reads every decode replica's KV usage, so
  any hand-off bounds every decode replica), then a submit. It follows a prefill replica's update
  that finishes a prompt, by `handoff_latency_s` (a timeout of the clock's now + delay: its time is
  recorded when it is set, PDHandoffs.pending_handoffs_s). A prefill replica waiting for a step's
  update (PrefillEngine.awaited_update_s_at) finishes nothing before that update: every later step
  ends after it (one GPU, steps in order). One with work but no update awaited may schedule now.
  An idle one (no unfinished request, not stalled) does nothing until a dispatch reaches it (the
  next dispatch time: ArrivalBounds.dispatch_at), its step ending after that. A stalled one (its pool
  full of finished prompts' KV) waits for any landing: no bound but now.
- A landing (kv_received): a transfer to this replica on one of its links lands no earlier than
  KVLink.next_event_s (transfers to it start only at its own schedules, which a run's plain steps
  are not: they admit nobody).
Whatever else happens in between (dispatches to busy prefill replicas, other decode replicas'
schedules, transfers and finishes, landings that free prefill blocks) touches none of this
replica's state and brings none of these events earlier. Each time is a lower bound; the planner
keeps every schedule and update of a run strictly before it, and Engine.submit / kv_received
assert that none went past (MacroPlanner.before_submit).

Finishes inside a bounded run are only the async skip-ahead's, at the run's first update, heard
when the run is applied, before their time; a paced run's (through finishes) are heard when it is
applied, after their time (MacroPlanner.finishes_heard_any_time). The cluster's decode-finish
callback (PDHandoffs.on_decode_finish) then only counts the request final: its transfer has started
(a decode-side lookup hits at most num_tokens - 1 tokens, so every admitted request loads at least
one), and the last final closes the engines, all idle but this one, whose end nothing reads. The
last final is never heard late: a paced run is applied early only for a hand-off or a landing, of
a request not final yet, and whole at its last update, the last finish of its batch.

Declined (the reason goes in the run's summary): a gateway before the router, session turns, an
autoscaler (replicas come and go) and lockstep (DP) groups, whose timing this bound does not cover.
"""

from __future__ import annotations

import heapq
from functools import partial
from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.simulator.cluster.pd import PrefillEngine
from servesim.simulator.fastpath.planner import MacroPlanner

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster, Replica
    from servesim.simulator.cluster.link import KVLink


class PDBounds:
    """The outside-event bounds of one P/D cluster's decode replicas (module docstring)."""

    def __init__(self, cluster: Cluster) -> None:
        assert cluster.cfg.pd is not None
        self.cluster = cluster
        self.env = cluster.env
        self.prefills: list[PrefillEngine] = []
        for r in cluster.replicas:
            if r.role == "prefill":
                assert isinstance(r.engine, PrefillEngine)
                self.prefills.append(r.engine)
        self.handoff_latency_s = cluster.cfg.pd.handoff_latency_s

    def handoff_bound_s(self) -> float:
        """No hand-off comes before this time (module docstring)."""
        now, cluster = self.env.now, self.cluster
        t = float("inf")
        idle = False
        for p in self.prefills:
            awaited_s = p.awaited_update_s_at(now)
            if awaited_s is not None:
                t = min(t, awaited_s)
            elif p.in_flight or p.scheduler.stalled or p.scheduler.has_unfinished_requests():
                t = now  # it schedules at this instant (or waits for a landing): a step may end soon
            else:
                idle = True
        if idle:
            t = min(t, cluster.arrival_bounds.dispatch_at(cluster.arrival_bounds.next_spec))
        if self.handoff_latency_s > 0:
            t = t + self.handoff_latency_s
        pending = cluster.handoffs.pending_handoffs_s
        while pending and pending[0] < now:  # fired (one due now may not have)
            heapq.heappop(pending)
        return min(t, pending[0]) if pending else t

    def bound_s(self, links: list[KVLink]) -> float:
        """No outside event touches the decode replica whose links these are before this time."""
        t = self.handoff_bound_s()
        for link in links:
            t = min(t, link.next_event_s())
        return t


def pd_declined(cluster: Cluster) -> str | None:
    """Why a P/D cluster's decode replicas cannot run in bulk, or None."""
    if cluster.gateway is not None:
        return "P/D behind a gateway: its admissions and releases are not bounded by the P/D fast path"
    if cluster.turns is not None:
        return "P/D with session turns: a turn is sent at a time of its own"
    if cluster.cfg.autoscale is not None:
        return "P/D with an autoscaler: replicas come and go at times of their own"
    if cluster.lockstep_groups:
        return "P/D with lockstep (DP) groups: a group steps its replicas together"
    return None


def attach_pd_bounds(cluster: Cluster) -> None:
    """Give each decode replica's planner its outside-event bound (or take the planner away, with
    the reason, where this module cannot bound it)."""
    why = pd_declined(cluster)
    bounds = PDBounds(cluster)
    reads = _decode_router_reads(cluster)
    for r in cluster.decoders:
        planner = r.engine.planner
        if planner is None:
            continue
        if why is not None or not isinstance(planner, MacroPlanner):
            r.engine.set_planner(None, why or "a P/D decode replica's planner must be the MacroPlanner")
            continue
        planner.next_arrival_fn = partial(bounds.bound_s, _links_to(cluster, r))
        planner.finishes_heard_any_time = True  # PDHandoffs.on_decode_finish: module docstring
        if reads is not None and r.cfg.scheduler.async_scheduling:  # paced runs (module docstring)
            planner.defer_runs(_no_dispatch, reads_state=reads)
            if planner.deferred.collides is not None:
                planner.deferred.paced = True
                planner.deferred.commuting_arrivals = not _decode_router_reads_prefix(cluster)


def _decode_router_reads(cluster: Cluster) -> bool | None:
    """Whether the decode router's decisions read a decode replica's KV usage or prefix cache
    (answered from a paced run's plan: fastpath/planned_reads.py), False where they read no more
    than its load (Engine.num_outstanding, answered from the plan too: DeferredRuns.load_drop) or
    nothing, None where its proof does not say (no proof registered: its runs stay eager)."""
    from servesim.simulator.fastpath.router_proofs import RoundRobinProof, proof_for

    proof = proof_for(cluster.decode_router)
    if proof is None:
        return None
    if proof.reads_planned_state:
        return True
    if proof.reads_only_load or isinstance(proof, RoundRobinProof):
        return False
    return None


def _decode_router_reads_prefix(cluster: Cluster) -> bool:
    """Whether the decode router's decisions read a decode replica's prefix cache (its proof's
    reads_prefix_cache): what an update caches is then seen, so no update goes early."""
    from servesim.simulator.fastpath.router_proofs import proof_for

    proof = proof_for(cluster.decode_router)
    return proof is None or proof.reads_prefix_cache


def _no_dispatch(times: Sequence[float]) -> int:
    """No update of a paced run needs to end before a dispatch: dispatches reach the prefill side
    (the front router reads only the front replicas) and the hand-offs and landings they set off
    meet a paced run at their time."""
    return len(times)


def _links_to(cluster: Cluster, decode: Replica) -> list[KVLink]:
    """Every link a transfer to `decode` can ride (its network link, its node's interconnect)."""
    links = {id(cluster.pd_links.link_for(p, decode)): cluster.pd_links.link_for(p, decode)
             for p in cluster.replicas if p.role == "prefill"}
    return list(links.values())
