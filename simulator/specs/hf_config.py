"""Model specs derived from Hugging Face ``config.json`` files, and the shipped config catalogue.

Understood layouts (keys as the published configs spell them):

* dense decoders (Llama, Mistral, Qwen2/2.5/3, Yi, Gemma 2/3, CodeLlama): ``num_hidden_layers``,
  ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads`` (GQA), ``head_dim`` (else
  hidden / heads), ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``;
* multimodal wrappers (Llama 4, Gemma 3): the language model's keys under ``text_config``;
* sliding windows: ``layer_types`` (count of ``sliding_attention``), Gemma 3's
  ``sliding_window_pattern`` (every P-th layer global), Gemma 2 (even layers local), a bare
  ``sliding_window`` (every layer, Mistral-7B-v0.1); ``use_sliding_window: false`` (Qwen) disables it;
* hybrid layers (specs/layer_kinds.py): Llama 4's chunked local attention (``attention_chunk_size``
  on the RoPE layers of ``no_rope_layers``), Gated DeltaNet (Qwen3-Next: ``linear_*`` keys, every
  4th layer full; Qwen3.5: ``layer_types``), Mamba2 (Nemotron-H: ``hybrid_override_pattern``),
  Mamba1 (Jamba: ``attn_layer_period`` / ``attn_layer_offset``, ``mamba_d_state``), and a vision
  tower (``vision_config``: Qwen2.5-VL, Gemma 3, Llama 4);
* encoder-decoder (Whisper: ``model_type`` whisper): the decoder as the language model
  (``decoder_layers``, ``d_model``, ``decoder_attention_heads``, ``decoder_ffn_dim``,
  ``max_target_positions``), each of its layers with a cross-attention over the audio encoder
  (``encoder_*``, ``max_source_positions`` frames), which is the model's encoder tower;
* MoE: experts (``num_local_experts`` / ``num_experts`` / ``n_routed_experts``), top-k
  (``num_experts_per_tok`` / ``experts_per_token``), expert width (``moe_intermediate_size``, else
  ``intermediate_size``), shared experts (``n_shared_experts`` x expert width,
  ``shared_expert_intermediate_size``, Llama 4's one shared expert), dense layers
  (``first_k_dense_replace``, ``mlp_only_layers`` / ``decoder_sparse_step``, Jamba's
  ``expert_layer_period`` / ``expert_layer_offset``,
  ``interleave_moe_layer_step`` / ``moe_layers`` with ``intermediate_size_mlp``);
* MLA: ``kv_lora_rank``, ``q_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``;
* precision: ``torch_dtype`` and ``quantization_config`` (fp8 / fp8 block, compressed-tensors,
  AWQ/GPTQ, ModelOpt FP8/NVFP4, MXFP4).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from servesim.traces.errors import InputError

from .layer_kinds import kinds_from_hf, linear_from_hf, vision_from_hf, whisper_decoder_keys
from .model_spec import MlaSpec, ModelSpec

CATALOGUE_DIR = Path(__file__).with_name("hf_configs")
_META_KEYS = ("_source", "_name", "_aliases", "_hf_id", "_note")


def _flatten(cfg: dict) -> dict:
    text = cfg.get("text_config")
    flat = {**cfg, **text} if isinstance(text, dict) else dict(cfg)
    if flat.get("model_type") == "whisper":  # the decoder is the language model (layer_kinds.py)
        flat = {**whisper_decoder_keys(flat), **flat}
    return flat


def _sliding(cfg: dict, layers: int) -> tuple[int | None, tuple[str, ...]]:
    """(window tokens, each layer's kind) of a windowed model; (None, ()) without a window."""
    if cfg.get("use_sliding_window") is False:
        return None, ()
    if cfg.get("attention_chunk_size"):  # Llama 4: chunked local attention, not a window (kinds_from_hf)
        return None, ()
    window = cfg.get("sliding_window")
    if not window:
        return None, ()
    types = cfg.get("layer_types")
    if types:
        windowed = [t == "sliding_attention" for t in types]
    elif cfg.get("sliding_window_pattern"):  # Gemma 3: every P-th layer global
        windowed = [bool((i + 1) % int(cfg["sliding_window_pattern"])) for i in range(layers)]
    elif str(cfg.get("model_type", "")).startswith("gemma2"):  # Gemma 2: even layers local
        windowed = [i % 2 == 0 for i in range(layers)]
    else:  # a bare window: every layer
        windowed = [True] * layers
    if not any(windowed):  # a window no layer uses
        return None, ()
    return int(window), tuple("sliding_window" if w else "full" for w in windowed)


def _moe(cfg: dict, layers: int) -> dict:
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or
                  cfg.get("n_routed_experts") or 1)
    if experts <= 1:
        return {"intermediate_size": int(cfg["intermediate_size"])}
    width = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 1)
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    shared += int(cfg.get("n_shared_experts") or 0) * width
    dense_width = int(cfg.get("intermediate_size") or 0)
    if "expert_layer_period" in cfg:  # Jamba: MoE every expert_layer_period from expert_layer_offset
        period, offset = int(cfg["expert_layer_period"]), int(cfg.get("expert_layer_offset") or 0)
        dense = sum(1 for i in range(layers) if i % period != offset)
    elif "first_k_dense_replace" in cfg:  # DeepSeek
        dense = int(cfg["first_k_dense_replace"])
    elif "interleave_moe_layer_step" in cfg or "moe_layers" in cfg:  # Llama 4
        moe_layers = cfg.get("moe_layers")
        step = int(cfg.get("interleave_moe_layer_step") or 1)
        dense = layers - (len(moe_layers) if moe_layers else layers // step)
        dense_width = int(cfg.get("intermediate_size_mlp") or dense_width)
        shared = shared or width  # one shared expert of the expert width in every MoE layer
    else:  # Qwen-MoE: mlp_only_layers and decoder_sparse_step
        only = set(cfg.get("mlp_only_layers") or ())
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense = sum(1 for i in range(layers) if i in only or (i + 1) % step)
    return {"intermediate_size": width, "num_experts": experts, "experts_per_token": top_k,
            "shared_expert_intermediate_size": shared, "num_dense_layers": dense,
            "dense_intermediate_size": dense_width if dense else 0}


def _quantization(cfg: dict) -> tuple[str, str]:
    """(dense weight format, expert weight format; "" = same)."""
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower()
    if not method:
        return "bf16", ""
    if method == "fp8":
        return ("fp8_block" if q.get("weight_block_size") else "fp8"), ""
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        return "int4", ""
    if method == "mxfp4":  # gpt-oss: experts in MXFP4, attention/router/embeddings in bf16
        return "bf16", "mxfp4"
    if method == "modelopt":
        algo = str(q.get("quant_algo", "")).lower()
        return ("nvfp4" if "fp4" in algo else "fp8"), ""
    if method == "compressed-tensors":
        fmt = str(q.get("format", "")).lower()
        if "nvfp4" in fmt:
            return "nvfp4", ""
        for group in (q.get("config_groups") or {}).values():
            w = group.get("weights") or {}
            if int(w.get("num_bits") or 16) == 8:
                return ("fp8" if w.get("type") == "float" else "int8"), ""
            if int(w.get("num_bits") or 16) == 4:
                return "int4", ""
    raise InputError(f"unsupported quantization_config quant_method {method!r}",
                     field="quantization_config",
                     allowed="fp8, compressed-tensors, awq, gptq, modelopt, mxfp4")


def spec_from_hf_dict(raw: dict, name: str, hf_id: str, aliases: tuple[str, ...] = ()) -> ModelSpec:
    """A :class:`ModelSpec` from a parsed config.json (see the module docstring)."""
    cfg = _flatten(raw)
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    mla = None
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if cfg.get("kv_lora_rank"):
        mla = MlaSpec(kv_lora_rank=int(cfg["kv_lora_rank"]),
                      qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                      qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
                      v_head_dim=int(cfg["v_head_dim"]),
                      q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None)
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    window, windowed = _sliding(cfg, layers)
    kinds = kinds_from_hf(cfg, layers) or windowed
    if windowed and kinds is not windowed:  # a window beside linear / chunked layers
        raise InputError("sliding-window layers beside linear-attention or chunked layers are not modelled",
                         field="sliding_window", allowed="a model with one of the two")
    sliding_layers = kinds.count("sliding_window")
    chunk = int(cfg["attention_chunk_size"]) if "chunked_local" in kinds else None
    linear = linear_from_hf(cfg) if "mamba" in kinds else None
    weight_fmt, expert_fmt = _quantization(raw) if raw.get("quantization_config") else \
        _quantization(cfg)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or "bfloat16")
    return ModelSpec(
        name=name, hf_id=hf_id, aliases=tuple(aliases),
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        vocab_size=int(cfg["vocab_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        dtype_bytes=2,  # vLLM dtype "auto" serves float32 checkpoints (Gemma 2) in bf16 too
        tied_embeddings=bool(raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        sliding_window=window, num_sliding_layers=sliding_layers, mla=mla,
        weight_dtype=weight_fmt, expert_weight_dtype=expert_fmt, layer_kinds=kinds,
        attention_chunk_size=chunk, linear_attention=linear, vision=vision_from_hf(raw),
        # Nemotron-H (up, relu^2, down) and Whisper (fc1, GELU, fc2) have no gate
        gated_mlp=str(cfg.get("mlp_hidden_act") or "silu") != "relu2" and cfg.get("model_type") != "whisper",
        cross_attention=bool(cfg.get("is_encoder_decoder")),
        attention_output_gate=bool(cfg.get("attn_output_gate", "linear_num_value_heads" in cfg)),
        **_moe(cfg, layers))


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read model config: {exc}", path=str(path)) from None


def config_fields(model: str, spec: ModelSpec) -> dict:
    """The raw config fields behind `spec` (text_config merged in, as specs read them): the file
    `model` names (a config.json or a folder holding one), else the catalogue's file for the spec,
    else {} (a hand-entered spec). For what a spec does not carry (norm and rotary constants,
    model_type)."""
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    if not (path.suffix == ".json" and path.is_file()):
        path = CATALOGUE_DIR / f"{spec.name}.json"
    return _flatten(_read(path)) if path.is_file() else {}


def spec_from_config_file(path: Path) -> ModelSpec:
    """A spec from a config.json path, named after its folder (or ``_name_or_path``)."""
    cfg = _read(path)
    hf_id = str(cfg.get("_name_or_path") or path.parent.name or "custom")
    name = (path.parent.name or hf_id.rsplit("/", 1)[-1] or "custom").lower()
    try:
        return spec_from_hf_dict(cfg, name, hf_id)
    except InputError as exc:
        raise InputError(exc.detail, path=str(path), field=exc.field) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"model config lacks or mangles a required key: {exc}", path=str(path)) from None


@cache
def catalogue_specs() -> tuple[ModelSpec, ...]:
    """Specs of the shipped catalogue (``hf_configs/*.json``: published config fields plus
    ``_name``, ``_hf_id``, ``_aliases`` and ``_source``)."""
    out = []
    for path in sorted(CATALOGUE_DIR.glob("*.json")):
        cfg = _read(path)
        body = {k: v for k, v in cfg.items() if k not in _META_KEYS}
        try:
            out.append(spec_from_hf_dict(body, cfg["_name"], cfg["_hf_id"],
                                         tuple(cfg.get("_aliases") or ())))
        except (InputError, KeyError, TypeError, ValueError) as exc:
            raise InputError(f"bad catalogue config: {exc!r}", path=str(path)) from None
    return tuple(out)
