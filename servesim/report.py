"""Terminal output: a progress bar while simulating and a summary table at the end."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


@contextlib.contextmanager
def progress_reporter(console: Console, num_requests: int):
    """Yield a callback(sim_time_s, requests_done); draws only on a terminal."""
    if not console.is_terminal:
        yield None
        return
    prog = Progress(TextColumn("[bold]simulating"), BarColumn(), TextColumn("{task.completed}/{task.total} requests"),
                    TextColumn("sim t={task.fields[sim_t]:.1f}s"), TimeElapsedColumn(), console=console, transient=True)
    with prog:
        task = prog.add_task("sim", total=num_requests, sim_t=0.0)
        yield lambda t, done: prog.update(task, completed=done, sim_t=t)


def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def print_summary(console: Console, s: dict, workload, out: Path | None) -> None:
    t = Table(title=f"servesim replay: {workload.name} ({s['num_requests']} requests)")
    t.add_column("metric")
    for c in ("mean", "p50", "p90", "p99"):
        t.add_column(c, justify="right")
    for key, label in (("ttft_s", "TTFT (ms)"), ("tpot_s", "TPOT (ms)"), ("itl_s", "ITL (ms)"), ("e2e_s", "E2E (ms)"),
                       ("queueing_s", "queueing (ms)")):
        st = s[key]
        t.add_row(label, *(_ms(st[c]) for c in ("mean", "p50", "p90", "p99")))
    console.print(t)
    tp = s["throughput"]
    console.print(
        f"finished {s['num_finished']}/{s['num_requests']}"
        + (f", {s['num_timed_out']} timed out (failed: clients gave up; excluded from latencies)"
           if s.get("num_timed_out") else "")
        + f" in {s['sim_duration_s']:.1f} s simulated "
        f"({s['wall_time_s']:.2f} s wall, {s['sim_speedup_x'] or 0:.0f}x real time), {s['num_steps']} steps\n"
        f"throughput {tp['requests_per_s']:.2f} req/s, {tp['output_tokens_per_s']:.0f} output tok/s, "
        f"{tp['total_tokens_per_s']:.0f} total tok/s; goodput {s['goodput']['requests_per_s']:.2f} req/s "
        f"({100 * s['goodput']['fraction_meeting_slo']:.0f} % meet TTFT<={s['goodput']['slo_ttft_s']}s, "
        f"TPOT<={s['goodput']['slo_tpot_s']}s)\n"
        f"preemptions {s['num_preemptions']}, prefix-cache hit rate {100 * s['prefix_cache_hit_rate']:.1f} %, "
        f"KV usage mean {100 * s['kv_usage_mean']:.1f} % of {s['num_gpu_blocks']} blocks ({s['num_gpu_blocks_source']})"
    )
    if out is not None:
        console.print(f"results in {out}/")


def write_gpu_timings(out: Path, timings) -> None:
    """steps_gpu.csv: predicted vs measured time of every step the GPU executor ran."""
    import pandas as pd

    rows = [{"num_tokens": t.num_tokens, "num_requests": t.num_requests, "prepare_s": t.prepare_s,
             "measured_s": t.measured_s, "predicted_s": t.predicted_s} for t in timings]
    pd.DataFrame(rows).to_csv(Path(out) / "steps_gpu.csv", index=False)
