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
           pp: int = 1, seed: int = 0, cost_model: str = "roofline", engine: str = "vllm", fmt: str = "auto",
           max_requests: int | None = None, rate_scale: float | None = None, dataset_name: str | None = None,
           dataset_path: str | Path | None = None, num_prompts: int | None = None, request_rate: float | None = None,
           burstiness: float | None = None, max_concurrency: int | None = None, goodput: list[str] | None = None,
           frontend: bool = False, options: dict | None = None, out_dir: str | Path | None = None,
           overwrite: bool = False, replicates: int = 1, workers: int | None = None,
           perturb_cost_model: bool = True, **overrides) -> Results:
    """`servesim replay` in Python: the same options (vllm bench's as keyword arguments, e.g.
    dataset_name="random", request_rate=8, max_concurrency=16, goodput=["ttft:500"]) with the same
    validation; other config fields as dotted keys with "__" for ".": scheduler__max_num_seqs=64.
    The `--random-*` lengths are options of dataset_name="random": random_input_len=..., etc.;
    `options` are the trace format loader's (--trace-option), e.g. {"start_s": 36000} for ServeGen.
    replicates > 1 (needs out_dir): docs/UNCERTAINTY.md; the summary holds the means and intervals,
    the frames every replicate's rows with a `replicate` column."""
    from servesim.bench_traffic import RANDOM_FLAGS, BenchFlags, workload_from_flags
    from servesim.replay_config import build_config, client_switches
    from servesim.running import _check_arg, _is_int

    for name, value in (("model", model), ("gpu", gpu), ("cost_model", cost_model), ("engine", engine),
                        ("fmt", fmt)):
        _check_arg(value, isinstance(value, str) and bool(value), name, "a name, e.g. llama-3.1-8b / h100")
    for name, value in (("tp", tp), ("pp", pp)):
        _check_arg(value, _is_int(value) and value >= 1, name, "an integer >= 1")
    _check_arg(seed, _is_int(seed), "seed", "an integer")
    _check_arg(trace, trace is None or isinstance(trace, (str, Path)), "trace",
               "a trace file path (str or pathlib.Path), or None for the bundled trace")
    random = {k: overrides.pop(k, None) for k in RANDOM_FLAGS}
    cfg = build_config(model, gpu, tp, cost_model, seed, {k.replace("__", "."): v for k, v in overrides.items()},
                       engine, pp)
    cfg = client_switches(cfg, frontend, goodput, max_concurrency)
    flags = BenchFlags(dataset_name, None if dataset_path is None else Path(dataset_path), num_prompts,
                       request_rate, burstiness, max_concurrency, random=random)
    _check_arg(options, options is None or isinstance(options, dict), "options", "a dict of loader options, or None")
    source = None if trace is None else Path(trace)
    wl = workload_from_flags(flags, source, fmt, seed, max_requests, rate_scale, options)
    if replicates != 1:
        from servesim.replicates import check_replicates, load_replicates, run_replay_replicates

        check_replicates(replicates, "replicates")
        _check_arg(out_dir, out_dir is not None, "out_dir", "a folder for the replicates' results")
        fixed = dataset_name is None and request_rate is None  # else drawn again from each replicate's seed
        run_replay_replicates(cfg, lambda rep: wl if fixed else workload_from_flags(
            flags, source, fmt, rep.seed, max_requests, rate_scale, options), replicates, out_dir,
            perturb=perturb_cost_model, workers=workers, overwrite=overwrite)
        return load_replicates(out_dir)
    return run(cfg, wl, out_dir=out_dir, overwrite=overwrite)


def cluster(config: str | Path, trace: str | Path | None = None, *, fmt: str | None = None,
            max_requests: int | None = None, rate_scale: float | None = None, out_dir: str | Path | None = None,
            overwrite: bool = False, smoke: bool = False):
    """`servesim cluster CONFIG [TRACE]` in Python: N replicas behind a router (docs/CLUSTER.md);
    returns the cluster's results (`.summary`, `.requests`, `.steps`); with out_dir, the result folder."""
    from servesim.cluster_run import run_cluster_file

    return run_cluster_file(config, trace, fmt=fmt, max_requests=max_requests, rate_scale=rate_scale,
                            out_dir=out_dir, overwrite=overwrite, smoke=smoke)[0]


def plan(config: str | Path, trace: str | Path | None = None, *, max_requests: int | None = None,
         rate_scale: float | None = None, out_dir: str | Path | None = None, overwrite: bool = False):
    """`servesim plan CONFIG` in Python: the cheapest deployments that meet the SLO; returns the plan
    table (a DataFrame); with out_dir, plan.csv and frontier.png there."""
    from servesim.cluster_run import run_plan_file

    return run_plan_file(config, trace, max_requests=max_requests, rate_scale=rate_scale, out_dir=out_dir,
                         overwrite=overwrite)


def validate(run_dir: str | Path, workload: str | Path, *, out_dir: str | Path, overwrite: bool = False,
             **options) -> dict:
    """`servesim validate RUN_DIR --workload FILE` in Python, for a measured run with a workload file
    (llmservingsim or servesim layouts): the options are ValidateOptions' fields (cost_model, gpu,
    model, num_gpu_blocks, cpu_overhead, frontend, ...); returns the report (validation.json's dict)."""
    from servesim.simulator.outdir import check_output, staged_output
    from servesim.validation_report import ValidateOptions, validate_run

    check_output(out_dir, overwrite=overwrite)
    fields = set(ValidateOptions.__dataclass_fields__)
    unknown = sorted(set(options) - fields)
    if unknown:
        from servesim.scheduler.registry import unknown_name_message
        from servesim.traces.errors import InputError

        raise InputError(unknown_name_message("option", unknown[0], sorted(fields)), field=unknown[0],
                         allowed=", ".join(sorted(fields)))
    with staged_output(Path(out_dir).expanduser(), "validate", overwrite=overwrite) as tmp:
        return validate_run(Path(run_dir), Path(workload), ValidateOptions(**options), out_dir=tmp)


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


def scenario_path(name: str) -> Path:
    """A shipped what-if scenario's file by name, from any folder (servesim/scenario/library.py)."""
    from servesim.scenario.library import scenario_path as _path  # the scenario package imports pandas

    return _path(name)


def scenario_names() -> list[str]:
    """The shipped what-if scenarios' names."""
    from servesim.scenario.library import scenario_names as _names

    return _names()


def library_path(name: str) -> Path:
    """Any file of the shipped library by name ("cluster/pd_vs_colocated_pd", "plan/...")."""
    from servesim.scenario.library import library_path as _path

    return _path(name)


def shared_data_dir() -> Path | None:
    """The shared measurements folder: $SERVESIM_SHARED_DATA, else shared/data beside the checkout."""
    from servesim.scenario.library import shared_data_dir as _dir

    return _dir()



__all__ = ["Results", "cluster", "compare", "bundled_trace_path", "library_path", "scenario_names", "scenario_path",
           "shared_data_dir", "load_results", "load_sweep", "load_trace", "plan",
           "plot_results", "replay", "run", "run_scenario", "validate"]
