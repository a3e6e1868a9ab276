"""Terminal output: progress while simulating and a summary table at the end.

In a terminal: a progress bar with an ETA. Otherwise (a log file, CI, a pipe): one line every
SERVESIM_PROGRESS_EVERY_S seconds (default 10), and tables at their full width instead of being cut
at 80 columns.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servesim.simulator.kv_offload_report import summary_line as offload_summary_line

LOG_EVERY_S = 10.0  # progress lines without a terminal (override: SERVESIM_PROGRESS_EVERY_S)
PIPE_WIDTH = 1000  # tables without a terminal: wide enough that no column is ever dropped


def make_console(stderr: bool = False) -> Console:
    """A rich Console that never cuts a table: a terminal's own width, else full width."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=PIPE_WIDTH)
    return console


def eta_s(elapsed_s: float, sim_t: float, done: int, total: int, span_s: float | None) -> float | None:
    """Seconds of wall time left. While arrivals remain (sim_t < span_s, the last arrival) the run
    must at least reach span_s on the simulated clock, at the pace simulated time has advanced so far;
    once every request has arrived, what is left is draining, paced by requests finished. None when
    nothing is known yet or the run is done."""
    if done >= total or elapsed_s <= 0:
        return None
    if span_s is not None and 0 < sim_t < span_s:
        return elapsed_s * (span_s - sim_t) / sim_t
    return elapsed_s * (total - done) / done if done else None


@contextlib.contextmanager
def progress_reporter(console: Console, num_requests: int, every_s: float | None = None,
                      span_s: float | None = None):
    """Yield a callback(sim_time_s, requests_done): a bar with an ETA (eta_s: from simulated time while
    requests still arrive, `span_s` being the last arrival) on a terminal, log lines otherwise."""
    if not console.is_terminal:
        every = every_s if every_s is not None else float(os.environ.get("SERVESIM_PROGRESS_EVERY_S", LOG_EVERY_S))
        yield _log_lines(console, num_requests, every, span_s)
        return
    prog = Progress(TextColumn("[bold]simulating"), BarColumn(), TextColumn("{task.completed}/{task.total} requests"),
                    TextColumn("sim t={task.fields[sim_t]:.1f}s"), TimeElapsedColumn(),
                    TextColumn("ETA {task.fields[eta]}"), console=console, transient=True)
    start = time.monotonic()
    with prog:
        task = prog.add_task("sim", total=num_requests, sim_t=0.0, eta="-")

        def update(t: float, done: int) -> None:
            eta = eta_s(time.monotonic() - start, t, done, num_requests, span_s)
            prog.update(task, completed=done, sim_t=t, eta="-" if eta is None else f"{eta:.0f} s")
        yield update


def _log_lines(console: Console, total: int, every_s: float, span_s: float | None = None):
    start = time.monotonic()
    last = [start]

    def report(sim_t: float, done: int) -> None:
        now = time.monotonic()
        if now - last[0] < every_s:
            return
        last[0] = now
        elapsed = now - start
        left = eta_s(elapsed, sim_t, done, total, span_s)
        eta = "" if left is None else f", ETA {left:.0f} s"
        console.print(f"simulating: {done}/{total} requests, sim t={sim_t:.1f} s, {elapsed:.0f} s elapsed{eta}",
                      highlight=False)
    return report


def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def time_unit(values) -> tuple[str, float]:
    """(unit, seconds per unit) that keeps these durations readable: ms below 10 s, s below 10
    minutes, then min (a 19-minute TTFT is not 1,139,782 ms)."""
    top = max((v for v in values if v is not None), default=0.0)
    if top < 10.0:
        return "ms", 1e-3
    if top < 600.0:
        return "s", 1.0
    return "min", 60.0


def _in(x, per_unit: float) -> str:
    if x is None:
        return "-"
    v = x / per_unit
    return f"{v:.1f}" if abs(v) >= 10 or per_unit == 1e-3 else f"{v:.2f}"


def load_lines(s: dict) -> list[str]:
    """The offered load against what was served, and a loud warning for an overloaded run."""
    ld = (s.get("metrics") or {}).get("load")
    if not ld:
        return []
    lines = [f"load: offered {ld['offered_requests_per_s']:.2f} req/s over {ld['arrival_span_s']:.1f} s, "
             f"engine busy {100 * (ld['busy_fraction'] or 0):.0f} % of the run, backlog drained in {ld['drain_s']:.1f} s"]
    if ld["overloaded"]:
        lines.append(
            f"[bold yellow]WARNING: overloaded about {ld['overload_factor']:.1f}x: requests arrived at "
            f"{ld['offered_requests_per_s']:.2f} req/s and were served at about {ld['served_requests_per_s']:.2f} req/s; "
            f"each second of trace added {ld['queueing_growth']:.1f} s of queueing, which is "
            f"{100 * ld['queueing_share_of_ttft']:.0f} % of the mean TTFT. Latencies measure the backlog, not the "
            f"engine: try --rate-scale {1 / ld['overload_factor']:.2g}, more replicas or a larger GPU.[/]")
    return lines


def print_summary(console: Console, s: dict, workload, out: Path | None) -> None:
    t = Table(title=f"servesim replay: {workload.name} ({s['num_requests']} requests)")
    t.add_column("metric")
    for c in ("mean", "p50", "p90", "p99"):
        t.add_column(c, justify="right")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queueing_s", "queueing")):
        st = s[key]
        values = [st[c] for c in ("mean", "p50", "p90", "p99")]
        unit, per = time_unit(values)
        t.add_row(f"{label} ({unit})", *(_in(v, per) for v in values))
    console.print(t)
    print_rejected(console, s)
    for line in load_lines(s):
        console.print(line)
    tp = s["throughput"]
    console.print(
        f"finished {s['num_finished']}/{s['num_requests']}, rejected {s.get('num_rejected', 0)}"
        + (f", {s['num_timed_out']} timed out (failed: clients gave up; excluded from latencies)"
           if s.get("num_timed_out") else "")
        + (f", {s['num_aborted']} aborted (failed: could never be admitted; excluded from latencies)"
           if s.get("num_aborted") else "")
        + f" in {s['sim_duration_s']:.1f} s simulated "
        f"({s['wall_time_s']:.2f} s wall{_speed(s)}), {s['num_steps']} steps\n"
        f"throughput {tp['requests_per_s']:.2f} req/s, {tp['output_tokens_per_s']:.0f} output tok/s, "
        f"{tp['total_tokens_per_s']:.0f} total tok/s; goodput {s['goodput']['requests_per_s']:.2f} req/s "
        f"({100 * s['goodput']['fraction_meeting_slo']:.0f} % meet TTFT<={s['goodput']['slo_ttft_s']}s, "
        f"TPOT<={s['goodput']['slo_tpot_s']}s)\n"
        f"preemptions {s['num_preemptions']}, prefix-cache hit rate {100 * s['prefix_cache_hit_rate']:.1f} %, "
        f"KV usage mean {100 * s['kv_usage_mean']:.1f} % of {s['num_gpu_blocks']} blocks ({s['num_gpu_blocks_source']})"
    )
    if "encoder_cache_hit_rate" in s:  # multimodal requests: the encoder cache beside the prefix cache
        console.print(f"encoder-cache hit rate {100 * s['encoder_cache_hit_rate']:.1f} % "
                      f"({s['encoder_cache_hit_tokens']} of {s['encoder_cache_query_tokens']} image tokens reused)")
    if "sessions" in s:  # per-session figures (simulator/session_metrics.py)
        from servesim.simulator.session_metrics import session_summary_line

        console.print(session_summary_line(s))
    hc = s.get("hicache")
    if hc is not None:  # SGLang HiCache: the host tier's share of the hits and the bytes copied
        console.print(f"HiCache host tier: {hc['host_hit_tokens']} of {s['prefix_cache_hit_tokens']} hit tokens loaded "
                      f"from host ({hc['num_loads']} loads, {hc['load_bytes'] / 1e9:.2f} GB in, "
                      f"{hc['write_bytes'] / 1e9:.2f} GB written)")
    offload = offload_summary_line(s)
    if offload is not None:
        console.print(offload)
    if out is not None:
        console.print(f"results in {out}/")


def _speed(s: dict) -> str:
    """", 950x real time"; nothing where no simulated clock ran (a GPU runner on its own clock)."""
    x = s.get("sim_speedup_x")
    if not x:
        return ""
    # Two significant digits below 10: a GPU-runner run at 0.3x real time is not "0x".
    return f", {x:.0f}x real time" if x >= 10 else f", {x:.2g}x real time"


def print_rejected(console: Console, s: dict) -> None:
    """A loud line when requests could never run (summary.json's rejected_by_reason)."""
    if s.get("num_rejected"):
        reasons = ", ".join(f"{k} {v}" for k, v in s["rejected_by_reason"].items())
        console.print(f"[bold yellow]WARNING: {s['num_rejected']} of {s['num_requests']} requests rejected, never "
                      f"ran ({reasons}); status 'rejected' in requests.parquet[/]")


def write_gpu_timings(out: Path, timings) -> None:
    """steps_gpu.csv: predicted vs measured time of every step the GPU executor ran."""
    import pandas as pd

    rows = [{"num_tokens": t.num_tokens, "num_requests": t.num_requests, "prepare_s": t.prepare_s,
             "measured_s": t.measured_s, "predicted_s": t.predicted_s} for t in timings]
    pd.DataFrame(rows).to_csv(Path(out) / "steps_gpu.csv", index=False)
