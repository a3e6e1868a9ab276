"""The gateway's configuration (SimConfig.gateway, ClusterConfig.gateway): nested slotted dataclasses,
validated on construction whichever way they were built (YAML, `--set`, the Python API).

    gateway:
      enabled: true
      max_in_flight: 64            # requests dispatched to the engines and not yet done; null: no cap
      queue_timeout_s: 5.0         # a request still queued this long is rejected; null: waits forever
      queuing: {name: wfq, params: {cost: requests}}
      rules:                       # applied in order at arrival; the first to refuse rejects (HTTP 429)
        - {name: queue_limit, params: {max_queued: 100}}
        - {name: token_bucket, params: {tenant: free, requests_per_s: 5, burst_requests: 10}}
      tenants:
        free: {weight: 1}
        premium: {weight: 4, priority: 0}
      slo_classes:
        interactive: {ttft_s: 0.5, tpot_s: 0.05, priority: 0}

`tenants` and `slo_classes` also apply with the gateway off: the summary breaks every metric down
by tenant and class (simulator/summary_metrics/classes.py) and judges each class by its own targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from servesim.simulator.gateway.defaults import DEFAULT_CLASS, DEFAULT_TENANT
from servesim.simulator.gateway.registries import ADMISSION_RULES, QUEUE_DISCIPLINES
from servesim.traces.errors import InputError



def _bad(field_name: str, value: object, allowed: str) -> InputError:
    return InputError(f"got {value!r}", field=f"gateway.{field_name}", allowed=allowed)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _opt_positive(value: object, where: str, unit: str) -> None:
    if value is not None and not (_is_number(value) and value > 0):
        raise _bad(where, value, f"a finite number > 0 ({unit}), or null")


def _opt_priority(value: object, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _bad(where, value, "an integer (lower runs first under scheduler.policy: priority), or null")


@dataclass(slots=True)
class TenantConfig:
    weight: float = 1.0  # its share under fair queuing (weighted: premium 4, free 1 -> 4:1)
    priority: int | None = None  # vLLM priority its requests get at dispatch; None: the request's own

    def check(self, name: str) -> None:
        if not (_is_number(self.weight) and self.weight > 0):
            raise _bad(f"tenants.{name}.weight", self.weight, "a finite number > 0")
        _opt_priority(self.priority, f"tenants.{name}.priority")


@dataclass(slots=True)
class SloClassConfig:
    """An SLO class's targets (a request meets them when TTFT <= ttft_s, TPOT <= tpot_s and, when
    set, E2E <= e2e_s: the run's `slo` rule, per class)."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1
    e2e_s: float | None = None
    priority: int | None = None  # vLLM priority at dispatch (wins over the tenant's); None: not mapped

    def check(self, name: str) -> None:
        for key in ("ttft_s", "tpot_s"):
            if not (_is_number(getattr(self, key)) and getattr(self, key) > 0):
                raise _bad(f"slo_classes.{name}.{key}", getattr(self, key), "a finite number of seconds > 0")
        _opt_positive(self.e2e_s, f"slo_classes.{name}.e2e_s", "s")
        _opt_priority(self.priority, f"slo_classes.{name}.priority")


@dataclass(slots=True)
class RuleConfig:
    name: str = "queue_limit"  # a registered admission rule (gateway/rules.py)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class QueuingConfig:
    name: str = "fifo"  # a registered queuing discipline (gateway/queues.py): fifo | wfq
    params: dict[str, Any] = field(default_factory=dict)


def _named(cls: type, raw: object, where: str) -> Any:
    """A RuleConfig/QueuingConfig from its YAML form: a name, or {name, params}."""
    if isinstance(raw, cls):
        return raw
    if isinstance(raw, str):
        return cls(raw)
    if not isinstance(raw, dict) or set(raw) - {"name", "params"} or "name" not in raw:
        raise _bad(where, raw, "a name, or {name: ..., params: {...}}")
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise _bad(f"{where}.params", params, "a mapping")
    return cls(raw["name"], dict(params))


def _mapping_of(cls: type, raw: object, where: str) -> dict[str, Any]:
    """{name: cls} from {name: cls or its mapping of fields}."""
    if not isinstance(raw, dict):
        raise _bad(where, raw, "a mapping of name -> settings")
    out = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name:
            raise _bad(where, name, "non-empty names")
        if isinstance(value, cls):
            out[name] = value
            continue
        value = {} if value is None else value
        fields = cls.__dataclass_fields__
        if not isinstance(value, dict) or set(value) - set(fields):
            unknown = sorted(set(value) - set(fields)) if isinstance(value, dict) else value
            raise _bad(f"{where}.{name}", unknown, "keys " + ", ".join(fields))
        out[name] = cls(**value)
    for name, value in out.items():
        value.check(name)
    return out


@dataclass(slots=True)
class GatewayConfig:
    enabled: bool = False  # admission and flow control in front of the engines (simulator/gateway/)
    max_in_flight: int | None = None  # dispatched and not done, at most; None: dispatch at once (no queue)
    queue_timeout_s: float | None = None  # a queued request is rejected after this long; None: never
    queuing: QueuingConfig = field(default_factory=QueuingConfig)
    rules: list[RuleConfig] = field(default_factory=list)
    tenants: dict[str, TenantConfig] = field(default_factory=dict)
    slo_classes: dict[str, SloClassConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise _bad("enabled", self.enabled, "true or false")
        m = self.max_in_flight
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise _bad("max_in_flight", m, "an integer >= 1, or null")
        _opt_positive(self.queue_timeout_s, "queue_timeout_s", "s")
        self.queuing = _named(QueuingConfig, self.queuing, "queuing")
        if not isinstance(self.rules, (list, tuple)):
            raise _bad("rules", self.rules, "a list of {name, params}")
        self.rules = [_named(RuleConfig, r, f"rules[{i}]") for i, r in enumerate(self.rules)]
        self.tenants = _mapping_of(TenantConfig, self.tenants, "tenants")
        self.slo_classes = _mapping_of(SloClassConfig, self.slo_classes, "slo_classes")
        # Unknown names and bad params fail here, not mid-run (each factory checks its params).
        for i, rule in enumerate(self.rules):
            ADMISSION_RULES.get(rule.name)(rule.params, f"gateway.rules[{i}]")
        QUEUE_DISCIPLINES.get(self.queuing.name)(self.queuing.params, self.tenants, "gateway.queuing")

    def tenant(self, name: str | None) -> TenantConfig:
        """The settings of a request's tenant (an unlisted tenant gets the defaults)."""
        return self.tenants.get(name or DEFAULT_TENANT) or TenantConfig()

    def dispatch_priority(self, tenant: str | None, slo_class: str | None) -> int | None:
        """The vLLM priority a request gets at dispatch: its class's, else its tenant's, else None
        (it keeps its own)."""
        cls = self.slo_classes.get(slo_class or DEFAULT_CLASS)
        if cls is not None and cls.priority is not None:
            return cls.priority
        return self.tenant(tenant).priority

    @property
    def maps_priority(self) -> bool:
        return any(c.priority is not None for c in self.slo_classes.values()) or \
            any(t.priority is not None for t in self.tenants.values())
