"""SGLang's hybrid-model and speculative-decoding settings: MambaCacheConfig (nested in SGLangConfig
as `mamba`: YAML `sglang: {mamba: {...}}`, `--set sglang.mamba.max_mamba_cache_size=...`), the
checks of the speculative fields, and resolve_pools, which sizes the state and KV pools the way
SGLang's model runner does.

Sources (read, not copied): sglang server_args.py (v0.5 line: --max-mamba-cache-size None,
--mamba-full-memory-ratio 0.9) and the model runner's handle_max_mamba_cache / init_memory_pool of
v0.5.9 (model_runner_kv_cache_mixin.py): the state memory is split from the KV memory by the ratio
(after reserving the speculative verify's intermediate states), running requests are capped at
a third of the state slots with the radix cache (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3),
and with speculative decoding the KV pool gets headroom for drafts and verify tokens.

The model seam: `num_mamba_layers` > 0 marks a hybrid model. Until the model specs say so
(simulator/specs/, the hybrid-models work), the run's config does; the resolver in
simulator/scheduler_kinds/sglang.py is where the spec's linear-attention layer count and state
bytes per request will be filled in, as HiCache's kv_bytes_per_token is today.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.sglang.config import SGLangConfig

# model_runner (v0.5.9): with the radix cache, max_num_reqs <= max_mamba_cache_size // 3 (a running
# request's own state, the tree state it copied from, and a forked copy for cache_unfinished_req).
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
# init_memory_pool (v0.5.9): draft_runner_cache_size adds this many tokens of buffer to the pool.
SPEC_KV_POOL_BUFFER_TOKENS = 100


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(slots=True)
class MambaCacheConfig:
    num_mamba_layers: int = 0  # linear-attention (Mamba / GDN) layers; 0: not a hybrid model
    max_mamba_cache_size: int | None = None  # --max-mamba-cache-size: state slots (None: derived)
    mamba_full_memory_ratio: float = 0.9  # --mamba-full-memory-ratio: state bytes / KV bytes
    # One GPU's bytes: a request's state (every linear layer's conv + temporal state), and the
    # full-attention layers' KV per token. With both, max_total_tokens is read as the memory the
    # model runner splits (in KV tokens), and the KV pool is what the state pool leaves of it.
    mamba_cache_per_req_bytes: int | None = None
    kv_bytes_per_token: int | None = None

    def __post_init__(self) -> None:
        _require(self.num_mamba_layers >= 0, f"num_mamba_layers must be >= 0, got {self.num_mamba_layers}")
        _require(self.max_mamba_cache_size is None or self.max_mamba_cache_size >= 1,
                 f"max_mamba_cache_size must be >= 1 (or None), got {self.max_mamba_cache_size}")
        _require(self.mamba_full_memory_ratio > 0,
                 f"mamba_full_memory_ratio must be > 0, got {self.mamba_full_memory_ratio}")
        for name in ("mamba_cache_per_req_bytes", "kv_bytes_per_token"):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"{name} must be >= 1 (or None), got {value}")

    @property
    def enabled(self) -> bool:
        return self.num_mamba_layers > 0

    @property
    def split_known(self) -> bool:
        return self.mamba_cache_per_req_bytes is not None and self.kv_bytes_per_token is not None


def check_hybrid(cfg: SGLangConfig) -> None:
    """The checks SGLangConfig.__post_init__ runs on the speculative and Mamba fields."""
    if isinstance(cfg.mamba, dict):  # a mapping from YAML / --set
        cfg.mamba = MambaCacheConfig(**cfg.mamba)
    _require(cfg.speculative_num_steps >= 0, f"speculative_num_steps must be >= 0, got {cfg.speculative_num_steps}")
    # Only the chain (topk 1) is modelled: tree drafts verify a token tree, not 1 + k tokens.
    _require(cfg.speculative_eagle_topk == 1,
             f"speculative_eagle_topk must be 1 (chain drafts, as MTP runs), got {cfg.speculative_eagle_topk}")
    if cfg.speculative_num_draft_tokens is not None:
        # SGLang's server_args: with topk 1 the draft tokens are the steps plus the verified one.
        _require(cfg.speculative_num_draft_tokens == cfg.speculative_num_steps + 1,
                 f"speculative_num_draft_tokens must be speculative_num_steps + 1 "
                 f"({cfg.speculative_num_steps + 1}) with speculative_eagle_topk 1, got "
                 f"{cfg.speculative_num_draft_tokens} (or leave it unset)")
    if cfg.speculative_num_steps:
        _require(not cfg.enable_mixed_chunk, "enable_mixed_chunk is not supported with speculative decoding "
                                             "(SGLang turns mixed chunk off for EAGLE / MTP)")
        _require(not cfg.overlap_schedule or cfg.enable_spec_v2,
                 "the overlap schedule with speculative decoding needs enable_spec_v2 (SGLANG_ENABLE_SPEC_V2; "
                 "without it SGLang turns the overlap schedule off)")
    if cfg.mamba.enabled:
        _require(not cfg.hicache.enable_hierarchical_cache,
                 "sglang.hicache with a hybrid (Mamba) model is not modelled: the host tier of "
                 "MambaRadixCache is not simulated (turn one of them off)")


def num_draft_tokens(cfg: SGLangConfig) -> int:
    """Tokens a verify step computes per request (0: no speculative decoding)."""
    return cfg.speculative_num_steps + 1 if cfg.speculative_num_steps else 0


def running_ratio(cfg: SGLangConfig) -> int:
    return MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO if cfg.enable_radix_cache else 1


def resolve_pools(cfg: SGLangConfig) -> SGLangConfig:
    """The pools SGLang's model runner builds for `cfg` (its inherited fields resolved): the
    Mamba state slots and the KV left beside them, the running-request cap, and the KV headroom
    for speculative drafts. Run once, where shared settings become SGLang's (map_sglang_config);
    a scheduler checks the result (check_resolved)."""
    m = cfg.mamba
    total, running = cfg.max_total_tokens, cfg.max_running_requests
    if m.enabled:
        slots = m.max_mamba_cache_size
        if m.split_known:
            rest = total * m.kv_bytes_per_token
            if cfg.speculative_num_steps:  # the verify's per-draft-position states
                rest -= m.mamba_cache_per_req_bytes * running * num_draft_tokens(cfg)
            if slots is None and cfg.enable_radix_cache:
                ratio = m.mamba_full_memory_ratio
                slots = int(rest * ratio / (1 + ratio) // m.mamba_cache_per_req_bytes)
        if slots is None and not cfg.enable_radix_cache:
            slots = running  # SGLang: without the radix cache, one state per running request
        _require(slots is not None, "a hybrid model needs sglang.mamba.max_mamba_cache_size, or "
                 "sglang.mamba.mamba_cache_per_req_bytes and kv_bytes_per_token to split the memory by "
                 "mamba_full_memory_ratio")
        if m.split_known:
            total = (rest - slots * m.mamba_cache_per_req_bytes) // m.kv_bytes_per_token
        running = min(running, slots // running_ratio(cfg))
        _require(running >= 1 and total >= cfg.page_size,
                 f"the Mamba state pool ({slots} slots) leaves {running} running requests and {total} KV "
                 "tokens: too small (more memory, a smaller mamba_full_memory_ratio or max_mamba_cache_size)")
        m = dataclasses.replace(m, max_mamba_cache_size=slots)
    if cfg.speculative_num_steps:  # draft_runner_cache_size (topk 1)
        total += running * (cfg.speculative_num_steps + num_draft_tokens(cfg)) + SPEC_KV_POOL_BUFFER_TOKENS
    total = total // cfg.page_size * cfg.page_size
    return dataclasses.replace(cfg, mamba=m, max_total_tokens=total, max_running_requests=running)


def check_resolved(cfg: SGLangConfig) -> int:
    """Mamba state slots the scheduler builds (0: not a hybrid model); refuses a config whose
    pools were not resolved."""
    m = cfg.mamba
    if not m.enabled:
        return 0
    _require(m.max_mamba_cache_size is not None,
             "sglang.mamba.max_mamba_cache_size is unresolved (size the pools with "
             "servesim.scheduler.sglang.hybrid_config.resolve_pools)")
    ratio = running_ratio(cfg)
    _require(cfg.max_running_requests * ratio <= m.max_mamba_cache_size,
             f"max_running_requests ({cfg.max_running_requests}) needs {ratio} Mamba states each, the pool "
             f"has {m.max_mamba_cache_size} (SGLang caps it: resolve_pools)")
    return m.max_mamba_cache_size
