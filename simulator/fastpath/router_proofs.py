"""Router proofs: what a cluster replica's macro-steps may assume about the router's coming decisions.

A router (simulator/cluster/routers.py) only chooses. What the fast path needs to know about its
decisions ahead of time lives here, one proof object per router, registered by the ROUTER'S NAME
(the name `register_router` gave it) in `ROUTER_PROOFS`:

    proof = proof_for(router)   # None: no proof, every arrival bounds every replica's runs
    proof.arrivals_elsewhere(candidate, load, candidates, upcoming, first)

A router with no registered proof gets none, and the cluster treats each of its decisions as one
that may pick or read any replica: its replicas' runs stop at every arrival (still exact, only
slower). A proof is built from the router instance (`ProofFactory`) and may read that router's
state (round_robin's turn, jsq_power_of_two's shared Generator); it never changes it, and the
router never knows it is watched.

The cluster asks for proofs only where its replicas can run macro-steps (simulator/cluster/
cluster.py); this module is the fast path's, so the reference cluster runs without it.
"""

from __future__ import annotations

import bisect
import copy
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from servesim.scheduler.registry import Registry
from servesim.simulator.cluster.routers import (
    PowerOfTwo, RoundRobin, Router, draw_pair, session_target,
)
from servesim.traces.workload import RequestSpec

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Replica


class RouterProof(Protocol):
    """Claims about a router's coming decisions, for a cluster replica's macro-steps (docs/
    ARCHITECTURE.md, "The fast path"). Every claim is about the coming decisions of the arrival
    sequence `upcoming` (every request in arrival order; `first` is the index of the next one to be
    routed, so the router has made `first` decisions) and must be exact: a claim that is wrong
    makes the run differ from plain stepping (or raise)."""

    # True: any decision may read any candidate's state, so arrivals_unread is never asked and every
    # arrival bounds every replica's runs. A router that reads only some candidates sets False.
    reads_all_candidates: bool
    # True: a decision reads nothing of a candidate but its num_outstanding (nor anything else
    # that a plain decode run changes), so a replica may apply its runs only when a request is
    # routed to it (simulator/fastpath/deferred.py). Must hold for choose() whatever the state. A
    # router that reads nothing (round_robin) leaves it False: its arrivals_unread already names
    # each replica's own next arrival exactly, and deferring would only add the waiting.
    reads_only_load: bool
    # True: a decision reads a candidate's KV usage and prefix cache as well as its load, and only
    # through Engine.kv_usage, Engine.cached_prefix_tokens and Engine.num_outstanding, which a
    # replica with a deferred run answers from its plan as stepping shows them (fastpath/
    # planned_reads.py): its runs may be deferred as reads_only_load's are.
    reads_planned_state: bool
    # True: a decision reads a candidate's prefix cache (Engine.cached_prefix_tokens), which sees
    # the blocks an update caches: no update of a replica's run may be applied before its time
    # (a P/D decode replica's paced runs: fastpath/pd_runs.py). KV usage and load do not see them.
    reads_prefix_cache: bool

    def arrivals_elsewhere(self, candidate: int, load: int, candidates: Sequence[Replica],
                           upcoming: Sequence[RequestSpec], first: int) -> int:
        """How many of the coming decisions provably pick another candidate than `candidate`,
        given that its num_outstanding stays >= load and that no other candidate's load grows
        except by these decisions; each of them must also decide the same (candidate, reason and
        score) whatever that load is. Lets that replica's macro-steps run past those arrivals, so
        a router may claim a count only if its decisions read nothing of that replica but the
        load (no KV usage, no prefix cache: those change mid-run). 0: no claim."""
        ...

    def arrivals_unread(self, candidate: int, candidates: Sequence[Replica],
                        upcoming: Sequence[RequestSpec], first: int) -> int:
        """How many of the coming decisions provably neither pick `candidate` nor read anything of
        it, whatever its state (asked only when reads_all_candidates is False). Until the first
        other one nothing outside depends on that replica, so the cluster announces that
        decision's time as the replica's next arrival. 0: no claim."""
        ...


ProofFactory = Callable[[Any], RouterProof]  # (the router instance) -> its proof
ROUTER_PROOFS: Registry[ProofFactory] = Registry("router proof")
_MAX_LOOKAHEAD = 4096  # decisions a proof draws ahead (bounds its memory and work)


def proof_for(router: Router) -> RouterProof | None:
    """The proof registered under the router's name, built for this router (None: no proof)."""
    factory = ROUTER_PROOFS.find(router.name)
    return None if factory is None else factory(router)


@ROUTER_PROOFS.register("round_robin")
class RoundRobinProof:
    """round_robin reads nothing of any replica; its turn (the router's `num_decisions`, read
    here) names the next decision that reaches each candidate."""

    reads_all_candidates = False
    reads_only_load = False
    reads_planned_state = False
    reads_prefix_cache = False

    def __init__(self, router: RoundRobin) -> None:
        self._router = router

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        return (candidate - self._router.num_decisions) % len(candidates)

    def arrivals_unread(self, candidate, candidates, upcoming, first):
        return (candidate - self._router.num_decisions) % len(candidates)


@ROUTER_PROOFS.register("least_outstanding")
class LeastOutstandingProof:
    """least_outstanding reads every load and nothing else; stateless."""

    reads_all_candidates = True
    reads_only_load = True
    reads_planned_state = False
    reads_prefix_cache = False

    def __init__(self, router: Router) -> None:
        pass

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        return requests_before_win(candidate, load, candidates)

    def arrivals_unread(self, candidate, candidates, upcoming, first):
        return 0  # every decision reads every load


def requests_before_win(candidate: int, load: int, candidates: Sequence[Replica]) -> int:
    """How many requests the other candidates must receive before least_outstanding can pick
    `candidate` while its load stays >= load: it wins only once every lower-index candidate holds
    more than `load` and every higher-index one at least `load` (ties go to the lowest index).
    Loads fall only by finishes and rise only by decisions, one request each. Whatever the
    candidate's load (>= load), a decision that does not pick it picks the same other candidate
    with the same score (the minimum of the others' loads)."""
    loads = [c.engine.num_outstanding for c in candidates]
    # Sum of the shortfalls; the candidate's own term (load - load = 0) adds nothing.
    need = sum([load + 1 - n for n in loads[:candidate] if n <= load])
    return need + sum([load - n for n in loads[candidate + 1:] if n < load])


class StateReadingProof:
    """least_kv and prefix_aware read every candidate's KV usage or prefix cache, which change
    within a run, so no decision is proved to go elsewhere; what they read, a replica with a
    deferred run answers from its plan (fastpath/planned_reads.py), so those runs go on through
    the arrivals routed elsewhere. Stateless."""

    reads_all_candidates = True
    reads_only_load = False
    reads_planned_state = True

    def __init__(self, router: Router, reads_prefix_cache: bool) -> None:
        self.reads_prefix_cache = reads_prefix_cache  # prefix_aware's; least_kv reads KV usage and load

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        return 0  # every decision reads state a run changes

    def arrivals_unread(self, candidate, candidates, upcoming, first):
        return 0  # every decision reads every candidate


ROUTER_PROOFS.add("least_kv", partial(StateReadingProof, reads_prefix_cache=False))
ROUTER_PROOFS.add("prefix_aware", partial(StateReadingProof, reads_prefix_cache=True))


@ROUTER_PROOFS.register("jsq_power_of_two")
class PowerOfTwoProof:
    """A jsq_power_of_two decision reads only the loads of the pair it draws; the proof draws the
    coming pairs ahead from a copy of the router's shared Generator (read, never drawn from).

    Invariant: `_ahead[k]` is the pair of decision `_base + k`, and `_states[k]` the shared
    Generator's state just before that decision draws it; `_peek` continues after the last pair
    foreseen. The pairs are only right while this router alone draws from the shared Generator:
    each question first checks the Generator is where the decisions made so far leave it, and
    raises if someone else drew in between (a foreseen pair would then be wrong)."""

    reads_all_candidates = False  # a decision reads only the two drawn
    reads_only_load = True  # ... and only their loads
    reads_planned_state = False
    reads_prefix_cache = False

    def __init__(self, router: PowerOfTwo) -> None:
        self._router = router
        self._base = 0
        self._ahead: deque[tuple[int, int]] = deque()
        self._states: deque[dict] = deque()
        self._peek: Any = None  # the Generator copy drawing ahead (None until first asked)

    def arrivals_unread(self, candidate, candidates, upcoming, first):
        # Decisions whose pair leaves the candidate out neither pick nor read it (and with it in the
        # pair it may win as soon as the other's load falls, so arrivals_elsewhere counts the same).
        n = len(candidates)
        if n == 1:
            return 0
        self._catch_up(first)
        left = len(upcoming) - first
        for k in range(min(left, _MAX_LOOKAHEAD)):
            if k == len(self._ahead):
                self._states.append(self._peek.bit_generator.state)
                self._ahead.append(draw_pair(self._peek, n))
            if candidate in self._ahead[k]:
                return k
        return min(left, _MAX_LOOKAHEAD)

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        return self.arrivals_unread(candidate, candidates, upcoming, first)

    def _catch_up(self, first: int) -> None:
        """Drop the pairs of the decisions made (first of them so far) and check the shared
        Generator drew exactly those; with none foreseen, start from its state now."""
        done = first - self._base
        if 0 < done <= len(self._ahead):
            for _state in range(done):
                self._ahead.popleft()
                self._states.popleft()
            self._base = first
            expected = self._states[0] if self._states else self._peek.bit_generator.state
            if self._router.rng.bit_generator.state != expected:
                raise AssertionError("jsq_power_of_two: the shared Generator was drawn from while pairs "
                                     "were foreseen (its proof is only exact when this router alone draws)")
        elif done > len(self._ahead):  # decisions past what was foreseen: nothing left to check
            self._ahead.clear()
            self._states.clear()
        if not self._ahead:  # nothing foreseen: start from the shared Generator's state
            self._base = first
            self._peek = copy.deepcopy(self._router.rng)


@ROUTER_PROOFS.register("session_affinity")
class SessionAffinityProof:
    """A session's turn reads nothing (its target is a hash); a request without a session goes to
    the least outstanding (which reads every load). Stateless but for a cache of where the arrival
    sequence's turns are pinned."""

    reads_all_candidates = False  # a session's turn reads nothing; only the fallback reads loads
    reads_only_load = True
    reads_planned_state = False
    reads_prefix_cache = False

    def __init__(self, router: Router) -> None:
        self._pins: _SessionPins | None = None  # the arrival sequence's targets

    def _pins_of(self, upcoming: Sequence[RequestSpec], n: int) -> _SessionPins:
        if self._pins is None or self._pins.upcoming is not upcoming or self._pins.n != n:
            self._pins = _SessionPins(upcoming, n)
        return self._pins

    def arrivals_unread(self, candidate, candidates, upcoming, first):
        # Up to the next turn pinned here or the next request without a session (which reads loads).
        pins = self._pins_of(upcoming, len(candidates))
        return min(pins.next_pinned(candidate, first), pins.next_unpinned(first)) - first

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        # Turns pinned elsewhere never come here. A request without a session goes to the least
        # outstanding, which can be this candidate only once the others received the requests
        # least_outstanding's proof counts; every decision before it (all elsewhere) is one of them.
        pins = self._pins_of(upcoming, len(candidates))
        pinned, unpinned = pins.next_pinned(candidate, first), pins.next_unpinned(first)
        if unpinned < pinned:
            unpinned = pins.next_unpinned(first + requests_before_win(candidate, load, candidates))
        return min(pinned, unpinned) - first


class _SessionPins:
    """Where session_affinity sends each request of an arrival sequence over n candidates: the
    indices of each candidate's pinned turns and of the requests without a session, for bisection."""

    def __init__(self, upcoming: Sequence[RequestSpec], n: int) -> None:
        self.upcoming, self.n = upcoming, n
        self._pinned: list[list[int]] = [[] for _ in range(n)]
        self._unpinned: list[int] = []
        for i, spec in enumerate(upcoming):
            if spec.session_id is None:
                self._unpinned.append(i)
            else:
                self._pinned[session_target(spec.session_id, n)].append(i)

    def next_pinned(self, candidate: int, first: int) -> int:
        """Index of the first turn at or after `first` pinned to candidate (len(upcoming): none)."""
        return _next_at(self._pinned[candidate], first, len(self.upcoming))

    def next_unpinned(self, first: int) -> int:
        return _next_at(self._unpinned, first, len(self.upcoming))


def _next_at(indices: list[int], first: int, end: int) -> int:
    k = bisect.bisect_left(indices, first)
    return indices[k] if k < len(indices) else end
