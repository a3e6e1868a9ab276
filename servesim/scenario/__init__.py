"""What-if scenarios: YAML files that mirror the configuration dataclasses, with sweeps.

    from servesim.scenario import run_scenario
    sweep = run_scenario("scenarios/kv_size_preemptions.yaml", smoke=True)
    sweep.table[["cache.num_gpu_blocks", "num_preemptions", "ttft_s.p50"]]

Modules: `source` (YAML with line numbers, extends), `schema` (dataclass-driven validation),
`workload` (the workload section), `sweep` (axes, zip, --set), `model` (load + validate every
variant), `runner` (execute one variant, drive a sweep), `backends` (local pool, Ray),
`store` (result folder layout), `table` (sweep.parquet), `results` (read results back).
See docs/SCENARIOS.md.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from servesim.scenario.model import Scenario, Variant, load_scenario

if TYPE_CHECKING:
    from servesim.scenario.results import SweepResults, load_results, load_sweep

# The result readers (results.py) import pandas: they load when first asked for, so a command that
# only reads a scenario module (a cluster file's generated workload: scenario/workload.py) never
# imports it.
_READERS = ("SweepResults", "load_results", "load_sweep")


def __getattr__(name: str):
    if name in _READERS:
        from servesim.scenario import results

        return getattr(results, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_scenario(scenario: str | Path | dict | Scenario, *, out_dir: str | Path | None = None, smoke: bool = False,
                 sets: list[str] | dict | None = None, backend: str = "local", workers: int | None = 1,
                 ray_address: str | None = None, progress=None) -> SweepResults:
    """Validate, run every variant not already in out_dir, and return the sweep table.

    out_dir None: a new temporary folder (kept, so the variants can still be loaded)."""
    from servesim.scenario.runner import run_sweep

    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario, sets=sets, smoke=smoke)
    out = Path(out_dir).expanduser() if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"servesim-{scenario.name}-"))
    run_sweep(scenario, out, backend=backend, workers=workers, ray_address=ray_address, progress=progress)
    from servesim.scenario.results import load_sweep

    return load_sweep(out)


__all__ = ["Scenario", "SweepResults", "Variant", "load_results", "load_scenario", "load_sweep", "run_scenario"]
