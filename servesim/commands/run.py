"""`servesim run`: run a what-if scenario (YAML) and its sweep, locally or on Ray."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


def _fmt(x, scale: float = 1.0, digits: int = 1) -> str:
    try:
        if x is None or x != x:
            return "-"
        return f"{float(x) * scale:.{digits}f}"
    except (TypeError, ValueError):
        return "-"


@app.command("run")
def run_command(
    scenario: Path = typer.Argument(..., help="scenario file, or the name of a shipped one (kv_size_preemptions: scenarios/, docs/SCENARIOS.md)"),
    out: Path = typer.Option(None, "--out", help="results folder (default: runs/<scenario name>[-smoke])"),
    backend: str = typer.Option("local", "--backend", help="local (process pool) | ray"),
    workers: int = typer.Option(None, "--workers", help="parallel variants (default: CPU cores)"),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster address (default: a local Ray)"),
    smoke: bool = typer.Option(False, "--smoke/--no-smoke", help="every variant at a reduced size (a few requests)"),
    sets: list[str] = typer.Option([], "--set", help="override a key: --set scheduler.max_num_seqs=64, "
                                                     "--set 'sweep.cache.block_size=[16,32]'"),
    dry_run: bool = typer.Option(False, "--dry-run/--no-dry-run", help="validate and list the variants; run nothing"),
) -> None:
    """Validate SCENARIO, run every variant not already finished in --out, write sweep.parquet."""
    from servesim.cli import on_interrupt
    from servesim.report import make_console
    from servesim.scenario import load_scenario
    from servesim.scenario.backends import default_workers, get_backend
    from servesim.scenario.runner import run_sweep
    from servesim.simulator.outdir import check_output

    console, err = make_console(), make_console(stderr=True)
    get_backend(backend)
    if out is not None:
        check_output(out, resume="sweep")
    sc = load_scenario(scenario, sets=sets, smoke=smoke)
    for note in sc.notes:
        err.print(f"[yellow]note:[/] {note}")
    out = out or Path("runs") / (sc.name + ("-smoke" if smoke else ""))
    n = len(sc.variants)
    valid = n - len(sc.failed)
    workers = default_workers(valid) if workers is None else workers  # run_sweep refuses < 1
    err.print(f"scenario [bold]{sc.name}[/]: {n} variant(s), {len(sc.failed)} invalid; "
              f"backend {backend}, {workers} worker(s); results in {out}/")
    if dry_run:
        _print_variants(console, sc)
        return
    check_output(out, resume="sweep")
    again = " ".join(["servesim run", str(scenario), "--out", str(out), *(["--smoke"] if smoke else []),
                      *(f"--set {s!r}" for s in sets)])
    on_interrupt(f"finished variants are kept in {out}/variants/; to resume, run again: {again}")

    def progress(o, done: int, total: int) -> None:
        tag = {"ok": "[green]done[/]", "cached": "[cyan]cached[/]"}.get(o.status, "[red]failed[/]")
        extra = f" in {o.wall_s:.1f} s" if o.status == "ok" else (f": {o.error}" if o.error else "")
        err.print(f"[{done}/{total}] {tag} {o.name}{extra}")

    outcomes = run_sweep(sc, out, backend=backend, workers=workers, ray_address=ray_address, progress=progress)
    _print_table(console, out)
    failed = [o for o in outcomes if o.status == "error"]
    if failed:
        err.print(f"[red]{len(failed)} variant(s) failed[/]; see error.txt in their folders under {out}/variants/")
        raise typer.Exit(1)


def _print_variants(console, sc) -> None:
    from rich.table import Table

    t = Table(title=f"{sc.name}: variants")
    t.add_column("#", justify="right")
    t.add_column("parameters")
    t.add_column("folder")
    for v in sc.variants:
        from servesim.scenario.model import describe_params

        t.add_row(str(v.index), describe_params(v.params) or "(base)", v.name if v.error is None else "[red]invalid")
    console.print(t)


def _print_table(console, out: Path) -> None:
    from rich.table import Table

    from servesim.scenario import load_sweep
    from servesim.scenario.model import short_label

    sw = load_sweep(out)
    t = Table(title=f"{sw.info.get('scenario', out.name)}: {len(sw.table)} variant(s)  ({out}/sweep.parquet)")
    cols = (("TTFT50 ms", "ttft_s.p50", 1e3), ("TTFT99 ms", "ttft_s.p99", 1e3), ("TPOT50 ms", "tpot_s.p50", 1e3),
            ("tok/s", "throughput.output_tokens_per_s", 1.0), ("preempt", "num_preemptions", 1.0),
            ("rejected", "num_rejected", 1.0),
            ("hit %", "prefix_cache_hit_rate", 100.0))
    t.add_column("variant", min_width=24, overflow="fold")
    for title, _, _ in cols:
        t.add_column(title, justify="right")
    labels = {v["name"]: short_label(v["params"]) for v in sw.info.get("variants", [])}
    for _, row in sw.table.iterrows():
        label = labels.get(row["variant"]) or "(base)"
        if row["status"] != "ok":
            t.add_row(f"{label} [red](failed)", *["-"] * len(cols))
            continue
        t.add_row(label, *(_fmt(row.get(c), s, 0 if c in ("num_preemptions", "num_rejected") or s == 1.0 else 1)
                           for _, c, s in cols))
    console.print(t)
