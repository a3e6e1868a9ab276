"""Admission rules: what the gateway checks when a request arrives, in the configured order; the
first that refuses rejects the request (HTTP 429, counted as a `failed` request by `vllm bench
serve`'s rules: simulator/bench_metrics.py).

    queue_limit   {max_queued: N}: a request that would have to wait while N are already queued
                  is refused ("gateway_queue_full"). The bound of Envoy's circuit breaker
                  `max_pending_requests` (requests queued for a connection-pool slot; overflow is
                  answered at once rather than queued).
    token_bucket  {tenant, requests_per_s, burst_requests, tokens_per_s, burst_tokens}: per
                  tenant (each its own bucket; with `tenant` set, that tenant's only), a bucket of
                  `burst` that refills continuously at `rate` and starts full; a request takes 1
                  request token and prompt_len + output_len token tokens (what OpenAI's TPM limit
                  meters: prompt plus max_tokens), and is refused ("gateway_rate_limited") when a
                  bucket holds less. The single-rate token bucket of RFC 2697 (committed rate and
                  burst size, updated continuously).

A rule registers by name in ADMISSION_RULES (gateway/registries.py); its factory takes the rule's
params and where they sit in the config (for errors) and returns a fresh AdmissionRule (state per run).
Rules are applied in order and a refused request keeps what earlier rules metered (a rate limiter
in front of a queue has spent the token before the queue answers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from servesim.simulator.gateway.registries import ADMISSION_RULES
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec

QUEUE_FULL = "gateway_queue_full"
RATE_LIMITED = "gateway_rate_limited"


class AdmissionRule(Protocol):
    """One admission check, with its own state for one run."""

    def admit(self, spec: RequestSpec, now_s: float, num_queued: int, must_queue: bool) -> str | None:
        """None: the request passes (what the rule meters is spent); otherwise the reject reason.
        `num_queued`: requests waiting in the gateway now; `must_queue`: this one would wait too."""
        ...


RuleFactory = Callable[[dict, str], AdmissionRule]


def _params(params: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InputError(f"unknown parameter {unknown[0]!r}", field=f"{where}.params.{unknown[0]}",
                         allowed=", ".join(allowed))


def _number(params: dict, key: str, where: str, integer: bool = False, minimum: float = 0.0) -> float | None:
    value = params.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= minimum
    if ok and integer:
        ok = isinstance(value, int)
    if not ok:
        kind = "an integer" if integer else "a finite number"
        raise InputError(f"got {value!r}", field=f"{where}.params.{key}", allowed=f"{kind} >= {minimum:g}")
    return value


class QueueLimit:
    __slots__ = ("max_queued",)

    def __init__(self, params: dict, where: str) -> None:
        _params(params, ("max_queued",), where)
        value = _number(params, "max_queued", where, integer=True)
        if value is None:
            raise InputError("missing", field=f"{where}.params.max_queued", allowed="an integer >= 0")
        self.max_queued = int(value)

    def admit(self, spec: RequestSpec, now_s: float, num_queued: int, must_queue: bool) -> str | None:
        return QUEUE_FULL if must_queue and num_queued >= self.max_queued else None


class Bucket:
    """A token bucket: `level` tokens at `updated_s`, refilled at rate_per_s up to burst."""

    __slots__ = ("rate_per_s", "burst", "level", "updated_s")

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.level = burst  # starts full
        self.updated_s = 0.0

    def refill(self, now_s: float) -> float:
        if now_s > self.updated_s:
            self.level = min(self.burst, self.level + self.rate_per_s * (now_s - self.updated_s))
            self.updated_s = now_s
        return self.level


class TokenBucket:
    __slots__ = ("tenant", "_requests", "_tokens", "_buckets")

    KEYS = ("tenant", "requests_per_s", "burst_requests", "tokens_per_s", "burst_tokens")

    def __init__(self, params: dict, where: str) -> None:
        _params(params, self.KEYS, where)
        tenant = params.get("tenant")
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            raise InputError(f"got {tenant!r}", field=f"{where}.params.tenant", allowed="a tenant name, or null (each)")
        self.tenant = tenant
        self._requests = self._pair(params, "requests_per_s", "burst_requests", where)
        self._tokens = self._pair(params, "tokens_per_s", "burst_tokens", where)
        if self._requests is None and self._tokens is None:
            raise InputError("no limit given", field=f"{where}.params",
                             allowed="requests_per_s with burst_requests, and/or tokens_per_s with burst_tokens")
        self._buckets: dict[tuple[str | None, str], Bucket] = {}

    @staticmethod
    def _pair(params: dict, rate_key: str, burst_key: str, where: str) -> tuple[float, float] | None:
        rate, burst = _number(params, rate_key, where), _number(params, burst_key, where, minimum=1.0)
        if (rate is None) != (burst is None):
            missing = burst_key if burst is None else rate_key
            raise InputError("missing", field=f"{where}.params.{missing}",
                             allowed=f"{rate_key} and {burst_key} together")
        if rate is not None and rate <= 0:
            raise InputError(f"got {rate!r}", field=f"{where}.params.{rate_key}", allowed="a finite number > 0")
        return None if rate is None else (float(rate), float(burst))

    def _bucket(self, tenant: str | None, kind: str, pair: tuple[float, float]) -> Bucket:
        bucket = self._buckets.get((tenant, kind))
        if bucket is None:
            bucket = self._buckets[(tenant, kind)] = Bucket(*pair)
        return bucket

    def admit(self, spec: RequestSpec, now_s: float, num_queued: int, must_queue: bool) -> str | None:
        if self.tenant is not None and spec.tenant != self.tenant:
            return None
        metered = []
        if self._requests is not None:
            metered.append((self._bucket(spec.tenant, "requests", self._requests), 1.0))
        if self._tokens is not None:
            metered.append((self._bucket(spec.tenant, "tokens", self._tokens), float(spec.prompt_len + spec.output_len)))
        if any(bucket.refill(now_s) < cost for bucket, cost in metered):
            return RATE_LIMITED
        for bucket, cost in metered:
            bucket.level -= cost
        return None


ADMISSION_RULES.add("queue_limit", QueueLimit)
ADMISSION_RULES.add("token_bucket", TokenBucket)


def make_rules(configs) -> list[AdmissionRule]:
    """Fresh rules for one run from the config's [RuleConfig] (unknown names: did-you-mean)."""
    out = []
    for i, rc in enumerate(configs):
        factory: RuleFactory = ADMISSION_RULES.get(rc.name)
        out.append(factory(rc.params, f"gateway.rules[{i}]"))
    return out
