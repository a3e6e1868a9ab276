"""Build the GPU executor for `replay --executor gpu` and `calibrate` (the top layer wires the
simulator's configuration to the GPU runner)."""

from __future__ import annotations

from simulator.config import SimConfig
from simulator.cost_model import make_cost_model
from simulator.engine import resolve_cache
from traces.errors import InputError

CPU_KV_LIMIT_GIB = 8.0  # refuse CPU KV caches larger than this: set cache.num_gpu_blocks instead


def make_gpu_executor(cfg: SimConfig, device: str = "cuda", clock: str = "model", sampling: str = "source",
                      backend: str | None = None, dtype: str | None = None):
    import torch

    from gpu_runner.model import LlamaModel
    from gpu_runner.runner import GpuExecutor, require_device
    from gpu_runner.weights import PRESETS, preset
    from scheduler.worker import TokenSource

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
    return GpuExecutor(model, cache.num_gpu_blocks, cache.block_size, TokenSource(cfg.seed, cfg.spec_decode.acceptance),
                       cfg.scheduler.num_spec_tokens, cost_model=cost, clock=clock, sampling=sampling)
