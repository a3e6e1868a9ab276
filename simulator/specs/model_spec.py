"""The model architecture spec types: `ModelSpec` (layer shapes, GQA, MoE, precision) and `MlaSpec`.

Apart from models.py (the catalogue and `resolve_model`) so that hf_config.py, which builds specs
from a Hugging Face config.json, and models.py, which falls back to it, both import the types from
here and not each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesim.traces.errors import InputError

from .layer_kinds import LAYER_KINDS, LinearAttentionSpec, VisionSpec
from .precision import bytes_per_element, canonical_dtype, kv_cache_dtype


@dataclass(slots=True, frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one compressed latent of
    ``kv_lora_rank`` plus a shared rotary key of ``qk_rope_head_dim`` per token and layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: queries projected directly from the hidden state

    def __post_init__(self) -> None:
        for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                raise InputError(f"mla: {f} must be a positive integer", field=f)


@dataclass(slots=True, frozen=True)
class ModelSpec:
    name: str  # short lowercase id, e.g. "llama-3.1-8b"
    hf_id: str  # canonical Hugging Face repository id
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # MLP width; per expert for MoE models
    vocab_size: int
    max_position_embeddings: int  # tokens
    dtype_bytes: int = 2  # bytes per activation element (bf16); weights: weight_dtype
    tied_embeddings: bool = False  # lm_head shares the embedding matrix
    num_experts: int = 1  # 1 = dense MLP
    experts_per_token: int = 1  # top-k routing
    sliding_window: int | None = None  # tokens; None = full attention
    num_sliding_layers: int = 0  # layers that use sliding_window (the others attend fully)
    # Mixture-of-Experts extras: always-on shared experts (total width) and layers that keep a
    # dense MLP (DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers) with their width.
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    dense_intermediate_size: int = 0
    mla: MlaSpec | None = None
    weight_dtype: str = "bf16"  # dense linear layers (simulator/specs/precision.py formats)
    expert_weight_dtype: str = ""  # MoE experts; "" = same as weight_dtype
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype: auto = the activation dtype, or fp8
    aliases: tuple[str, ...] = ()
    # Hybrid models (specs/layer_kinds.py): each layer's KV cache group kind; () = every layer full
    # attention but the num_sliding_layers windowed ones (which layers does not matter then).
    layer_kinds: tuple[str, ...] = ()
    attention_chunk_size: int | None = None  # tokens, for chunked_local layers (Llama 4)
    linear_attention: LinearAttentionSpec | None = None  # the mixer of the mamba layers
    attention_output_gate: bool = False  # Qwen3-Next / Qwen3.5 gated attention: q_proj doubled
    vision: VisionSpec | None = None  # the vision tower of a multimodal model
    gated_mlp: bool = True  # gate, up, down (SwiGLU); False: up, down (Nemotron-H's squared ReLU)
    # Encoder-decoder (Whisper): every layer also cross-attends over the encoder's states (`vision`
    # is then the encoder); their KV is vLLM's cross-attention group, sized by the encoder input.
    cross_attention: bool = False

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "max_position_embeddings", "dtype_bytes",
                  "num_experts", "experts_per_token"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError(f"model '{self.name}': {f} must be a positive integer, got {value!r}",
                                 field=f)
        if self.num_attention_heads % self.num_kv_heads:
            raise InputError(f"model '{self.name}': num_attention_heads ({self.num_attention_heads}) "
                             f"is not a multiple of num_kv_heads ({self.num_kv_heads})",
                             field="num_kv_heads")
        if self.experts_per_token > self.num_experts:
            raise InputError(f"model '{self.name}': experts_per_token > num_experts",
                             field="experts_per_token")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise InputError(f"model '{self.name}': sliding_window must be positive or absent",
                             field="sliding_window")
        if (self.sliding_window is None) != (self.num_sliding_layers == 0) or \
                not 0 <= self.num_sliding_layers <= self.num_layers:
            raise InputError(f"model '{self.name}': num_sliding_layers must be 1..num_layers with a "
                             "sliding_window and 0 without", field="num_sliding_layers")
        if not 0 <= self.num_dense_layers <= self.num_layers or \
                (self.num_dense_layers and not (self.is_moe and self.dense_intermediate_size > 0)):
            raise InputError(f"model '{self.name}': num_dense_layers needs an MoE model and a "
                             "dense_intermediate_size", field="num_dense_layers")
        self._check_layer_kinds()
        canonical_dtype(self.weight_dtype, field="weight_dtype")
        if self.expert_weight_dtype:
            canonical_dtype(self.expert_weight_dtype, field="expert_weight_dtype")
        kv_cache_dtype(self.kv_cache_dtype, "bf16")

    def _check_layer_kinds(self) -> None:
        kinds = self.layer_kinds
        if not kinds:
            if self.linear_attention is not None or self.attention_chunk_size is not None:
                raise InputError(f"model '{self.name}': linear attention or chunked layers need layer_kinds",
                                 field="layer_kinds")
            return
        unknown = sorted(set(kinds) - set(LAYER_KINDS))
        if unknown or len(kinds) != self.num_layers:
            raise InputError(f"model '{self.name}': layer_kinds must name each of the {self.num_layers} layers "
                             f"(got {len(kinds)}{', unknown ' + str(unknown) if unknown else ''})",
                             field="layer_kinds", allowed=", ".join(LAYER_KINDS))
        if kinds.count("sliding_window") != self.num_sliding_layers:
            raise InputError(f"model '{self.name}': {kinds.count('sliding_window')} sliding_window layers "
                             f"but num_sliding_layers={self.num_sliding_layers}", field="num_sliding_layers")
        for kind, present, what in (("mamba", self.linear_attention is not None, "linear_attention"),
                                    ("chunked_local", self.attention_chunk_size is not None, "attention_chunk_size")):
            if (kind in kinds) != present:
                raise InputError(f"model '{self.name}': {kind} layers and {what} go together",
                                 field=what)
        if self.attention_chunk_size is not None and self.attention_chunk_size <= 0:
            raise InputError(f"model '{self.name}': attention_chunk_size must be positive",
                             field="attention_chunk_size")
        if self.cross_attention and (self.vision is None or not self.vision.max_tokens_per_item):
            raise InputError(f"model '{self.name}': cross_attention needs an encoder (vision) with its input "
                             "length (max_tokens_per_item)", field="cross_attention")
        if not self.num_attention_layers:
            raise InputError(f"model '{self.name}': no attention layer (attention-free models are not modelled)",
                             field="layer_kinds")

    def count_layers(self, kind: str) -> int:
        """Layers of one kind (full: every layer of a model without layer_kinds but the windowed ones)."""
        if self.layer_kinds:
            return self.layer_kinds.count(kind)
        return {"full": self.num_layers - self.num_sliding_layers,
                "sliding_window": self.num_sliding_layers}.get(kind, 0)

    @property
    def num_attention_layers(self) -> int:
        """Layers that hold a per-token KV cache (full, sliding-window and chunked attention)."""
        return sum(self.count_layers(k) for k in ("full", "sliding_window", "chunked_local"))

    @property
    def kv_bytes_per_elem(self) -> float:
        if self.kv_cache_dtype == "auto":
            return float(self.dtype_bytes)
        return bytes_per_element(kv_cache_dtype(self.kv_cache_dtype, "bf16"))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def dense_mlp_layers(self) -> int:
        """Layers whose MLP is a plain gated MLP (all of them in a dense model; Nemotron-H: its
        MLP-only layers, the mixer layers having none)."""
        if "mlp" in self.layer_kinds:
            return self.layer_kinds.count("mlp")
        return self.num_dense_layers if self.is_moe else self.num_layers

    @property
    def dense_mlp_width(self) -> int:
        return self.dense_intermediate_size if self.is_moe else self.intermediate_size

    @property
    def experts_dtype(self) -> str:
        return self.expert_weight_dtype or self.weight_dtype

    @property
    def q_size(self) -> int:
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def heads_per_gpu(self, tp: int) -> int:
        return max(1, self.num_attention_heads // tp)

    def kv_heads_per_gpu(self, tp: int) -> int:
        # vLLM replicates KV heads when tp exceeds their number, so each GPU keeps at least one.
        return max(1, math.ceil(self.num_kv_heads / tp))

    def kv_elems_per_token_layer(self, tp: int) -> int:
        """KV-cache elements one token keeps in one layer on one GPU."""
        if self.mla is not None:  # the latent is shared by all heads: replicated on every TP rank
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.kv_heads_per_gpu(tp) * self.head_dim
