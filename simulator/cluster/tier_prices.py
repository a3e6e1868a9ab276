"""What a prefix hit in each KV tier is worth to a replica, in seconds of prefill it saves.

A prefix-aware router (routers.py `prefix_aware`) prices a replica's hits as an estimate of the
time to first token they save:
- a GPU hit saves the prefill compute of its tokens;
- a CPU hit saves that compute too, but the request first waits for the host-to-device copy of
  its KV (vLLM's OffloadingConnector loads before the request is scheduled,
  WAITING_FOR_REMOTE_KVS; SGLang's HiCache load_back before the prefill): copy_s(n) =
  latency + n x one GPU's KV bytes per token / (host link bytes/s x efficiency), the copy time
  the replica's own worker uses (simulator/kv_offload.py TimedOffloadWorker.copy_s,
  scheduler/sglang/hicache.py HiCacheController.transfer_s);
- a miss costs the prefill.
So n CPU-hit tokens are worth n - copy_s(n) / prefill_s_per_token prefill tokens: fewer than n
GPU-hit tokens, more than a miss while the copy is faster than recomputing, and negative
(worse than a miss) when it is not, since the load is made whatever the router thinks.

prefill_s_per_token is the replica's own cost model's time for one prefill chunk of its step
budget (max_num_batched_tokens, no cached context) divided by that chunk: the cost model is the
run's measured or spec-derived step time (docs/COST_MODEL.md), nothing here is fitted. Pricing
prefill linearly per token ignores attention's growth with context; it errs towards valuing
late-prompt hits less than they save.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.simulator.config import SimConfig


@dataclass(slots=True, frozen=True)
class TierPrices:
    prefill_s_per_token: float  # > 0: prefill compute per prompt token (module doc)
    cpu_load_latency_s: float  # fixed cost of one host-to-device load
    cpu_load_s_per_token: float  # one GPU's KV bytes per token / the host link's bytes/s (0: no tier)

    def cpu_load_s(self, num_tokens: int) -> float:
        """Seconds the host-to-device load of num_tokens tokens' KV takes (one copy)."""
        return self.cpu_load_latency_s + num_tokens * self.cpu_load_s_per_token

    def cpu_hit_worth_tokens(self, num_tokens: int) -> float:
        """Prefill tokens whose time a CPU hit of num_tokens saves (module doc); 0 for no hit."""
        if num_tokens <= 0:
            return 0.0
        return num_tokens - self.cpu_load_s(num_tokens) / self.prefill_s_per_token


def cpu_tier_link(cfg: SimConfig) -> tuple[float, float] | None:
    """(latency s, seconds per token) of the replica's host-to-device KV copies, or None without a
    CPU tier: vLLM's kv_offload or SGLang's HiCache, each with the figures its own worker uses."""
    from servesim.simulator.kv_offload import host_link_figures

    if cfg.engine == "vllm" and cfg.kv_offload.enabled:
        per_token, link = host_link_figures(cfg)
        ko = cfg.kv_offload
        return ko.transfer_latency_s, per_token / (link * ko.transfer_efficiency)
    if cfg.engine == "sglang" and cfg.sglang.hicache.enable_hierarchical_cache:
        from servesim.simulator.scheduler_kinds.sglang import resolve_hicache

        hc = resolve_hicache(cfg.sglang, cfg.hardware).hicache
        return hc.transfer_latency_s, hc.kv_bytes_per_token / (hc.host_link_bytes_per_s * hc.transfer_efficiency)
    return None


def tier_prices(cfg: SimConfig) -> TierPrices:
    """The replica's prices (cfg: its resolved SimConfig, e.g. Engine.cfg)."""
    from servesim.simulator.cost_model.base import prefill_shape, run_cost_model

    chunk = cfg.scheduler.max_num_batched_tokens
    prefill_s = run_cost_model(cfg).step_time_s(prefill_shape(chunk))
    link = cpu_tier_link(cfg)
    latency_s, s_per_token = link if link is not None else (0.0, 0.0)
    return TierPrices(prefill_s / chunk, latency_s, s_per_token)
