"""Build the GPU executor for `replay --executor gpu` and `calibrate` (the top layer wires the
simulator's configuration to the GPU runner)."""

from __future__ import annotations

import dataclasses

from servesim.simulator.config import SimConfig
from servesim.simulator.cost_model import run_cost_model
from servesim.simulator.engine import resolve_cache
from servesim.simulator.sampling import sampler_cost_for
from servesim.simulator.startup import resolve_max_model_len
from servesim.traces.errors import InputError

CPU_KV_LIMIT_GIB = 8.0  # refuse CPU KV caches larger than this: set cache.num_gpu_blocks instead
# The KV pool `--device cpu` uses by default (the pool derived from the GPU's memory would not fit):
# as many blocks as fit in this many GiB (fp32), capped by the derived pool. Documented in README.
CPU_KV_BUDGET_GIB = 2.0


def runner_model(model: str, field: str = "--model"):
    """The GPU runner's model (gpu_runner/weights.py ModelConfig; random weights) for `model`: a
    preset by name, or any dense Llama-style decoder the specs resolve (a config.json path or
    folder, a catalogue id), at its real shapes. Refused with the reason: Mixture-of-Experts, MLA,
    sliding-window layers and quantized weights, which the runner does not run. Q/K/V biases
    (Qwen2) are not run: a few microseconds a layer."""
    from servesim.gpu_runner.weights import PRESETS, ModelConfig
    from servesim.simulator.specs import resolve_model
    from servesim.simulator.specs.hf_config import config_fields

    allowed = (f"a GPU-runner preset ({', '.join(sorted(PRESETS))}), or a dense Llama-style model: a "
               "Hugging Face config.json or catalogue id without MoE, MLA or sliding-window layers")
    if model.lower() in PRESETS:
        return PRESETS[model.lower()]
    try:
        spec = resolve_model(model)
    except InputError as e:
        if e.path is not None:  # a config file that does not read: its own error names it
            raise
        raise InputError(f"no GPU-runner preset or model {model!r}", field=field, allowed=allowed) from None
    if spec.name in PRESETS:
        return PRESETS[spec.name]
    unsupported = [why for cond, why in (
        (spec.is_moe, "Mixture-of-Experts layers"), (spec.mla is not None, "MLA attention"),
        (spec.sliding_window is not None, "sliding-window layers"),
        (bool(set(spec.layer_kinds) - {"full", "sliding_window"}), "chunked, linear-attention or MLP-only layers"),
        (spec.weight_dtype not in ("bf16", "fp16"), f"{spec.weight_dtype} weights")) if cond]
    if unsupported:
        raise InputError(f"model {spec.name!r}: the GPU runner runs dense Llama-style decoders in bf16/fp16, "
                         f"and this one has {' and '.join(unsupported)}", field=field, allowed=allowed)
    # What the spec does not carry (it changes no shape): the norm and rotary constants, and whether
    # q and k are normalised per head (Qwen3) -- from the config itself where there is one.
    raw = config_fields(model, spec)
    return ModelConfig(spec.name, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                       intermediate_size=spec.intermediate_size, num_layers=spec.num_layers,
                       num_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                       rope_theta=float(raw.get("rope_theta") or 10000.0),
                       rms_eps=float(raw.get("rms_norm_eps") or 1e-5), tie_embeddings=spec.tied_embeddings,
                       qk_norm=raw.get("model_type") == "qwen3", max_position=spec.max_position_embeddings)


def fit_cpu_kv_pool(cfg: SimConfig, device: str) -> tuple[SimConfig, str | None]:
    """On the CPU with a derived pool: the config with a pool that fits CPU_KV_BUDGET_GIB, and a note
    saying so. A pool the user set (cache.num_gpu_blocks) is kept as given (and checked later)."""
    if device != "cpu" or not cfg.derive_num_gpu_blocks:
        return cfg, None
    mcfg = runner_model(cfg.hardware.model, field="hardware.model")
    cache, _ = resolve_cache(cfg)
    block_bytes = 2 * mcfg.num_layers * cache.block_size * mcfg.num_kv_heads * mcfg.head_dim * 4  # fp32
    blocks = max(1, min(cache.num_gpu_blocks, int(CPU_KV_BUDGET_GIB * 2**30 // block_bytes)))
    sched = cfg.scheduler
    # vLLM's start-up rule: the pool must hold one max_model_len request. Like vLLM's estimate, a
    # smaller pool serves the longest requests it can hold.
    fit_len = blocks * cache.block_size
    if resolve_max_model_len(cfg) > fit_len:
        sched = dataclasses.replace(sched, max_model_len=fit_len)
    cfg = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, num_gpu_blocks=blocks),
                              scheduler=sched, derive_num_gpu_blocks=False)
    note = (f"--device cpu: KV pool of {blocks} blocks ({blocks * block_bytes / 2**30:.2f} GiB, the CPU budget "
            f"is {CPU_KV_BUDGET_GIB} GiB), max_model_len {sched.max_model_len}; set --set cache.num_gpu_blocks=N "
            "to choose another")
    return cfg, note


def make_gpu_executor(cfg: SimConfig, device: str = "cuda", clock: str = "model", sampling: str = "source",
                      backend: str | None = None, dtype: str | None = None, model=None):
    """The GPU executor for `cfg` on `device`: random weights at cfg.hardware.model's shapes, or
    `model` (a gpu_runner LlamaModel already on the device, e.g. real weights) when given."""
    import torch

    from servesim.gpu_runner.memory import check_fits
    from servesim.gpu_runner.model import LlamaModel
    from servesim.gpu_runner.runner import GpuExecutor, require_device
    from servesim.scheduler.worker import TokenSource

    try:
        dev = require_device(device)
    except RuntimeError as e:
        raise InputError(str(e), field="--device") from None
    mcfg = runner_model(cfg.hardware.model) if model is None else model.config
    cache, _ = resolve_cache(cfg)
    torch_dtype = model.dtype if model is not None else {"fp32": torch.float32, "fp16": torch.float16,
                                                         "bf16": torch.bfloat16}[dtype or ("bf16" if dev.type == "cuda" else "fp32")]
    kv_bytes = (2 * mcfg.num_layers * cache.num_gpu_blocks * cache.block_size * mcfg.num_kv_heads * mcfg.head_dim
                * torch.tensor([], dtype=torch_dtype).element_size())
    kv_gib = kv_bytes / 2**30
    if dev.type == "cpu" and kv_gib > CPU_KV_LIMIT_GIB:
        raise InputError(f"the KV cache would take {kv_gib:.1f} GiB on the CPU", field="cache.num_gpu_blocks",
                         allowed=f"a smaller pool, e.g. --set cache.num_gpu_blocks=1024 (limit {CPU_KV_LIMIT_GIB} GiB)")
    if model is None:  # a given model's weights are already in memory
        check_fits(mcfg, torch_dtype, dev, kv_bytes)  # weights and KV together, before allocating either
        model = LlamaModel.random(mcfg, seed=cfg.seed, dtype=torch_dtype, device=dev,
                                  backend=backend or ("triton" if dev.type == "cuda" else "torch"))
    # Always attached: every step pairs the predicted with the measured time.
    cost = run_cost_model(cfg)
    # The requests' sampler path: measured on the real logits, priced as the simulator prices it.
    sampler = sampler_cost_for(cfg)
    top_p = cfg.sampling.top_p if cfg.sampling.path == "sort" else 1.0
    return GpuExecutor(model, cache.num_gpu_blocks, cache.block_size, TokenSource(cfg.seed, cfg.spec_decode.acceptance),
                       cfg.scheduler.num_spec_tokens, cost_model=cost, clock=clock, sampling=sampling,
                       top_p=top_p, sampler_s=sampler.seconds if sampler.s_per_row else None)
