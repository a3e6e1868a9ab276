"""Scheduler and cache configuration: nested dataclasses validated on construction.

Defaults follow vLLM 0.19.1 where vLLM has one (scheduler_reserve_full_isl=True, chunked prefill
on, prefix caching on, block size 16).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.scheduler.kv.single_type import KVCacheGroupSpec
from servesim.scheduler.policies.base import DEFAULT_POLICY, SCHEDULING_POLICIES

# Policy names: the registry of scheduler/policies/ (iterable, supports `in`).
POLICIES = SCHEDULING_POLICIES
SPEC_METHODS = ("ngram", "eagle", "draft_model")
ATTENTION_LAYOUTS = ("full", "sliding_window", "hybrid", "groups")
MAMBA_CACHE_MODES = ("none", "align", "all")  # vLLM 0.19.1's CacheConfig.mamba_cache_mode


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def max_concurrent_batches(pipeline_parallel_size: int, async_scheduling: bool) -> int:
    """Steps the engine keeps in flight (vLLM 0.19's VllmConfig.max_concurrent_batches, V1 model
    runner): with pipeline parallelism one batch per stage fills the pipeline, async scheduling or
    not; without it, async scheduling keeps two (step N+1 scheduled while step N runs), sync one.
    The scheduler's decisions depend on nothing else of PP (checked with the vLLM oracle: an
    async PP=2 trace is byte-identical to the async one; tests/golden/pp*)."""
    _require(pipeline_parallel_size >= 1, f"pipeline_parallel_size must be >= 1, got {pipeline_parallel_size}")
    if pipeline_parallel_size > 1:
        return pipeline_parallel_size
    return 2 if async_scheduling else 1


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256  # running requests at most
    max_num_batched_tokens: int = 2048  # token budget per step
    # Tokens (prompt + output) per request at most. None: "the model's context length", which a
    # caller that knows the model fills in (simulator.config.SimConfig); a scheduler needs an int.
    max_model_len: int | None = 2048
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # > 0: cap each request's tokens per step
    policy: str = DEFAULT_POLICY  # a name in POLICIES (scheduler/policies/)
    async_scheduling: bool = False
    num_spec_tokens: int = 0  # speculative tokens proposed per step per request
    spec_method: str = "ngram"  # eagle / draft_model also reserve lookahead slots
    scheduler_reserve_full_isl: bool = True  # admit only if the whole prompt fits
    max_loras: int | None = None  # None: LoRA disabled; else adapters per step at most
    # Multimodal encoder (vLLM's SchedulerConfig, scheduler/encoder_cache.py): the model's largest item
    # in embeddings (0: a text-only model, no encoder budget or cache, as vLLM), the encoder compute
    # budget per step and the encoder cache size, both in embeddings (None: max_num_batched_tokens,
    # vLLM's default; each is raised to at least one largest item: compute_mm_encoder_budget).
    mm_max_tokens_per_item: int = 0
    max_num_encoder_input_tokens: int | None = None
    encoder_cache_size: int | None = None
    disable_chunked_mm_input: bool = False  # never split an item across steps
    # Continuum policy: pins longer than this are not worth it (seconds).
    continuum_pin_threshold_s: float = 2.0
    # Continuum: tool-call gap predicted for a job with no observations yet (seconds).
    continuum_default_gap_s: float = 1.0

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _require(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        _require(self.max_model_len is None or self.max_model_len >= 2,
                 f"max_model_len must be >= 2 (or None: from the model), got {self.max_model_len}")
        _require(
            self.long_prefill_token_threshold >= 0,
            f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}",
        )
        SCHEDULING_POLICIES.get(self.policy)  # unknown: a ValueError with a did-you-mean
        _require(self.num_spec_tokens >= 0, f"num_spec_tokens must be >= 0, got {self.num_spec_tokens}")
        _require(
            self.spec_method in SPEC_METHODS,
            f"unknown spec_method {self.spec_method!r} (valid: {', '.join(SPEC_METHODS)})",
        )
        _require(
            self.max_num_scheduled_tokens >= 1,
            f"draft_model speculation keeps max_num_seqs ({self.max_num_seqs}) slots of "
            f"max_num_batched_tokens ({self.max_num_batched_tokens}) for drafting: none left to schedule",
        )
        _require(self.max_loras is None or self.max_loras >= 1, "max_loras must be None or >= 1")
        _require(self.continuum_pin_threshold_s >= 0, "continuum_pin_threshold_s must be >= 0")
        _require(self.continuum_default_gap_s >= 0, "continuum_default_gap_s must be >= 0")
        _check_encoder(self)
        if not self.enable_chunked_prefill and self.max_model_len is not None:
            # vLLM's rule: without chunking every prompt must fit in one step's budget.
            _require(
                self.max_num_batched_tokens >= self.max_model_len,
                "with chunked prefill off, max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})",
            )
            # The same rule on the budget the scheduler really has: vLLM checks it on
            # max_num_batched_tokens only, and a draft model's reserved slots leave prompts between
            # the two budgets waiting forever (never scheduled, never refused).
            _require(
                self.max_num_scheduled_tokens >= self.max_model_len,
                "with chunked prefill off and draft_model speculation, the scheduler's budget "
                f"max_num_batched_tokens - max_num_seqs ({self.max_num_scheduled_tokens}) must be >= "
                f"max_model_len ({self.max_model_len}): longer prompts could never be scheduled",
            )

    @property
    def max_num_scheduled_tokens(self) -> int:
        """The scheduler's per-step token budget (VllmConfig._set_max_num_scheduled_tokens).

        A draft model drafts for every sequence of the batch with one extra slot each, so vLLM
        keeps max_num_seqs slots of max_num_batched_tokens free for it."""
        if self.spec_method == "draft_model" and self.num_spec_tokens > 0:
            return self.max_num_batched_tokens - self.max_num_seqs
        return self.max_num_batched_tokens

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved beyond the scheduled tokens for the drafter (eagle, draft model)."""
        return self.num_spec_tokens if self.spec_method in ("eagle", "draft_model") else 0

    @property
    def use_eagle(self) -> bool:
        return self.spec_method == "eagle" and self.num_spec_tokens > 0


def _check_encoder(cfg: SchedulerConfig) -> None:
    _require(cfg.mm_max_tokens_per_item >= 0, f"mm_max_tokens_per_item must be >= 0, got {cfg.mm_max_tokens_per_item}")
    for name, value in (("max_num_encoder_input_tokens", cfg.max_num_encoder_input_tokens),
                        ("encoder_cache_size", cfg.encoder_cache_size)):
        _require(value is None or value >= 1, f"{name} must be >= 1 (or None: max_num_batched_tokens), got {value}")
    # vLLM's compute_mm_encoder_budget refuses this: an unsplittable item must fit one step's budget.
    _require(not (cfg.disable_chunked_mm_input and cfg.mm_max_tokens_per_item > cfg.max_num_batched_tokens),
             f"Chunked MM input disabled but max_tokens_per_mm_item ({cfg.mm_max_tokens_per_item}) is larger "
             f"than max_num_batched_tokens ({cfg.max_num_batched_tokens}). Please increase max_num_batched_tokens.")


def _group_spec(value: object) -> KVCacheGroupSpec:
    if isinstance(value, KVCacheGroupSpec):
        return value
    _require(isinstance(value, dict), f"each of kv_cache_groups is a mapping of KVCacheGroupSpec fields, got {value!r}")
    assert isinstance(value, dict)
    try:
        return KVCacheGroupSpec(**value)
    except TypeError as e:
        raise ValueError(f"kv_cache_groups: {e}") from None


@dataclass(slots=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    num_gpu_blocks: int = 1000  # blocks in the pool, block 0 (the null block) included
    enable_prefix_caching: bool = True
    sliding_window: int | None = None  # tokens; required by the sliding_window/hybrid layouts
    # "full": one full-attention group; "sliding_window": one sliding-window group;
    # "hybrid": a full-attention group and a sliding-window group sharing the pool;
    # "groups": the groups listed in kv_cache_groups (a model's layers, any kinds) share the pool.
    attention: str = "full"
    hash_algo: str = "sha256"  # block hash function: sha256 | blake2b
    enable_kv_cache_events: bool = False
    # The KV cache groups when attention == "groups", in vLLM's group order (KVCacheGroupSpec,
    # scheduler/kv/single_type.py); empty otherwise.
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = ()
    # How Mamba / linear-attention state is cached for prefix reuse (vLLM's --mamba-cache-mode):
    # "none" keeps one state per request, "align" caches it at block boundaries, "all" every block.
    mamba_cache_mode: str = "none"

    def __post_init__(self) -> None:
        _require(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        _require(
            self.num_gpu_blocks >= 2,
            f"num_gpu_blocks must be >= 2 (block 0 is the null block), got {self.num_gpu_blocks}",
        )
        _require(
            self.attention in ATTENTION_LAYOUTS,
            f"unknown attention layout {self.attention!r} (valid: {', '.join(ATTENTION_LAYOUTS)})",
        )
        if self.sliding_window is not None and self.attention == "full":
            self.attention = "sliding_window"  # a window given alone means every layer uses it
        _require(self.mamba_cache_mode in MAMBA_CACHE_MODES,
                 f"unknown mamba_cache_mode {self.mamba_cache_mode!r} (valid: {', '.join(MAMBA_CACHE_MODES)})")
        # YAML and --set give each group as a mapping of KVCacheGroupSpec's fields.
        self.kv_cache_groups = tuple(_group_spec(g) for g in self.kv_cache_groups)
        _require((self.attention == "groups") == bool(self.kv_cache_groups),
                 "kv_cache_groups is given exactly when attention='groups'")
        if self.kv_cache_groups:
            from servesim.scheduler.kv.kinds import validate_kv_cache_groups

            validate_kv_cache_groups(self.kv_cache_groups, self.block_size, self.enable_prefix_caching,
                                     self.mamba_cache_mode)
        if self.attention not in ("full", "groups"):
            _require(
                self.sliding_window is not None and self.sliding_window >= 1,
                f"attention={self.attention!r} needs sliding_window >= 1 tokens",
            )
        from servesim.scheduler.hashing import HASH_FUNCTIONS
        from servesim.scheduler.registry import unknown_name_message

        _require(
            self.hash_algo in HASH_FUNCTIONS,
            f"{unknown_name_message('hash_algo', self.hash_algo, HASH_FUNCTIONS.names())} "
            f"(valid: {', '.join(HASH_FUNCTIONS.names())})",
        )
