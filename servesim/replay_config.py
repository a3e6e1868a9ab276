"""The SimConfig of a replay from its options, the one path `servesim replay` and servesim.api.replay
share (the same defaults, the same validation)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from servesim.traces.errors import InputError


def build_config(model: str, gpu: str, tp: int, cost_model: str, seed: int, overrides: dict, engine: str = "vllm",
                 pp: int = 1):
    """vLLM 0.19 defaults with the hardware, cost model, seed and engine set, then dotted overrides."""
    from servesim.overrides import apply_overrides
    from servesim.simulator.config import CostModelConfig, SimConfig

    cfg = SimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, model=model, gpu=gpu, tp=tp, pp=pp)
    cfg.cost_model = CostModelConfig(name=cost_model)
    if Path(cost_model).suffix in (".json", ".yaml", ".yml"):  # a fitted model file from `servesim fit`
        cfg.cost_model = CostModelConfig(name="profiled", params={"path": cost_model})
    cfg.seed = seed
    cfg.engine = engine
    return apply_overrides(cfg, overrides)


def client_switches(cfg, frontend: bool = False, goodput: list[str] | None = None,
                    max_concurrency: int | None = None):
    """The OpenAI frontend, `--goodput` SLOs (vllm bench's ttft:MS ...) and the client's
    `--max-concurrency` semaphore (simulator/client.py), applied to cfg."""
    if frontend:
        cfg.frontend = dataclasses.replace(cfg.frontend, enabled=True)
    if goodput:
        from servesim.overrides import apply_overrides
        from servesim.traces.bench import parse_goodput

        cfg = apply_overrides(cfg, parse_goodput(list(goodput)))
    if max_concurrency is not None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise InputError(f"got {max_concurrency!r}", field="--max-concurrency", allowed="an integer >= 1")
        cfg.client = dataclasses.replace(cfg.client, max_concurrency=max_concurrency)
    return cfg
