"""Building an engine with its fast path: the one place that joins the reference engine and the
fast path (simulator/fastpath/).

`Engine(...)` is the reference: it steps every step. `build_engine(...)` is that engine plus the
planner `planner_for` gives it, or the reason it declined, recorded in `Engine.planner_declined`.
Without the fast path package (deleted, or not shipped) every engine is the reference, and says so.
"""

from __future__ import annotations

from typing import Any

from servesim.simulator.config import SimConfig
from servesim.simulator.engine import Engine
from servesim.traces.workload import Workload

FASTPATH = "servesim.simulator.fastpath"


def build_engine(cfg: SimConfig, workload: Workload | None = None, **kwargs: Any) -> Engine:
    """An Engine (same arguments) with the fast path's planner attached where it applies."""
    return attach_planner(Engine(cfg, workload, **kwargs))


def attach_planner(engine: Engine) -> Engine:
    """Give a built engine (not started) the fast path's planner, or record why it has none."""
    if not engine.cfg.macro_steps:
        engine.set_planner(None, "macro_steps is off")
        return engine
    try:
        from servesim.simulator.fastpath import planner_for
    except ModuleNotFoundError as e:
        if e.name != FASTPATH:
            raise
        engine.set_planner(None, f"the fast path ({FASTPATH}) is not installed")
        return engine
    choice = planner_for(engine)
    engine.set_planner(choice.planner, choice.declined)
    return engine
