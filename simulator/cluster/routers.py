"""Routers: pick a replica for each request, by name from a registry.

A router sees the candidate replicas (live engines, in index order) at the moment it decides and
returns a `Decision`: which candidate, why, and the score it used. Every router is deterministic
given the cluster seed (the only randomness is the shared numpy Generator) and breaks ties by the
lowest replica index.

Load signal: `Engine.num_outstanding` (waiting + running, blocked P/D requests included). The
cluster hands a request to its replica in the same instant the router decides (the routing latency
elapses before the decision), so no request is ever "in flight" to a replica unseen by the load.
"""

from __future__ import annotations

import bisect
import copy
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.scheduler.registry import Registry, UnknownNameError
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Replica


@dataclass(slots=True)
class Decision:
    candidate: int  # position in the candidate list handed to the router
    reason: str  # short tag: "round_robin", "least_load", "prefix", "session_hash", ...
    score: float | None = None  # the value the router minimised/maximised (None: no score)


class Router:
    """Base class: subclasses implement `choose`.

    Two optional proofs let a cluster replica's macro-steps run past arrivals (docs/ARCHITECTURE.md,
    "Macro-steps"). Both are about the coming decisions of the arrival sequence `upcoming` (every
    request in arrival order; `first` is the index of the next one to be routed) and both must be
    exact: a claim that is wrong makes the run differ from plain stepping (or raise)."""

    name = "router"
    # True: any decision may read any candidate's state, so arrivals_unread is never asked and every
    # arrival bounds every replica's runs. A router that reads only some candidates sets False.
    reads_all_candidates = True
    # True: a decision reads nothing of a candidate but its num_outstanding (nor anything else
    # that a plain decode run changes), so a replica may apply its runs only when a request is
    # routed to it (simulator/deferred_run.py). Must hold for choose() whatever the state. A
    # router that reads nothing (round_robin) leaves it False: its arrivals_unread already names
    # each replica's own next arrival exactly, and deferring would only add the waiting.
    reads_only_load = False

    def choose(self, spec: RequestSpec, candidates: Sequence[Replica], now_s: float) -> Decision:
        raise NotImplementedError

    def arrivals_elsewhere(self, candidate: int, load: int, candidates: Sequence[Replica],
                           upcoming: Sequence[RequestSpec], first: int) -> int:
        """How many of the coming decisions provably pick another candidate than `candidate`,
        given that its num_outstanding stays >= load and that no other candidate's load grows
        except by these decisions; each of them must also decide the same (candidate, reason and
        score) whatever that load is. Lets that replica's macro-steps run past those arrivals, so
        a router may claim a count only if its decisions read nothing of that replica but the
        load (no KV usage, no prefix cache: those change mid-run). 0: no claim (the default)."""
        return 0

    def arrivals_unread(self, candidate: int, candidates: Sequence[Replica],
                        upcoming: Sequence[RequestSpec], first: int) -> int:
        """How many of the coming decisions provably neither pick `candidate` nor read anything of
        it, whatever its state (asked only when reads_all_candidates is False). Until the first
        other one nothing outside depends on that replica, so the cluster announces that
        decision's time as the replica's next arrival. 0: no claim."""
        return 0


RouterFactory = Callable[..., Router]
_MAX_LOOKAHEAD = 4096  # decisions a router draws ahead for a proof (bounds its memory and work)
# Built-ins are below (and vllm_dp in dp.py); every module of simulator/cluster/ is imported on the
# first lookup, so a new router is one new file there.
ROUTERS: Registry[RouterFactory] = Registry("router", plugins="servesim.simulator.cluster")


def register_router(name: str):
    def wrap(cls):
        ROUTERS.add(name, cls)
        cls.name = name
        return cls
    return wrap


def available_routers() -> list[str]:
    return ROUTERS.names()


def make_router(name: str, params: dict[str, Any] | None = None, rng: np.random.Generator | None = None,
                field: str = "router") -> Router:
    """Build a router by name; `rng` is the run's one Generator (routers that draw use it)."""
    try:
        factory = ROUTERS.get(name)
    except UnknownNameError as e:
        raise InputError(e.detail, field=f"{field}.name", allowed=e.allowed) from None
    try:
        return factory(rng=rng if rng is not None else np.random.default_rng(0), **(params or {}))
    except TypeError as e:
        raise InputError(f"bad parameters for router {name!r}: {e}", field=f"{field}.params") from None


def _least(keys: Sequence[tuple]) -> int:
    """Index of the smallest key; ties go to the lowest index (candidates are in replica order)."""
    return min(range(len(keys)), key=lambda i: (keys[i], i))


@register_router("round_robin")
class RoundRobin(Router):
    def __init__(self, rng: np.random.Generator) -> None:
        self._next = 0

    def choose(self, spec, candidates, now_s):
        i = self._next % len(candidates)
        self._next += 1
        return Decision(i, "round_robin")

    reads_all_candidates = False  # reads nothing of any replica

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        return (candidate - self._next) % len(candidates)

    def arrivals_unread(self, candidate, candidates, upcoming, first):
        return (candidate - self._next) % len(candidates)


@register_router("least_outstanding")
class LeastOutstanding(Router):
    reads_only_load = True

    def __init__(self, rng: np.random.Generator) -> None:
        pass

    def choose(self, spec, candidates, now_s):
        loads = [c.engine.num_outstanding for c in candidates]
        i = loads.index(min(loads))  # _least's rule (ties to the lowest index), in two C calls
        return Decision(i, "least_load", float(loads[i]))

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        return requests_before_win(candidate, load, candidates)


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


@register_router("least_kv")
class LeastKv(Router):
    """Lowest KV-cache usage; equal usage (e.g. several arrivals before any step ran) falls back to
    fewer outstanding requests, so a burst does not pile onto replica 0."""

    def __init__(self, rng: np.random.Generator) -> None:
        pass

    def choose(self, spec, candidates, now_s):
        keys = [(c.engine.kv_usage, c.engine.num_outstanding) for c in candidates]
        i = _least(keys)
        return Decision(i, "least_kv", float(keys[i][0]))


@register_router("jsq_power_of_two")
class PowerOfTwo(Router):
    """Join the shorter queue of two replicas drawn without replacement from the shared Generator."""

    reads_all_candidates = False  # a decision reads only the two drawn
    reads_only_load = True  # ... and only their loads

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        # The coming decisions' pairs, drawn ahead from a copy of the Generator (arrivals_unread);
        # choose() still draws from the shared one and checks it drew the pair foreseen.
        self._ahead: deque[tuple[int, int]] = deque()
        self._peek: np.random.Generator | None = None

    def _draw(self, rng: np.random.Generator, n: int) -> tuple[int, int]:
        a, b = sorted(int(x) for x in rng.choice(n, size=2, replace=False))
        return a, b

    def choose(self, spec, candidates, now_s):
        n = len(candidates)
        if n == 1:
            return Decision(0, "only", float(candidates[0].engine.num_outstanding))
        a, b = self._draw(self.rng, n)
        if self._ahead and self._ahead.popleft() != (a, b):
            raise AssertionError("jsq_power_of_two: the shared Generator was drawn from while pairs were "
                                 "foreseen (arrivals_unread is only exact when this router alone draws)")
        la, lb = candidates[a].engine.num_outstanding, candidates[b].engine.num_outstanding
        i = a if la <= lb else b
        return Decision(i, f"jsq({a},{b})", float(min(la, lb)))

    def arrivals_unread(self, candidate, candidates, upcoming, first):
        # Decisions whose pair leaves the candidate out neither pick nor read it (and with it in the
        # pair it may win as soon as the other's load falls, so arrivals_elsewhere counts the same).
        n = len(candidates)
        if n == 1:
            return 0
        if not self._ahead:  # nothing foreseen: start from the shared Generator's state
            self._peek = copy.deepcopy(self.rng)
        left = len(upcoming) - first
        for k in range(min(left, _MAX_LOOKAHEAD)):
            if k == len(self._ahead):
                self._ahead.append(self._draw(self._peek, n))
            if candidate in self._ahead[k]:
                return k
        return min(left, _MAX_LOOKAHEAD)

    def arrivals_elsewhere(self, candidate, load, candidates, upcoming, first):
        return self.arrivals_unread(candidate, candidates, upcoming, first)


@register_router("session_affinity")
class SessionAffinity(Router):
    """Every turn of a session goes to crc32(session_id) mod N (stable across runs and machines,
    unlike Python's salted hash); requests without a session go to the least outstanding."""

    reads_all_candidates = False  # a session's turn reads nothing; only the fallback reads loads
    reads_only_load = True

    def __init__(self, rng: np.random.Generator) -> None:
        self._fallback = LeastOutstanding(rng)
        self._pins: _SessionPins | None = None  # the arrival sequence's targets, for the proofs

    def choose(self, spec, candidates, now_s):
        if spec.session_id is None:
            d = self._fallback.choose(spec, candidates, now_s)
            return Decision(d.candidate, "no_session", d.score)
        return Decision(_session_target(spec.session_id, len(candidates)), "session_hash")

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


def _session_target(session_id: str, n: int) -> int:
    return zlib.crc32(session_id.encode()) % n


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
                self._pinned[_session_target(spec.session_id, n)].append(i)

    def next_pinned(self, candidate: int, first: int) -> int:
        """Index of the first turn at or after `first` pinned to candidate (len(upcoming): none)."""
        return _next_at(self._pinned[candidate], first, len(self.upcoming))

    def next_unpinned(self, first: int) -> int:
        return _next_at(self._unpinned, first, len(self.upcoming))


def _next_at(indices: list[int], first: int, end: int) -> int:
    k = bisect.bisect_left(indices, first)
    return indices[k] if k < len(indices) else end


@register_router("prefix_aware")
class PrefixAware(Router):
    """Cache hit versus load.

        score_i = hit_i - load_weight * outstanding_i / max_num_seqs_i

    hit_i is the fraction of the prompt replica i would serve from its prefix cache right now
    (`cached_prefix_tokens` of the scheduler contract: vLLM's block hashes or SGLang's radix tree,
    as each counts a hit), so it lies in [0, 1) whatever the block size; the load term is
    outstanding requests relative to the replica's batch capacity. The highest score wins. With
    load_weight=1 a replica holding the whole prompt is preferred until it carries about one full
    batch more than an empty replica.
    """

    def __init__(self, rng: np.random.Generator, load_weight: float = 1.0) -> None:
        if not load_weight >= 0:
            raise InputError(f"got {load_weight!r}", field="router.params.load_weight", allowed="a number >= 0")
        self.load_weight = float(load_weight)

    def choose(self, spec, candidates, now_s):
        caching = any(c.engine.scheduler.capabilities.prefix_cache is not None for c in candidates)
        tokens = spec.token_ids() if caching else ()  # no prompt to build when nothing caches
        keys, hits = [], []
        for c in candidates:
            hit = c.engine.scheduler.cached_prefix_tokens(tokens, spec.lora_id, c.engine.token_provenance(spec))
            load = c.engine.num_outstanding / c.cfg.scheduler.max_num_seqs
            hits.append(hit)
            keys.append((-(hit / spec.prompt_len - self.load_weight * load),))
        i = _least(keys)
        return Decision(i, "prefix" if hits[i] > 0 else "load", -keys[i][0])
