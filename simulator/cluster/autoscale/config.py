"""Autoscaling configuration: a validated dataclass tree that the cluster YAML's `autoscale:` mirrors.

    autoscale:
      interval_s: 15            # decision interval (the HPA's sync period)
      window_s: 60              # metrics window: request rate, TTFT/ITL percentiles, SLO attainment
      percentile: 90
      pools:
        - group: both           # a replica group's name (its `name`, else its role)
          min_replicas: 2
          max_replicas: 16
          policy: {name: target_utilization, params: {metric: outstanding, target: 32}}
          scale_up_stabilization_s: 0       # Kubernetes HPA defaults (behavior.scaleUp / scaleDown)
          scale_down_stabilization_s: 300
          scale_up_policies:                # rate limits per period (behavior.scaleUp.policies)
            - {type: percent, value: 100, period_s: 15}
            - {type: pods, value: 4, period_s: 15}
          scale_up_select_policy: max       # max | min | disabled (behavior.scaleUp.selectPolicy)
          scale_down_policies: [{type: percent, value: 100, period_s: 15}]
          cold_start: {provision_s: 410}    # any ColdStartConfig field

Every default cites its source here and in docs/AUTOSCALING.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from servesim.traces.errors import InputError

def _number(value: Any, where: str, minimum: float, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > minimum if strict else value >= minimum)
    if not ok:
        raise InputError(f"got {value!r}", field=where, allowed=f"a finite number {'>' if strict else '>='} {minimum:g}")


# Kaito's measured cold start of one vLLM replica on a fresh Azure A100 node (kaito-project/kaito
# issue #2325, 2026-09-07: Qwen 27B, 51.75 GiB in 18 safetensors shards, image 5.60 GB, vLLM 0.25.1).
_KAITO_PROVISION_S = 284.0 + 126.0  # "GPU node provisioning" + "GPU node initialization"
_KAITO_IMAGE_BYTES = 5.60e9  # "Image ... (5.60 GB)"
_KAITO_IMAGE_PULL_S = 101.0  # "Container image pull"
_KAITO_CONTAINER_START_S = 7.0 + 3.0 + 74.0 + 21.0  # resource preparation, container start, framework bootstrap, engine pre-load init
_KAITO_WEIGHT_BYTES = 51.75 * 2**30  # "51.75 GiB"
_KAITO_WEIGHT_LOAD_S = 62.0  # "Model download and loading"
# vLLM's own start-up log for Llama-3-8B with torch.compile (vllm-project/vllm PR #11005, 2024-12-09):
# "torch.compile takes 19.37 s in total", "Graph capturing finished in 15 secs", "init engine
# (profile, create kv cache, warmup model) took 39.34 seconds".
_VLLM_COMPILE_S = 19.37
_VLLM_GRAPH_CAPTURE_S = 15.0
_VLLM_INIT_ENGINE_S = 39.34


@dataclass(slots=True)
class ColdStartConfig:
    """What a new replica costs before it serves: every term a parameter (cold_start.py adds them)."""

    provision_s: float = _KAITO_PROVISION_S  # a GPU node created and joined (0: a warm node pool)
    image_bytes: float = _KAITO_IMAGE_BYTES  # the serving container image
    image_pull_bytes_per_s: float = _KAITO_IMAGE_BYTES / _KAITO_IMAGE_PULL_S  # registry -> node
    container_start_s: float = _KAITO_CONTAINER_START_S  # container up -> the engine starts loading
    # The replica's weights (every GPU's shard, from the model spec) over the node's storage or
    # network path: one path per node, so a TP/PP replica's shards share it.
    weight_load_bytes_per_s: float = _KAITO_WEIGHT_BYTES / _KAITO_WEIGHT_LOAD_S
    compile_s: float = _VLLM_COMPILE_S  # torch.compile (0: enforce_eager, or a warm compile cache)
    graph_capture_s: float = _VLLM_GRAPH_CAPTURE_S  # CUDA-graph capture (0: enforce_eager)
    warmup_s: float = _VLLM_INIT_ENGINE_S - _VLLM_COMPILE_S - _VLLM_GRAPH_CAPTURE_S  # profile run, KV cache, warm-up

    def __post_init__(self) -> None:
        for name in ("provision_s", "image_bytes", "container_start_s", "compile_s", "graph_capture_s", "warmup_s"):
            _number(getattr(self, name), name, minimum=0.0)
        for name in ("image_pull_bytes_per_s", "weight_load_bytes_per_s"):
            _number(getattr(self, name), name, minimum=0.0, strict=True)


SCALING_POLICY_TYPES = ("pods", "percent")  # autoscaling/v2 HPAScalingPolicyType, lower-cased
SELECT_POLICIES = ("max", "min", "disabled")  # autoscaling/v2 ScalingPolicySelect (Max, Min, Disabled)
_MAX_PERIOD_S = 1800.0  # HPAScalingPolicy.periodSeconds: "must be greater than zero and less than or equal to 1800"


@dataclass(slots=True, frozen=True)
class ScalingPolicy:
    """One rate limit of the HPA's behavior (autoscaling/v2 HPAScalingPolicy): at most `value` pods,
    or `value` percent of the replicas at the period's start, added (or removed) per `period_s`."""

    type: str
    value: int
    period_s: float

    def __post_init__(self) -> None:
        if self.type not in SCALING_POLICY_TYPES:
            from servesim.scheduler.registry import unknown_name_message

            raise InputError(unknown_name_message("scaling policy type", str(self.type), SCALING_POLICY_TYPES),
                             field="type", allowed=", ".join(SCALING_POLICY_TYPES))
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 1:
            raise InputError(f"got {self.value!r}", field="value", allowed="an integer >= 1")
        _number(self.period_s, "period_s", minimum=0.0, strict=True)
        if self.period_s > _MAX_PERIOD_S:
            raise InputError(f"got {self.period_s!r}", field="period_s", allowed="(0, 1800] seconds, as Kubernetes")
        object.__setattr__(self, "period_s", float(self.period_s))  # frozen: YAML may give an int


# Kubernetes' defaults (pkg/apis/autoscaling/v2/defaults.go, GenerateHPAScaleUpRules /
# GenerateHPAScaleDownRules): up by the larger of 100 % and 4 pods per 15 s; down by up to 100 % per 15 s.
K8S_SCALE_UP_POLICIES = (ScalingPolicy("percent", 100, 15.0), ScalingPolicy("pods", 4, 15.0))
K8S_SCALE_DOWN_POLICIES = (ScalingPolicy("percent", 100, 15.0),)


def _policies(raw, where: str) -> tuple[ScalingPolicy, ...]:
    """A tuple of ScalingPolicy from the YAML's list of mappings (or ScalingPolicy objects)."""
    out = []
    for i, p in enumerate(raw):
        if isinstance(p, ScalingPolicy):
            out.append(p)
            continue
        if not isinstance(p, dict) or set(p) - {"type", "value", "period_s"} or not {"type", "value", "period_s"} <= set(p):
            raise InputError(f"got {p!r}", field=f"{where}[{i}]", allowed="{type: pods|percent, value, period_s}")
        try:
            out.append(ScalingPolicy(p["type"], p["value"], p["period_s"]))
        except InputError as e:
            raise InputError(e.detail, field=f"{where}[{i}].{e.field}", allowed=e.allowed) from None
    return tuple(out)


@dataclass(slots=True)
class PolicyConfig:
    name: str = "target_utilization"  # registry name (autoscale/policies.py: available_policies)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class PoolConfig:
    group: str  # the replica group it scales: the group's `name`, else its role
    min_replicas: int = 1
    max_replicas: int = 8
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # Kubernetes HPA behavior defaults (autoscaling/v2 HorizontalPodAutoscalerBehavior): scale-up
    # uses no stabilization; scale-down takes the highest recommendation of the last 300 s.
    scale_up_stabilization_s: float = 0.0
    scale_down_stabilization_s: float = 300.0
    # How fast the count may move (behavior.scaleUp/scaleDown policies and selectPolicy); an empty
    # list: no limit (a planner outside Kubernetes).
    scale_up_policies: tuple[ScalingPolicy, ...] = K8S_SCALE_UP_POLICIES
    scale_up_select_policy: str = "max"
    scale_down_policies: tuple[ScalingPolicy, ...] = K8S_SCALE_DOWN_POLICIES
    scale_down_select_policy: str = "max"
    cold_start: ColdStartConfig = field(default_factory=ColdStartConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or not self.group:
            raise InputError(f"got {self.group!r}", field="group", allowed="a replica group's name")
        for name in ("min_replicas", "max_replicas"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "min_replicas" else 1):
                raise InputError(f"got {v!r}", field=name,
                                 allowed="an integer >= " + ("0" if name == "min_replicas" else "1"))
        if self.min_replicas > self.max_replicas:
            raise InputError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}",
                             field="min_replicas", allowed="min_replicas <= max_replicas")
        for name in ("scale_up_stabilization_s", "scale_down_stabilization_s"):
            _number(getattr(self, name), name, minimum=0.0)
        for name in ("scale_up_policies", "scale_down_policies"):
            raw = getattr(self, name)
            if not isinstance(raw, (list, tuple)):
                raise InputError(f"got {raw!r}", field=name, allowed="a list of {type, value, period_s}")
            setattr(self, name, _policies(raw, name))
        for name in ("scale_up_select_policy", "scale_down_select_policy"):
            if getattr(self, name) not in SELECT_POLICIES:
                from servesim.scheduler.registry import unknown_name_message

                raise InputError(unknown_name_message("select policy", str(getattr(self, name)), SELECT_POLICIES),
                                 field=name, allowed=", ".join(SELECT_POLICIES))


@dataclass(slots=True)
class AutoscaleConfig:
    pools: list[PoolConfig] = field(default_factory=list)
    interval_s: float = 15.0  # the HPA controller's default --horizontal-pod-autoscaler-sync-period
    window_s: float = 60.0  # the metrics window (Dynamo's planner reads its metrics over one adjustment interval)
    percentile: float = 90.0  # of the TTFT and ITL metrics over the window

    def __post_init__(self) -> None:
        if not self.pools:
            raise InputError("no pools", field="autoscale.pools", allowed="at least one {group, min_replicas, ...}")
        groups = [p.group for p in self.pools]
        if len(set(groups)) != len(groups):
            raise InputError(f"a group is scaled twice: {groups}", field="autoscale.pools[].group",
                             allowed="one pool per replica group")
        _number(self.interval_s, "interval_s", minimum=0.0, strict=True)
        _number(self.window_s, "window_s", minimum=0.0, strict=True)
        _number(self.percentile, "percentile", minimum=0.0, strict=True)
        if self.percentile > 100:
            raise InputError(f"got {self.percentile!r}", field="percentile", allowed="a number in (0, 100]")


def autoscale_config_from_dict(raw: Any, path: str | None = None) -> AutoscaleConfig:
    """The `autoscale:` section (the one config-tree builder, config_values.build_dataclass, checks
    every key, with a did-you-mean); errors name the file and the field."""
    from servesim.simulator.config_values import build_dataclass

    if not isinstance(raw, dict):
        raise InputError("autoscale must be a mapping", path=path, field="autoscale",
                         allowed="{pools, interval_s, window_s, percentile}")
    pools_raw = raw.get("pools")
    if not isinstance(pools_raw, list) or not pools_raw:
        raise InputError("needs a list of pools", path=path, field="autoscale.pools",
                         allowed="[{group, min_replicas, max_replicas, policy, ...}]")
    pools = [_pool(p, f"autoscale.pools[{i}]", path) for i, p in enumerate(pools_raw)]
    try:
        first = AutoscaleConfig(pools)
    except InputError as e:
        raise InputError(e.detail, path=path, field=e.field, allowed=e.allowed) from None
    return build_dataclass(first, {k: v for k, v in raw.items() if k != "pools"}, "autoscale", path)


def _pool(raw: Any, where: str, path: str | None) -> PoolConfig:
    from servesim.simulator.config_values import build_dataclass

    if not isinstance(raw, dict) or "group" not in raw:
        raise InputError(f"got {raw!r}", path=path, field=where,
                         allowed="{group, min_replicas, max_replicas, policy, ...} with a group")
    data = dict(raw)
    if isinstance(data.get("policy"), str):
        data["policy"] = {"name": data["policy"]}
    try:
        base = PoolConfig(group=data.pop("group"))
    except InputError as e:
        raise InputError(e.detail, path=path, field=f"{where}.group", allowed=e.allowed) from None
    return build_dataclass(base, data, where, path)
