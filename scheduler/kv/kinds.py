"""Every KV cache group kind and its manager: the one registry the coordinator builds from.

Each manager lives in its own module; this module imports them all and registers each by the name
``KVCacheGroupSpec.kind`` uses. Registered here, after the classes, rather than by a class
decorator: a decorated class would not compile to a native class under mypyc.
"""

from __future__ import annotations

from servesim.scheduler.kv.cross_attention import CrossAttentionManager
from servesim.scheduler.kv.local_attention import ChunkedLocalAttentionManager
from servesim.scheduler.kv.mamba import MambaManager
from servesim.scheduler.kv.single_type import (
    FullAttentionManager, KVCacheGroupSpec, SingleTypeKVCacheManager, SlidingWindowManager, cdiv,
)
from servesim.scheduler.kv.sink_full import SinkFullAttentionManager
from servesim.scheduler.registry import Registry

MANAGERS: Registry[type[SingleTypeKVCacheManager]] = Registry("KV cache group kind")
MANAGERS.add("full", FullAttentionManager)
MANAGERS.add("sliding_window", SlidingWindowManager)
MANAGERS.add("cross_attention", CrossAttentionManager)
MANAGERS.add("chunked_local", ChunkedLocalAttentionManager)
MANAGERS.add("mamba", MambaManager)
MANAGERS.add("sink_full", SinkFullAttentionManager)


def validate_kv_cache_groups(groups: tuple[KVCacheGroupSpec, ...], block_size: int, enable_prefix_caching: bool,
                             mamba_cache_mode: str) -> None:
    """CacheConfig's checks of attention='groups' (ValueError naming the group): known kinds, each
    kind's own fields, one block size (cache.block_size; a Mamba group's is max_model_len without
    prefix caching), and vLLM 0.19.1's rules for Mamba groups (MambaModelConfig,
    vllm/model_executor/models/config.py: prefix caching on means mode 'all' or 'align', off means
    'none')."""
    for i, g in enumerate(groups):
        where = f"kv_cache_groups[{i}] (kind {g.kind!r})"
        MANAGERS.get(g.kind)  # unknown kind: a ValueError with a did-you-mean
        if g.block_size < 1:
            raise ValueError(f"{where}: block_size must be >= 1, got {g.block_size}")
        if g.kind == "sliding_window" and (g.sliding_window is None or g.sliding_window < 1):
            raise ValueError(f"{where}: needs sliding_window >= 1 tokens, got {g.sliding_window}")
        if g.kind == "chunked_local" and (g.attention_chunk_size is None or g.attention_chunk_size < 1):
            raise ValueError(f"{where}: needs attention_chunk_size >= 1 tokens, got {g.attention_chunk_size}")
        if g.kind == "sink_full" and (g.sink_len is None or g.sink_len <= 0 or g.sink_len % g.block_size):
            raise ValueError(f"{where}: needs sink_len > 0 tokens, a multiple of block_size {g.block_size}, "
                             f"got {g.sink_len}")
        if g.num_speculative_blocks < 0:
            raise ValueError(f"{where}: num_speculative_blocks must be >= 0, got {g.num_speculative_blocks}")
        if g.kind == "mamba" and g.mamba_cache_mode != mamba_cache_mode:
            raise ValueError(f"{where}: mamba_cache_mode {g.mamba_cache_mode!r} differs from the cache's "
                             f"mamba_cache_mode {mamba_cache_mode!r} (vLLM has one mode for every Mamba layer)")
        if g.block_size != block_size and (enable_prefix_caching or g.kind != "mamba"):
            # vLLM: attention groups have cache_config.block_size; a Mamba group too with prefix
            # caching on (mamba_block_size = block_size), max_model_len without (kv/mamba.py)
            raise ValueError(f"{where}: block_size {g.block_size} differs from cache.block_size {block_size} "
                             "(the attention block size, and the block hash size with prefix caching on)")
    if not any(g.kind == "mamba" for g in groups):
        return
    if enable_prefix_caching and mamba_cache_mode == "none":
        raise ValueError("mamba_cache_mode 'none' with prefix caching on: vLLM uses 'all' (models whose Mamba "
                         "layers support prefix caching) or 'align'; set one, or turn prefix caching off")
    if not enable_prefix_caching and mamba_cache_mode != "none":
        raise ValueError(f"mamba_cache_mode {mamba_cache_mode!r} needs prefix caching (vLLM sets it to 'none' "
                         "when prefix caching is off)")


_TOKENS_FIELD = {"sliding_window": "sliding_window", "chunked_local": "attention_chunk_size", "sink_full": "sink_len"}


def group_specs_from_text(text: str, block_size: int, mamba_cache_mode: str,
                          num_speculative_blocks: int) -> tuple[KVCacheGroupSpec, ...]:
    """The groups of tools/kv_groups_oracle.py's --groups ('full,chunked_local:64,mamba'; the number
    is the kind's tokens: window, chunk or sink length), every group of block_size tokens (a Mamba
    group's block is resized to max_model_len with prefix caching off, kv/mamba.py). Mamba groups
    get the cache's mode and num_speculative_blocks (vLLM: the number of speculative tokens)."""
    out = []
    for item in text.split(","):
        kind, _, num = item.strip().partition(":")
        MANAGERS.get(kind)  # unknown kind: a ValueError with a did-you-mean
        field = _TOKENS_FIELD.get(kind)
        if (field is None) != (not num):
            raise ValueError(f"groups: {kind!r} {'takes no' if field is None else 'needs'} ':TOKENS' (got {item!r})")
        try:
            extra: dict = {field: int(num)} if field is not None else {}
        except ValueError:
            raise ValueError(f"groups: {item!r}: tokens must be an integer") from None
        if kind == "mamba":
            extra = {"mamba_cache_mode": mamba_cache_mode, "num_speculative_blocks": num_speculative_blocks}
        out.append(KVCacheGroupSpec(kind, block_size, **extra))
    return tuple(out)


def max_blocks_per_request(group: KVCacheGroupSpec, max_model_len: int, max_num_batched_tokens: int) -> int:
    """Blocks of one group a request of max_model_len tokens needs at most: each spec's
    max_memory_usage_bytes in pages (vllm/v1/kv_cache_interface.py), for vLLM's start-up check."""
    bs = group.block_size
    if group.kind == "sliding_window":
        assert group.sliding_window is not None
        return cdiv(min(group.sliding_window - 1 + max_num_batched_tokens, max_model_len), bs) + 1
    if group.kind == "chunked_local":
        assert group.attention_chunk_size is not None
        return cdiv(min(group.attention_chunk_size + max_num_batched_tokens, max_model_len), bs)
    if group.kind == "mamba":
        if group.mamba_cache_mode == "all":
            return cdiv(max_model_len, bs)
        return (2 if group.mamba_cache_mode == "align" else 1) + group.num_speculative_blocks
    if group.kind == "cross_attention":
        # CrossAttentionSpec: the encoder's states, max_num_encoder_input_tokens of them, which
        # vLLM's SchedulerConfig sets to max_num_batched_tokens
        return cdiv(max_num_batched_tokens, bs)
    return cdiv(max_model_len, bs)  # full attention (sink_full too: its sink blocks are not counted)


def admission_shape(groups: tuple[KVCacheGroupSpec, ...], max_model_len: int,
                    max_num_batched_tokens: int) -> tuple[int, tuple[int, ...]]:
    """(groups that hold a block per block_size tokens of the whole sequence, the most blocks each
    other group holds): how the never-fits admission rule (simulator/liveness.py) counts groups.
    Mamba 'all' asks for the whole sequence at admission (its blocks are freed only as it runs)."""
    whole = [g for g in groups
             if g.kind in ("full", "sink_full") or (g.kind == "mamba" and g.mamba_cache_mode == "all")]
    bounded = tuple(max_blocks_per_request(g, max_model_len, max_num_batched_tokens) for g in groups if g not in whole)
    return len(whole), bounded
