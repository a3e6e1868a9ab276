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

import zlib
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
    """Base class: subclasses implement `choose`."""

    name = "router"

    def choose(self, spec: RequestSpec, candidates: Sequence[Replica], now_s: float) -> Decision:
        raise NotImplementedError

    def arrivals_elsewhere(self, candidate: int, load: int, candidates: Sequence[Replica]) -> int:
        """How many of the coming decisions provably pick another candidate than `candidate`,
        given that its num_outstanding stays >= load and that no other candidate's load grows
        except by these decisions. Lets that replica's macro-steps run past those arrivals, so
        a router may claim a count only if its decisions read nothing of that replica but the
        load (no KV usage, no prefix cache: those change mid-run). 0: no claim (the default)."""
        return 0


RouterFactory = Callable[..., Router]
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

    def arrivals_elsewhere(self, candidate, load, candidates):
        return (candidate - self._next) % len(candidates)  # reads nothing of any replica


@register_router("least_outstanding")
class LeastOutstanding(Router):
    def __init__(self, rng: np.random.Generator) -> None:
        pass

    def choose(self, spec, candidates, now_s):
        loads = [c.engine.num_outstanding for c in candidates]
        i = _least([(n,) for n in loads])
        return Decision(i, "least_load", float(loads[i]))

    def arrivals_elsewhere(self, candidate, load, candidates):
        # `candidate` wins a decision only once every lower-index replica holds more than `load`
        # and every higher-index one at least `load` (ties go to the lowest index). Loads fall
        # only by finishes and rise only by these decisions, one request each: count the
        # requests the others must receive first.
        need = 0
        for j, c in enumerate(candidates):
            if j != candidate:
                need += max(0, load + (j < candidate) - c.engine.num_outstanding)
        return need


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

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def choose(self, spec, candidates, now_s):
        n = len(candidates)
        if n == 1:
            return Decision(0, "only", float(candidates[0].engine.num_outstanding))
        a, b = sorted(int(x) for x in self.rng.choice(n, size=2, replace=False))
        la, lb = candidates[a].engine.num_outstanding, candidates[b].engine.num_outstanding
        i = a if la <= lb else b
        return Decision(i, f"jsq({a},{b})", float(min(la, lb)))


@register_router("session_affinity")
class SessionAffinity(Router):
    """Every turn of a session goes to crc32(session_id) mod N (stable across runs and machines,
    unlike Python's salted hash); requests without a session go to the least outstanding."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._fallback = LeastOutstanding(rng)

    def choose(self, spec, candidates, now_s):
        if spec.session_id is None:
            d = self._fallback.choose(spec, candidates, now_s)
            return Decision(d.candidate, "no_session", d.score)
        return Decision(zlib.crc32(spec.session_id.encode()) % len(candidates), "session_hash")


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
            hit = c.engine.scheduler.cached_prefix_tokens(tokens, spec.lora_id)
            load = c.engine.num_outstanding / c.cfg.scheduler.max_num_seqs
            hits.append(hit)
            keys.append((-(hit / spec.prompt_len - self.load_weight * load),))
        i = _least(keys)
        return Decision(i, "prefix" if hits[i] > 0 else "load", -keys[i][0])
