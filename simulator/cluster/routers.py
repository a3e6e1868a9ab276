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

from servesim.scheduler.lazy_ids import LazyTokenIds
from servesim.scheduler.registry import Registry, UnknownNameError
from servesim.simulator.cluster.tier_prices import TierPrices, tier_prices
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
    """Base class: subclasses implement `choose` and own whatever state it keeps.

    What a cluster's macro-steps may assume about a router's coming decisions is not the router's
    business: the fast path keeps a proof per router name (simulator/fastpath/router_proofs.py),
    which may read the router's state. A router without one is simply never proved anything."""

    # The registry name it was built under (make_router sets it on the instance; register_router on
    # the class): the name its proof, if any, is registered under.
    name = "router"

    def choose(self, spec: RequestSpec, candidates: Sequence[Replica], now_s: float) -> Decision:
        raise NotImplementedError


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
        router = factory(rng=rng if rng is not None else np.random.default_rng(0), **(params or {}))
    except TypeError as e:
        raise InputError(f"bad parameters for router {name!r}: {e}", field=f"{field}.params") from None
    router.name = name  # whatever class the factory built (a subclass may inherit another's name)
    return router


def _least(keys: Sequence[tuple]) -> int:
    """Index of the smallest key; ties go to the lowest index (candidates are in replica order)."""
    return min(range(len(keys)), key=lambda i: (keys[i], i))


@register_router("round_robin")
class RoundRobin(Router):
    def __init__(self, rng: np.random.Generator) -> None:
        self.num_decisions = 0  # the next decision picks num_decisions mod N (read by its proof)

    def choose(self, spec, candidates, now_s):
        i = self.num_decisions % len(candidates)
        self.num_decisions += 1
        return Decision(i, "round_robin")


@register_router("least_outstanding")
class LeastOutstanding(Router):
    def __init__(self, rng: np.random.Generator) -> None:
        pass

    def choose(self, spec, candidates, now_s):
        loads = [c.engine.num_outstanding for c in candidates]
        i = loads.index(min(loads))  # _least's rule (ties to the lowest index), in two C calls
        return Decision(i, "least_load", float(loads[i]))


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
        self.rng = rng  # the run's shared Generator (its proof reads a copy of it)

    def choose(self, spec, candidates, now_s):
        n = len(candidates)
        if n == 1:
            return Decision(0, "only", float(candidates[0].engine.num_outstanding))
        a, b = draw_pair(self.rng, n)
        la, lb = candidates[a].engine.num_outstanding, candidates[b].engine.num_outstanding
        i = a if la <= lb else b
        return Decision(i, f"jsq({a},{b})", float(min(la, lb)))


def draw_pair(rng: np.random.Generator, n: int) -> tuple[int, int]:
    """jsq_power_of_two's draw: two of n candidates without replacement, in index order."""
    a, b = sorted(int(x) for x in rng.choice(n, size=2, replace=False))
    return a, b


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
        return Decision(session_target(spec.session_id, len(candidates)), "session_hash")


def session_target(session_id: str, n: int) -> int:
    """The candidate every turn of a session goes to (session_affinity)."""
    return zlib.crc32(session_id.encode()) % n


@register_router("prefix_aware")
class PrefixAware(Router):
    """Cache hits in both KV tiers versus load.

        score_i = (gpu_i + worth_i(cpu_i)) / prompt_len - load_weight * outstanding_i / max_num_seqs_i

    gpu_i is how many leading prompt tokens replica i would serve from its GPU prefix cache right
    now (`cached_prefix_tokens` of the scheduler contract: vLLM's block hashes or SGLang's radix
    tree, as each counts a hit); cpu_i how many more its CPU KV tier would load
    (`cpu_cached_prefix_tokens`: vLLM's OffloadingConnector, SGLang's HiCache), worth
    worth_i(n) = n - load_s_i(n) / prefill_s_per_token_i prefill tokens (tier_prices.py: the
    host-to-device copy the request waits for, against the prefill it saves), or
    n x cpu_hit_weight when that is given (a fixed per-tier weight, as llm-d's scorer's). The hit
    term is the fraction of the prompt's prefill time the replica saves, in [0, 1) without a CPU
    tier whatever the block size; the load term is outstanding requests relative to the
    replica's batch capacity. The highest score wins. With load_weight=1 a replica holding the
    whole prompt on its GPU is preferred until it carries about one full batch more than an
    empty replica.
    """

    def __init__(self, rng: np.random.Generator, load_weight: float = 1.0, cpu_hit_weight: float | None = None) -> None:
        if not load_weight >= 0:
            raise InputError(f"got {load_weight!r}", field="router.params.load_weight", allowed="a number >= 0")
        if cpu_hit_weight is not None and (isinstance(cpu_hit_weight, bool) or not 0 <= cpu_hit_weight <= 1):
            raise InputError(f"got {cpu_hit_weight!r}", field="router.params.cpu_hit_weight",
                             allowed="a number in [0, 1], or null (priced from the replica's link and cost model)")
        self.load_weight = float(load_weight)
        self.cpu_hit_weight = None if cpu_hit_weight is None else float(cpu_hit_weight)
        self._prices: dict[int, TierPrices] = {}  # by replica index, built on its first CPU hit

    def cpu_hit_worth(self, replica: Replica, num_tokens: int) -> float:
        """Prefill tokens' worth of a CPU hit of num_tokens on `replica` (class doc)."""
        if num_tokens <= 0:
            return 0.0
        if self.cpu_hit_weight is not None:
            return num_tokens * self.cpu_hit_weight
        prices = self._prices.get(replica.index)
        if prices is None:
            prices = self._prices[replica.index] = tier_prices(replica.engine.cfg)
        return prices.cpu_hit_worth_tokens(num_tokens)

    def choose(self, spec, candidates, now_s):
        caching = any(c.engine.scheduler.capabilities.prefix_cache is not None for c in candidates)
        # no prompt to build when nothing caches; its ids built only if a lookup reads them (a
        # provenance-keyed one reads the length), shared by each replica's lookup
        # (scheduler/prefix_lookup.py: one probe for every replica that keys blocks alike)
        tokens = LazyTokenIds(spec.prompt_len, spec.token_id_array) if caching else ()
        prompt_len, load_weight = spec.prompt_len, self.load_weight
        best, best_key, best_reason = 0, 0.0, ""
        for i, c in enumerate(candidates):
            engine = c.engine
            gpu, cpu = engine.prefix_hits(spec, tokens, caching)
            worth = self.cpu_hit_worth(c, cpu) if cpu > 0 else 0.0
            key = -((gpu + worth) / prompt_len - load_weight * (engine.num_outstanding / c.cfg.scheduler.max_num_seqs))
            if i == 0 or key < best_key:  # _least's rule: the smallest, ties to the lowest index
                best, best_key = i, key
                best_reason = "prefix" if gpu > 0 else "cpu_prefix" if worth > 0 else "load"
        return Decision(best, best_reason, -best_key)
