"""What vLLM 0.19.1 itself computes for a hybrid model's KV cache: groups, block sizes, num_blocks.

Run with the oracle's interpreter (the vLLM 0.19.1 install, ../shared/tools/vllm_oracle):

    /tmp/vllm-oracle-venv/bin/python tools/kv_capacity_oracle.py tests/golden/kv_capacity_vllm.json

For each case it builds every decoder layer's KV cache spec with vLLM's own classes
(FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec with the model class's
get_mamba_state_shape_from_config / _dtype_from_config), runs
HybridAttentionMambaModelConfig.verify_and_update_config (the attention block-size raise and the
Mamba page padding) and get_kv_cache_configs (grouping, page-size unification, num_blocks,
the per-stage minimum), and records num_blocks, each group's kind / block size / layer count, the
page size and the figures vLLM logs. Which layer is which kind comes from vLLM's and transformers'
config classes (Qwen3NextConfig.layer_types, NemotronHConfig.hybrid_override_pattern,
JambaConfig.layers_block_type, Gemma3TextConfig.layer_types, Llama 4's no_rope_layers as
llama4.py reads them), not from servesim. vLLM's model config object is a stand-in
(SimpleNamespace) carrying exactly the fields these functions read; no model is loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from vllm.model_executor.models.config import HybridAttentionMambaModelConfig
from vllm.model_executor.models.interfaces import supports_mamba_prefix_caching
from vllm.v1.core import kv_cache_utils as kcu
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)

CONFIGS = Path(__file__).resolve().parents[1] / "simulator" / "specs" / "hf_configs"
GIB = 1 << 30

# (name, config file, tp, pp, block_size, prefix caching, mamba_cache_mode, max_model_len,
#  max_num_batched_tokens, available KV bytes per GPU, disable the hybrid manager)
CASES = [
    ("qwen3-next tp1 align", "qwen3-next-80b-a3b", 1, 1, 16, True, "none", 32768, 8192, 20 * GIB, False),
    ("qwen3-next tp2 align", "qwen3-next-80b-a3b", 2, 1, 16, True, "none", 65536, 8192, 30 * GIB, False),
    ("qwen3-next tp4 no prefix caching", "qwen3-next-80b-a3b", 4, 1, 16, False, "none", 262144, 8192, 40 * GIB, False),
    ("qwen3-next tp1 align pp2", "qwen3-next-80b-a3b", 1, 2, 16, True, "none", 32768, 8192, 20 * GIB, False),
    ("qwen3.5-35b tp2 align", "qwen3.5-35b-a3b", 2, 1, 16, True, "none", 65536, 8192, 25 * GIB, False),
    ("nemotron-h tp1 all", "nemotron-h-8b", 1, 1, 16, True, "none", 8192, 8192, 30 * GIB, False),
    ("nemotron-h tp2 align", "nemotron-h-8b", 2, 1, 16, True, "align", 8192, 4096, 30 * GIB, False),
    ("jamba tp2 all", "jamba-1.5-mini", 2, 1, 16, True, "none", 65536, 8192, 20 * GIB, False),
    ("llama-4-scout tp4", "llama-4-scout", 4, 1, 16, True, "none", 131072, 8192, 30 * GIB, False),
    ("llama-4-scout tp8 no hybrid manager", "llama-4-scout", 8, 1, 16, True, "none", 131072, 8192, 30 * GIB, True),
    ("llama-4-scout tp4 pp2", "llama-4-scout", 4, 2, 16, True, "none", 65536, 8192, 30 * GIB, False),
    ("qwen2.5-vl-7b tp1", "qwen2.5-vl-7b", 1, 1, 16, True, "none", 128000, 8192, 50 * GIB, False),
    ("gemma-3-27b tp2", "gemma-3-27b", 2, 1, 16, True, "none", 131072, 8192, 40 * GIB, False),
    ("gemma-3-27b tp2 pp2", "gemma-3-27b", 2, 2, 16, True, "none", 65536, 2048, 40 * GIB, False),
    ("gemma-3-12b tp1 block 32", "gemma-3-12b", 1, 1, 32, True, "none", 32768, 4096, 30 * GIB, False),
]


def _flat(cfg: dict) -> dict:
    body = {k: v for k, v in cfg.items() if not k.startswith("_")}
    text = body.get("text_config")
    return {**body, **text} if isinstance(text, dict) else body


def _layer_kinds(cfg: dict) -> tuple[list[str], object | None]:
    """Each layer's kind, from the config classes vLLM loads, and the model class (Mamba)."""
    mt = cfg["model_type"]
    if mt == "qwen3_next":
        from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
        from vllm.transformers_utils.configs.qwen3_next import Qwen3NextConfig
        types = Qwen3NextConfig(**cfg).layer_types
        return ["mamba" if t == "linear_attention" else "full" for t in types], Qwen3NextForCausalLM
    if mt in ("qwen3_5_moe", "qwen3_5_moe_text"):
        # qwen3_5.py imports torchvision (absent from the oracle install); its
        # get_mamba_state_shape_from_config / _dtype_from_config (qwen3_5.py:708-738) are
        # Qwen3-Next's line for line, and it supports no Mamba prefix caching either.
        from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
        from vllm.transformers_utils.configs.qwen3_5_moe import Qwen3_5MoeTextConfig
        types = Qwen3_5MoeTextConfig(**cfg).layer_types
        return ["mamba" if t == "linear_attention" else "full" for t in types], Qwen3NextForCausalLM
    if mt == "nemotron_h":
        from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
        from vllm.transformers_utils.configs.nemotron_h import NemotronHConfig
        pattern = NemotronHConfig(**cfg).hybrid_override_pattern
        return [{"M": "mamba", "*": "full"}.get(c, "none") for c in pattern], NemotronHForCausalLM
    if mt == "jamba":
        from transformers import JambaConfig
        from vllm.model_executor.models.jamba import JambaForCausalLM
        types = JambaConfig(**cfg).layers_block_type
        return ["mamba" if t == "mamba" else "full" for t in types], JambaForCausalLM
    if mt in ("llama4", "llama4_text"):  # llama4.py: ChunkedLocalAttention unless a NoPE layer
        return ["chunked_local" if x else "full" for x in cfg["no_rope_layers"]], None
    if mt in ("gemma3", "gemma3_text"):
        from transformers import Gemma3TextConfig
        keys = ("num_hidden_layers", "sliding_window", "sliding_window_pattern")
        types = Gemma3TextConfig(**{k: cfg[k] for k in keys}).layer_types
        return ["sliding_window" if t == "sliding_attention" else "full" for t in types], None
    return ["full"] * int(cfg["num_hidden_layers"]), None


def _vllm_config(cfg: dict, tp: int, block_size: int, prefix: bool, mode: str, mml: int, mnbt: int,
                 disable: bool, arch: str | None, model_cls: object | None) -> SimpleNamespace:
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    head = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    hf = SimpleNamespace(**cfg)
    ssm = "auto"
    if cfg["model_type"] == "nemotron_h":  # NemotronHForCausalLMConfig: the config's, else float16
        ssm = cfg.get("mamba_ssm_cache_dtype", "float16")
    elif cfg.get("mamba_ssm_dtype"):  # Qwen3_5ForConditionalGenerationConfig
        ssm = cfg["mamba_ssm_dtype"]
    chunk = cfg.get("mamba_chunk_size") or cfg.get("chunk_size")
    if chunk is None and cfg["model_type"] == "nemotron_h":
        chunk = 256  # NemotronHConfig's mamba_chunk_size default, stored as chunk_size
    model_config = SimpleNamespace(
        dtype=torch.bfloat16, use_mla=False, architecture=arch, model=cfg["model_type"],
        max_model_len=mml, original_max_model_len=mml, hf_config=hf, hf_text_config=hf,
        supports_mamba_prefix_caching=bool(model_cls is not None and supports_mamba_prefix_caching(model_cls)),
        get_num_kv_heads=lambda pc: max(1, kv // pc.tensor_parallel_size),
        get_head_size=lambda: head, get_mamba_chunk_size=lambda: chunk or 2048)
    return SimpleNamespace(
        model_config=model_config,
        cache_config=SimpleNamespace(
            block_size=block_size, enable_prefix_caching=prefix, mamba_cache_mode=mode, mamba_block_size=None,
            mamba_page_size_padded=None, cache_dtype="auto", mamba_cache_dtype="auto",
            mamba_ssm_cache_dtype=ssm, calculate_kv_scales=False, num_gpu_blocks_override=None),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, decode_context_parallel_size=1,
                                        prefill_context_parallel_size=1),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=True, max_num_batched_tokens=mnbt,
                                         disable_hybrid_kv_cache_manager=disable),
        speculative_config=None, num_speculative_tokens=0, attention_config=SimpleNamespace(backend=None),
        kv_head=(kv, head))


def _specs(kinds: list[str], vc: SimpleNamespace, cfg: dict, model_cls: object | None) -> dict:
    cc, tp = vc.cache_config, vc.parallel_config.tensor_parallel_size
    kv, head = vc.kv_head
    common = dict(num_kv_heads=max(1, kv // tp), head_size=head, dtype=torch.bfloat16)
    out = {}
    for i, kind in enumerate(kinds):
        if kind == "full":
            out[f"layers.{i}.attn"] = FullAttentionSpec(block_size=cc.block_size, **common)
        elif kind == "sliding_window":
            out[f"layers.{i}.attn"] = SlidingWindowSpec(block_size=cc.block_size, sliding_window=cfg["sliding_window"], **common)
        elif kind == "chunked_local":
            out[f"layers.{i}.attn"] = ChunkedLocalAttentionSpec(
                block_size=cc.block_size, attention_chunk_size=cfg["attention_chunk_size"], **common)
        elif kind == "mamba":
            out[f"layers.{i}.mixer"] = MambaSpec(
                shapes=model_cls.get_mamba_state_shape_from_config(vc),
                dtypes=model_cls.get_mamba_state_dtype_from_config(vc), block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded, mamba_cache_mode=cc.mamba_cache_mode)
    return out


def run_case(case: tuple) -> dict:
    name, file, tp, pp, block_size, prefix, mode, mml, mnbt, avail, disable = case
    raw = json.loads((CONFIGS / f"{file}.json").read_text())
    cfg = _flat(raw)
    kinds, model_cls = _layer_kinds(cfg)
    arch = (raw.get("architectures") or [None])[0]
    vc = _vllm_config(cfg, tp, block_size, prefix, mode, mml, mnbt, disable, arch, model_cls)
    if model_cls is not None:
        from vllm.model_executor.models import registry
        registry.ModelRegistry.resolve_model_cls = lambda *a, **k: (model_cls, arch)
        HybridAttentionMambaModelConfig.verify_and_update_config(vc)
    specs = _specs(kinds, vc, cfg, model_cls)
    from vllm.distributed.utils import get_pp_indices
    workers = []
    for rank in range(pp):
        lo, hi = get_pp_indices(len(kinds), rank, pp)
        workers.append({k: v for k, v in specs.items() if lo <= int(k.split(".")[1]) < hi})
    configs = kcu.get_kv_cache_configs(vc, workers, [avail] * pp)
    kvc = configs[0]
    groups = [{"kind": _kind(g.kv_cache_spec), "block_size": g.kv_cache_spec.block_size,
               "num_layers": len(g.layer_names), "layers": sorted(int(n.split(".")[1]) for n in g.layer_names)}
              for g in kvc.kv_cache_groups]
    page = kcu.get_uniform_page_size([g.kv_cache_spec for g in kvc.kv_cache_groups])
    groups_all = kcu.get_kv_cache_groups(vc, dict(specs)) if pp == 1 else None
    return {
        "name": name, "model": file, "tp": tp, "pp": pp, "block_size": block_size,
        "enable_prefix_caching": prefix, "mamba_cache_mode": mode, "max_model_len": mml,
        "max_num_batched_tokens": mnbt, "available_bytes": avail, "disable_hybrid_kv_cache_manager": disable,
        "expect": {
            "num_blocks": kvc.num_blocks, "page_size_bytes": page, "groups": groups,
            "attention_block_size": vc.cache_config.block_size,
            "resolved_mamba_cache_mode": vc.cache_config.mamba_cache_mode,
            "mamba_block_size": vc.cache_config.mamba_block_size,
            "kv_cache_size_tokens": kvc.num_blocks // len(kvc.kv_cache_groups)
            * min(g.kv_cache_spec.block_size for g in kvc.kv_cache_groups),
            "max_concurrency": kcu.get_max_concurrency_for_kv_cache_config(vc, kvc) if groups_all else None,
            "estimated_max_model_len_at_num_blocks": None,
        },
    }


def _kind(spec: object) -> str:
    if isinstance(spec, MambaSpec):
        return "mamba"
    if isinstance(spec, SlidingWindowSpec):
        return "sliding_window"
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return "chunked_local"
    return "full"


def too_small() -> dict:
    """vLLM's refusal and its estimated max model length when the pool is too small for one
    request (_check_enough_kv_cache_memory / _estimate_max_model_len_from_groups)."""
    case = ("qwen3-next tp1 too small", "qwen3-next-80b-a3b", 1, 1, 16, True, "none", 262144, 8192, 2 * GIB, False)
    try:
        run_case(case)
    except ValueError as exc:
        text = str(exc)
        est = int(text.split("estimated maximum model length is ")[1].split(".")[0])
        return {"name": case[0], "model": case[1], "tp": 1, "pp": 1, "block_size": 16,
                "enable_prefix_caching": True, "mamba_cache_mode": "none", "max_model_len": case[7],
                "max_num_batched_tokens": case[8], "available_bytes": case[9],
                "disable_hybrid_kv_cache_manager": False, "refused": text.split(" Try")[0],
                "estimated_max_model_len": est}
    raise AssertionError("vLLM accepted a pool too small for one request")


def main() -> None:
    out = {"vllm": "0.19.1", "generated_by": "tools/kv_capacity_oracle.py",
           "cases": [run_case(c) for c in CASES], "refusals": [too_small()]}
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")  # (vLLM logs to stdout)


if __name__ == "__main__":
    main()
