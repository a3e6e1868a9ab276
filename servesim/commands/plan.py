"""`servesim plan CONFIG.yaml`: search replica counts, P:D ratios and TP for the cheapest deployment
that meets the SLOs; writes plan.csv and frontier.png."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


@app.command("plan")
def plan_command(
    config: Path = typer.Argument(..., help="plan config YAML (see docs/CLUSTER.md)"),
    trace: str = typer.Option(None, "--trace", help="trace file or bundled sample name (overrides the config)"),
    max_requests: int = typer.Option(None, "--max-requests"),
    rate_scale: float = typer.Option(None, "--rate-scale", help="2.0 = twice the traffic"),
    out: Path = typer.Option(Path("runs/plan"), "--out", help="results folder (new, empty, or an earlier result "
                                                                "with --overwrite)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite",
                                   help="replace an earlier servesim result in --out"),
    replicates: int = typer.Option(None, "--replicates", help="runs per candidate (default: search.replicates, 1)"),
    probability: float = typer.Option(None, "--probability",
                                      help="with replicates: the fraction of them that must meet the SLO "
                                           "(default: search.probability, 0.9)"),
    workers: int = typer.Option(None, "--workers", help="a candidate's replicates in parallel (default: CPU cores)"),
    perturb_cost_model: bool = typer.Option(True, "--perturb-cost-model/--no-perturb-cost-model",
                                            help="each replicate draws step-time factors from the cost model's error"),
) -> None:
    """Sweep deployments (early stop per shape), print the cost/goodput table, write CSV and PNG."""
    from servesim.cli import on_interrupt
    from servesim.cluster_run import cost_label, run_plan_file
    from servesim.simulator.cluster.plan import PlanConfig
    from servesim.report import make_console

    err, console = make_console(stderr=True), make_console()

    def progress(row: dict) -> None:
        if row["error"] is not None:
            err.print(f"  {row['shape']} x{row['size']}: [red]skipped[/] ({row['error']})")
        else:
            tag = "[green]meets SLO[/]" if row["meets_slo"] else "misses"
            prob = f", P(meets) {row['probability']:.0%}" if "probability" in row else ""
            err.print(f"  {row['shape']} x{row['size']}: {row['num_gpus']} GPU(s), goodput "
                      f"{row['goodput_fraction']:.1%}{prob} {tag} ({row['wall_s']:.1f} s)")

    on_interrupt(f"nothing was written to {out}/ (results are written when the search finishes); "
                 "run the same command again to start over", unless_published=out)
    df = run_plan_file(config, trace, max_requests=max_requests, rate_scale=rate_scale, out_dir=out,
                       overwrite=overwrite, progress=progress, announce=err.print, replicates=replicates,
                       probability=probability, workers=workers, perturb_cost_model=perturb_cost_model)
    print_plan(console, df, cost_label(PlanConfig.from_yaml(config)))
    console.print(f"wrote {out / 'plan.csv'} and {out / 'frontier.png'}")
    auto = df.attrs.get("autoscaled")
    if auto is not None:
        print_static_vs_autoscaled(console, df, auto)
        console.print(f"wrote {out / 'plan_autoscaled.csv'}")


def print_static_vs_autoscaled(console, static, autoscaled) -> None:
    from servesim.simulator.cluster.plan_autoscale import static_vs_autoscaled

    both = static_vs_autoscaled(static, autoscaled)
    s, a = both["static"], both["autoscaled"]
    console.print("cheapest fixed fleet meeting the SLO: " + ("none" if s is None else
                  f"{s['shape']} x{s['num_replicas']}, ${s['usd_per_day']:,.2f}/day, goodput {s['goodput_fraction']:.1%}"))
    console.print("cheapest autoscaled fleet meeting the SLO: " + ("none" if a is None else
                  f"{a['shape']} {a['min_replicas']}-{a['max_replicas']} replicas, {a['policy']}, "
                  f"${a['usd_per_day']:,.2f}/day (cold starts billed), goodput {a['goodput_fraction']:.1%}"))


def print_plan(console, df, cost_label: str) -> None:
    from rich.table import Table

    t = Table(title="deployments evaluated (* cheapest meeting the SLO, F on the cost/goodput frontier)")
    replicated = "probability" in df
    for c in ("", "shape", "replicas (P+D)", "GPUs", cost_label, "goodput", *(("P(meets SLO) [90 % CI]",) if replicated
              else ()), "rejected", "TTFT p90 (ms)", "TPOT p90 (ms)"):
        t.add_column(c, justify="left" if c in ("", "shape") else "right")
    for _, r in df.sort_values("cost", na_position="last").iterrows():
        if r["error"] is not None and r["error"] == r["error"]:
            t.add_row("", r["shape"], "-", "-", "-", "[red]error[/]", *(("-",) if replicated else ()), "-", "-", "-")
            continue
        mark = ("*" if r["best"] else "") + ("F" if r["frontier"] else "")
        reps = f"{r['num_prefill']}+{r['num_decode']}" if r["kind"] == "pd" else str(r["num_replicas"])
        prob = (f"{r['probability']:.0%} [{r['probability_low']:.0%}, {r['probability_high']:.0%}]",) if replicated else ()
        t.add_row(mark, r["shape"], reps, str(r["num_gpus"]), f"{r['cost']:g}", f"{r['goodput_fraction']:.1%}", *prob,
                  str(round(r.get("num_rejected", 0))), _ms(r["ttft_p90_s"]), _ms(r["tpot_p90_s"]))
    console.print(t)
    if not df["best"].any():
        console.print("[yellow]no evaluated deployment meets the SLO[/]: widen the search")


def _ms(x) -> str:
    return "-" if x is None or x != x else f"{1e3 * x:.0f}"
