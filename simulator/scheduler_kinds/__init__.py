"""Scheduler kinds by name: what `engine: vllm|sglang` in a scenario (or --engine) selects.

An engine factory takes (SchedulerConfig, CacheConfig, SimConfig) and returns a scheduler that
implements scheduler.interface.SchedulerInterface (the only members the engine loop may use).
Every module of this folder registers one kind (vllm.py, sglang.py); a new kind is one new file.
Not to be confused with simulator/engine.py, the engine loop that drives whichever scheduler this
registry builds.
"""

from __future__ import annotations

from collections.abc import Callable

from servesim.scheduler.registry import Registry
from servesim.traces.errors import field_error

EngineFactory = Callable[..., object]

ENGINES: Registry[EngineFactory] = Registry("engine", plugins="servesim.simulator.scheduler_kinds",
                                            error=field_error("engine"))


def register_engine(name: str):
    return ENGINES.register(name)


def available_engines() -> list[str]:
    return ENGINES.names()


def make_engine_scheduler(name: str, scheduler_config, cache_config, sim_config=None):
    return ENGINES.get(name)(scheduler_config, cache_config, sim_config)
