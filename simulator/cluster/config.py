"""Cluster configuration: a validated dataclass tree that YAML mirrors one to one.

    base: {hardware: {model: llama-3.1-8b, gpu: h100}}     # SimConfig fields every group starts from
    replicas:
      - {count: 4, sim: {hardware: {tp: 2}}}                # nested or dotted keys ("hardware.tp": 2)
      - {count: 2, name: small, sim: {hardware.gpu: a100-80gb}}
    router: {name: prefix_aware, params: {load_weight: 1.0}}
    routing_latency_s: 0.001
    pd: null                                               # or {link: {...}, decode_router: {...}}
    slo: {ttft_s: 2.0, tpot_s: 0.1}
    seed: 0

`ClusterConfig.from_dict` resolves every group to a full SimConfig (base deep-merged with the
group's overrides); `cluster_config_to_dict` writes those full configs back, so a dumped config
reloads to an equal one.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim.simulator.cluster.autoscale.config import AutoscaleConfig, autoscale_config_from_dict
from servesim.simulator.config import SimConfig, SloConfig, to_dict
from servesim.simulator.gateway.config import GatewayConfig
from servesim.simulator.config_values import build_dataclass, coerce_field  # noqa: F401  (re-exported)
from servesim.traces.errors import InputError

ROLES = ("both", "prefill", "decode")  # "both": a colocated replica (no P/D split)
LINK_SHARING = ("fair", "lanes")
LINK_SCOPES = ("per_decode", "shared")


@dataclass(slots=True)
class RouterConfig:
    name: str = "round_robin"  # registry name (simulator.cluster.routers.available_routers)
    params: dict[str, Any] = field(default_factory=dict)  # router-specific, e.g. load_weight


@dataclass(slots=True)
class ReplicaGroup:
    count: int = 1  # identical replicas in this group
    sim: SimConfig = field(default_factory=SimConfig)  # each replica's full engine config
    role: str = "both"  # one of ROLES
    name: str | None = None  # replica names are f"{name}{i}"; default "<role>"
    # The group's replicas step together, idle ones running dummy batches (vLLM DP for MoE:
    # simulator/cluster/dp.py LockstepGroup); role "both" only.
    lockstep: bool = False
    # The machine the group's replicas run on: groups naming the same node share its host (P/D
    # transfers between them ride its GPU interconnect: pd_links.py). None: a node of their own.
    node: str | None = None

    def __post_init__(self) -> None:
        if self.node is not None and (not isinstance(self.node, str) or not self.node):
            raise InputError(f"got {self.node!r}", field="replicas[].node", allowed="a node name, or null")
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise InputError(f"got {self.count!r}", field="replicas[].count", allowed="an integer >= 1")
        if self.role not in ROLES:
            raise InputError(f"unknown role {self.role!r}", field="replicas[].role", allowed=", ".join(ROLES))
        if self.lockstep and self.role != "both":
            raise InputError("lockstep groups are data-parallel ranks serving whole requests",
                             field="replicas[].lockstep", allowed="role 'both'")


@dataclass(slots=True)
class LinkConfig:
    bandwidth_bytes_per_s: float = 50e9  # per GPU: each TP rank sends its KV shard over its own NIC
    latency_s: float = 20e-6  # fixed cost per transfer (setup + propagation)
    sharing: str = "fair"  # "fair": concurrent transfers split the bandwidth; "lanes": N FIFO lanes
    lanes: int = 4  # with sharing == "lanes": lanes of bandwidth/lanes each
    scope: str = "per_decode"  # "per_decode": one ingress link per decode replica; "shared": one link

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise InputError(f"got {self.bandwidth_bytes_per_s!r}", field="pd.link.bandwidth_bytes_per_s",
                             allowed="a number > 0 (bytes/s)")
        if not self.latency_s >= 0:
            raise InputError(f"got {self.latency_s!r}", field="pd.link.latency_s", allowed="a number >= 0 (s)")
        if self.sharing not in LINK_SHARING:
            raise InputError(f"got {self.sharing!r}", field="pd.link.sharing", allowed=", ".join(LINK_SHARING))
        if self.scope not in LINK_SCOPES:
            raise InputError(f"got {self.scope!r}", field="pd.link.scope", allowed=", ".join(LINK_SCOPES))
        if not isinstance(self.lanes, int) or self.lanes < 1:
            raise InputError(f"got {self.lanes!r}", field="pd.link.lanes", allowed="an integer >= 1")


@dataclass(slots=True)
class IntraNodeLinkConfig:
    """P/D transfers between replicas on one node (pd_links.py): the node's GPU interconnect."""

    bandwidth_bytes_per_s: float | None = None  # per GPU, one direction; None: the host spec's interconnect
    latency_s: float = 0.0  # per transfer; no measured figure is cited, so none is added by default

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s is not None and not self.bandwidth_bytes_per_s > 0:
            raise InputError(f"got {self.bandwidth_bytes_per_s!r}", field="pd.intra_node.bandwidth_bytes_per_s",
                             allowed="a number > 0 (bytes/s), or null for the host spec's interconnect")
        if not self.latency_s >= 0:
            raise InputError(f"got {self.latency_s!r}", field="pd.intra_node.latency_s", allowed="a number >= 0 (s)")


@dataclass(slots=True)
class PDConfig:
    link: LinkConfig = field(default_factory=LinkConfig)  # across nodes: the network (RDMA)
    intra_node: IntraNodeLinkConfig = field(default_factory=IntraNodeLinkConfig)
    # Picks the decode replica when a prefill finishes (the main router picks the prefill replica).
    decode_router: RouterConfig = field(default_factory=lambda: RouterConfig("least_outstanding"))
    handoff_latency_s: float = 0.0  # prefill done -> request reaches the decode replica

    def __post_init__(self) -> None:
        if not self.handoff_latency_s >= 0:
            raise InputError(f"got {self.handoff_latency_s!r}", field="pd.handoff_latency_s",
                             allowed="a number >= 0 (s)")


@dataclass(slots=True)
class ClusterConfig:
    replicas: list[ReplicaGroup] = field(default_factory=lambda: [ReplicaGroup()])
    router: RouterConfig = field(default_factory=RouterConfig)
    routing_latency_s: float = 0.0  # arrival -> the router decides and the replica receives it
    pd: PDConfig | None = None  # None: colocated replicas (every role "both")
    slo: SloConfig = field(default_factory=SloConfig)  # for the cluster summary's goodput
    seed: int = 0  # seeds the one numpy Generator the routers share
    # Admission and flow control before the router, tenants and SLO classes (simulator/gateway/).
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    # Pools scaled at run time (simulator/cluster/autoscale/); None: the replica counts are fixed.
    autoscale: AutoscaleConfig | None = None
    # $ per GPU-hour by GPU, over the shipped table (simulator/specs/gpu_prices.yaml)
    gpu_cost_per_hour: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_gateway(self)
        if not self.replicas:
            raise InputError("no replica groups", field="replicas", allowed="at least one group")
        if not self.routing_latency_s >= 0:
            raise InputError(f"got {self.routing_latency_s!r}", field="routing_latency_s",
                             allowed="a number >= 0 (s)")
        _check_nodes(self.replicas)
        _check_step_rows(self.replicas)
        roles = {g.role for g in self.replicas}
        if self.pd is None and roles != {"both"}:
            raise InputError(f"roles {sorted(roles)} need a pd section", field="replicas[].role",
                             allowed="role 'both' without pd; 'prefill' and 'decode' with pd")
        if self.pd is not None:
            if roles != {"prefill", "decode"}:
                raise InputError(f"P/D needs prefill and decode groups only, got roles {sorted(roles)}",
                                 field="replicas[].role", allowed="prefill, decode")
            _check_pd_groups(self.replicas)
        from servesim.simulator.specs.gpu_prices import check_price_overrides

        self.gpu_cost_per_hour = check_price_overrides(self.gpu_cost_per_hour)
        if self.autoscale is not None:
            from servesim.simulator.cluster.autoscale.checks import check_autoscale

            check_autoscale(self)

    @property
    def num_replicas(self) -> int:
        return sum(g.count for g in self.replicas)

    @property
    def num_gpus(self) -> int:
        return sum(g.count * g.sim.hardware.tp * g.sim.hardware.pp for g in self.replicas)

    @classmethod
    def from_dict(cls, data: dict, path: str | None = None) -> ClusterConfig:
        return cluster_config_from_dict(data, path)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ClusterConfig:
        from servesim.simulator.yaml_input import read_text_bounded, safe_load_bounded

        text = read_text_bounded(path, "cluster config")
        data = safe_load_bounded(text, str(path))
        return cluster_config_from_dict(data, str(path))


def _check_gateway(cfg: ClusterConfig) -> None:
    """One gateway, the cluster's, in front of its router (with P/D, the prefill router)."""
    for i, g in enumerate(cfg.replicas):
        if g.sim.gateway.enabled:
            raise InputError("a replica has no gateway of its own", field=f"replicas[{i}].sim.gateway.enabled",
                             allowed="false (the cluster's gateway is the top-level `gateway:`)")


def _check_step_rows(groups: list[ReplicaGroup]) -> None:
    """One steps file or none: every group keeps its step rows, or none does (the cluster's figures
    and series are folded alike either way)."""
    kept = {g.sim.step_rows for g in groups}
    if len(kept) > 1:
        names = [f"replicas[{i}]" for i, g in enumerate(groups) if not g.sim.step_rows]
        raise InputError(f"step_rows is false for {', '.join(names)} only", field="replicas[].sim.step_rows",
                         allowed="the same value for every group (set it once in base:)")


def _check_nodes(groups: list[ReplicaGroup]) -> None:
    """Groups on one node run on its one host: the same GPU and host spec."""
    from servesim.simulator.specs import host_for

    hosts: dict[str, tuple[str, int]] = {}
    for i, g in enumerate(groups):
        if g.node is None:
            continue
        host = host_for(g.sim.hardware.gpu, g.sim.hardware.host).name
        first = hosts.setdefault(g.node, (host, i))
        if first[0] != host:
            raise InputError(f"node {g.node!r} holds replicas[{first[1]}] on host {first[0]!r} and replicas[{i}] "
                             f"on host {host!r}", field=f"replicas[{i}].node",
                             allowed="one GPU and host spec per node")


def _check_pd_groups(groups: list[ReplicaGroup]) -> None:
    from servesim.simulator.specs import resolve_model

    models = {resolve_model(g.sim.hardware.model).name for g in groups}
    if len(models) > 1:
        raise InputError(f"P/D replicas must serve one model, got {sorted(models)}", field="replicas[].sim")
    for g in groups:
        if g.sim.engine != "vllm":
            raise InputError(f"P/D needs the vllm engine (its KV connector), got {g.sim.engine!r}",
                             field="replicas[].sim.engine", allowed="vllm")


# --- dict -> dataclass ------------------------------------------------------------------------------
_TOP_KEYS = ("base", "replicas", "router", "routing_latency_s", "pd", "slo", "seed", "gateway", "autoscale",
             "gpu_cost_per_hour")


def cluster_config_from_dict(data: Any, path: str | None = None) -> ClusterConfig:
    if not isinstance(data, dict):
        raise InputError("a cluster config must be a mapping", path=path, allowed="keys: " + ", ".join(_TOP_KEYS))
    _known(data, _TOP_KEYS, "", path)
    base = _expand_dotted(data.get("base") or {}, "base", path)
    groups_raw = data.get("replicas")
    if not isinstance(groups_raw, list) or not groups_raw:
        raise InputError("needs a non-empty list of replica groups", path=path, field="replicas",
                         allowed="[{count: N, role: ..., sim: {...}}, ...]")
    groups = [_group(g, i, base, path) for i, g in enumerate(groups_raw)]
    try:
        slo = data.get("slo", base.get("slo"))
        pd_raw = data.get("pd")
        return ClusterConfig(
            replicas=groups,
            router=_router(data.get("router", {}), "router", path),
            routing_latency_s=_number(data.get("routing_latency_s", 0.0), "routing_latency_s", path),
            pd=None if pd_raw is None else _pd(pd_raw, path),
            slo=build_dataclass(SloConfig(), slo or {}, "slo", path),
            seed=_int(data.get("seed", 0), "seed", path),
            gateway=build_dataclass(GatewayConfig(), data.get("gateway") or {}, "gateway", path),
            autoscale=None if data.get("autoscale") is None else autoscale_config_from_dict(data["autoscale"], path),
            gpu_cost_per_hour=data.get("gpu_cost_per_hour") or {},
        )
    except InputError as e:
        if e.path is None and path is not None:
            raise InputError(e.detail, path=path, field=e.field, allowed=e.allowed) from None
        raise


def _group(raw: Any, i: int, base: dict, path: str | None) -> ReplicaGroup:
    where = f"replicas[{i}]"
    if not isinstance(raw, dict):
        raise InputError("a replica group must be a mapping", path=path, field=where,
                         allowed="{count, role, name, lockstep, node, sim}")
    _known(raw, ("count", "role", "name", "lockstep", "node", "sim"), where + ".", path)
    sim_dict = deep_merge(base, _expand_dotted(raw.get("sim") or {}, where + ".sim", path))
    sim = sim_config_from_dict(sim_dict, where + ".sim", path)
    try:
        lockstep = raw.get("lockstep", False)
        if not isinstance(lockstep, bool):
            raise InputError(f"got {lockstep!r}", field="replicas[].lockstep", allowed="true or false")
        return ReplicaGroup(count=raw.get("count", 1), sim=sim, role=raw.get("role", "both"), name=raw.get("name"),
                            lockstep=lockstep, node=raw.get("node"))
    except InputError as e:
        raise InputError(e.detail, path=path, field=(e.field or "").replace("replicas[]", where),
                         allowed=e.allowed) from None


def _router(raw: Any, where: str, path: str | None) -> RouterConfig:
    if isinstance(raw, str):
        return RouterConfig(raw)
    if not isinstance(raw, dict):
        raise InputError("expected a router name or {name, params}", path=path, field=where)
    _known(raw, ("name", "params"), where + ".", path)
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise InputError("params must be a mapping", path=path, field=where + ".params")
    return RouterConfig(str(raw.get("name", "round_robin")), dict(params))


def _pd(raw: Any, path: str | None) -> PDConfig:
    if not isinstance(raw, dict):
        raise InputError("pd must be a mapping", path=path, field="pd",
                         allowed="{link, intra_node, decode_router, handoff_latency_s}")
    _known(raw, ("link", "intra_node", "decode_router", "handoff_latency_s"), "pd.", path)
    link = build_dataclass(LinkConfig(), raw.get("link") or {}, "pd.link", path)
    intra = build_dataclass(IntraNodeLinkConfig(), raw.get("intra_node") or {}, "pd.intra_node", path)
    router = _router(raw.get("decode_router", {"name": "least_outstanding"}), "pd.decode_router", path)
    return PDConfig(link, intra, router, _number(raw.get("handoff_latency_s", 0.0), "pd.handoff_latency_s", path))


def sim_config_from_dict(data: dict, where: str = "sim", path: str | None = None) -> SimConfig:
    """A SimConfig from a (nested or dotted) dict of overrides on the defaults.

    Setting cache.num_gpu_blocks turns derive_num_gpu_blocks off unless that is given too (the
    same rule as `--set`)."""
    data = _expand_dotted(data, where, path) if path is None else models_near(data, where, path)
    cfg = build_dataclass(SimConfig(), data, where, path)
    if "num_gpu_blocks" in (data.get("cache") or {}) and "derive_num_gpu_blocks" not in data:
        cfg = dataclasses.replace(cfg, derive_num_gpu_blocks=False)
    return cfg


def models_near(data: dict, where: str, path: str) -> dict:
    """A sim dict (nested or dotted), expanded to nested, with hardware.model, when it names a
    config.json relative to the config file `path`, and cost_model.params.path (a fitted model
    file) and the host collectives profiles (PARAM_FILES) made absolute (simulator/specs/models.py
    model_path_near, file_near)."""
    from servesim.simulator.specs.models import file_near, model_path_near

    data = _expand_dotted(data, where, path)
    base = Path(path).parent
    hardware = data.get("hardware")
    if isinstance(hardware, dict) and "model" in hardware:
        data["hardware"] = {**hardware, "model": model_path_near(hardware["model"], base)}
    cost_model = data.get("cost_model")
    params = cost_model.get("params") if isinstance(cost_model, dict) else None
    if isinstance(params, dict) and params.keys() & set(PARAM_FILES):
        near = {k: file_near(v, base) for k, v in params.items() if k in PARAM_FILES}
        data["cost_model"] = {**cost_model, "params": {**params, **near}}
    return data


# cost_model.params naming files: a fitted model, this host's collectives
PARAM_FILES = ("path", "allreduce_profile", "collectives_profile")


def _expand_dotted(data: Any, where: str, path: str | None) -> dict:
    """{"hardware.tp": 2} -> {"hardware": {"tp": 2}}, merged with nested keys."""
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping, got {data!r}", path=path, field=where)
    out: dict = {}
    for key, value in data.items():
        parts = str(key).split(".")
        nested = value if not isinstance(value, dict) else _expand_dotted(value, f"{where}.{key}", path)
        for part in reversed(parts[1:]):
            nested = {part: nested}
        out = deep_merge(out, {parts[0]: nested})
    return out


def deep_merge(a: dict, b: dict) -> dict:
    """b over a; nested mappings merge, everything else is replaced."""
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _known(data: dict, keys: tuple[str, ...], prefix: str, path: str | None) -> None:
    for key in data:
        if key not in keys:
            near = difflib.get_close_matches(str(key), keys, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise InputError(f"unknown key {key!r}{hint}", path=path, field=f"{prefix}{key}", allowed=", ".join(keys))


def _number(value: Any, where: str, path: str | None) -> float:
    if isinstance(value, str):
        value = _coerce(0.0, value, where, path)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"expected a number, got {value!r}", path=path, field=where)
    return float(value)


def _int(value: Any, where: str, path: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"expected an integer, got {value!r}", path=path, field=where)
    return value


def cluster_config_to_dict(cfg: ClusterConfig) -> dict:
    """Plain form (for config.yaml): every group with its full SimConfig; reloads to an equal config."""
    return {
        "replicas": [{"count": g.count, "role": g.role, "name": g.name, **({"lockstep": True} if g.lockstep else {}),
                      **({"node": g.node} if g.node is not None else {}), "sim": to_dict(g.sim)} for g in cfg.replicas],
        "router": to_dict(cfg.router),
        "routing_latency_s": cfg.routing_latency_s,
        "pd": None if cfg.pd is None else to_dict(cfg.pd),
        "slo": to_dict(cfg.slo),
        "seed": cfg.seed,
        **({"gateway": to_dict(cfg.gateway)} if cfg.gateway != GatewayConfig() else {}),
        **({"autoscale": to_dict(cfg.autoscale)} if cfg.autoscale is not None else {}),
        **({"gpu_cost_per_hour": dict(cfg.gpu_cost_per_hour)} if cfg.gpu_cost_per_hour else {}),
    }
