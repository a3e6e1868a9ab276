"""When a request can next reach each front replica of a cluster: what lets a replica's planner
run past the clock (RunPlanner.expect_next_arrival, expect_arrivals_by_load, defer_runs).

The open-loop requests reach the router at known times (arrival + routing_latency_s), and the clock
reads each of them exactly as computed in advance (_landing_times). Without a router proof every
front replica's bound is the next dispatch; with one (simulator/fastpath/router_proofs.py, asked for
by the cluster), each replica's bound is the first decision that may pick or read it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the fast path's contract; the cluster asks for a proof only where replicas have planners
    from servesim.simulator.cluster.cluster import Replica
    from servesim.simulator.fastpath.router_proofs import RouterProof
    from servesim.traces.workload import RequestSpec


class ArrivalBounds:
    """Owns the dispatch times of the open-loop requests, the index of the next one to dispatch
    (`next_spec`, which the cluster's arrival process advances), and the router's proof with, when it
    proves that decisions read only some replicas, per front replica: (index of the first decision
    that may pick or read it, its position in front), a heap."""

    def __init__(self, dispatch_s: list[float], front: list[Replica], requests: list[RequestSpec]) -> None:
        self.dispatch_s = dispatch_s  # when each open-loop request reaches the router
        self.landing_s = _landing_times(dispatch_s)  # where SimPy's clock reads each dispatch
        self._landing_set = frozenset(self.landing_s)
        self._front = front  # the cluster's list (an autoscaler changes it in place)
        self._requests = requests  # the workload's, which the proofs read
        self.next_spec = 0  # index in the open-loop requests of the next request to dispatch
        self.proof: RouterProof | None = None
        self._unread_until: list[tuple[int, int]] | None = None

    def use_proof(self, proof: RouterProof | None) -> None:
        """Hand each front replica the router's proof (None: none for this router) of when a request
        can next reach it; without one each replica's bound is the next dispatch, whoever it goes to
        (still exact)."""
        self.proof = proof
        dispatch_s = self.dispatch_s
        dispatch_sorted = all(a <= b for a, b in zip(dispatch_s, dispatch_s[1:]))
        for pos, r in enumerate(self._front):
            r.engine.expect_arrivals_by_load(partial(self.arrival_bound, pos))
            if proof is not None and (proof.reads_only_load or proof.reads_planned_state) and dispatch_sorted:
                r.engine.defer_runs(self.first_dispatch_at, reads_state=not proof.reads_only_load)
        if proof is not None and not proof.reads_all_candidates:
            self._unread_until = [(-1, pos) for pos in range(len(self._front))]

    def announce(self, i: int) -> None:
        """Tell each front replica when its next arrival can come (request i is the next to be
        dispatched; all before it were): what lets a replica's macro-steps run, as a replay tells its own
        engine (WorkloadReplay.arrivals). The first decision that may pick a replica or read its state bounds
        it: with a router that reads every replica that is request i's, for every replica; with
        one that reads only some, each replica's own, which stays valid until that decision is
        made (RouterProof.arrivals_unread), so only the replicas whose decision was made are asked again."""
        heap, proof = self._unread_until, self.proof
        if heap is None or proof is None:
            t = self.dispatch_at(i)
            for r in self._front:
                r.engine.expect_next_arrival(t)
            return
        specs = self._requests
        while heap and heap[0][0] < i:
            pos = heap[0][1]
            until = i + proof.arrivals_unread(pos, self._front, specs, i)
            heapq.heapreplace(heap, (until, pos))
            self._front[pos].engine.expect_next_arrival(self.dispatch_at(until))

    def dispatch_at(self, i: int) -> float:
        """When request i reaches the router (never, past the last)."""
        return self.landing_s[i] if i < len(self.landing_s) else float("inf")

    def first_dispatch_at(self, times: Sequence[float]) -> int:
        """Index of the first of `times` at which a request reaches the router (len(times) if
        none): a deferred run must end before it (simulator/fastpath/deferred.py). Exact: the clock's
        reading at each dispatch is known in advance (_landing_times)."""
        at = self._landing_set
        if at.isdisjoint(times):  # the usual answer, in one C loop
            return len(times)
        return next((i for i, t in enumerate(times) if t in at), len(times))

    def arrival_bound(self, pos: int, load: int) -> float:
        """The earliest time a request can reach front replica `pos` while its load stays >= load:
        the dispatch time of the first request the router's proof cannot show goes elsewhere (the
        next one, without a proof)."""
        i, proof = self.next_spec, self.proof
        if proof is None:
            return self.dispatch_at(i)
        return self.dispatch_at(i + proof.arrivals_elsewhere(pos, load, self._front, self._requests, i))


def _landing_times(dispatch_s: list[float]) -> list[float]:
    """The clock at each dispatch as Cluster._arrivals reaches it: a timeout of (t - now) from
    the previous one lands at now + (t - now), which can differ from t in the last bit; a time
    already passed dispatches at once."""
    out, now = [], 0.0
    for t in dispatch_s:
        if t > now:
            now = now + (t - now)
        out.append(now)
    return out
