"""Model architecture specs: the shapes the cost models and the KV-cache sizing need.

Specs live in ``models.yaml`` (published config.json numbers) and are looked up by
:func:`resolve_model`, which also accepts a path to a Hugging Face ``config.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

import yaml

from scheduler.registry import unknown_name_message
from traces.errors import InputError

from ._names import alias_keys, candidates

_SPEC_FILE = Path(__file__).with_name("models.yaml")


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
    dtype_bytes: int = 2  # bytes per weight / activation / KV element (bf16)
    tied_embeddings: bool = False  # lm_head shares the embedding matrix
    num_experts: int = 1  # 1 = dense MLP
    experts_per_token: int = 1  # top-k routing
    sliding_window: int | None = None  # tokens; None = full attention
    aliases: tuple[str, ...] = ()

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

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def heads_per_gpu(self, tp: int) -> int:
        return max(1, self.num_attention_heads // tp)

    def kv_heads_per_gpu(self, tp: int) -> int:
        # vLLM replicates KV heads when tp exceeds their number, so each GPU keeps at least one.
        return max(1, math.ceil(self.num_kv_heads / tp))


def _check_tp(model: ModelSpec, tp: int) -> None:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 0:
        raise InputError(f"tensor-parallel degree must be a positive integer, got {tp!r}", field="tp")
    if model.num_attention_heads % tp:
        raise InputError(f"model '{model.name}' has {model.num_attention_heads} attention heads, "
                         f"which tp={tp} does not divide", field="tp")


def kv_bytes_per_token(model: ModelSpec, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
    """KV-cache bytes one token occupies on ONE GPU, over all layers (K and V)."""
    _check_tp(model, tp)
    elem = model.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    return 2 * model.num_layers * model.kv_heads_per_gpu(tp) * model.head_dim * elem


def layer_weight_elems(model: ModelSpec, tp: int) -> dict[str, int]:
    """Weight elements of one decoder layer on one GPU, by projection (used by the roofline too)."""
    _check_tp(model, tp)
    h = model.hidden_size
    kv_out = model.kv_heads_per_gpu(tp) * model.head_dim
    mlp_one = model.hidden_size * model.intermediate_size // tp  # one of gate/up/down
    return {
        "qkv_proj": h * (model.q_size // tp + 2 * kv_out),
        "o_proj": model.q_size // tp * h,
        "gate_up_proj": 2 * mlp_one * model.num_experts,
        "down_proj": mlp_one * model.num_experts,
        "router": h * model.num_experts if model.is_moe else 0,
        "norm": 2 * h,
    }


def weight_bytes(model: ModelSpec, tp: int = 1) -> int:
    """Weight bytes resident on ONE GPU under tensor parallelism (vocab-parallel embeddings)."""
    _check_tp(model, tp)
    per_layer = sum(layer_weight_elems(model, tp).values())
    embed = math.ceil(model.vocab_size / tp) * model.hidden_size
    lm_head = 0 if model.tied_embeddings else embed
    total = model.num_layers * per_layer + embed + lm_head + model.hidden_size  # + final norm
    return total * model.dtype_bytes


@cache
def _registry() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    raw = yaml.safe_load(_SPEC_FILE.read_text())
    specs: dict[str, ModelSpec] = {}
    lookup: dict[str, str] = {}
    for name, entry in raw.items():
        spec = _spec_from_mapping(name, dict(entry), str(_SPEC_FILE))
        specs[name] = spec
        for alias in (name, spec.hf_id, *spec.aliases):
            for key in alias_keys(alias):
                lookup.setdefault(key, name)
    return specs, lookup


def _spec_from_mapping(name: str, entry: dict, path: str) -> ModelSpec:
    allowed = {f.name for f in fields(ModelSpec)} - {"name"}
    unknown = set(entry) - allowed
    if unknown:
        raise InputError(f"model '{name}': unknown fields {sorted(unknown)}", path=path,
                         allowed=", ".join(sorted(allowed)))
    entry["aliases"] = tuple(entry.get("aliases") or ())
    try:
        return ModelSpec(name=name, **entry)
    except TypeError as exc:  # missing required field
        raise InputError(f"model '{name}': {exc}", path=path) from None


def available_models() -> list[str]:
    return sorted(_registry()[0])


def resolve_model(name: str | ModelSpec) -> ModelSpec:
    """Spec for a short id, an alias (case-insensitive, HF ids with or without org), or a config.json path."""
    if isinstance(name, ModelSpec):
        return name
    specs, lookup = _registry()
    for key in candidates(str(name)):
        if key in lookup:
            return specs[lookup[key]]
    path = Path(str(name))
    if path.suffix == ".json" and path.is_file():
        return model_from_hf_config(path)
    raise InputError(unknown_name_message("model", str(name), available_models()), field="model",
                     allowed=", ".join(available_models()) + ", or a path to a Hugging Face config.json")


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Build a spec from a Hugging Face ``config.json`` (Llama/Mistral/Qwen/Mixtral-style keys)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read model config: {exc}", path=str(path)) from None
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        return ModelSpec(
            name=path.parent.name.lower() or "custom",
            hf_id=str(cfg.get("_name_or_path") or path.parent.name),
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
            dtype_bytes=4 if dtype in ("float32", "fp32") else 2,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_experts=int(cfg.get("num_local_experts") or cfg.get("num_experts") or 1),
            experts_per_token=int(cfg.get("num_experts_per_tok") or 1),
            sliding_window=cfg.get("sliding_window") or None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"model config lacks or mangles a required key: {exc}", path=str(path)) from None
