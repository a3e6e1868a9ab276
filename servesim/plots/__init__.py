"""Every figure servesim draws (matplotlib, Agg): runs and sweeps with the self-contained report.html
(here, run.py, sweep.py, report.py), `servesim plan`'s frontier (plan.py), `servesim calibrate`'s
report (calibration.py) and the validation pages (validation.py).

    from servesim.plots import plot_results
    pngs, report = plot_results("runs/kv_size_preemptions")     # a sweep folder or one run's folder

Figure functions (each returns a matplotlib Figure, so notebooks can show or restyle them):
`run.latency_cdfs`, `run.timeline`, `run.preemptions_and_hits`, `run.batch_composition`,
`sweep.metrics_vs_axis`, `sweep.small_multiples`, `sweep.latency_overlay`, `offload.tier_sizing` (a
sweep over the CPU KV tier's size).
"""

from __future__ import annotations

from pathlib import Path

MAX_VARIANT_PAGES = 6  # per-variant detail figures in a sweep report (each costs ~2 s to draw)


def _save(fig, path: Path) -> Path:
    from servesim.plots import style

    style.save(fig, path)
    fig.clear()
    return path


def run_figures(res, out: Path, prefix: str = "", cdfs: bool = True) -> list[tuple[Path, str]]:
    """The figures of one run, written as PNGs; returns (path, caption) pairs. A sweep report
    leaves out the CDFs (cdfs=False): its overlay already shows every variant's."""
    from servesim.plots import run
    from servesim.plots.timeline import request_gantt

    label = res.out_dir.name if res.out_dir is not None else "run"
    specs = [("latency_cdf", lambda: run.latency_cdfs({label: res}), "TTFT, TPOT and end-to-end latency CDFs"),
             ("timeline", lambda: run.timeline(res), "KV-cache usage, running/waiting requests and tokens per second"),
             ("preemptions_hits", lambda: run.preemptions_and_hits(res),
              "Preemptions per time bin (cumulative line) and prefix-cache hit rate by finish time"),
             ("batch_composition", lambda: run.batch_composition(res), "Prefill vs decode tokens per step"),
             ("request_timelines", lambda: request_gantt(res),
              "Request timelines: queued, prefill and decode of the most preempted and slowest requests and an "
              "even sample of the rest (servesim export-trace gives every request, step by step)")]
    if not cdfs:
        specs = specs[1:]
    return [(_save(build(), out / f"{prefix}{name}.png"), caption) for name, build, caption in specs]


def plot_run(folder: str | Path, out: str | Path | None = None) -> tuple[list[Path], Path]:
    from servesim.plots.context import run_context
    from servesim.plots.interactive import charts_html, run_charts
    from servesim.plots.report import run_table, write_report
    from servesim.scenario.results import load_results

    res = load_results(folder)
    out = Path(out) if out is not None else Path(folder) / "plots"
    figs = run_figures(res, out)
    from servesim.plots.autoscale import fleet_figure

    fleet = fleet_figure(Path(folder))  # an autoscaled cluster run: its fleet over time
    if fleet is not None:
        figs.append((_save(fleet, out / "autoscale_fleet.png"),
                     "Replicas ready / starting / draining with cold starts and drains, the queue, TTFT and SLO attainment"))
    charts = charts_html(run_charts(res, Path(folder).name))
    report = write_report(out, f"servesim run: {Path(folder).name}", run_context(folder), run_table(res.summary),
                          [("Figures", figs, False)], charts)
    return [p for p, _ in figs], report


def plot_sweep(folder: str | Path, out: str | Path | None = None) -> tuple[list[Path], Path]:
    from servesim.plots import offload as op
    from servesim.plots import sweep as sp
    from servesim.plots.report import sweep_table, write_report
    from servesim.plots.interactive import charts_html, sweep_charts
    from servesim.plots.partial import partial_sweep
    from servesim.scenario.model import short_label
    from servesim.scenario.results import load_sweep

    finished = (Path(folder) / "sweep.parquet").is_file()
    sw = load_sweep(folder) if finished else partial_sweep(folder)
    out = Path(out) if out is not None else Path(folder) / "plots"
    labels = {v["name"]: short_label(v["params"]) for v in sw.info.get("variants", [])}
    sections = []
    ok = sw.table[sw.table["status"] == "ok"]
    if len(ok):
        overview = [(_save(sp.metrics_vs_axis(sw), out / "metrics_vs_axis.png"),
                     "Metrics against the swept axis: line = p50 over requests, band = p10-p90"),
                    (_save(sp.latency_overlay(sw), out / "latency_cdfs.png"), "Latency CDFs per variant"),
                    (_save(sp.small_multiples(sw), out / "small_multiples.png"),
                     "Running / waiting requests and KV usage over time, one panel per variant")]
        if op.tier_axis(sw) is not None:  # the sweep sizes the CPU KV tier: "how much CPU KV do I need?"
            overview.insert(1, (_save(op.tier_sizing(sw), out / "offload_tier_sizing.png"),
                                "CPU KV tier: TTFT (mean, p90) and hit rates (GPU prefix cache, CPU tier, "
                                "combined) against tier size"))
        sections.append(("Sweep overview", overview, False))
    for name in list(ok["variant"])[:MAX_VARIANT_PAGES]:
        figs = run_figures(sw.variant(name), out / "variants" / name, cdfs=False)
        sections.append((f"Variant: {labels.get(name) or name}", figs, True))
    info = sw.info
    desc = info.get("description") or ""
    if len(ok) > MAX_VARIANT_PAGES:  # say what the pages leave out: the table and overview have every variant
        desc += (f" Detail pages show the first {MAX_VARIANT_PAGES} of {len(ok)} finished variants; the others "
                 f"({', '.join(list(ok['variant'])[MAX_VARIANT_PAGES:])}) are in the table and overview figures.")
    if len(ok):  # what the variants share, named from the first (the table shows what they vary)
        from servesim.plots.context import run_context
        from servesim.scenario.store import variant_dir

        desc += f" First finished variant: {run_context(variant_dir(Path(folder), ok['variant'].iloc[0]))}."
    if not finished:
        desc += (f" This sweep did not finish: {len(ok)} of {len(sw.table)} variants have results; the figures "
                 f"show those (run the same `servesim run` again to finish it).")
    if info.get("smoke"):
        desc += " (smoke run: a few requests per variant; numbers are not meaningful)"
    report = write_report(out, f"servesim sweep: {info.get('scenario', Path(folder).name)}", desc.strip(),
                          sweep_table(sw.table, labels), sections, charts_html(sweep_charts(sw, labels)))
    return [p for _, imgs, _ in sections for p, _ in imgs], report


def plot_results(folder: str | Path, out: str | Path | None = None, *,
                 overwrite: bool = False) -> tuple[list[Path], Path]:
    """PNG figures and report.html for a sweep folder (sweep.parquet) or one run (summary.json).

    They are written to a staging folder and published as `out` (default RESULTS/plots) only when
    complete, under the output rule of simulator/outdir.py: an existing `out` must be servesim's
    and is replaced only with overwrite — except the default RESULTS/plots, which earlier
    `servesim plot` calls wrote and which plotting again is meant to refresh."""
    from servesim.simulator.outdir import result_kind, staged_output

    folder = Path(folder).expanduser()
    is_sweep = (folder / "sweep.parquet").is_file() or (folder / "sweep.json").is_file()  # finished or not
    plot = plot_sweep if is_sweep else plot_run
    if result_kind(folder) == "replicates":  # servesim/replicates.py: bands over the replicates
        from servesim.plots.replicates import plot_replicates as plot
    if plot is plot_run and not (folder / "summary.json").is_file():
        _not_results(folder)
    target = Path(out).expanduser() if out is not None else folder / "plots"
    refresh = out is None and result_kind(target) == "plots"
    with staged_output(target, "plots", overwrite=overwrite or refresh, flag="--out") as tmp:
        pngs, report = plot(folder, tmp)
    return [target / p.relative_to(tmp) for p in pngs], target / report.relative_to(tmp)


def _not_results(folder: Path) -> None:
    from servesim.traces.errors import InputError

    raise InputError("not a results folder: it has neither sweep.parquet (a sweep) nor summary.json (a run)",
                     path=str(folder), allowed="the --out folder of `servesim run` or `servesim replay`")


__all__ = ["plot_results", "plot_run", "plot_sweep", "run_figures"]
