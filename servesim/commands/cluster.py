"""`servesim cluster CONFIG.yaml [TRACE]`: replay a trace on a simulated cluster (routers, P/D)."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app
from servesim.traces.errors import InputError


def load_cluster_yaml(path: Path) -> tuple[dict, dict]:
    """(cluster config dict, workload section) from a YAML file; `workload:` is optional."""
    from servesim.simulator.yaml_input import read_text_bounded, safe_load_bounded

    text = read_text_bounded(path, "cluster config")
    data = safe_load_bounded(text, str(path))
    if not isinstance(data, dict):
        raise InputError("a cluster config must be a mapping", path=str(path))
    workload = data.pop("workload", None) or {}
    if not isinstance(workload, dict):
        raise InputError("workload must be a mapping", path=str(path), field="workload",
                         allowed="{trace, format, rate_scale, max_requests}, or a generator: section")
    return data, workload


def load_cluster_workload(spec: dict, trace: str | None = None, base_dir: Path | None = None,
                          smoke: bool = False):
    """A cluster file's workload: a trace (simulator/cluster/plan.py load_plan_workload) or, with
    `generator:` and no TRACE argument, a synthetic workload written as a scenario's `workload:`
    section (servesim/scenario/workload.py). `smoke`: cut to a few requests (CI, quick looks;
    generators are cut inside, so sessions end on a last turn)."""
    from servesim.scenario.source import Marks
    from servesim.scenario.workload import SMOKE_MAX_REQUESTS, build_workload, parse_workload
    from servesim.simulator.cluster.plan import load_plan_workload

    if "generator" in spec and trace is None:
        parsed = parse_workload(spec, 0, Marks())
        return build_workload(parsed.smoke() if smoke else parsed)
    if smoke:
        spec = {**spec, "max_requests": min(spec.get("max_requests") or SMOKE_MAX_REQUESTS, SMOKE_MAX_REQUESTS)}
    return load_plan_workload(spec, trace, base_dir=base_dir)


@app.command("cluster")
def cluster_command(
    config: Path = typer.Argument(..., help="cluster config YAML (see docs/CLUSTER.md)"),
    trace: str = typer.Argument(None, help="trace file or bundled sample name (default: the config's workload)"),
    fmt: str = typer.Option(None, "--format", help="trace format (default: the config's, or auto)"),
    max_requests: int = typer.Option(None, "--max-requests"),
    rate_scale: float = typer.Option(None, "--rate-scale", help="2.0 = twice the traffic"),
    out: Path = typer.Option(Path("runs/cluster"), "--out", help="results folder (new, empty, or an earlier result "
                                                                   "with --overwrite)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite",
                                   help="replace an earlier servesim result in --out"),
    smoke: bool = typer.Option(False, "--smoke", help="a few requests only (CI, quick looks; numbers not meaningful)"),
) -> None:
    """Replay a trace on N replicas behind a router (or P/D-disaggregated) and summarise it."""
    from servesim.cli import freeze_startup_objects, on_interrupt
    from servesim.report import make_console
    from servesim.simulator.cluster import cluster_config_from_dict, run_cluster, write_cluster_results
    from servesim.simulator.outdir import check_output, claim_output

    check_output(out, overwrite=overwrite)  # before any work: a refused --out costs nothing
    data, wl_spec = load_cluster_yaml(config)
    cfg = cluster_config_from_dict(data, str(config))
    for key, value in (("format", fmt), ("max_requests", max_requests), ("rate_scale", rate_scale)):
        if value is not None:
            wl_spec[key] = value
    wl = load_cluster_workload(wl_spec, trace, base_dir=config.parent, smoke=smoke)
    err = make_console(stderr=True)
    err.print(f"cluster: {cfg.num_replicas} replica(s), {cfg.num_gpus} GPU(s), router {cfg.router.name}"
              f"{', P/D' if cfg.pd else ''}; {len(wl.requests)} requests")
    on_interrupt(f"nothing was written to {out}/ (results are written when the run finishes); "
                 "run the same command again to start over", unless_published=out)
    freeze_startup_objects()
    with claim_output(out, overwrite=overwrite) as out:  # out: ~ expanded
        res = run_cluster(cfg, wl)
        meta = {"name": wl.name, "source": str(wl.source), "num_requests": len(wl.requests),
                "attribution": wl.attribution}
        from servesim.identity import run_identity

        inputs = [str(config)] + ([str(trace)] if trace is not None else [])
        write_cluster_results(out, res, meta, overwrite=overwrite, identity=run_identity(cfg.seed, inputs))
    console = make_console()
    print_cluster_summary(console, res.summary, wl.name)
    print_replicas(console, res)
    console.print(f"results in {out}/")


def print_cluster_summary(console, s: dict, workload_name: str) -> None:
    from rich.table import Table

    c = s["cluster"]
    t = Table(title=f"servesim cluster: {workload_name} ({s['num_requests']} requests, {c['num_replicas']} replicas, "
                    f"{c['num_gpus']} GPUs, router {c['router']})")
    t.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for key, label in (("ttft_s", "TTFT (ms)"), ("tpot_s", "TPOT (ms)"), ("e2e_s", "E2E (ms)"),
                       ("queueing_s", "queueing (ms)")):
        t.add_row(label, *(_ms(s[key][col]) for col in ("mean", "p50", "p90", "p99")))
    console.print(t)
    tp, g = s["throughput"], s["goodput"]
    from servesim.report import print_rejected

    print_rejected(console, s)
    console.print(f"finished {s['num_finished']}/{s['num_requests']}, rejected {s.get('num_rejected', 0)}, in "
                  f"{s['sim_duration_s']:.1f} s simulated "
                  f"({s['wall_time_s']:.2f} s wall); {tp['requests_per_s']:.2f} req/s, "
                  f"{tp['output_tokens_per_s']:.0f} output tok/s; {100 * g['fraction_meeting_slo']:.0f} % meet "
                  f"TTFT<={g['slo_ttft_s']}s and TPOT<={g['slo_tpot_s']}s; prefix-cache hit rate "
                  f"{100 * s['prefix_cache_hit_rate']:.1f} %; preemptions {s['num_preemptions']}")
    from servesim.simulator.kv_offload_report import summary_line

    line = summary_line(s)  # the replicas' CPU KV tiers, summed
    if line is not None:
        console.print(line)


def print_replicas(console, res) -> None:
    from rich.table import Table

    t = Table(title="replicas")
    for c in ("replica", "role", "gpu", "tp x pp", "requests", "rejected", "TTFT p50 (ms)", "TPOT p50 (ms)", "hit rate", "KV mean",
              "preemptions"):
        t.add_column(c, justify="right" if c not in ("replica", "role", "gpu") else "left")
    for r in res.summary["replicas"]:
        layout = str(r["tp"]) if r["pp"] == 1 else f"{r['tp']} x {r['pp']}"
        t.add_row(r["name"], r["role"], str(r["gpu"]), layout, str(r["num_routed"]), str(r.get("num_rejected", 0)),
                  _ms(r["ttft_p50_s"]),
                  _ms(r["tpot_p50_s"]), f"{100 * r['prefix_cache_hit_rate']:.1f} %",
                  f"{100 * r['kv_usage_mean']:.1f} %",
                  str(r["num_preemptions"]))
    console.print(t)
    pd_s = res.summary.get("pd")
    if pd_s:
        parts = ", ".join(f"{k[:-2]} {_ms(v['mean'])}" for k, v in pd_s["ttft_breakdown_s"].items())
        console.print(f"P/D TTFT breakdown, mean ms: {parts}; KV moved {pd_s['kv_bytes_total'] / 2**30:.2f} GiB")


def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"
