"""Model architecture specs: the shapes the cost models and the KV-cache sizing need.

Specs live in ``models.yaml`` (published config.json numbers) and are looked up by
:func:`resolve_model`, which also accepts a path to a Hugging Face ``config.json``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path

from servesim.scheduler.registry import did_you_mean
from servesim.traces.errors import InputError

from ._names import alias_keys, is_release_tag, model_id_candidates, quantization_of
from ._yaml import load_spec_file
from .model_spec import MlaSpec, ModelSpec  # noqa: F401 (MlaSpec: part of this module's public names)
from .precision import bytes_per_element, canonical_dtype, kv_cache_dtype

_SPEC_FILE = Path(__file__).with_name("models.yaml")


def _check_tp(model: ModelSpec, tp: int) -> None:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 0:
        raise InputError(f"tensor-parallel degree must be a positive integer, got {tp!r}", field="tp")
    if model.num_attention_heads % tp:
        raise InputError(f"model '{model.name}' has {model.num_attention_heads} attention heads, "
                         f"which tp={tp} does not divide", field="tp")


def kv_bytes_per_token(model: ModelSpec, tp: int = 1, kv_dtype_bytes: float | None = None) -> int:
    """KV-cache bytes one token occupies on ONE GPU, over all layers (K and V, or the MLA latent).

    Sliding-window and chunked layers are counted in full (one page per block each, as a pool
    without the hybrid manager holds them); Mamba and MLP-only layers hold no per-token KV.
    Hybrid layouts are sized by simulator/kv_groups.py instead."""
    _check_tp(model, tp)
    elem = model.kv_bytes_per_elem if kv_dtype_bytes is None else kv_dtype_bytes
    return int(model.num_attention_layers * model.kv_elems_per_token_layer(tp) * elem)


def attention_weight_elems(model: ModelSpec, tp: int) -> dict[str, int]:
    """Weight elements of one layer's attention projections on one GPU."""
    h, heads = model.hidden_size, model.heads_per_gpu(tp)
    mla = model.mla
    if mla is None:
        kv_out = model.kv_heads_per_gpu(tp) * model.head_dim
        q_out = model.q_size // tp * (2 if model.attention_output_gate else 1)  # + the output gate
        return {"qkv_proj": h * (q_out + 2 * kv_out), "o_proj": model.q_size // tp * h}
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    # q_a / kv_a projections are replicated on every rank; q_b, kv_b and o are head-sharded.
    q = h * heads * qk if mla.q_lora_rank is None else \
        h * mla.q_lora_rank + mla.q_lora_rank * heads * qk
    kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + \
        mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return {"qkv_proj": q + kv, "o_proj": heads * mla.v_head_dim * h}


def layer_weight_elems(model: ModelSpec, tp: int) -> dict[str, int]:
    """Weight elements on one GPU, by projection: attention and norms per layer; ``gate_up_proj`` /
    ``down_proj`` per dense-MLP layer; ``experts`` (all routed experts), ``shared_experts`` and
    ``router`` per MoE layer (used by the roofline too)."""
    _check_tp(model, tp)
    h = model.hidden_size
    dense_one = h * model.dense_mlp_width // tp if model.dense_mlp_layers else 0
    return {
        **attention_weight_elems(model, tp),
        "gate_up_proj": (2 if model.gated_mlp else 1) * dense_one,
        "down_proj": dense_one,
        "experts": 3 * h * model.intermediate_size // tp * model.num_experts if model.is_moe else 0,
        "shared_experts": 3 * h * model.shared_expert_intermediate_size // tp,
        "router": h * model.num_experts if model.is_moe else 0,
        "norm": 2 * h,
    }


def weight_bytes(model: ModelSpec, tp: int = 1, moe_shards: int | None = None) -> int:
    """Weight bytes resident on ONE GPU under tensor parallelism (vocab-parallel embeddings;
    quantised formats with their scales; router, norms and embeddings stay in the activation
    dtype as vLLM keeps them). ``moe_shards``: the GPUs the routed experts are split over (default
    tp; a data-parallel MoE deployment splits them over tp x dp, with expert parallelism or not)."""
    per_layer, dense, moe, embed, lm_head = weight_parts(model, tp, moe_shards)
    total = model.num_layers * per_layer + model.dense_mlp_layers * dense + model.num_moe_layers * moe \
        + (embed + (0 if model.tied_embeddings else lm_head) + model.hidden_size) * model.dtype_bytes  # + final norm
    if model.vision is not None:  # the vision tower, in the activation dtype, sharded over TP (vLLM's default)
        total += model.vision.weight_elems() // tp * model.dtype_bytes
    if model.cross_attention:  # each decoder layer's cross-attention q, k, v, o (heads = kv heads)
        total += model.num_layers * 4 * model.hidden_size * model.q_size // tp * model.dtype_bytes
    return int(total)


def weight_parts(model: ModelSpec, tp: int, moe_shards: int | None = None) -> tuple[float, float, float, int, int]:
    """Bytes on one GPU of (every layer's attention and norms, one dense MLP, one MoE block)
    and elements of (the embedding, the lm_head) shard: what a pipeline stage sums over its
    layers (specs/pipeline_stages.py) and weight_bytes over all of them."""
    w = layer_weight_elems(model, tp)
    if moe_shards is not None and model.is_moe:  # vLLM flattens TP across DP for the experts
        if moe_shards < tp or moe_shards % tp:
            raise InputError(f"the experts cannot split over {moe_shards} GPUs with tp={tp}", field="moe_shards",
                             allowed="a multiple of tp")
        w = {**w, "experts": 3 * model.hidden_size * model.intermediate_size * model.num_experts // moe_shards}
    lin = bytes_per_element(model.weight_dtype)
    # the layer average: attention projections in the attention layers, the recurrent mixer's
    # in the mamba layers (a plain model: every layer)
    attn = (w["qkv_proj"] + w["o_proj"]) * lin
    if model.num_attention_layers != model.num_layers:
        attn = attn * model.num_attention_layers / model.num_layers
    if model.linear_attention is not None:
        proj_in, proj_out, small = model.linear_attention.weight_elems(model.hidden_size, tp)
        attn += ((proj_in + proj_out) * lin + small * model.dtype_bytes) * model.count_layers("mamba") / model.num_layers
    per_layer = attn + w["norm"] * model.dtype_bytes
    dense = (w["gate_up_proj"] + w["down_proj"]) * lin
    moe = w["experts"] * bytes_per_element(model.experts_dtype) + w["shared_experts"] * lin + \
        w["router"] * model.dtype_bytes
    embed = math.ceil(model.vocab_size / tp) * model.hidden_size
    return per_layer, dense, moe, embed, embed


@cache
def _registry() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    """models.yaml first, then the shipped Hugging Face config catalogue (``hf_configs/``)."""
    from .hf_config import catalogue_specs

    raw = load_spec_file(_SPEC_FILE)
    specs: dict[str, ModelSpec] = {}
    lookup: dict[str, str] = {}
    for name, entry in raw.items():
        _add(specs, lookup, _spec_from_mapping(name, dict(entry), str(_SPEC_FILE)))
    for spec in catalogue_specs():
        if spec.name not in specs and not any(k in lookup for k in alias_keys(spec.hf_id)):
            _add(specs, lookup, spec)
    return specs, lookup


def _add(specs: dict[str, ModelSpec], lookup: dict[str, str], spec: ModelSpec) -> None:
    specs[spec.name] = spec
    for alias in (spec.name, spec.hf_id, *spec.aliases):
        for key in alias_keys(alias):
            lookup.setdefault(key, spec.name)


def register_model(spec: ModelSpec) -> ModelSpec:
    """Make a spec built at run time (from a config.json) resolvable by its name, so every
    command that passes model names around finds it. A different spec under a taken name is
    registered as ``<name>-<n>``."""
    specs, lookup = _registry()
    have = specs.get(spec.name)
    if have == spec:
        return have
    if have is not None:
        n = 2
        while f"{spec.name}-{n}" in specs and \
                specs[f"{spec.name}-{n}"] != replace(spec, name=f"{spec.name}-{n}"):
            n += 1
        spec = replace(spec, name=f"{spec.name}-{n}")
        if specs.get(spec.name) == spec:
            return specs[spec.name]
    specs[spec.name] = spec
    _RUNTIME.add(spec.name)
    for key in alias_keys(spec.name):
        lookup[key] = spec.name
    return spec


_RUNTIME: set[str] = set()
_PRECISION_NAME = re.compile(r"(?P<base>[^@]+)@(?P<weights>[a-z0-9_]+)-kv(?P<kv>[a-z0-9_]+)")  # names registered by register_model (not in the shipped lists)


def with_precision(model: str | ModelSpec, weight_dtype: str | None = None,
                   kv_cache_dtype: str | None = None) -> ModelSpec:
    """The model served with other weight / KV-cache formats (a run's ``quantization`` or
    ``kv_cache_dtype``), registered as ``<name>@<weights>-kv<kv>`` so names keep resolving."""
    spec = resolve_model(model)
    w = canonical_dtype(weight_dtype, field="weight_dtype") if weight_dtype else spec.weight_dtype
    kv = str(kv_cache_dtype).lower() if kv_cache_dtype else spec.kv_cache_dtype
    kv = kv if kv == "auto" else canonical_dtype(kv, field="kv_cache_dtype")
    if (w, kv) == (spec.weight_dtype, spec.kv_cache_dtype):
        return spec
    base = spec.name.split("@", 1)[0]
    return register_model(replace(spec, name=f"{base}@{w}-kv{kv}", weight_dtype=w,
                                  expert_weight_dtype=spec.expert_weight_dtype, kv_cache_dtype=kv,
                                  aliases=()))


def _spec_from_mapping(name: str, entry: dict, path: str) -> ModelSpec:
    allowed = {f.name for f in fields(ModelSpec)} - {"name"}
    unknown = set(entry) - allowed
    if unknown:
        raise InputError(f"model '{name}': unknown fields {sorted(unknown)}", path=path,
                         allowed=", ".join(sorted(allowed)))
    entry["aliases"] = tuple(entry.get("aliases") or ())
    if entry.get("sliding_window") and "num_sliding_layers" not in entry:
        entry["num_sliding_layers"] = entry.get("num_layers")  # a bare window: every layer
    if isinstance(entry.get("mla"), dict):
        entry["mla"] = MlaSpec(**entry["mla"])
    try:
        return ModelSpec(name=name, **entry)
    except TypeError as exc:  # missing required field
        raise InputError(f"model '{name}': {exc}", path=path) from None


def available_models() -> list[str]:
    """The shipped models (models.yaml and the config catalogue)."""
    return sorted(set(_registry()[0]) - _RUNTIME)


def resolve_model(name: str | ModelSpec) -> ModelSpec:
    """Spec for a short id, an alias (case-insensitive, HF ids with or without org), a checkpoint id
    with known suffixes (:func:`resolve_model_id`), or a path to a Hugging Face config.json (or a
    folder holding one); path-built specs are registered under their name (:func:`register_model`)."""
    if isinstance(name, ModelSpec):
        return name
    return resolve_model_id(name).spec


@dataclass(slots=True, frozen=True)
class ModelResolution:
    """A model id resolved: the spec and, for the report, how the id reached it."""

    spec: ModelSpec
    how: str  # e.g. "Qwen/Qwen3-30B-A3B-Instruct-2507 -> qwen3-30b-a3b (suffix -instruct-2507: ...)"
    # what the resolution could not carry over (a dated re-release's own context length); "" = nothing
    caveat: str = ""


def resolve_model_id(name: str) -> ModelResolution:
    """Resolve ``name`` and say how. Checkpoint ids resolve by architecture: the org prefix or
    local folder is dropped and known suffix tokens are taken off the end one at a time
    (simulator/specs/_names.py: fine-tunes -Instruct/-Chat/-Base/-hf/-it/-Thinking, release tags
    -Instruct-2507, quantizations -FP8/-AWQ/-GPTQ-Int4/-W8A8/...) until a registry id or alias
    matches; a quantization suffix then selects that weight format (:func:`with_precision`), and a
    registered spec with exactly the resulting fields is returned in its place. Conflicting
    quantization suffixes and unknown ids raise an InputError (the latter with a did-you-mean)."""
    path = Path(str(name))
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():  # a path is read, never matched by its folder name
        spec = register_model(model_from_hf_config(path))
        return ModelResolution(spec, f"{name} -> {spec.name} (read from the config.json)")
    specs, lookup = _registry()
    cands = model_id_candidates(str(name))
    for cand in cands:
        if cand.key in lookup:
            return _from_candidate(str(name), specs[lookup[cand.key]], cand.suffixes, cand.prefix)
    variant = _PRECISION_NAME.fullmatch(str(name).strip())
    if variant:  # "<model>@<weights>-kv<kv>", the name with_precision gives its specs
        spec = with_precision(variant["base"], variant["weights"], variant["kv"])
        return ModelResolution(spec, f"{name} -> {spec.name} (precision variant)")
    # the suggestion is made for the id without its org and suffixes (what the registry spells)
    guess = did_you_mean(cands[-1].key, available_models()) or did_you_mean(str(name), available_models())
    raise InputError(f"unknown model {str(name)!r}" + (f"; did you mean {guess!r}?" if guess else ""), field="model",
                     allowed=", ".join(available_models()) + ", or a path to a Hugging Face config.json")


def _from_candidate(name: str, spec: ModelSpec, suffixes: tuple[str, ...], prefix: str) -> ModelResolution:
    if not suffixes:
        how = "registry id" if name == spec.name else "alias" + (f", {prefix} dropped" if prefix else "")
        return ModelResolution(spec, f"{name} -> {spec.name} ({how})")
    formats = {s: quantization_of(s) for s in suffixes if quantization_of(s)}
    if len(set(formats.values())) > 1:
        raise InputError(f"model {name!r}: the suffixes {', '.join(formats)} name different weight formats "
                         f"({', '.join(sorted(set(formats.values())))}); ambiguous", field="model",
                         allowed="one quantization suffix, or a path to the checkpoint's config.json")
    notes, caveat = [], ""
    for s in suffixes:
        if s in formats:
            notes.append(f"suffix {s}: {formats[s]} weights")
        else:
            notes.append(f"suffix {s}: same architecture and config")
        if is_release_tag(s):
            caveat = (f"{name} is a dated re-release of {spec.hf_id}: same architecture, but its config may "
                      f"differ in context length (max_position_embeddings {spec.max_position_embeddings} here); "
                      f"give its config.json (--model) where max_model_len matters")
    if formats:
        spec = _registered_twin(with_precision(spec, next(iter(formats.values()))))
    dropped = f"{prefix} dropped; " if prefix else ""
    return ModelResolution(spec, f"{name} -> {spec.name} ({dropped}{'; '.join(notes)})", caveat)


def _registered_twin(spec: ModelSpec) -> ModelSpec:
    """A shipped spec with every field of ``spec`` but its names (the catalogue's own FP8
    checkpoint entry, say), else ``spec``."""
    bare = replace(spec, name="", hf_id="", aliases=())
    for name in available_models():
        other = _registry()[0][name]
        if replace(other, name="", hf_id="", aliases=()) == bare:
            return other
    return spec


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Build a spec from a Hugging Face ``config.json`` (see simulator/specs/hf_config.py)."""
    from .hf_config import spec_from_config_file

    return spec_from_config_file(Path(path))


def file_near(value: object, base_dir: str | Path) -> object:
    """`value` as written in a config file in `base_dir`: a relative path to an existing file there
    becomes its absolute path (a fitted cost model's `path`); anything else is returned as it is."""
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        return value
    candidate = Path(base_dir) / value
    return str(candidate.resolve()) if candidate.is_file() else value


def model_path_near(model: object, base_dir: str | Path) -> object:
    """`model` as written in a config file in `base_dir`: a config.json (or a folder holding one)
    relative to that file becomes its absolute path, as trace paths do; anything else (a model
    name, an absolute path, a path that is not there) is returned as it is."""
    if not isinstance(model, str) or not model or Path(model).is_absolute():
        return model
    candidate = Path(base_dir) / model
    if (candidate.suffix == ".json" and candidate.is_file()) or (candidate / "config.json").is_file():
        return str(candidate.resolve())
    return model
