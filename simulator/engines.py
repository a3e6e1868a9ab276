"""Scheduler engines by name: what `engine: vllm|sglang` in a scenario (or --engine) selects.

An engine factory takes (SchedulerConfig, CacheConfig, SimConfig) and returns a scheduler that
implements scheduler.interface.SchedulerInterface (the only members the engine loop may use).
"""

from __future__ import annotations

from collections.abc import Callable

from servesim.scheduler import make_scheduler
from servesim.scheduler.registry import Registry
from servesim.traces.errors import field_error

EngineFactory = Callable[..., object]


def _load_optional() -> None:
    try:  # the SGLang-style engine registers itself when its module exists
        import servesim.simulator.sglang_engine  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "servesim.simulator.sglang_engine":
            raise


ENGINES: Registry[EngineFactory] = Registry("engine", loader=_load_optional, error=field_error("engine"))


def register_engine(name: str):
    return ENGINES.register(name)


@register_engine("vllm")
def _vllm(scheduler_config, cache_config, sim_config=None):
    return make_scheduler(scheduler_config, cache_config)


def available_engines() -> list[str]:
    return ENGINES.names()


def make_engine_scheduler(name: str, scheduler_config, cache_config, sim_config=None):
    return ENGINES.get(name)(scheduler_config, cache_config, sim_config)
