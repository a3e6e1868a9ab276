"""Layer kinds of hybrid models and the vision tower of multimodal ones: `LinearAttentionSpec`
(Gated DeltaNet, Mamba2, Mamba1 state shapes), `VisionSpec`, and their reading from config.json.

A model's ``layer_kinds`` names each decoder layer by the KV cache group kind vLLM 0.19.1 gives it
(scheduler/kv/kinds.py): ``full``, ``sliding_window``, ``chunked_local``, ``mamba`` (every
recurrent-state mixer: vLLM's MambaSpec covers GDN, Mamba1 and Mamba2), plus ``mlp`` for
Nemotron-H's MLP-only layers, which hold no cache. The state shapes follow vLLM 0.19.1's
``MambaStateShapeCalculator`` (model_executor/layers/mamba/mamba_utils.py) and each model's
``get_mamba_state_shape_from_config`` (qwen3_next.py, nemotron_h.py, jamba.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesim.traces.errors import InputError

LAYER_KINDS = ("full", "sliding_window", "chunked_local", "mamba", "mlp")
MAMBA_TYPES = ("gdn_attention", "mamba2", "mamba1")  # vLLM's MambaBase.mamba_type
MAMBA_SSM_DTYPES = ("auto", "float32", "float16", "bfloat16")  # vLLM's MambaDType
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _divide(a: int, b: int, what: str) -> int:
    """vLLM's distributed.divide: an exact split over the TP ranks, or vLLM refuses."""
    if a % b:
        raise InputError(f"{what} ({a}) is not divisible by tp={b}; vLLM refuses this split", field="tp")
    return a // b


@dataclass(slots=True, frozen=True)
class LinearAttentionSpec:
    """The recurrent mixer of a model's ``mamba`` layers: what its state holds per request."""

    mamba_type: str  # one of MAMBA_TYPES
    conv_kernel: int  # causal conv1d width (linear_conv_kernel_dim / conv_kernel / mamba_d_conv)
    num_heads: int  # GDN: value heads; Mamba2: mamba_num_heads; Mamba1: 1 (channels, no heads)
    head_dim: int  # GDN: value head dim; Mamba2: mamba_head_dim; Mamba1: intermediate_size
    state_size: int  # GDN: key head dim; Mamba2 / Mamba1: ssm_state_size (d_state)
    num_k_heads: int = 0  # GDN only: key heads (linear_num_key_heads)
    n_groups: int = 0  # Mamba2 only: B/C groups
    dt_rank: int = 0  # Mamba1 only: the dt projection's rank
    ssm_dtype: str = "auto"  # the temporal state's dtype (vLLM mamba_ssm_cache_dtype from the config)
    chunk_size: int = 0  # the SSD / chunked-scan kernel's chunk (vLLM get_mamba_chunk_size); 0 = 2048

    def __post_init__(self) -> None:
        if self.mamba_type not in MAMBA_TYPES:
            raise InputError(f"unknown linear-attention kind {self.mamba_type!r}", field="mamba_type",
                             allowed=", ".join(MAMBA_TYPES))
        for f in ("conv_kernel", "num_heads", "head_dim", "state_size"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                raise InputError(f"linear attention: {f} must be a positive integer", field=f)
        if self.mamba_type == "gdn_attention" and self.num_k_heads <= 0:
            raise InputError("gated delta net: linear_num_key_heads must be positive", field="linear_num_key_heads")
        if self.mamba_type == "mamba2" and self.n_groups <= 0:
            raise InputError("mamba2: n_groups must be positive", field="n_groups")
        if self.ssm_dtype not in MAMBA_SSM_DTYPES:
            raise InputError(f"unknown mamba ssm dtype {self.ssm_dtype!r}", field="mamba_ssm_dtype",
                             allowed=", ".join(MAMBA_SSM_DTYPES))

    @property
    def intermediate_size(self) -> int:
        """Channels the mixer works on: value heads x dims (GDN, Mamba2) or d_inner (Mamba1)."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d (the whole model, before TP)."""
        if self.mamba_type == "gdn_attention":
            return 2 * self.num_k_heads * self.state_size + self.intermediate_size
        if self.mamba_type == "mamba2":
            return self.intermediate_size + 2 * self.n_groups * self.state_size
        return self.intermediate_size

    def weight_elems(self, hidden: int, tp: int) -> tuple[int, int, int]:
        """(input projections, output projection, conv / A / D / dt / norm) weight elements of
        one layer on one GPU, as vLLM's mixers hold them (column / row parallel over TP)."""
        inner, conv = self.intermediate_size, self.conv_dim
        if self.mamba_type == "gdn_attention":  # in_proj_qkvz + in_proj_ba; conv1d; A_log, dt_bias; norm
            proj_in = hidden * (conv + inner + 2 * self.num_heads)
            small = conv * self.conv_kernel + 2 * self.num_heads + self.head_dim * tp
        elif self.mamba_type == "mamba2":  # in_proj (z, x, B, C, dt); conv1d; A, D, dt_bias; gated norm
            proj_in = hidden * (inner + conv + self.num_heads)
            small = conv * self.conv_kernel + 3 * self.num_heads + inner
        else:  # mamba1: in_proj (x, z), x_proj (dt, B, C), dt_proj; conv1d; A, D
            proj_in = hidden * 2 * inner + inner * (self.dt_rank + 2 * self.state_size) + self.dt_rank * inner
            small = inner * self.conv_kernel + inner * self.state_size + inner
        return proj_in // tp, inner * hidden // tp, small // tp

    def state_shapes(self, tp: int, num_spec: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv state, temporal state) shapes on one GPU, as vLLM's MambaStateShapeCalculator."""
        k = self.conv_kernel - 1
        if self.mamba_type == "gdn_attention":
            conv = (k + num_spec, _divide(self.conv_dim, tp, "GDN conv channels"))
            return conv, (_divide(self.num_heads, tp, "linear_num_value_heads"), self.head_dim, self.state_size)
        if self.mamba_type == "mamba2":
            groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)  # head-shard replication
            conv_dim = self.intermediate_size + 2 * groups * self.state_size
            return (k + num_spec, _divide(conv_dim, tp, "mamba2 conv channels")), \
                (_divide(self.num_heads, tp, "mamba_num_heads"), self.head_dim, self.state_size)
        inner = _divide(self.intermediate_size, tp, "mamba intermediate size")
        return (k, inner), (inner, self.state_size)

    def state_dtype_bytes(self, model_dtype_bytes: int) -> tuple[int, int]:
        """(conv, temporal) bytes per element: the conv state in the model dtype (vLLM
        mamba_cache_dtype auto), the temporal state in ``ssm_dtype`` (auto: the same)."""
        ssm = model_dtype_bytes if self.ssm_dtype == "auto" else _DTYPE_BYTES[self.ssm_dtype]
        return model_dtype_bytes, ssm

    def state_bytes(self, tp: int, model_dtype_bytes: int, num_spec: int = 0) -> int:
        """One request's state in one layer on one GPU (vLLM MambaSpec.page_size_bytes unpadded)."""
        conv, temporal = self.state_shapes(tp, num_spec)
        cb, tb = self.state_dtype_bytes(model_dtype_bytes)
        return math.prod(conv) * cb + math.prod(temporal) * tb


@dataclass(slots=True, frozen=True)
class VisionSpec:
    """An encoder tower: a vision tower (ViT) by its config.json ``vision_config``, or an
    encoder-decoder model's audio encoder (Whisper): what one item costs to encode.

    ``patches_per_token``: ViT patches behind one embedding the language model sees (Qwen2.5-VL's
    spatial_merge_size^2, Gemma 3's 4x4 average pooling, Llama 4's pixel shuffle 1/ratio^2)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patches_per_token: int
    gated_mlp: bool = False  # SwiGLU (gate, up, down: Qwen2.5-VL) or fc1/fc2 (SigLIP, Llama 4)
    window_patches: int = 0  # > 0: patches each windowed layer attends within (Qwen2.5-VL)
    num_full_layers: int = 0  # layers with full attention when window_patches > 0 (fullatt_block_indexes)
    out_hidden_size: int = 0  # the merger's / projector's output width (the LM hidden size)
    pooled: bool = False  # patches averaged into a token (Gemma 3), not concatenated (Qwen, Llama 4)
    # Embeddings of the largest image the model's processor makes (vLLM's max tokens per item, which
    # sizes the encoder budget and cache); 0: not known here (scheduler.mm_max_tokens_per_item sets it).
    max_tokens_per_item: int = 0

    def __post_init__(self) -> None:
        for f in ("depth", "hidden_size", "intermediate_size", "num_heads", "patches_per_token"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                raise InputError(f"vision_config: {f} must be a positive integer", field=f"vision_config.{f}")
        if not 0 <= self.num_full_layers <= self.depth:
            raise InputError("vision_config: more full-attention blocks than layers",
                             field="vision_config.fullatt_block_indexes")


    def weight_elems(self) -> int:
        """Weight elements of the tower (attention and MLP of every layer, plus the merger /
        projector from patches_per_token x hidden to the LM width); norms and the patch
        embedding are left out (under 0.1 % of the tower)."""
        h, mlp = self.hidden_size, (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        if self.pooled:  # average pooling, then one projection to the LM width
            return self.depth * (4 * h * h + mlp) + h * self.out_hidden_size
        merged = h * self.patches_per_token  # an MLP over the concatenated patches
        return self.depth * (4 * h * h + mlp) + merged * merged + merged * self.out_hidden_size


def kinds_from_hf(cfg: dict, layers: int) -> tuple[str, ...]:
    """Each decoder layer's kind from a (text_config-merged) config.json; () for a plain model
    (every layer full or the legacy sliding-window count). Raises InputError on inconsistent input."""
    types = cfg.get("layer_types")
    if cfg.get("hybrid_override_pattern") is not None:  # Nemotron-H: M mamba2, * attention, -/E MLP
        pattern = str(cfg["hybrid_override_pattern"])
        kinds = tuple({"M": "mamba", "*": "full", "-": "mlp", "E": "mlp"}.get(c, "?" + c) for c in pattern)
    elif "attn_layer_period" in cfg:  # Jamba: attention every attn_layer_period from attn_layer_offset
        period, offset = int(cfg["attn_layer_period"]), int(cfg.get("attn_layer_offset") or 0)
        kinds = tuple("full" if i % period == offset else "mamba" for i in range(layers))
    elif types and any(t == "linear_attention" for t in types):  # Qwen3.5
        kinds = tuple({"linear_attention": "mamba", "full_attention": "full"}.get(t, "?" + str(t)) for t in types)
    elif "linear_num_value_heads" in cfg:  # no layer_types: vLLM's configs make every 4th layer full
        every = int(cfg.get("full_attention_interval") or 4)  # (Qwen3-Next's config ignores the key: 4)
        kinds = tuple("mamba" if (i + 1) % every else "full" for i in range(layers))
    elif cfg.get("attention_chunk_size") and cfg.get("no_rope_layers"):  # Llama 4: RoPE layers chunked
        kinds = tuple("chunked_local" if x else "full" for x in cfg["no_rope_layers"])
    else:
        return ()
    bad = sorted({k[1:] for k in kinds if k.startswith("?")})
    if bad:
        raise InputError(f"unknown layer kind(s) {bad}", field="layer_types",
                         allowed="full_attention, linear_attention (layer_types); M, *, -, E (hybrid_override_pattern)")
    if len(kinds) != layers:
        raise InputError(f"{len(kinds)} layer kinds for num_hidden_layers={layers}", field="layer_types",
                         allowed=f"exactly {layers} entries")
    return kinds


def linear_from_hf(cfg: dict) -> LinearAttentionSpec | None:
    """The recurrent mixer's shapes, or None for a model without one."""
    ssm = str(cfg.get("mamba_ssm_dtype") or cfg.get("mamba_ssm_cache_dtype") or "auto")
    if "linear_num_value_heads" in cfg:  # Gated DeltaNet (Qwen3-Next, Qwen3.5)
        return LinearAttentionSpec("gdn_attention", int(cfg["linear_conv_kernel_dim"]),
                                   int(cfg["linear_num_value_heads"]), int(cfg["linear_value_head_dim"]),
                                   int(cfg["linear_key_head_dim"]), num_k_heads=int(cfg["linear_num_key_heads"]),
                                   ssm_dtype=ssm, chunk_size=64)  # vLLM fla/ops/chunk.py: chunk_size=64
    if "hybrid_override_pattern" in cfg:  # Mamba2 (Nemotron-H); vLLM's NemotronH config: ssm state float16
        return LinearAttentionSpec("mamba2", int(cfg.get("conv_kernel") or cfg.get("mamba_d_conv") or 4),
                                   int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"]),
                                   int(cfg["ssm_state_size"]), n_groups=int(cfg.get("n_groups") or cfg.get("mamba_n_groups") or 8),
                                   ssm_dtype=str(cfg.get("mamba_ssm_cache_dtype") or "float16"),
                                   chunk_size=int(cfg.get("mamba_chunk_size") or cfg.get("chunk_size") or 256))  # NemotronHConfig's default
    if "mamba_d_state" in cfg:  # Mamba1 (Jamba): d_inner = mamba_expand x hidden
        return LinearAttentionSpec("mamba1", int(cfg["mamba_d_conv"]), 1,
                                   int(cfg["mamba_expand"]) * int(cfg["hidden_size"]), int(cfg["mamba_d_state"]),
                                   dt_rank=int(cfg.get("mamba_dt_rank") or math.ceil(int(cfg["hidden_size"]) / 16)),
                                   ssm_dtype=ssm, chunk_size=2048)  # vLLM: Mamba1 has no chunk, 2048
    return None


QWEN_VL_MAX_PIXELS = 12_845_056  # Qwen2VLImageProcessor's default max_pixels (transformers)


def whisper_decoder_keys(cfg: dict) -> dict:
    """A Whisper config.json's decoder in the language-model keys the specs read (the decoder's
    self-attention has as many KV heads as heads; its positions stop at max_target_positions)."""
    return {"num_hidden_layers": cfg["decoder_layers"], "hidden_size": cfg["d_model"],
            "num_attention_heads": cfg["decoder_attention_heads"],
            "num_key_value_heads": cfg["decoder_attention_heads"], "intermediate_size": cfg["decoder_ffn_dim"],
            "max_position_embeddings": cfg["max_target_positions"], "is_encoder_decoder": True}


def whisper_encoder(cfg: dict) -> VisionSpec:
    """Whisper's audio encoder as an encoder tower: a transformer of encoder_layers over the
    max_source_positions frames (1500: 30 s of audio, which the feature extractor always pads to,
    so every input is that long), one frame per encoder state (patches_per_token 1), fc1/GELU/fc2
    MLPs, no projector (the decoder's cross-attention reads the states). The two conv1d layers in
    front (num_mel_bins -> d_model, kernel 3) are under 1 % of its FLOPs and not priced."""
    frames = int(cfg["max_source_positions"])
    return VisionSpec(int(cfg["encoder_layers"]), int(cfg["d_model"]), int(cfg["encoder_ffn_dim"]),
                      int(cfg["encoder_attention_heads"]), 1, pooled=True, max_tokens_per_item=frames)


def vision_from_hf(raw: dict) -> VisionSpec | None:
    """The encoder tower of a multimodal config.json (``vision_config``; Whisper's audio encoder), or None."""
    if raw.get("model_type") == "whisper":
        return whisper_encoder(raw)
    v = raw.get("vision_config")
    if not isinstance(v, dict):
        return None
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    out = int(v.get("out_hidden_size") or text.get("hidden_size") or 0)
    depth = int(v.get("depth") or v.get("num_hidden_layers") or 0)
    heads = int(v.get("num_heads") or v.get("num_attention_heads") or 0)
    hidden, inter = int(v.get("hidden_size") or 0), int(v.get("intermediate_size") or 0)
    if "spatial_merge_size" in v:  # Qwen2.5-VL / Qwen3-VL / Qwen3.5 vision towers
        merge, patch = int(v["spatial_merge_size"]), int(v.get("patch_size") or 14)
        window = int(v.get("window_size") or 0)
        full = v.get("fullatt_block_indexes")
        side = window // patch if window else 0  # the window in patches per side (vLLM get_window_index)
        # The image processor's default max_pixels, 12,845,056 (transformers Qwen2VLImageProcessor;
        # traces/vlm.py), in patches of patch x patch merged merge x merge: 16,384 for Qwen2.5-VL.
        max_tokens = QWEN_VL_MAX_PIXELS // (patch * patch * merge * merge)
        return VisionSpec(depth, hidden, inter, heads, merge * merge, gated_mlp=window > 0,
                          window_patches=side * side, num_full_layers=len(full) if (full and window) else 0,
                          out_hidden_size=out, max_tokens_per_item=max_tokens)
    if "pixel_shuffle_ratio" in v:  # Llama 4: pixel shuffle folds 1/ratio^2 patches into a token
        ratio = float(v["pixel_shuffle_ratio"])
        return VisionSpec(depth, hidden, inter, heads, round(1 / (ratio * ratio)), out_hidden_size=out)
    tokens = int(raw.get("mm_tokens_per_image") or 0)  # Gemma 3: SigLIP patches average-pooled to tokens
    if tokens:
        patches = (int(v["image_size"]) // int(v["patch_size"])) ** 2
        return VisionSpec(depth, hidden, inter, heads, patches // tokens, out_hidden_size=out, pooled=True,
                          max_tokens_per_item=tokens)  # every image is mm_tokens_per_image tokens
    raise InputError("vision_config of an unknown layout", field="vision_config",
                     allowed="Qwen2.5-VL / Qwen3-VL (spatial_merge_size), Llama 4 (pixel_shuffle_ratio), "
                             "Gemma 3 (mm_tokens_per_image)")
