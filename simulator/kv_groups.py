"""A hybrid model's KV cache groups and pool size, computed the way vLLM 0.19.1 lays them out.

vLLM gives every decoder layer a KV cache spec (attention: full, sliding window, chunked local;
recurrent mixers: MambaSpec), raises the attention block size so an attention page holds at least
one Mamba state (HybridAttentionMambaModelConfig.verify_and_update_config,
model_executor/models/config.py:156-318), pads the Mamba page to the attention page, and splits the
layers into groups of equal size (get_kv_cache_groups / _get_kv_cache_groups_uniform_page_size,
v1/core/kv_cache_utils.py:959-1078, 1222-1262). All groups share one block pool of
``available_memory // page_size // group_size`` blocks (get_num_blocks, kv_cache_utils.py:839-854,
get_kv_cache_config_from_groups :1081-1157); every pipeline stage keeps the groups' layers it holds
and the engine runs with the smallest stage's count (get_kv_cache_configs :1508-1617). A request
of max_model_len must fit (_max_memory_usage_bytes_from_groups :1332-1367, each spec's
max_memory_usage_bytes in v1/kv_cache_interface.py). tools/kv_capacity_oracle.py runs vLLM's own
functions on the same inputs; tests/golden/kv_capacity_vllm.json holds what they return.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesim.scheduler.kv.kinds import max_blocks_per_request
from servesim.scheduler.kv.single_type import KVCacheGroupSpec
from servesim.simulator.specs.model_spec import ModelSpec
from servesim.simulator.specs.pipeline_stages import pp_layer_partition
from servesim.traces.errors import InputError

_KERNEL_BLOCK_ALIGNMENT = 16  # FlashAttention's block-size multiple (HybridAttentionMambaModelConfig)
# Models whose class declares SupportsMambaPrefixCaching in vLLM 0.19.1 (jamba.py, nemotron_h.py):
# mamba_cache_mode "all" is theirs; the GDN models (qwen3_next.py, qwen3_5.py) fall back to "align".
_ALL_MODE_TYPES = ("mamba1", "mamba2")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, frozen=True)
class KvLayout:
    """The groups vLLM builds for a model and what sizes its pool."""

    groups: tuple[KVCacheGroupSpec, ...]  # in vLLM's order (the first layer's kind first)
    group_layers: tuple[tuple[int, ...], ...]  # the decoder layers of each group (padding not listed)
    page_size_bytes: int  # one block of one layer, the same in every group (Mamba pages padded)
    block_size: int  # the attention block size after vLLM raised it for the Mamba state
    mamba_cache_mode: str  # as vLLM resolved it ("none" without Mamba layers)

    @property
    def group_size(self) -> int:
        """Layers per group: the tensors each block spans (vLLM's group_size)."""
        return max(len(layers) for layers in self.group_layers)

    def num_blocks(self, available_bytes: int, stage_layers: tuple[range, ...] | None = None) -> int:
        """Blocks of the pool from each GPU's KV memory (``stage_layers``: the layers of each
        pipeline stage; the pool is the smallest stage's)."""
        stages = stage_layers or (range(0, 1 << 30),)
        counts = []
        for layers in stages:
            size = max(sum(1 for i in g if i in layers) for g in self.group_layers)
            if size:
                counts.append(max(int(available_bytes // self.page_size_bytes // size), 0))
        return min(counts)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of max_model_len tokens holds at most, summed over the groups."""
        return sum(max_blocks_per_request(g, max_model_len, max_num_batched_tokens) for g in self.groups)

    def kv_cache_size_tokens(self, num_blocks: int) -> int:
        """vLLM's logged "GPU KV cache size: N tokens" (_report_kv_cache_config)."""
        return num_blocks // len(self.groups) * min(g.block_size for g in self.groups)

    def max_concurrency(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> float:
        """vLLM's logged "Maximum concurrency for N tokens per request"
        (get_max_concurrency_for_kv_cache_config)."""
        per_request = self.group_size * self.page_size_bytes * \
            self.blocks_per_request(max_model_len, max_num_batched_tokens)
        return num_blocks / _cdiv(per_request, self.page_size_bytes * self.group_size)

    def estimate_max_model_len(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The longest request the pool holds (vLLM's binary search,
        _estimate_max_model_len_from_groups); 0 when not even one token fits."""
        def fits(n: int) -> bool:
            return self.blocks_per_request(n, max_num_batched_tokens) <= num_blocks

        if not fits(1):
            return 0
        lo, hi, best = 1, max_model_len, 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if fits(mid):
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best


def resolve_mamba_cache_mode(model: ModelSpec, requested: str, enable_prefix_caching: bool) -> str:
    """vLLM's MambaModelConfig.verify_and_update_config (models/config.py:423-480): with prefix
    caching "none" becomes the model's default ("all" where the model class supports it, else
    "align") and an unsupported "all" falls back to "align"; without it, always "none"."""
    lin = model.linear_attention
    if lin is None or not enable_prefix_caching:
        return "none"
    supports_all = lin.mamba_type in _ALL_MODE_TYPES
    if requested == "none":
        return "all" if supports_all else "align"
    return "align" if requested == "all" and not supports_all else requested


def _mamba_blocks(model: ModelSpec, tp: int, block_size: int, mode: str, max_model_len: int,
                  attn_page_1: int, num_spec: int) -> tuple[int, int, int]:
    """(attention block size, Mamba block size, Mamba state bytes) after
    HybridAttentionMambaModelConfig (models/config.py:156-318)."""
    lin = model.linear_attention
    assert lin is not None
    state = lin.state_bytes(tp, model.dtype_bytes, num_spec)
    mamba_block = block_size if mode != "none" else max_model_len  # MambaModelConfig's default
    if mode == "all":  # a multiple of the kernel chunk that holds one state
        chunk = math.lcm(lin.chunk_size, _KERNEL_BLOCK_ALIGNMENT)
        attn_block = chunk * _cdiv(_cdiv(state, attn_page_1), chunk)
        mamba_block = attn_block
    else:
        attn_block = _KERNEL_BLOCK_ALIGNMENT * _cdiv(state, _KERNEL_BLOCK_ALIGNMENT * attn_page_1)
    block_size = max(block_size, attn_block)  # raised even when the user set it
    if mode == "align":
        mamba_block = block_size
    return block_size, mamba_block, state


def layer_kinds(model: ModelSpec) -> tuple[str, ...]:
    """Each layer's kind; a model without layer_kinds has its windowed layers first (Gemma 2/3,
    gpt-oss and Mistral all start with a sliding layer), which fixes vLLM's group order."""
    if model.layer_kinds:
        return model.layer_kinds
    return ("sliding_window",) * model.num_sliding_layers + ("full",) * (model.num_layers - model.num_sliding_layers)


def kv_layout(model: ModelSpec, tp: int, block_size: int, *, mamba_cache_mode: str = "none",
              enable_prefix_caching: bool = True, max_model_len: int, num_spec_tokens: int = 0,
              disable_hybrid_kv_cache_manager: bool = False) -> KvLayout:
    """The groups vLLM 0.19.1 builds for ``model`` on ``tp`` GPUs (see the module docstring).
    ``disable_hybrid_kv_cache_manager`` (vLLM turns it on with KV events): windowed and chunked
    layers are held as full attention; a Mamba model is refused, as vLLM refuses it."""
    kinds = layer_kinds(model)
    attn_page_1 = int(model.kv_elems_per_token_layer(tp) * model.kv_bytes_per_elem)
    mode = resolve_mamba_cache_mode(model, mamba_cache_mode, enable_prefix_caching)
    mamba_block = state = 0
    if "mamba" in kinds:
        block_size, mamba_block, state = _mamba_blocks(model, tp, block_size, mode, max_model_len,
                                                       attn_page_1, num_spec_tokens)
    page = block_size * attn_page_1  # the Mamba page is padded to exactly this
    if "mamba" in kinds and page < state:
        raise AssertionError("attention page below the Mamba state")  # vLLM asserts it too
    if disable_hybrid_kv_cache_manager and len(set(kinds) - {"mlp"}) > 1:
        if "mamba" in kinds:
            raise InputError("Hybrid KV cache manager is disabled but failed to convert the KV cache specs to "
                             "one unified type (vLLM refuses a Mamba model without the hybrid manager, "
                             "which KV cache events turn off)", field="cache.enable_kv_cache_events",
                             allowed="false for a model with Mamba / linear-attention layers")
        kinds = tuple("full" if k in ("sliding_window", "chunked_local") else k for k in kinds)
    specs = {
        "full": KVCacheGroupSpec("full", block_size),
        "sliding_window": KVCacheGroupSpec("sliding_window", block_size, sliding_window=model.sliding_window),
        "chunked_local": KVCacheGroupSpec("chunked_local", block_size,
                                          attention_chunk_size=model.attention_chunk_size),
        "mamba": KVCacheGroupSpec("mamba", mamba_block, mamba_cache_mode=mode,
                                  num_speculative_blocks=num_spec_tokens),
    }
    same_type: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds):
        if kind != "mlp":
            same_type.setdefault(kind, []).append(i)
    if model.cross_attention:  # Whisper: each decoder layer's cross-attention, after the self-attention
        specs["cross_attention"] = KVCacheGroupSpec("cross_attention", block_size)
        same_type["cross_attention"] = list(range(len(kinds), 2 * len(kinds)))
    groups, members = _split(same_type)
    return KvLayout(tuple(specs[k] for k in groups), tuple(members), page, block_size, mode)


def _split(same_type: dict[str, list[int]]) -> tuple[list[str], list[tuple[int, ...]]]:
    """_get_kv_cache_groups_uniform_page_size: groups of the smallest kind's size (the largest's
    when it is under 1.5x the smallest), each kind's layers dealt round-robin."""
    if len(same_type) == 1:  # one kind: one group of every layer (_get_kv_cache_groups_uniform_spec)
        kind, layers = next(iter(same_type.items()))
        return [kind], [tuple(layers)]
    sizes = [len(v) for v in same_type.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    kinds, members = [], []
    for kind, layers in same_type.items():
        n = _cdiv(len(layers), group_size)
        for i in range(n):
            kinds.append(kind)
            members.append(tuple(layers[i::n]))
    return kinds, members


def stage_ranges(num_layers: int, pp: int) -> tuple[range, ...]:
    """Each pipeline stage's decoder layers (vLLM's get_pp_indices, specs/pipeline_stages.py)."""
    out, first = [], 0
    for n in pp_layer_partition(num_layers, pp):
        out.append(range(first, first + n))
        first += n
    return tuple(out)


def kv_cache_report(groups: tuple[KVCacheGroupSpec, ...], num_blocks: int, max_model_len: int,
                    max_num_batched_tokens: int) -> dict:
    """What vLLM logs for a pool of groups at start-up (_report_kv_cache_config): "GPU KV cache
    size: N tokens" and "Maximum concurrency for max_model_len tokens per request", with the
    groups' kinds and block sizes (a run's summary carries it)."""
    per_request = sum(max_blocks_per_request(g, max_model_len, max_num_batched_tokens) for g in groups)
    return {"groups": [f"{g.kind}:{g.block_size}" for g in groups],
            "gpu_kv_cache_size_tokens": num_blocks // len(groups) * min(g.block_size for g in groups),
            "max_concurrency": num_blocks / per_request}
