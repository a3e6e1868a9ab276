"""Registers the "vllm" engine: vLLM V1's scheduler (scheduler/), sync or async."""

from __future__ import annotations

from servesim.scheduler import make_scheduler
from servesim.simulator.scheduler_kinds import register_engine


@register_engine("vllm")
def _vllm(scheduler_config, cache_config, sim_config=None):
    return make_scheduler(scheduler_config, cache_config)
