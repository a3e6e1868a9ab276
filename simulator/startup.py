"""What vLLM refuses at start-up, refused here before anything runs, with vLLM's reason.

`check_startup(cfg)` runs whenever a SimConfig is constructed (YAML, `--set`, flags and the Python
API all build one) and again when an Engine is built from it, so every path sees the same rules:

- the model and GPU exist; `max_model_len` is at most the model's context length
  (vLLM: "User-specified max_model_len ... is greater than the derived max_model_len");
- `max_num_batched_tokens >= max_num_seqs` (vLLM's SchedulerConfig; not for the SGLang engine);
- without chunked prefill, `max_num_batched_tokens >= max_model_len` (vLLM's SchedulerConfig);
- the KV pool holds one request of `max_model_len` tokens (vLLM's check_enough_kv_cache_memory:
  "To serve at least one request with the models's max seq len ...");
- SGLang: a prefill budget of at least one page (chunks are whole pages);
- the CPU KV tier (kv_offload): vLLM's engine, prefix caching on, a tier of at least one offload
  block (simulator/kv_offload.py);
- an encoder-decoder model (Whisper): as vLLM forces its settings, on the vllm engine, without
  pipeline parallelism or a KV connector (simulator/encoder_decoder.py).

`resolve_max_model_len` / `resolve_cache` give what an engine runs with: the model's context
length when `scheduler.max_model_len` is None (vLLM derives it from max_position_embeddings), the
KV cache groups of a hybrid model (sliding-window, chunked local or Mamba layers: vLLM's hybrid
manager, simulator/kv_groups.py, with its raised block size and resolved mamba_cache_mode), and
the KV pool derived from GPU memory unless `cache.num_gpu_blocks` was set.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from servesim.scheduler.config import CacheConfig
from servesim.scheduler.sglang import SGLangConfig
from servesim.simulator.encoder_decoder import encoder_decoder_config
from servesim.simulator.kv_capacity import KvCapacity, derive_num_gpu_blocks
from servesim.simulator.kv_groups import KvLayout, kv_layout, layer_kinds
from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.simulator.config import SimConfig


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def resolve_max_model_len(cfg: SimConfig) -> int:
    """scheduler.max_model_len, or the model's max_position_embeddings when it is None."""
    if cfg.scheduler.max_model_len is not None:
        return cfg.scheduler.max_model_len
    return resolve_model(cfg.hardware.model).max_position_embeddings


def data_parallel_size(cfg: SimConfig) -> int:
    """The DP group this engine is a rank of: the roofline's ``data_parallel_size`` parameter, which
    cluster/dp.py's dp_cluster_config sets for every rank (1 for a lone engine)."""
    size = cfg.cost_model.params.get("data_parallel_size", 1)
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else 1


def model_kv_layout(cfg: SimConfig) -> KvLayout | None:
    """The KV cache groups vLLM's hybrid manager builds for the run's model (simulator/kv_groups.py),
    or None where the cache config is run as given: a model whose layers are all full attention,
    groups or a windowed layout set explicitly, or the SGLang engine. vLLM turns its hybrid manager
    off for KV events and for a KV connector (the CPU tier's), and for chunked attention with EAGLE;
    windowed and chunked layers then hold every token as full attention does."""
    model = resolve_model(cfg.hardware.model)
    kinds = set(layer_kinds(model)) - {"full", "mlp"} | ({"cross_attention"} if model.cross_attention else set())
    if cfg.engine != "vllm" or not kinds or cfg.cache.attention != "full" or cfg.cache.kv_cache_groups:
        return None
    sched = cfg.scheduler
    # vLLM 0.19.1 also turns it off for chunked local attention by default (config/vllm.py: "a latency
    # regression when using chunked local attention with the hybrid KV cache manager"; only
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 keeps it): Llama 4's chunked layers then
    # hold every token, as full attention does. The chunked-local manager runs where the groups are
    # given (cache.attention: groups).
    disable = cfg.cache.enable_kv_cache_events or cfg.kv_offload.enabled or "chunked_local" in kinds
    layout = kv_layout(model, cfg.hardware.tp, cfg.cache.block_size, mamba_cache_mode=cfg.cache.mamba_cache_mode,
                       enable_prefix_caching=cfg.cache.enable_prefix_caching,
                       max_model_len=resolve_max_model_len(cfg), num_spec_tokens=sched.num_spec_tokens,
                       disable_hybrid_kv_cache_manager=disable)
    if [g.kind for g in layout.groups] == ["full"] and layout.block_size == cfg.cache.block_size:
        return None  # the hybrid manager off: every layer holds every token, the plain layout
    return layout


def resolve_cache(cfg: SimConfig) -> tuple[CacheConfig, KvCapacity | None]:
    """The cache config to run with: as configured, or with num_gpu_blocks derived from memory;
    a hybrid model's groups, block size and mamba_cache_mode as vLLM lays them out."""
    hw = cfg.hardware
    layout = model_kv_layout(cfg)
    cache = cfg.cache if layout is None else replace(
        cfg.cache, attention="groups", kv_cache_groups=layout.groups, block_size=layout.block_size,
        mamba_cache_mode=layout.mamba_cache_mode)
    if not cfg.derive_num_gpu_blocks:
        return cache, None
    cap = derive_num_gpu_blocks(hw.model, hw.gpu, hw.tp, cache.block_size, hw.gpu_memory_utilization,
                                hw.activation_reserve_gib, pp=hw.pp, data_parallel_size=data_parallel_size(cfg),
                                layout=layout)
    return replace(cache, num_gpu_blocks=cap.num_gpu_blocks), cap


def resolved(cfg: SimConfig) -> SimConfig:
    """cfg checked, with scheduler.max_model_len filled in and what vLLM forces for an
    encoder-decoder model applied (simulator/encoder_decoder.py): what an engine is built from."""
    check_startup(cfg)
    cfg = encoder_decoder_config(cfg)
    sched = cfg.scheduler
    if sched.mm_max_tokens_per_item == 0:  # a vision-language model takes images as vLLM sizes them
        vision = resolve_model(cfg.hardware.model).vision
        if vision is not None and vision.max_tokens_per_item:
            sched = replace(sched, mm_max_tokens_per_item=vision.max_tokens_per_item)
    if sched.max_model_len is None:
        sched = replace(sched, max_model_len=resolve_max_model_len(cfg))
    return cfg if sched is cfg.scheduler else replace(cfg, scheduler=sched)


def blocks_for_max_model_len(cache: CacheConfig, max_model_len: int, max_num_batched_tokens: int) -> int:
    """KV blocks one request of max_model_len tokens needs, summed over the attention groups
    (a sliding-window group keeps only its window plus one step's chunk, as vLLM sizes it)."""
    if cache.attention == "groups":
        from servesim.scheduler.kv.kinds import max_blocks_per_request

        return sum(max_blocks_per_request(g, max_model_len, max_num_batched_tokens) for g in cache.kv_cache_groups)
    full = _cdiv(max_model_len, cache.block_size)
    if cache.attention == "full":
        return full
    window = min(_cdiv(cache.sliding_window - 1 + max_num_batched_tokens, cache.block_size) + 1, full)
    return window if cache.attention == "sliding_window" else full + window


def _check_pipeline(cfg: SimConfig) -> None:
    """Pipeline parallelism: every stage holds at least one layer; only the vLLM engine models it."""
    hw = cfg.hardware
    if hw.pp == 1:
        return
    layers = resolve_model(hw.model).num_layers
    if hw.pp > layers:
        raise InputError(f"{hw.model} has {layers} layers, too few for {hw.pp} pipeline stages",
                         field="hardware.pp", allowed=f"1 to {layers}")
    if cfg.engine != "vllm":
        raise InputError(f"pipeline parallelism is modelled for the vllm engine only, not {cfg.engine!r}",
                         field="hardware.pp", allowed="1 with engine: " + cfg.engine)
    from servesim.simulator.cost_model import run_cost_model
    from servesim.simulator.cost_model.pipeline import PipelineCost

    cost = run_cost_model(cfg)
    PipelineCost(cost, hw.model, hw.tp, hw.pp)  # refuses a model that cannot split a step over stages


def check_startup(cfg: SimConfig) -> None:
    """Raise InputError (naming the field and what is allowed) for what vLLM refuses at start-up."""
    hw, sched = cfg.hardware, cfg.scheduler
    for key, resolve in (("model", resolve_model), ("gpu", resolve_gpu)):
        try:
            resolve(getattr(hw, key))
        except InputError as exc:
            raise InputError(exc.detail, field=f"hardware.{key}", allowed=exc.allowed) from None
    cfg = encoder_decoder_config(cfg)  # checked as it will run
    _check_pipeline(cfg)
    mml = resolve_max_model_len(cfg)
    limit = resolve_model(hw.model).max_position_embeddings
    if mml > limit:
        raise InputError(
            f"max_model_len ({mml}) is greater than the derived max_model_len (max_position_embeddings="
            f"{limit} of {hw.model}); vLLM refuses this", field="scheduler.max_model_len", allowed=f"<= {limit}")
    if cfg.engine != "sglang" and sched.max_num_batched_tokens < sched.max_num_seqs:  # SGLang has no such rule
        raise InputError(
            f"max_num_batched_tokens ({sched.max_num_batched_tokens}) must be greater than or equal to "
            f"max_num_seqs ({sched.max_num_seqs}) (vLLM's rule: every running request must get a token "
            "each step)", field="scheduler.max_num_batched_tokens", allowed=f">= {sched.max_num_seqs}")
    if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < mml:
        raise InputError(
            f"max_num_batched_tokens ({sched.max_num_batched_tokens}) is smaller than max_model_len ({mml}) "
            "with chunked prefill off: longer prompts could never be scheduled",
            field="scheduler.max_num_batched_tokens", allowed=f">= {mml}, or scheduler.enable_chunked_prefill")
    cache, cap = resolve_cache(cfg)
    _check_group_kinds(cfg, cache)
    _check_pool(cfg, cache, cap, mml)
    if cfg.engine == "sglang":
        _check_sglang(cfg, cache)
    from servesim.simulator.kv_offload import check_kv_offload  # it imports the specs and the scheduler

    check_kv_offload(cfg, cache, data_parallel_size(cfg))


def _check_group_kinds(cfg: SimConfig, cache: CacheConfig) -> None:
    """Every group kind the model needs has a manager in the scheduler (scheduler/kv/kinds.py)."""
    from servesim.scheduler.kv.kinds import MANAGERS

    missing = sorted({g.kind for g in cache.kv_cache_groups} - set(MANAGERS.names()))
    if missing:
        raise InputError(f"{cfg.hardware.model} needs KV cache group kind(s) {missing}, which this scheduler "
                         "has no manager for", field="hardware.model",
                         allowed="a model whose layers are " + " / ".join(MANAGERS.names()))


def _check_pool(cfg: SimConfig, cache: CacheConfig, cap: KvCapacity | None, mml: int) -> None:
    need = blocks_for_max_model_len(cache, mml, cfg.scheduler.max_num_batched_tokens)
    have = cache.num_gpu_blocks
    if need <= have:
        return
    fit = _longest_fit(cache, have, mml, cfg.scheduler.max_num_batched_tokens)
    if cap is not None:
        gib = cap.kv_bytes_per_block / 2**30
        raise InputError(
            f"To serve at least one request with the model's max seq len ({mml}), {need * gib:.2f} GiB KV "
            f"cache is needed, which is larger than the available KV cache memory ({have * gib:.2f} GiB). "
            f"Based on the available memory, the estimated maximum model length is {fit} (vLLM's start-up check)",
            field="scheduler.max_model_len",
            allowed=f"<= {fit}, or a larger hardware.gpu_memory_utilization / tp / GPU")
    raise InputError(
        f"To serve at least one request with the model's max seq len ({mml}), {need} KV blocks of "
        f"{cache.block_size} tokens are needed, more than the pool's {have} (vLLM's start-up check; "
        f"the estimated maximum model length is {fit})",
        field="cache.num_gpu_blocks", allowed=f">= {need}, or scheduler.max_model_len <= {fit}")


def _longest_fit(cache: CacheConfig, num_blocks: int, mml: int, max_num_batched_tokens: int) -> int:
    """The longest request the pool holds: vLLM's binary search over max_model_len for a layout of
    groups (_estimate_max_model_len_from_groups), num_blocks x block_size for full attention."""
    if cache.attention != "groups":
        return num_blocks * cache.block_size
    lo, hi, best = 1, mml, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if blocks_for_max_model_len(cache, mid, max_num_batched_tokens) <= num_blocks:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _check_sglang(cfg: SimConfig, cache: CacheConfig) -> None:
    sched = cfg.scheduler
    sg = cfg.sglang if cfg.sglang is not None else SGLangConfig()  # None: everything inherited
    chunk = sg.chunked_prefill_size if sg.chunked_prefill_size is not None else sched.max_num_batched_tokens
    page = sg.page_size if sg.page_size is not None else cache.block_size
    chunked = sg.enable_chunked_prefill if sg.enable_chunked_prefill is not None else sched.enable_chunked_prefill
    if chunked and chunk < page:
        field = "sglang.chunked_prefill_size" if sg.chunked_prefill_size is not None else \
            "scheduler.max_num_batched_tokens"
        raise InputError(
            f"SGLang's prefill budget ({chunk} tokens) is below one KV page ({page} tokens): prefill chunks "
            "are whole pages, so no prompt could ever be admitted", field=field, allowed=f">= {page}")
    radix = sg.enable_radix_cache if sg.enable_radix_cache is not None else cache.enable_prefix_caching
    if sg.hicache.enable_hierarchical_cache and not radix:
        raise InputError(
            "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and cannot "
            "be used at the same time (SGLang's ServerArgs check): HiCache is a tier of the radix cache",
            field="sglang.hicache.enable_hierarchical_cache",
            allowed="false, or cache.enable_prefix_caching / sglang.enable_radix_cache true")
    if sg.hicache.enable_hierarchical_cache:
        from servesim.simulator.scheduler_kinds.sglang import resolve_hicache

        tokens = sg.max_total_tokens if sg.max_total_tokens is not None else (cache.num_gpu_blocks - 1) * cache.block_size
        try:
            resolve_hicache(sg, cfg.hardware).hicache.host_num_pages(tokens // page * page, page)
        except ValueError as exc:
            field = "hicache_size_gb" if sg.hicache.hicache_size_gb > 0 else "hicache_ratio"
            raise InputError(str(exc), field=f"sglang.hicache.{field}",
                             allowed="a host pool larger than the device pool (hicache_ratio > 1, or more GB)") from None
