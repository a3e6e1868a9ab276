"""Pinned host memory per node: the CPU KV tiers of the replicas on one node share its system
memory, and a cluster whose tiers need more than the node has is refused.

A replica's tier pins (all its ranks together):
- vLLM's OffloadingConnector: num_blocks offload blocks of block_size_factor GPU blocks, each GPU
  block block_size x kv_bytes_per_token(model, tp) x tp bytes (CPUOffloadingSpec's arithmetic,
  simulator/kv_offload.py tier_num_blocks): at most --kv-offloading-size GiB;
- SGLang's HiCache: the host pool of each TP rank (MHATokenToKVPoolHost: hicache_size GB, else the
  device pool x hicache_ratio; HiCacheConfig.host_num_pages) x one GPU's KV bytes per token x tp.
Replicas of groups naming the same `node` share that node; a replica naming none has a node of its
own (its tier alone must fit). The node's memory is its host spec's `host_memory_gib` (hosts.yaml,
cited; a host without one is not checked). The check is an upper bound: the OS, the engines'
processes and other pinned buffers also use host memory, and are not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.scheduler.config import CacheConfig
    from servesim.simulator.cluster.cluster import Replica
    from servesim.simulator.config import SimConfig

GIB_BYTES = 1 << 30


def cpu_tier_bytes(cfg: SimConfig, cache: CacheConfig) -> int:
    """Host bytes the replica's CPU KV tier pins, over all its ranks (0 without a tier); cfg and
    cache resolved (Engine.cfg, Engine.cache)."""
    hw = cfg.hardware
    if cfg.engine == "vllm" and cfg.kv_offload.enabled:
        from servesim.simulator.kv_offload import tier_bytes

        return tier_bytes(cfg, cache)
    if cfg.engine == "sglang" and cfg.sglang.hicache.enable_hierarchical_cache:
        from servesim.simulator.scheduler_kinds.sglang import map_sglang_config, resolve_hicache

        sg = map_sglang_config(cfg.scheduler, cache, resolve_hicache(cfg.sglang, hw), cfg.seed)
        tokens = sg.hicache.host_num_pages(sg.max_total_tokens, sg.page_size) * sg.page_size
        return tokens * sg.hicache.kv_bytes_per_token * hw.tp
    return 0


def check_node_memory(replicas: list[Replica]) -> None:
    """Refuse a node whose replicas' CPU tiers need more than its host memory (module doc)."""
    from servesim.simulator.specs import host_for

    nodes: dict[str, list[Replica]] = {}
    for r in replicas:
        nodes.setdefault(r.node if r.node is not None else f"{r.name}'s own node", []).append(r)
    for node, members in nodes.items():
        tiers = {r.name: cpu_tier_bytes(r.engine.cfg, r.engine.cache) for r in members}
        need = sum(tiers.values())
        hw = members[0].cfg.hardware
        host = host_for(hw.gpu, hw.host)
        if need == 0 or host.host_memory_gib is None or need <= host.host_memory_gib * GIB_BYTES:
            continue
        parts = ", ".join(f"{name} {n / GIB_BYTES:.1f}" for name, n in tiers.items() if n)
        raise InputError(f"the CPU KV tiers on node {node!r} pin {need / GIB_BYTES:.1f} GiB of host memory "
                         f"({parts} GiB), more than its host {host.name!r} has ({host.host_memory_gib:g} GiB)",
                         field="replicas[].sim.kv_offload / replicas[].sim.sglang.hicache",
                         allowed=f"tiers summing to <= {host.host_memory_gib:g} GiB per node, or the replicas on "
                                 "more nodes (replicas[].node)")
