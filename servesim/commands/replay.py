"""`servesim replay`: replay a request trace on the simulated vLLM engine and summarise it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from servesim.cli import app
from servesim.traces.errors import InputError


SWITCH_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")
REPLICATES_HELP = "rerun over N derived seeds and cost-model draws; intervals per metric (docs/UNCERTAINTY.md)"
WORKERS_HELP = "replicates run in parallel (default: CPU cores)"
PERTURB_HELP = "each replicate draws step-time factors from the cost model's measured error"


def _build_config(model, gpu, tp, cost_model, seed, sets, engine="vllm", pp=1):
    from servesim.overrides import apply_overrides, split_set_items
    from servesim.simulator.config import CostModelConfig, SimConfig

    cfg = SimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, model=model, gpu=gpu, tp=tp, pp=pp)
    cfg.cost_model = CostModelConfig(name=cost_model)
    if Path(cost_model).suffix in (".json", ".yaml", ".yml"):  # a fitted model file from `servesim fit`
        cfg.cost_model = CostModelConfig(name="profiled", params={"path": cost_model})
    cfg.seed = seed
    cfg.engine = engine
    return apply_overrides(cfg, split_set_items(sets))


@app.command()
def replay(
    trace: Path = typer.Argument(None, help="trace file (default: the bundled ShareGPT sample)"),
    fmt: str = typer.Option("auto", "--format", help="trace format (auto sniffs; see traces.available_formats)"),
    model: str = typer.Option("llama-3.1-8b", "--model"),
    gpu: str = typer.Option("h100", "--gpu"),
    tp: int = typer.Option(1, "--tp"),
    pp: int = typer.Option(1, "--pp", help="pipeline-parallel stages (vLLM --pipeline-parallel-size)"),
    cost_model: str = typer.Option("roofline", "--cost-model", help="registry name, or a fitted model file"),
    sets: list[str] = typer.Option([], "--set", help="override a config field: --set scheduler.max_num_seqs=64"),
    seed: int = typer.Option(0, "--seed"),
    engine: str = typer.Option("vllm", "--engine", help="scheduler engine: vllm | sglang"),
    macro_steps: bool = typer.Option(True, "--macro-steps/--no-macro-steps",
                                     help="exact macro-steps over runs of plain decode steps (off: step one by "
                                          "one, for debugging; results are identical)"),
    fast_forward: bool = typer.Option(False, "--fast-forward", hidden=True,
                                      help="deprecated: macro-steps (on by default) replaced fast-forward"),
    executor: str = typer.Option("sim", "--executor", help="sim (cost model) | gpu (real model, Triton kernels)"),
    device: str = typer.Option("cuda", "--device", help="with --executor gpu: cuda | cpu"),
    clock: str = typer.Option("model", "--clock", help="with --executor gpu: model (cost model) | measured"),
    sampling: str = typer.Option("source", "--sampling", help="with --executor gpu: source (shared rule) | greedy"),
    max_requests: int = typer.Option(None, "--max-requests"),
    rate_scale: float = typer.Option(None, "--rate-scale", help="2.0 = twice the traffic"),
    out: Path = typer.Option(Path("runs/replay"), "--out", help="results folder (new, empty, or an earlier result "
                                                                  "with --overwrite)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite",
                                   help="replace an earlier servesim result in --out"),
    step_trace: Path = typer.Option(None, "--step-trace", help="write every engine step in the oracle's schema"),
    dataset_name: str = typer.Option(None, "--dataset-name", rich_help_panel="vllm bench serve",
                                     help="generate the workload as `vllm bench serve` would (instead of TRACE): "
                                          "random | sharegpt | sonnet | shared_prefix"),
    num_prompts: int = typer.Option(1000, "--num-prompts", rich_help_panel="vllm bench serve"),
    request_rate: float = typer.Option(float("inf"), "--request-rate", rich_help_panel="vllm bench serve",
                                       help="requests/s (inf: all at once)"),
    burstiness: float = typer.Option(1.0, "--burstiness", rich_help_panel="vllm bench serve",
                                     help="gamma shape of the gaps (1: Poisson)"),
    random_input_len: int = typer.Option(1024, "--random-input-len", rich_help_panel="vllm bench serve"),
    random_output_len: int = typer.Option(128, "--random-output-len", rich_help_panel="vllm bench serve"),
    random_range_ratio: float = typer.Option(0.0, "--random-range-ratio", rich_help_panel="vllm bench serve"),
    random_prefix_len: int = typer.Option(0, "--random-prefix-len", rich_help_panel="vllm bench serve"),
    goodput: list[str] = typer.Option([], "--goodput", rich_help_panel="vllm bench serve",
                                      help="SLO as vllm bench writes it: ttft:MS tpot:MS e2el:MS"),
    frontend: bool = typer.Option(False, "--frontend/--no-frontend",
                                  help="model the OpenAI HTTP frontend (as seen by a benchmark client)"),
    replicates: int = typer.Option(1, "--replicates", help=REPLICATES_HELP, rich_help_panel="replicates"),
    workers: int = typer.Option(None, "--workers", help=WORKERS_HELP, rich_help_panel="replicates"),
    perturb_cost_model: bool = typer.Option(True, "--perturb-cost-model/--no-perturb-cost-model", help=PERTURB_HELP,
                                            rich_help_panel="replicates"),
) -> None:
    """Replay TRACE and report TTFT, TPOT, throughput, preemptions and prefix-cache hits."""
    from servesim.running import run
    from servesim.cli import freeze_startup_objects, on_interrupt
    from servesim.report import make_console, print_summary, progress_reporter

    _check_outputs(out, step_trace, overwrite)  # before any work: a refused --out costs nothing
    cfg = _replay_config(_build_config(model, gpu, tp, cost_model, seed, sets, engine, pp),
                         macro_steps, fast_forward, frontend, goodput)
    bench = dict(num_prompts=num_prompts, request_rate=request_rate, burstiness=burstiness,
                 random_input_len=random_input_len, random_output_len=random_output_len,
                 random_range_ratio=random_range_ratio, random_prefix_len=random_prefix_len)
    wl = _workload(trace, fmt, max_requests, rate_scale, seed, dataset_name, bench)
    _check_choice(executor, "--executor", ("sim", "gpu"), "executor")
    _check_choice(clock, "--clock", ("model", "measured"), "clock")
    _check_choice(sampling, "--sampling", ("source", "greedy"), "sampling")
    if replicates != 1:  # a generated workload is reseeded per replicate; a trace is the same in each
        from servesim.commands.replicate_runs import replay_replicates
        return replay_replicates(cfg, lambda r: wl if dataset_name is None else _workload(
            trace, fmt, max_requests, rate_scale, r.seed, dataset_name, bench), replicates, out, overwrite=overwrite,
            workers=workers, perturb=perturb_cost_model, refused=dict(step_trace=step_trace, executor=executor != "sim"))
    err = make_console(stderr=True)
    cfg, exe = _gpu_executor(cfg, device, clock, sampling, err) if executor == "gpu" else (cfg, None)
    on_interrupt(f"nothing was written to {out}/ (results are written when the replay finishes; "
                 "a partial replay is not kept); run the same command again to start over", unless_published=out)
    freeze_startup_objects()
    with progress_reporter(err, len(wl.requests)) as progress:
        res = run(cfg, wl, out_dir=out, step_trace=step_trace, progress=progress, executor=exe, overwrite=overwrite)
    if exe is not None:
        from servesim.report import write_gpu_timings

        write_gpu_timings(out, exe.timings)
    print_summary(make_console(), res.summary, wl, out)


def _check_outputs(out: Path, step_trace: Path | None, overwrite: bool) -> None:
    """Refuse an --out or --step-trace that would replace something not ours to replace."""
    from servesim.simulator.outdir import check_output
    from servesim.simulator.outfile import check_output_file

    check_output(out, overwrite=overwrite)
    if step_trace is not None:
        check_output_file(step_trace, overwrite=overwrite, flag="--step-trace")


def _replay_config(cfg, macro_steps: bool, fast_forward: bool, frontend: bool, goodput: list[str]):
    """The switches of `replay` applied to the config _build_config made."""
    if fast_forward:
        from servesim.report import make_console

        make_console(stderr=True).print("--fast-forward is deprecated and does nothing more: exact macro-steps "
                                        "are on by default (--no-macro-steps turns them off)")
    if not macro_steps:
        cfg.macro_steps = False
    if frontend:
        cfg.frontend = dataclasses.replace(cfg.frontend, enabled=True)
    if goodput:
        from servesim.overrides import apply_overrides
        from servesim.traces.bench import parse_goodput

        cfg = apply_overrides(cfg, parse_goodput(goodput))
    return cfg


def _workload(trace: Path | None, fmt: str, max_requests: int | None, rate_scale: float | None, seed: int,
              dataset_name: str | None, bench: dict):
    """TRACE loaded, or (--dataset-name) the workload `vllm bench serve` generates from ``bench``,
    the BenchConfig fields of its options."""
    if dataset_name is not None:
        from servesim.traces.bench import BenchConfig, bench_workload

        if trace is not None:
            raise InputError("give either a TRACE or --dataset-name, not both", field="--dataset-name")
        return bench_workload(BenchConfig(dataset_name=dataset_name, seed=seed, **bench))
    from servesim.running import load_trace

    if trace is not None and not trace.exists() and str(trace).lower() in SWITCH_WORDS:
        raise InputError("file not found; switches take no value: --macro-steps / --no-macro-steps, "
                         "--overwrite / --no-overwrite", path=str(trace))
    return load_trace(trace, fmt, max_requests, rate_scale)


def _check_choice(value: str, option: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise InputError(f"unknown {what} {value!r}", field=option, allowed=", ".join(allowed))


def _gpu_executor(cfg, device: str, clock: str, sampling: str, err):
    """--executor gpu: the config with the KV pool fitted to ``device`` (a note on ``err`` when it
    shrank), and the executor that runs the real model."""
    from servesim.gpu import fit_cpu_kv_pool, make_gpu_executor

    cfg, note = fit_cpu_kv_pool(cfg, device)
    if note:
        err.print(f"[yellow]note:[/] {note}", highlight=False)
    return cfg, make_gpu_executor(cfg, device=device, clock=clock, sampling=sampling)
