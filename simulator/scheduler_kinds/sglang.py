"""Registers the "sglang" engine: SGLangScheduler configured from the shared configs.

Selected with `SimConfig(engine="sglang")` or `servesim replay --engine sglang`. An optional
`sim_config.sglang` (an SGLangConfig) sets SGLang-only knobs; its None fields inherit from the
shared SchedulerConfig / CacheConfig / SimConfig (map_sglang_config), so `--set
scheduler.max_num_seqs=...` means the same for both engines.
"""

from __future__ import annotations

import dataclasses

from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.hybrid_config import resolve_pools
from servesim.simulator.scheduler_kinds import register_engine


def map_sglang_config(scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                      sglang: SGLangConfig | None = None, seed: int = 0) -> SGLangConfig:
    """The SGLang config to run: explicit SGLang settings win; the rest map from the shared ones.

    max_num_seqs -> max_running_requests, max_num_batched_tokens -> chunked_prefill_size,
    enable_chunked_prefill -> enable_chunked_prefill, block_size -> page_size (so page ids mean
    what block ids mean to the executors), (num_gpu_blocks - 1) * block_size -> max_total_tokens
    (the same usable KV as vLLM), enable_prefix_caching -> enable_radix_cache,
    async_scheduling -> overlap_schedule, SimConfig.seed -> seed, num_spec_tokens ->
    speculative_num_steps (EAGLE / MTP chain drafts; the acceptance model is the run's
    spec_decode.acceptance, which the executor draws from). Then the pools are sized as SGLang's
    model runner sizes them (hybrid_config.resolve_pools: Mamba states, running-request cap,
    speculative KV headroom).
    """
    base = sglang if sglang is not None else SGLangConfig()
    steps = scheduler_config.num_spec_tokens
    if base.speculative_num_steps and base.speculative_num_steps != steps:
        raise ValueError(f"sglang.speculative_num_steps ({base.speculative_num_steps}) differs from "
                         f"scheduler.num_spec_tokens ({steps}): set scheduler.num_spec_tokens (and "
                         "spec_decode.acceptance), which both engines and the executor read")
    # SGLang turns the overlap schedule off for EAGLE / MTP unless spec v2 is on.
    overlap = scheduler_config.async_scheduling and (not steps or base.enable_spec_v2)
    if steps and not base.speculative_num_steps:
        if not overlap and base.overlap_schedule:
            base = dataclasses.replace(base, overlap_schedule=False)
        base = dataclasses.replace(base, speculative_num_steps=steps)
    return resolve_pools(base.resolved(
        max_running_requests=scheduler_config.max_num_seqs,
        chunked_prefill_size=scheduler_config.max_num_batched_tokens,
        enable_chunked_prefill=scheduler_config.enable_chunked_prefill,
        page_size=cache_config.block_size,
        max_total_tokens=(cache_config.num_gpu_blocks - 1) * cache_config.block_size,
        enable_radix_cache=cache_config.enable_prefix_caching,
        overlap_schedule=overlap,
        seed=seed,
    ))


def resolve_hicache(sglang: SGLangConfig, hardware) -> SGLangConfig:
    """HiCache's hardware figures, where unset: the model's KV bytes per token on one GPU (tp
    shards it) and the host link (the host's PCIe generation x lanes, one direction)."""
    hc = sglang.hicache
    if not hc.enable_hierarchical_cache or hardware is None:
        return sglang
    from servesim.simulator.specs import host_for, kv_bytes_per_token, resolve_model

    fill = {}
    if hc.kv_bytes_per_token is None:
        fill["kv_bytes_per_token"] = kv_bytes_per_token(resolve_model(hardware.model), hardware.tp)
    if hc.host_link_bytes_per_s is None:
        fill["host_link_bytes_per_s"] = host_for(hardware.gpu, hardware.host).pcie_gb_s * 1e9
    return dataclasses.replace(sglang, hicache=dataclasses.replace(hc, **fill)) if fill else sglang


def resolve_mamba(sglang: SGLangConfig, hardware, num_spec_tokens: int = 0) -> SGLangConfig:
    """The hybrid model's figures from its spec where the config leaves them unset: the Mamba / GDN
    layer count and one request's state bytes on one GPU (every linear layer's conv + temporal
    state, as SGLang's MambaPool holds it: LinearAttentionSpec.state_bytes, the shapes vLLM's
    MambaStateShapeCalculator gives), and the attention layers' KV bytes per token, which
    hybrid_config.resolve_pools needs to split the memory between the two pools."""
    if hardware is None:
        return sglang
    from servesim.simulator.specs import kv_bytes_per_token, resolve_model

    model = resolve_model(hardware.model)
    m = sglang.mamba
    lin = model.linear_attention
    if not m.enabled and lin is not None:  # a hybrid model: its linear layers from the spec
        n = model.count_layers("mamba")
        m = dataclasses.replace(m, num_mamba_layers=n, mamba_cache_per_req_bytes=m.mamba_cache_per_req_bytes or
                                n * lin.state_bytes(hardware.tp, model.dtype_bytes, num_spec_tokens))
    if not m.enabled or m.mamba_cache_per_req_bytes is None or m.kv_bytes_per_token is not None:
        return sglang if m is sglang.mamba else dataclasses.replace(sglang, mamba=m)
    kv = kv_bytes_per_token(model, hardware.tp)
    return dataclasses.replace(sglang, mamba=dataclasses.replace(m, kv_bytes_per_token=kv))


@register_engine("sglang")
def _sglang(scheduler_config, cache_config, sim_config=None):
    sglang = getattr(sim_config, "sglang", None)
    seed = getattr(sim_config, "seed", 0)
    if sglang is not None:
        hardware = getattr(sim_config, "hardware", None)
        sglang = resolve_mamba(resolve_hicache(sglang, hardware), hardware, scheduler_config.num_spec_tokens)
    cfg = map_sglang_config(scheduler_config, cache_config, sglang, seed)
    # prefix_cache_keys: provenance keys the radix tree by page keys (no synthetic id is built);
    # token_ids by the ids, as SGLang does. The tree hits and misses alike either way.
    page_keys = getattr(sim_config, "prefix_cache_keys", "provenance") == "provenance"
    return SGLangScheduler(cfg, scheduler_config.max_model_len,
                           page_keys_hash_algo=cache_config.hash_algo if page_keys else None)
