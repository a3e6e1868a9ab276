"""`servesim replay`: replay a request trace on the simulated vLLM engine and summarise it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from servesim.cli import app
from servesim.traces.errors import InputError


SWITCH_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")
BENCH = "vllm bench serve"
HELP = {
    "to": "a trace-format loader option KEY=VALUE (repeatable), e.g. --format servegen --trace-option start_s=36000",
    "te": "also write the simulated timeline as a Chrome trace (ui.perfetto.dev); with --step-trace, every chunk",
    "dataset_name": "generate the workload as `vllm bench serve` would (instead of TRACE): "
                    "random | sharegpt | sonnet | shared_prefix",
    "dataset_path": "sharegpt: the ShareGPT JSON its lengths come from; without --dataset-name: the TRACE",
    "num_prompts": "requests (--dataset-name; default 1000), or the first N of TRACE",
    "request_rate": "requests/s (inf: all at once; default inf); gives a length-only TRACE its arrivals",
    "burstiness": "gamma shape of the gaps (1: Poisson; default 1)",
    "mc": "requests in flight at most: the client waits for a free slot before sending",
    "goodput": "SLO as vllm bench writes it: ttft:MS tpot:MS e2el:MS",
    "pm": "metrics with percentiles in the result file: ttft,tpot,itl,e2el (default ttft,tpot,itl)",
    "mp": "percentiles of those metrics, e.g. 50,90,99 (default 99)",
    "save_result": "write vllm bench serve's result JSON (its schema and file name)",
    "save_detailed": "with --save-result: the per-request lists (ttfts, itls, start_times, ...)",
    "append_result": "add the result as a new line of an existing result file (or write a new one), as vllm bench does",
    "result_dir": "with --save-result: the folder of the result file",
    "rf": "with --save-result: the file name (default {label}-{rate}qps-{model}-{date}.json)",
    "label": "the result's label (file name prefix; default the backend, servesim)",
    "metadata": "with --save-result: KEY=VALUE pairs written into the result",
}
REPS = "replicates"
REPLICATES_HELP = "rerun over N derived seeds and cost-model draws; intervals per metric (docs/UNCERTAINTY.md)"
WORKERS_HELP = "replicates run in parallel (default: CPU cores)"
PERTURB_HELP = "each replicate draws step-time factors from the cost model's measured error"


def _build_config(model, gpu, tp, cost_model, seed, sets, engine="vllm", pp=1):
    from servesim.overrides import split_set_items
    from servesim.replay_config import build_config

    return build_config(model, gpu, tp, cost_model, seed, split_set_items(sets), engine, pp)


@app.command()
def replay(
    trace: Path = typer.Argument(None, help="trace file (default: the bundled ShareGPT sample)"),
    fmt: str = typer.Option("auto", "--format", help="trace format (auto sniffs; see traces.available_formats)"),
    trace_options: list[str] = typer.Option([], "--trace-option", help=HELP["to"]),
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
    trace_events: Path = typer.Option(None, "--trace-events", help=HELP["te"]),
    dataset_name: str = typer.Option(None, "--dataset-name", rich_help_panel=BENCH, help=HELP["dataset_name"]),
    dataset_path: Path = typer.Option(None, "--dataset-path", rich_help_panel=BENCH, help=HELP["dataset_path"]),
    num_prompts: int = typer.Option(None, "--num-prompts", rich_help_panel=BENCH, help=HELP["num_prompts"]),
    request_rate: float = typer.Option(None, "--request-rate", rich_help_panel=BENCH, help=HELP["request_rate"]),
    burstiness: float = typer.Option(None, "--burstiness", rich_help_panel=BENCH, help=HELP["burstiness"]),
    max_concurrency: int = typer.Option(None, "--max-concurrency", rich_help_panel=BENCH, help=HELP["mc"]),
    random_input_len: int = typer.Option(None, "--random-input-len", rich_help_panel=BENCH, help="default 1024"),
    random_output_len: int = typer.Option(None, "--random-output-len", rich_help_panel=BENCH, help="default 128"),
    random_range_ratio: float = typer.Option(None, "--random-range-ratio", rich_help_panel=BENCH, help="default 0"),
    random_prefix_len: int = typer.Option(None, "--random-prefix-len", rich_help_panel=BENCH, help="default 0"),
    goodput: list[str] = typer.Option([], "--goodput", rich_help_panel=BENCH, help=HELP["goodput"]),
    percentile_metrics: str = typer.Option(None, "--percentile-metrics", rich_help_panel=BENCH, help=HELP["pm"]),
    metric_percentiles: str = typer.Option("99", "--metric-percentiles", rich_help_panel=BENCH, help=HELP["mp"]),
    save_result: bool = typer.Option(False, "--save-result", rich_help_panel=BENCH, help=HELP["save_result"]),
    save_detailed: bool = typer.Option(False, "--save-detailed", rich_help_panel=BENCH, help=HELP["save_detailed"]),
    append_result: bool = typer.Option(False, "--append-result", rich_help_panel=BENCH, help=HELP["append_result"]),
    result_dir: str = typer.Option(None, "--result-dir", rich_help_panel=BENCH, help=HELP["result_dir"]),
    result_filename: str = typer.Option(None, "--result-filename", rich_help_panel=BENCH, help=HELP["rf"]),
    label: str = typer.Option(None, "--label", rich_help_panel=BENCH, help=HELP["label"]),
    metadata: list[str] = typer.Option([], "--metadata", rich_help_panel=BENCH, help=HELP["metadata"]),
    frontend: bool = typer.Option(False, "--frontend/--no-frontend",
                                  help="model the OpenAI HTTP frontend (as seen by a benchmark client)"),
    replicates: int = typer.Option(1, "--replicates", help=REPLICATES_HELP, rich_help_panel=REPS),
    workers: int = typer.Option(None, "--workers", help=WORKERS_HELP, rich_help_panel=REPS),
    perturb_cost_model: bool = typer.Option(True, "--perturb-cost-model/--no-perturb-cost-model", help=PERTURB_HELP,
                                            rich_help_panel=REPS),
) -> None:
    """Replay TRACE and report TTFT, TPOT, throughput, preemptions and prefix-cache hits."""
    from servesim.bench_serve import check_append_target
    from servesim.bench_traffic import BenchFlags, parse_trace_options, workload_from_flags

    _check_outputs(out, step_trace, overwrite, trace_events)  # before any work: a refused --out costs nothing
    results = _result_options(percentile_metrics, metric_percentiles, save_result, save_detailed, result_dir,
                              result_filename, label, metadata, append_result)
    check_append_target(results)
    flags = BenchFlags(dataset_name, dataset_path, num_prompts, request_rate, burstiness, max_concurrency,
                       random=dict(random_input_len=random_input_len, random_output_len=random_output_len,
                                   random_range_ratio=random_range_ratio, random_prefix_len=random_prefix_len))
    cfg = _replay_config(_build_config(model, gpu, tp, cost_model, seed, sets, engine, pp),
                         macro_steps, fast_forward, frontend, goodput, max_concurrency)
    _check_trace_word(trace)
    options = parse_trace_options(trace_options)
    wl = workload_from_flags(flags, trace, fmt, seed, max_requests, rate_scale, options)
    _check_executor(executor, clock, sampling)
    if replicates != 1:  # a generated workload is reseeded per replicate; a trace is the same in each
        return _replicates(cfg, wl, flags, (trace, fmt, max_requests, rate_scale, options), replicates, out,
                           overwrite, workers, perturb_cost_model, dict(step_trace=step_trace, executor=executor != "sim"))
    res, exe, cfg = _run(cfg, wl, out, overwrite, step_trace, (executor, device, clock, sampling))
    _after_run(res, exe, out, wl, flags, results, cfg, goodput, trace_events, step_trace, overwrite)


def _run(cfg, wl, out, overwrite, step_trace, executor_options):
    """The replay itself, with progress and the interrupt note: (results, the GPU executor or None,
    the config it ran: the GPU runner's changes made)."""
    from servesim.cli import freeze_startup_objects, on_interrupt
    from servesim.report import make_console, progress_reporter
    from servesim.running import run

    executor, device, clock, sampling = executor_options
    err = make_console(stderr=True)
    cfg, exe = _gpu_executor(cfg, device, clock, sampling, err) if executor == "gpu" else (cfg, None)
    on_interrupt(f"nothing was written to {out}/ (results are written when the replay finishes; "
                 "a partial replay is not kept); run the same command again to start over", unless_published=out)
    freeze_startup_objects()
    span_s = wl.requests[-1].arrival_time_s if wl.requests else None
    with progress_reporter(err, len(wl.requests), span_s=span_s) as progress:
        res = run(cfg, wl, out_dir=out, step_trace=step_trace, progress=progress, executor=exe, overwrite=overwrite)
    return res, exe, cfg


def _replicates(cfg, wl, flags, source, replicates, out, overwrite, workers, perturb, refused):
    """--replicates N (docs/UNCERTAINTY.md): `source` is (trace, fmt, max_requests, rate_scale, options);
    a generated workload (--dataset-name, or arrivals drawn at --request-rate) is drawn again from each
    replicate's seed; a trace with its own arrivals is the same in each."""
    from servesim.bench_traffic import workload_from_flags
    from servesim.commands.replicate_runs import replay_replicates

    trace, fmt, max_requests, rate_scale, options = source
    fixed = flags.dataset_name is None and flags.request_rate is None
    return replay_replicates(cfg, lambda r: wl if fixed else workload_from_flags(
        flags, trace, fmt, r.seed, max_requests, rate_scale, options), replicates, out, overwrite=overwrite,
        workers=workers, perturb=perturb, refused=refused)


def _after_run(res, exe, out, wl, flags, results, cfg, goodput, trace_events, step_trace, overwrite) -> None:
    """The summary on the console, then what the flags ask beside the result folder."""
    from servesim.report import make_console, print_summary

    if exe is not None:
        from servesim.report import write_gpu_timings

        write_gpu_timings(out, exe.timings)
    print_summary(make_console(), res.summary, wl, out)
    if results.writes:
        _save_bench_result(res, results, flags, wl, cfg, goodput)
    if trace_events is not None:
        from servesim.perfetto import write_chrome_trace

        path = write_chrome_trace(out, trace_events, step_trace, overwrite=overwrite)
        make_console().print(f"timeline trace: {path} (open it at https://ui.perfetto.dev)", highlight=False)


def _check_outputs(out: Path, step_trace: Path | None, overwrite: bool, trace_events: Path | None = None) -> None:
    """Refuse an --out, --step-trace or --trace-events that would replace something not ours to replace."""
    from servesim.simulator.outdir import check_output
    from servesim.simulator.outfile import check_output_file

    check_output(out, overwrite=overwrite)
    if step_trace is not None:
        check_output_file(step_trace, overwrite=overwrite, flag="--step-trace")
    if trace_events is not None:
        check_output_file(trace_events, overwrite=overwrite, flag="--trace-events")


def _replay_config(cfg, macro_steps: bool, fast_forward: bool, frontend: bool, goodput: list[str],
                   max_concurrency: int | None = None):
    """The switches of `replay` applied to the config _build_config made."""
    if fast_forward:
        from servesim.report import make_console

        make_console(stderr=True).print("--fast-forward is deprecated and does nothing more: exact macro-steps "
                                        "are on by default (--no-macro-steps turns them off)")
    if not macro_steps:
        cfg.macro_steps = False
    from servesim.replay_config import client_switches

    return client_switches(cfg, frontend, goodput, max_concurrency)


def _result_options(percentile_metrics, metric_percentiles, save_result, save_detailed, result_dir,
                    result_filename, label, metadata, append_result=False):
    from servesim.bench_serve import (BenchResultOptions, parse_metadata, parse_metric_percentiles,
                                      parse_percentile_metrics)

    for flag, given in (("--percentile-metrics", percentile_metrics is not None),
                        ("--metric-percentiles", metric_percentiles != "99")):
        if given and not (save_result or append_result):  # the console table has its own columns
            raise InputError(f"{flag} shapes the result file, and without --save-result none is written",
                             field=flag, allowed="add --save-result or --append-result")
    return BenchResultOptions(parse_percentile_metrics(percentile_metrics),
                              parse_metric_percentiles(metric_percentiles), save_result, save_detailed,
                              result_dir, result_filename, label, parse_metadata(metadata), append_result)


def _save_bench_result(res, results, flags, wl, cfg, goodput: list[str]) -> None:
    """--save-result: the run in `vllm bench serve`'s result file (servesim/bench_serve.py)."""
    from servesim.bench_serve import write_result
    from servesim.bench_traffic import traffic_of
    from servesim.report import make_console
    from servesim.simulator.bench_metrics import GoodputSlo
    from servesim.simulator.specs.models import resolve_model

    slo = None
    if goodput:  # vllm bench writes request_goodput only when --goodput was given
        slo = GoodputSlo(ttft_ms=None if cfg.slo.ttft_s is None else cfg.slo.ttft_s * 1e3,
                         tpot_ms=None if cfg.slo.tpot_s is None else cfg.slo.tpot_s * 1e3,
                         e2el_ms=None if cfg.slo.e2e_s is None else cfg.slo.e2e_s * 1e3)
    path = write_result(res.requests, results, traffic_of(flags, wl), resolve_model(cfg.hardware.model).hf_id, slo)
    make_console().print(f"vllm bench serve result: {path}", highlight=False)


def _check_trace_word(trace: Path | None) -> None:
    """A switch's value taken for TRACE (`--overwrite true`): say so, not only "file not found"."""
    if trace is not None and not trace.exists() and str(trace).lower() in SWITCH_WORDS:
        raise InputError("file not found; switches take no value: --macro-steps / --no-macro-steps, "
                         "--overwrite / --no-overwrite", path=str(trace))


def _check_executor(executor: str, clock: str, sampling: str) -> None:
    _check_choice(executor, "--executor", ("sim", "gpu"), "executor")
    _check_choice(clock, "--clock", ("model", "measured"), "clock")
    _check_choice(sampling, "--sampling", ("source", "greedy"), "sampling")


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
