"""Autoscaling policies: from a pool's metrics to a desired replica count, by name from a registry.

A policy sees one `PoolMetrics` (what the simulation shows at a decision) and returns the replica
count it recommends; the controller then applies the pool's stabilization windows and min/max
(controller.py), so a policy is a pure function of what it is shown plus its own parameters.

    threshold           current +/- step when a metric crosses an upper / lower bound
    target_utilization  the Kubernetes HPA formula: ceil(current * value / target), within a tolerance
    slo_planner         NVIDIA Dynamo's throughput-based planner: predicted load / per-replica capacity
                        at the SLO, corrected by the observed TTFT and ITL against their targets
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from servesim.scheduler.registry import Registry, UnknownNameError
from servesim.traces.errors import InputError


@dataclass(slots=True)
class PoolMetrics:
    """A pool at one decision (per-replica values are over its ready replicas; None: no sample)."""

    now_s: float
    role: str  # "both" | "prefill" | "decode"
    num_ready: int  # serving replicas (routed to)
    num_starting: int  # in their cold start
    num_waiting: int  # waiting requests on the ready replicas, summed
    num_outstanding: int  # waiting + running on the ready replicas, summed
    kv_usage: float  # mean KV-cache usage of the ready replicas (0 with none)
    request_rate_per_s: float  # requests routed to the pool over the window, per second
    mean_prompt_len: float | None  # of the requests routed over the window
    mean_output_len: float | None
    ttft_s: float | None  # the window's TTFT percentile (requests whose first token came in the window)
    itl_s: float | None  # the window's percentile of per-request mean ITL (requests finished in the window)
    slo_attainment: float | None  # fraction of requests finished in the window meeting the cluster SLO

    def metric(self, name: str) -> float | None:
        """A named per-replica metric (METRICS) for the threshold and target policies."""
        return METRICS[name](self)


def _per_ready(total: float, m: PoolMetrics) -> float:
    return total / m.num_ready if m.num_ready else total


# Metrics a threshold or target policy can be given: per ready replica where it is a count.
METRICS: dict[str, Callable[[PoolMetrics], float | None]] = {
    "queue_depth": lambda m: _per_ready(m.num_waiting, m),  # waiting requests per replica
    "outstanding": lambda m: _per_ready(m.num_outstanding, m),  # waiting + running per replica
    "kv_usage": lambda m: m.kv_usage,  # mean KV-cache usage, 0..1
    "request_rate": lambda m: _per_ready(m.request_rate_per_s, m),  # req/s per replica over the window
    "ttft": lambda m: m.ttft_s,  # s, the window's percentile
    "itl": lambda m: m.itl_s,  # s, the window's percentile
}


class AutoscalePolicy(Protocol):
    """Recommends a replica count for a pool; `current` is its ready plus starting replicas."""

    def desired(self, m: PoolMetrics, current: int) -> int:
        """The recommended count (the controller clamps it to the pool's min/max)."""
        ...


PolicyFactory = Callable[..., AutoscalePolicy]
# Built-ins are below (a plain module: the registry imports it on the first lookup).
POLICIES: Registry[PolicyFactory] = Registry("autoscale policy", plugins="servesim.simulator.cluster.autoscale.policies")


def register_policy(name: str):
    def wrap(cls):
        POLICIES.add(name, cls)
        return cls
    return wrap


def available_policies() -> list[str]:
    return POLICIES.names()


def make_policy(name: str, params: dict[str, Any], field: str, slo: Any) -> AutoscalePolicy:
    """Build a policy by name; `slo` is the cluster's SloConfig (the SLO planner's targets)."""
    try:
        factory = POLICIES.get(name)
    except UnknownNameError as e:
        raise InputError(e.detail, field=f"{field}.name", allowed=e.allowed) from None
    try:
        return factory(slo=slo, **params)
    except TypeError as e:
        raise InputError(f"bad parameters for autoscale policy {name!r}: {e}", field=f"{field}.params") from None


def _metric_name(metric: Any, field: str) -> str:
    if metric not in METRICS:
        from servesim.scheduler.registry import unknown_name_message

        raise InputError(unknown_name_message("metric", str(metric), METRICS), field=field, allowed=", ".join(METRICS))
    return metric


def _positive(value: Any, field: str, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise InputError(f"got {value!r}", field=field, allowed="a finite number " + (">= 0" if allow_zero else "> 0"))
    return float(value)


@register_policy("threshold")
class Threshold:
    """One step up when the metric is above `scale_up_above`, one down below `scale_down_below`
    (Dynamo's default "throughput" mode scales on static queue and KV thresholds alike); no
    sample (e.g. no request finished in the window): no change."""

    def __init__(self, slo: Any, metric: str = "queue_depth", scale_up_above: float = 4.0,
                 scale_down_below: float = 1.0, step: int = 1) -> None:
        self.metric = _metric_name(metric, "autoscale.pools[].policy.params.metric")
        self.up = _positive(scale_up_above, "autoscale.pools[].policy.params.scale_up_above", allow_zero=True)
        self.down = _positive(scale_down_below, "autoscale.pools[].policy.params.scale_down_below", allow_zero=True)
        if self.down > self.up:
            raise InputError(f"scale_down_below {self.down} > scale_up_above {self.up}",
                             field="autoscale.pools[].policy.params", allowed="scale_down_below <= scale_up_above")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise InputError(f"got {step!r}", field="autoscale.pools[].policy.params.step", allowed="an integer >= 1")
        self.step = step

    def desired(self, m: PoolMetrics, current: int) -> int:
        value = m.metric(self.metric)
        if value is None:
            return current
        if value > self.up:
            return current + self.step
        if value < self.down:
            return current - self.step
        return current


@register_policy("target_utilization")
class TargetUtilization:
    """The HPA formula on the ready replicas: desired = ceil(num_ready * value / target), left
    unchanged while value / target is within `tolerance` of 1 (the HPA's default 0.1, flag
    --horizontal-pod-autoscaler-tolerance). Starting replicas count at zero use, as the HPA
    counts pods that are not yet ready when scaling up; no sample: no change."""

    def __init__(self, slo: Any, metric: str = "outstanding", target: float = 32.0, tolerance: float = 0.1) -> None:
        self.metric = _metric_name(metric, "autoscale.pools[].policy.params.metric")
        self.target = _positive(target, "autoscale.pools[].policy.params.target")
        self.tolerance = _positive(tolerance, "autoscale.pools[].policy.params.tolerance", allow_zero=True)

    def desired(self, m: PoolMetrics, current: int) -> int:
        value = m.metric(self.metric)
        if value is None or m.num_ready == 0:
            return current
        ratio = value / self.target
        if abs(ratio - 1.0) <= self.tolerance:
            return current
        return max(math.ceil(m.num_ready * ratio - 1e-9), current if ratio > 1 else 0)


@register_policy("slo_planner")
class SloPlanner:
    """NVIDIA Dynamo planner's throughput-based scaling (docs.nvidia.com/dynamo, "Planner Design"):
    the next interval's load is predicted (here Dynamo's "constant" predictor: the window's
    request rate, prompt and output lengths), divided by what one replica serves within the SLO
    (from pre-deployment profiling: `prefill_tokens_per_s` at the TTFT target and
    `decode_tokens_per_s` at the ITL target, e.g. from `servesim plan` on one replica), and
    corrected by observed / expected latency (Dynamo's prefill_correction = actual_ttft /
    expected_ttft, decode_correction = actual_itl / expected_itl, with the SLO as the expected
    value; a correction below 1 is not trusted to cut capacity, so it is floored at 1).

        prefill replicas = ceil(rate * prompt_len * c_prefill / prefill_tokens_per_s)
        decode replicas  = ceil(rate * output_len * c_decode / decode_tokens_per_s)

    A colocated pool ("both") serves both: the sum of the two fractions, rounded up."""

    def __init__(self, slo: Any, prefill_tokens_per_s: float | None = None,
                 decode_tokens_per_s: float | None = None, max_correction: float = 4.0) -> None:
        where = "autoscale.pools[].policy.params"
        if prefill_tokens_per_s is None or decode_tokens_per_s is None:
            raise InputError("the SLO planner needs the per-replica capacity from a profile", field=where,
                             allowed="prefill_tokens_per_s and decode_tokens_per_s (tokens/s one replica serves within the SLO)")
        self.prefill = _positive(prefill_tokens_per_s, where + ".prefill_tokens_per_s")
        self.decode = _positive(decode_tokens_per_s, where + ".decode_tokens_per_s")
        self.max_correction = _positive(max_correction, where + ".max_correction")
        if self.max_correction < 1:
            raise InputError(f"got {max_correction!r}", field=where + ".max_correction", allowed="a number >= 1")
        self.ttft_target_s, self.itl_target_s = slo.ttft_s, slo.tpot_s

    def _correction(self, observed: float | None, target: float) -> float:
        if observed is None or not target > 0:
            return 1.0
        return min(max(observed / target, 1.0), self.max_correction)

    def desired(self, m: PoolMetrics, current: int) -> int:
        if m.mean_prompt_len is None or m.mean_output_len is None:
            return current if m.request_rate_per_s > 0 else 0  # no request in the window: no load to serve
        need = 0.0
        if m.role != "decode":
            need += m.request_rate_per_s * m.mean_prompt_len * self._correction(m.ttft_s, self.ttft_target_s) / self.prefill
        if m.role != "prefill":
            need += m.request_rate_per_s * m.mean_output_len * self._correction(m.itl_s, self.itl_target_s) / self.decode
        return math.ceil(need - 1e-9)
