"""SGLangConfig: the knobs of the SGLang-style scheduler, validated on construction.

Defaults are SGLang's (server_args.py / environ.py of the v0.5 line) except where a comment says
otherwise. Fields typed `X | None` default to None, meaning "take the value from the shared
SchedulerConfig/CacheConfig" (simulator/scheduler_kinds/sglang.py::map_sglang_config fills them in); the
scheduler itself only accepts a config whose fields are all resolved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from servesim.scheduler.registry import Registry, unknown_name_message
from servesim.scheduler.sglang.hicache_config import HiCacheConfig
from servesim.scheduler.sglang.hybrid_config import MambaCacheConfig, check_hybrid

# Queue orderings (SchedulePolicy.calc_priority) by name: `ordering(waiting, QueueContext)`. The
# built-ins register themselves in policy.py (named here as a string: policy.py imports this
# module); a new ordering registers with policy.register_ordering.
ORDERINGS: Registry[Callable[..., None]] = Registry("schedule policy", plugins="servesim.scheduler.sglang.policy")
# The cache-aware orderings need the radix cache (without it they fall back to fcfs).
CACHE_AWARE_POLICIES = ("lpm", "dfs-weight")

# Fields that inherit a shared setting when None (see map_sglang_config).
INHERITED_FIELDS = (
    "max_running_requests", "chunked_prefill_size", "enable_chunked_prefill", "page_size",
    "max_total_tokens", "enable_radix_cache", "overlap_schedule", "seed",
)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(slots=True)
class SGLangConfig:
    schedule_policy: str = "fcfs"  # a name in ORDERINGS
    # --- inherited from the shared configs when None -------------------------------------------
    max_running_requests: int | None = None  # requests in the running batch at most (max_num_seqs)
    chunked_prefill_size: int | None = None  # tokens per prefill chunk (max_num_batched_tokens)
    enable_chunked_prefill: bool | None = None  # False: SGLang's chunked_prefill_size=-1
    page_size: int | None = None  # tokens per KV page (cache.block_size; SGLang's own default is 1)
    max_total_tokens: int | None = None  # token pool size ((num_gpu_blocks - 1) * block_size)
    enable_radix_cache: bool | None = None  # False: SGLang's --disable-radix-cache (ChunkCache)
    overlap_schedule: bool | None = None  # CPU/GPU overlap (scheduler.async_scheduling; SGLang: on)
    seed: int | None = None  # seeds the `random` policy (SimConfig.seed)
    # --- SGLang-only ----------------------------------------------------------------------------
    max_prefill_tokens: int = 16384  # tokens per prefill batch (rem_input_tokens)
    prefill_max_requests: int | None = None  # requests per prefill batch at most; None: no cap
    disable_consecutive_prefill_overlap: bool = False  # SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP
    enable_mixed_chunk: bool = False  # decode tokens ride along with a prefill batch
    init_new_token_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO (times conservativeness)
    min_new_token_ratio_factor: float = 0.14  # min ratio = init ratio * this factor
    new_token_ratio_decay_steps: int = 600  # decode steps to decay from init to min
    schedule_conservativeness: float = 1.0  # scales init_new_token_ratio (capped at 1)
    retract_decode_steps: int = 20  # decode steps of headroom assumed after a retraction
    clip_max_new_tokens: int = 4096  # cap on max_new_tokens in reservation estimates
    enable_priority_scheduling: bool = False
    # SGLang's default is False (larger values first). Ours is True so the trace's `priority`
    # means the same thing (lower runs first) for the vLLM and SGLang engines.
    schedule_low_priority_values_first: bool = True
    priority_scheduling_preemption_threshold: int = 10  # priority gap needed to preempt
    in_batch_prefix_check_threshold: int = 32  # tokens: LPM in-batch dedup looks below this hit
    in_batch_prefix_deprioritize_threshold: int = 32  # tokens shared with an earlier waiter
    lpm_fallback_queue_len: int = 128  # LPM sorts only queues up to this length (else FCFS)
    # SGLang's hierarchical cache (--enable-hierarchical-cache and the --hicache-* flags).
    hicache: HiCacheConfig = field(default_factory=HiCacheConfig)
    # Speculative decoding as SGLang's EAGLE / MTP worker runs it with chain drafts (topk 1): each
    # decode step verifies 1 + speculative_num_steps tokens per request. The engine sets the steps
    # from scheduler.num_spec_tokens (acceptance: spec_decode.acceptance, the run's one model).
    speculative_num_steps: int = 0  # --speculative-num-steps (0: off)
    speculative_eagle_topk: int = 1  # --speculative-eagle-topk: only 1 is modelled
    speculative_num_draft_tokens: int | None = None  # --speculative-num-draft-tokens; None: steps + 1
    # SGLANG_ENABLE_SPEC_V2: the overlap-capable speculative worker. Without it SGLang turns the
    # overlap schedule off for EAGLE / MTP (server_args._handle_speculative_decoding).
    enable_spec_v2: bool = False
    # Hybrid (Mamba / linear-attention) models: the state pool and MambaRadixCache.
    mamba: MambaCacheConfig = field(default_factory=MambaCacheConfig)

    def __post_init__(self) -> None:
        if self.schedule_policy not in ORDERINGS:
            valid = [*CACHE_AWARE_POLICIES, *(n for n, _ in ORDERINGS.items() if n not in CACHE_AWARE_POLICIES)]
            raise ValueError(f"{unknown_name_message('schedule_policy', self.schedule_policy, valid)} "
                             f"(valid: {', '.join(valid)})")
        for name in ("max_running_requests", "chunked_prefill_size", "page_size", "max_total_tokens",
                     "prefill_max_requests"):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"{name} must be >= 1 (or None), got {value}")
        _require(self.seed is None or self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        _require(self.max_prefill_tokens >= 1, f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        _require(0 < self.init_new_token_ratio <= 1, "init_new_token_ratio must be in (0, 1]")
        _require(0 < self.min_new_token_ratio_factor <= 1, "min_new_token_ratio_factor must be in (0, 1]")
        _require(self.new_token_ratio_decay_steps >= 1, "new_token_ratio_decay_steps must be >= 1")
        _require(self.schedule_conservativeness > 0, "schedule_conservativeness must be > 0")
        _require(self.retract_decode_steps >= 1, "retract_decode_steps must be >= 1")
        _require(self.clip_max_new_tokens >= 1, "clip_max_new_tokens must be >= 1")
        _require(self.priority_scheduling_preemption_threshold >= 0,
                 "priority_scheduling_preemption_threshold must be >= 0")
        _require(self.lpm_fallback_queue_len >= 0, "lpm_fallback_queue_len must be >= 0")
        if self.page_size is not None and self.chunked_prefill_size is not None and self.enable_chunked_prefill:
            # SGLang cuts every prefill chunk down to whole pages: a smaller budget admits nothing.
            _require(self.chunked_prefill_size >= self.page_size,
                     f"chunked_prefill_size ({self.chunked_prefill_size}) must be >= page_size ({self.page_size}): "
                     "prefill chunks are whole pages, so a smaller budget could never admit a prompt")
        if self.page_size is not None and self.max_total_tokens is not None:
            _require(self.max_total_tokens >= self.page_size,
                     f"max_total_tokens ({self.max_total_tokens}) must hold one page ({self.page_size})")
        if isinstance(self.hicache, dict):  # a mapping from YAML / --set
            self.hicache = HiCacheConfig(**self.hicache)
        check_hybrid(self)
        if self.hicache.enable_hierarchical_cache:
            # SGLang's ServerArgs check, its own words.
            _require(self.enable_radix_cache is not False,
                     "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
                     "and cannot be used at the same time. Please use only one of them "
                     "(sglang.hicache.enable_hierarchical_cache needs the radix cache: "
                     "cache.enable_prefix_caching / sglang.enable_radix_cache)")
            if self.page_size is not None and self.max_total_tokens is not None:
                self.hicache.host_num_pages(self.num_pages * self.page_size, self.page_size)

    # --- derived ---------------------------------------------------------------------------------
    @property
    def init_ratio(self) -> float:
        """new_token_ratio at start, after idle periods and as the retraction ceiling."""
        return min(self.init_new_token_ratio * self.schedule_conservativeness, 1.0)

    @property
    def min_ratio(self) -> float:
        return min(self.init_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def ratio_decay(self) -> float:
        """Linear decay per decode step (SGLang: (init - min) / decay_steps)."""
        return (self.init_ratio - self.min_ratio) / self.new_token_ratio_decay_steps

    @property
    def num_pages(self) -> int:
        """Usable KV pages; page 0 is reserved on top of these (SGLang's padding slot)."""
        return self.max_total_tokens // self.page_size

    def unresolved_fields(self) -> list[str]:
        return [name for name in INHERITED_FIELDS if getattr(self, name) is None]

    def resolved(self, **values) -> SGLangConfig:
        """A copy with the None fields among `values` filled in (explicit settings win)."""
        unknown = set(values) - set(INHERITED_FIELDS)
        _require(not unknown, f"not inheritable: {sorted(unknown)} (valid: {', '.join(INHERITED_FIELDS)})")
        fill = {k: v for k, v in values.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **fill)
