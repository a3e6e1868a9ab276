"""`servesim validate RUN_DIR --workload W`: replay a measured run and report the simulator's error.

`servesim validate-closed-loop`: the same for fixed-concurrency benchmark rows (aiconfigurator's
silicon sweeps): measured vs simulated mean TTFT / TPOT per row.
"""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


@app.command()
def validate(
    run_dir: Path = typer.Argument(..., help="measured run folder (llmservingsim: meta.json, requests.jsonl, "
                                             "timeseries.csv; or a servesim result folder)"),
    workload: Path = typer.Option(None, "--workload", help="the workload the run replayed (its arrivals and tokens); "
                                                         "not needed for a blis_h100_trainval folder"),
    experiment: str = typer.Option(None, "--experiment", help="blis_h100_trainval folder: which run (id or name)"),
    workload_format: str = typer.Option("auto", "--workload-format", help="trace format of --workload"),
    run_format: str = typer.Option("auto", "--run-format",
                                   help="run layout: auto (detected), or a registered run format "
                                        "(a wrong name lists them)"),
    cost_model: str = typer.Option("calibrated", "--cost-model",
                                   help="calibrated (shipped fit for model/GPU/TP), roofline, or a fitted .json"),
    gpu: str = typer.Option(None, "--gpu", help="GPU, when the run does not record its device"),
    host: str = typer.Option(None, "--host", help="the machine the GPUs sit in (simulator/specs/hosts.yaml: link, "
                                                  "P2P, measured collectives); default: the run's, else the "
                                                  "GPU's default host"),
    model: str = typer.Option(None, "--model", help="model id, alias or config.json path (default: the run's)"),
    num_gpu_blocks: int = typer.Option(None, "--num-gpu-blocks", help="KV blocks, when the run does not record them"),
    cpu_overhead: str = typer.Option("calibrated", "--cpu-overhead", help="calibrated | default | zero"),
    async_scheduling: bool = typer.Option(None, "--async-scheduling/--no-async-scheduling",
                                          help="override the run's vLLM default"),
    skew_alpha: float = typer.Option(None, "--skew-alpha",
                                     help="override the profile's decode-skew factor (0 = off)"),
    out: Path = typer.Option(Path("runs/validate"), "--out", help="folder for validation.json and the plot page"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an earlier result in --out"),
    plots: bool = typer.Option(True, "--plots/--no-plots"),
    frontend: bool = typer.Option(None, "--frontend/--no-frontend",
                                  help="model the OpenAI HTTP frontend (default: on when the run was measured "
                                       "over HTTP, e.g. blis_h100_trainval; off for engine timestamps)"),
    client_timeout_s: float = typer.Option(None, "--client-timeout-s",
                                           help="blis_h100_trainval: clients give up after this (s)"),
    cpu_kv_tier: bool = typer.Option(True, "--cpu-kv-tier/--no-cpu-kv-tier",
                                     help="blis_h100_trainval: model the CPU KV tier the run served with "
                                          "(its cpu_kv_blocks; off: compare without it)"),
    sampling: list[str] = typer.Option([], "--sampling",
                                       help="the requests' sampling parameters instead of the run's rule "
                                            "(a sampling: field, repeatable): --sampling top_p=0.9 "
                                            "--sampling temperature=0.6"),
    sets: list[str] = typer.Option([], "--set", help="override a config field on top of the run's settings (as "
                                                     "replay's --set, repeatable): --set hardware.disable_custom_all_reduce=true"),
) -> None:
    """Replay RUN_DIR with its recorded engine settings; write validation.json, CSVs and index.html."""
    from servesim.simulator.outdir import check_output, staged_output
    from servesim.validation_report import ValidateOptions, validate_run
    from servesim.simulator.validation.blis import is_blis_dir

    check_output(out, overwrite=overwrite)
    given_sampling = _sampling_option(sampling)
    if is_blis_dir(run_dir):  # per-stage aggregates: the workload is rebuilt from the run's spec
        _validate_blis(run_dir, experiment, cost_model, cpu_overhead, out, frontend is not False, client_timeout_s,
                       given_sampling, host, tuple(sets), cpu_kv_tier)
        return
    if workload is None:
        raise typer.BadParameter("--workload is required for this run layout", param_hint="--workload")

    opts = ValidateOptions(cost_model=cost_model, gpu=gpu, model=model, num_gpu_blocks=num_gpu_blocks,
                           cpu_overhead=cpu_overhead, frontend=frontend,
                           async_scheduling=async_scheduling, run_format=run_format,
                           workload_format=workload_format, plots=plots, skew_alpha=skew_alpha,
                           sampling=given_sampling, host=host, sets=tuple(sets))
    with staged_output(out, "validate", overwrite=overwrite) as tmp:
        rep = validate_run(run_dir, workload, opts, out_dir=tmp)
    _print_report(rep, out, plots)


def _print_report(rep: dict, out: Path, plots: bool) -> None:
    """The summary `validate` prints: pairing, the host's collectives (TP > 1), the errors."""
    pr, ag = rep["per_request"], rep["aggregate"]
    typer.echo(f"{rep['run']['name']}: {rep['pairing']['num_paired']} requests paired "
               f"({rep['pairing']['method']}); cost model {rep['cost_model']['name']}; "
               f"KV {rep['kv_cache']['num_gpu_blocks']} blocks ({rep['kv_cache']['source']}); "
               f"sampler path {rep['sampling']['path']} ({rep['sampling']['source']})")
    col = rep["collectives"]
    if rep["settings"]["tp"] > 1:
        typer.echo(f"host {col['host']} ({rep['settings']['provenance'].get('host', '')}); "
                   f"custom all-reduce {col['custom_allreduce']}; all-reduce {col['allreduce']}")
    typer.echo(f"{'metric':<9}{'median APE':>11}{'MAPE':>8}{'mean meas':>11}{'mean sim':>10}{'p90 err':>9}")
    for m in ("ttft", "tpot", "e2e"):
        typer.echo(f"{m:<9}{100 * pr[m]['median_ape']:>10.1f}%{100 * pr[m]['mape']:>7.1f}%"
                   f"{ag[m]['mean']['measured']:>11.4f}{ag[m]['mean']['simulated']:>10.4f}"
                   f"{100 * (ag[m]['p90']['error'] or 0):>8.1f}%")
    q = pr["queueing"]
    typer.echo(f"queueing MAE {q['mae_s']:.3f} s; makespan error {100 * rep['makespan']['error']:+.1f}%")
    for name, ts in rep["timeseries"].items():
        if ts.get("mae") is not None:
            typer.echo(f"series {name:<20} MAE {ts['mae']:.2f}{'  (' + ts['note'] + ')' if 'note' in ts else ''}")
    for note in rep["run"]["notes"]:
        typer.echo(f"note: {note}")
    typer.echo(f"wrote {out / 'validation.json'}" + (f" and {out / 'index.html'}" if plots else ""))


def _sampling_option(items: list[str]):
    """`--sampling k=v` items -> the SamplingConfig they give (validated as `--set sampling.k=v`
    would be: the error names the field and its allowed values), or None for the run's own rule."""
    from dataclasses import fields

    from servesim.overrides import apply_overrides, split_set_items
    from servesim.simulator.config import SimConfig
    from servesim.simulator.sampling import SamplingConfig
    from servesim.traces.errors import InputError

    if not items:
        return None
    pairs = split_set_items(items, "--sampling")
    for key in pairs:
        if not key or "." in key:
            raise InputError(f"expects a field of the sampling: section, got {key!r}", field="--sampling",
                             allowed=", ".join(f.name for f in fields(SamplingConfig)))
    try:
        return apply_overrides(SimConfig(), {f"sampling.{k}": v for k, v in pairs.items()}).sampling
    except InputError as e:  # named as the user typed it: --sampling top_p, not sampling.top_p
        field = e.field or ""
        named = f"--sampling {field.removeprefix('sampling.')}" if field.startswith("sampling.") else "--sampling"
        raise InputError(e.detail, field=named, allowed=e.allowed) from None


def _validate_blis(run_dir: Path, experiment: str | None, cost_model: str, cpu_overhead: str,
                   out: Path, frontend: bool, client_timeout_s: float | None, sampling=None,
                   host: str | None = None, sets: tuple[str, ...] = (), cpu_tier: bool = True) -> None:
    from servesim.simulator.validation.blis import format_blis_report, load_experiments, validate_blis
    from servesim.simulator.validation.replay import write_json_atomic

    if experiment is None:
        ids = ", ".join(e.id for e in load_experiments(run_dir))
        raise typer.BadParameter(f"pick a run: {ids}", param_hint="--experiment")
    rep = validate_blis(run_dir, experiment, "auto" if cost_model == "calibrated" else cost_model,
                        cpu_overhead, frontend, client_timeout_s, sampling=sampling, host=host, sets=sets,
                        cpu_tier=cpu_tier)
    write_json_atomic(out / "validation.json", rep)
    typer.echo(format_blis_report(rep))
    typer.echo(f"wrote {out / 'validation.json'}")


@app.command("validate-closed-loop")
def validate_closed_loop(
    silicon: Path = typer.Option(Path("/work/shared/data/benchmarks/aiconfigurator_silicon/silicon_sample.csv.gz"),
                                 "--silicon", help="aiconfigurator silicon_sample.csv(.gz)"),
    system: str = typer.Option("h100_sxm", "--system"),
    backend: str = typer.Option("vllm", "--backend"),
    model: list[str] = typer.Option(["Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B"], "--model",
                                    help="model_path values to include (repeat)"),
    max_rows: int = typer.Option(None, "--max-rows", help="only the first N rows (quick look)"),
    requests_per_client: int = typer.Option(4, "--requests-per-client"),
    warmup: int = typer.Option(1, "--warmup", help="requests per client excluded from the steady-state means"),
    stagger: str = typer.Option("random", "--stagger", help="client phases: random | cycle | none"),
    cost_model: str = typer.Option("calibrated", "--cost-model"),
    cpu_overhead: str = typer.Option("calibrated", "--cpu-overhead", help="calibrated | default | zero"),
    out: Path = typer.Option(Path("runs/validate-closed-loop"), "--out"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an earlier result in --out"),
) -> None:
    """Run each measured fixed-concurrency row closed-loop; write closed_loop.json/.csv/.html."""
    from servesim.simulator.outdir import check_output, staged_output
    from servesim.simulator.validation.closed_loop import ClosedLoopOptions, load_silicon_rows
    from servesim.validation_report import closed_loop_report

    check_output(out, overwrite=overwrite)

    rows = load_silicon_rows(silicon, backend=backend, system=system, models=tuple(model))
    if max_rows is not None:
        rows = rows.head(max_rows)
    opts = ClosedLoopOptions(requests_per_client=requests_per_client, warmup_requests_per_client=warmup,
                             cost_model=cost_model, cpu_overhead=cpu_overhead, stagger=stagger)

    def progress(i: int, n: int, r: dict) -> None:
        if r["status"] == "ok":
            typer.echo(f"[{i}/{n}] {r['model']} tp{r['tp']} {r['isl']}/{r['osl']} c{r['concurrency']}: "
                       f"TTFT {r['measured_ttft_ms']:.0f} vs {r['sim_ttft_ms']:.0f} ms "
                       f"({100 * r['ttft_error']:+.0f}%), "
                       f"TPOT {r['measured_tpot_ms']:.1f} vs {r['sim_tpot_ms']:.1f} ms ({100 * r['tpot_error']:+.0f}%)")

    with staged_output(out, "validate-closed-loop", overwrite=overwrite) as tmp:
        rep = closed_loop_report(rows, opts, out_dir=tmp, progress=progress)
    s = rep["summary"]
    typer.echo(f"{s['num_ok']} rows simulated, {s['num_unsupported']} unsupported: "
               f"{'; '.join(s['unsupported_reasons'])}")
    for k, v in s["overall"].items():
        if v["n"]:
            typer.echo(f"{k:<16} median APE {100 * v['median_ape']:.1f}%  MAPE {100 * v['mape']:.1f}%  "
                       f"median signed {100 * v['median_signed']:+.1f}%")
    typer.echo(f"wrote {out / 'closed_loop.json'} and {out / 'closed_loop.html'}")
