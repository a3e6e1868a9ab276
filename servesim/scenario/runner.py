"""Drive a whole sweep: build one `VariantTask` per variant, run them on a backend, write the header.

The unit of work, `execute()`, lives in task.py (backends import it from there, so the runner can
pick a backend by name without an import cycle).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from servesim.scenario import store
from servesim.traces.errors import InputError
from servesim.simulator.outdir import MARKER
from servesim.scenario.model import Scenario, Variant, describe_params
from servesim.scenario.task import Outcome, VariantTask


Progress = Callable[[Outcome, int, int], None]  # (outcome, number done, total)


def run_sweep(scenario: Scenario, out_dir: str | Path, *, backend: str = "local", workers: int | None = None,
              ray_address: str | None = None, progress: Progress | None = None) -> list[Outcome]:
    """Run every variant not already complete in out_dir; write sweep.parquet; return outcomes in
    sweep order. out_dir must be new, empty or a sweep folder (resumed); it is locked meanwhile, so a
    second run on it refuses instead of computing the same variants again."""
    from servesim.scenario.backends import get_backend
    from servesim.simulator.outdir import claim_output

    get_backend(backend)  # an unknown backend: refused before anything is written
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise InputError(f"got {workers!r}", field="--workers", allowed="an integer >= 1 (default: the CPU cores)")
    if ray_address and backend != "ray":
        raise InputError("--ray-address only applies to --backend ray", field="--ray-address")
    with claim_output(out_dir, resume="sweep") as root:
        root.mkdir(exist_ok=True)
        store.clean_staging(root)
        store.clean_dead_scratch()
        try:
            return _run_locked(scenario, root, backend, workers, ray_address, progress)
        finally:
            store.clean_staging(root)


def _run_locked(scenario: Scenario, root: Path, backend: str, workers: int | None, ray_address: str | None,
                progress: Progress | None) -> list[Outcome]:
    from servesim.scenario.backends import get_backend
    from servesim.scenario.table import write_table

    _write_header(scenario, root)
    total = len(scenario.variants)
    outcomes: dict[str, Outcome] = {}

    def done(outcome: Outcome) -> None:
        variant = by_name[outcome.name]
        outcome.index, outcome.params = variant.index, variant.params
        if outcome.files is not None:  # came back over the network: publish here
            store.publish(root, outcome.name, outcome.files)
            outcome.files = None
        outcomes[outcome.name] = outcome
        if progress is not None:
            progress(outcome, len(outcomes), total)

    by_name = {v.name: v for v in scenario.variants}
    tasks = []
    for v in scenario.variants:
        if v.error is not None:
            store.publish(root, v.name, {"error.txt": v.error.encode() + b"\n", **_extra(scenario, v)})
            done(Outcome(v.name, "error", v.error))
        elif store.is_complete(store.variant_dir(root, v.name)):
            done(Outcome(v.name, "cached"))
        else:
            tasks.append(VariantTask(v.name, v.cfg, v.workload, _extra(scenario, v), None, _simulate(scenario)))
    if tasks:
        get_backend(backend)(tasks, root, workers, ray_address, done)
    write_table(scenario, root)
    return [outcomes[v.name] for v in scenario.variants]


def _simulate(scenario: Scenario):
    """How each variant runs: None (one run), or over the scenario's replicates (docs/UNCERTAINTY.md)."""
    if scenario.replicates == 1:
        return None
    from functools import partial

    from servesim.replicates import variant_replicates

    return partial(variant_replicates, n=scenario.replicates, perturb=scenario.perturb_cost_model)


def _extra(scenario: Scenario, v: Variant) -> dict[str, bytes]:
    return {"variant.yaml": yaml.safe_dump(v.resolved(scenario), sort_keys=False).encode()}


def _write_header(scenario: Scenario, root: Path) -> None:
    axes = [{"keys": list(a.keys), "points": [list(p) for p in a.points]} for a in scenario.axes]
    info = {"scenario": scenario.name, "description": scenario.description, "source": scenario.source,
            "smoke": scenario.smoke, "axes": axes,
            "variants": [{"name": v.name, "params": v.params, "label": describe_params(v.params)}
                         for v in scenario.variants]}
    store.write_atomic(root / MARKER, "sweep\n")
    store.write_atomic(root / "sweep.json", json.dumps(info, indent=1, default=list) + "\n")
    store.write_atomic(root / "scenario.yaml", yaml.safe_dump(scenario.tree(), sort_keys=False))
