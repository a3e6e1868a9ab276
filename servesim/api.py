"""The public Python API: run a replay and get pandas frames back.

    from servesim.api import replay
    res = replay("traces/data/...", model="llama-3.1-8b", gpu="h100")
    res.summary["ttft_s"]["p50"], res.requests.head()
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from servesim.simulator.config import SimConfig
from servesim.running import Results, load_trace, run  # noqa: F401  (the public names live in running)
from servesim.traces.bundled import DEFAULT_TRACE, bundled_trace_path  # noqa: F401


def replay(trace: str | Path | None = None, *, model: str = "llama-3.1-8b", gpu: str = "h100", tp: int = 1,
           seed: int = 0, out_dir: str | Path | None = None, overwrite: bool = False, replicates: int = 1,
           workers: int | None = None, perturb_cost_model: bool = True, **overrides) -> Results:
    """Replay a trace (None: the bundled default) with vLLM 0.19 defaults; overrides use dotted keys.
    replicates > 1 (needs out_dir): docs/UNCERTAINTY.md; the summary holds the means and intervals,
    the frames every replicate's rows with a `replicate` column."""
    from servesim.overrides import apply_overrides
    from servesim.running import _check_arg, _is_int

    for name, value in (("model", model), ("gpu", gpu)):
        _check_arg(value, isinstance(value, str) and bool(value), name, "a name, e.g. llama-3.1-8b / h100")
    _check_arg(tp, _is_int(tp) and tp >= 1, "tp", "an integer >= 1")
    _check_arg(seed, _is_int(seed), "seed", "an integer")
    cfg = SimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, model=model, gpu=gpu, tp=tp)
    cfg.seed = seed
    cfg = apply_overrides(cfg, {k.replace("__", "."): v for k, v in overrides.items()})
    if replicates != 1:
        from servesim.replicates import check_replicates, load_replicates, run_replay_replicates

        check_replicates(replicates, "replicates")
        _check_arg(out_dir, out_dir is not None, "out_dir", "a folder for the replicates' results")
        wl = load_trace(trace)
        run_replay_replicates(cfg, lambda rep: wl, replicates, out_dir, perturb=perturb_cost_model, workers=workers,
                              overwrite=overwrite)
        return load_replicates(out_dir)
    return run(cfg, load_trace(trace), out_dir=out_dir, overwrite=overwrite)


def run_scenario(scenario, *, out_dir: str | Path | None = None, smoke: bool = False, sets=None,
                 backend: str = "local", workers: int | None = 1, ray_address: str | None = None, progress=None):
    """Run a what-if scenario (YAML path or dict) and its sweep; returns SweepResults
    (`.table` = sweep.parquet, `.variant(i)` -> Results). See docs/SCENARIOS.md."""
    from servesim.scenario import run_scenario as _run_scenario

    return _run_scenario(scenario, out_dir=out_dir, smoke=smoke, sets=sets, backend=backend, workers=workers,
                         ray_address=ray_address, progress=progress)


def load_results(folder: str | Path) -> Results:
    """A finished run's folder (servesim replay --out, or one sweep variant) as Results; a replicates
    folder stacks its replicates' frames (a `replicate` column)."""
    from servesim.replicate_summary import is_replicates
    from servesim.replicates import load_replicates
    from servesim.scenario.results import load_results as _load

    return load_replicates(folder) if is_replicates(folder) else _load(folder)


def load_sweep(folder: str | Path):
    """A finished sweep's folder (servesim run --out) as SweepResults."""
    from servesim.scenario.results import load_sweep as _load

    return _load(folder)


def plot_results(folder: str | Path, out_dir: str | Path | None = None, overwrite: bool = False):
    """PNG figures and a self-contained report.html for a run or sweep folder: (pngs, report path).
    An existing out_dir must be an earlier plot folder, replaced only with overwrite."""
    from servesim.plots import plot_results as _plot

    return _plot(folder, out_dir, overwrite=overwrite)


def compare(runs: list[str | Path], out_dir: str | Path | None = None, overwrite: bool = False):
    """Runs side by side (the first is the baseline): a Comparison with the settings that differ
    and each metric per run; with out_dir, also a report.html there (a new result folder)."""
    from servesim.compare import compare_runs, write_compare_report
    from servesim.simulator.outdir import check_output

    if out_dir is not None:
        check_output(out_dir, overwrite=overwrite)
    cmp = compare_runs(list(runs))
    if out_dir is not None:
        write_compare_report(cmp, Path(out_dir).expanduser(), overwrite)
    return cmp


__all__ = ["Results", "compare", "bundled_trace_path", "load_results", "load_sweep", "load_trace", "plot_results", "replay",
           "run", "run_scenario"]
