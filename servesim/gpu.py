"""Build the GPU executor for `replay --executor gpu` and `calibrate` (the top layer wires the
simulator's configuration to the GPU runner)."""

from __future__ import annotations

import dataclasses

from servesim.simulator.config import SimConfig
from servesim.simulator.cost_model import make_cost_model
from servesim.simulator.engine import resolve_cache
from servesim.simulator.sampling import sampler_cost_for
from servesim.simulator.startup import resolve_max_model_len
from servesim.traces.errors import InputError

CPU_KV_LIMIT_GIB = 8.0  # refuse CPU KV caches larger than this: set cache.num_gpu_blocks instead
# The KV pool `--device cpu` uses by default (the pool derived from the GPU's memory would not fit):
# as many blocks as fit in this many GiB (fp32), capped by the derived pool. Documented in README.
CPU_KV_BUDGET_GIB = 2.0


def fit_cpu_kv_pool(cfg: SimConfig, device: str) -> tuple[SimConfig, str | None]:
    """On the CPU with a derived pool: the config with a pool that fits CPU_KV_BUDGET_GIB, and a note
    saying so. A pool the user set (cache.num_gpu_blocks) is kept as given (and checked later)."""
    from servesim.gpu_runner.weights import PRESETS, preset

    name = cfg.hardware.model.lower()
    if device != "cpu" or not cfg.derive_num_gpu_blocks or name not in PRESETS:
        return cfg, None
    mcfg = preset(name)
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
                      backend: str | None = None, dtype: str | None = None):
    import torch

    from servesim.gpu_runner.model import LlamaModel
    from servesim.gpu_runner.runner import GpuExecutor, require_device
    from servesim.gpu_runner.weights import PRESETS, preset
    from servesim.scheduler.worker import TokenSource

    try:
        dev = require_device(device)
    except RuntimeError as e:
        raise InputError(str(e), field="--device") from None
    name = cfg.hardware.model.lower()
    if name not in PRESETS:
        raise InputError(f"no GPU-runner preset for model {cfg.hardware.model!r}", field="--model",
                         allowed=", ".join(sorted(PRESETS)))
    mcfg = preset(name)
    cache, _ = resolve_cache(cfg)
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
        dtype or ("bf16" if dev.type == "cuda" else "fp32")]
    kv_gib = (2 * mcfg.num_layers * cache.num_gpu_blocks * cache.block_size * mcfg.num_kv_heads * mcfg.head_dim
              * torch.tensor([], dtype=torch_dtype).element_size()) / 2**30
    if dev.type == "cpu" and kv_gib > CPU_KV_LIMIT_GIB:
        raise InputError(f"the KV cache would take {kv_gib:.1f} GiB on the CPU", field="cache.num_gpu_blocks",
                         allowed=f"a smaller pool, e.g. --set cache.num_gpu_blocks=1024 (limit {CPU_KV_LIMIT_GIB} GiB)")
    model = LlamaModel.random(mcfg, seed=cfg.seed, dtype=torch_dtype, device=dev,
                              backend=backend or ("triton" if dev.type == "cuda" else "torch"))
    hw = cfg.hardware
    # Always attached: every step pairs the predicted with the measured time.
    cost = make_cost_model(cfg.cost_model.name, model=hw.model, gpu=hw.gpu, tp=hw.tp, **cfg.cost_model.params)
    # The requests' sampler path: measured on the real logits, priced as the simulator prices it.
    sampler = sampler_cost_for(cfg)
    top_p = cfg.sampling.top_p if cfg.sampling.path == "sort" else 1.0
    return GpuExecutor(model, cache.num_gpu_blocks, cache.block_size, TokenSource(cfg.seed, cfg.spec_decode.acceptance),
                       cfg.scheduler.num_spec_tokens, cost_model=cost, clock=clock, sampling=sampling,
                       top_p=top_p, sampler_s=sampler.seconds if sampler.s_per_row else None)
