"""The core of a single run: load a trace, simulate it, hand back Results (frames and the result folder).

Why a module of its own: servesim.api is the public facade; the scenario runner, the result loaders and the
replay command need this core too, and importing it from the facade made api <-> scenario a cycle.
servesim.api re-exports every name here.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from servesim.simulator.collector import collector_paused, release_freed_heap
from servesim.simulator.columns import Columns
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.outdir import claim_output
from servesim.simulator.outputs import build_summary, write_results
from servesim.simulator.session_metrics import has_sessions, session_summary
from servesim.simulator.summary import warn_rejected
from servesim.simulator.summary_metrics.classes import add_gateway_figures
from servesim.traces.bundled import DEFAULT_TRACE, bundled_trace_path, load_bundled
from servesim.traces.errors import InputError
from servesim.traces.formats import load_workload
from servesim.traces.transforms import rate_scale, request_limit
from servesim.traces.workload import Workload
from servesim.traces.streams import is_stream


if TYPE_CHECKING:
    import pandas as pd


class Results:
    """A run's summary and its requests, steps and timeseries frames. A frame given as Columns
    (a run just simulated) is built on first read: the CLI reads none, and never imports pandas."""

    __slots__ = ("summary", "out_dir", "_tables")

    def __init__(self, summary: dict, requests: pd.DataFrame | Columns, steps: pd.DataFrame | Columns,
                 timeseries: pd.DataFrame | Columns, out_dir: Path | None) -> None:
        self.summary = summary
        self.out_dir = out_dir
        self._tables = {"requests": requests, "steps": steps, "timeseries": timeseries}

    def _frame(self, name: str) -> pd.DataFrame:
        table = self._tables[name]
        if isinstance(table, Columns):
            table = self._tables[name] = table.frame()
        return table

    @property
    def requests(self) -> pd.DataFrame:
        return self._frame("requests")

    @property
    def steps(self) -> pd.DataFrame:
        return self._frame("steps")

    @property
    def timeseries(self) -> pd.DataFrame:
        return self._frame("timeseries")

    def __repr__(self) -> str:
        return f"Results(out_dir={self.out_dir!r}, {len(self._tables['requests'])} requests)"


def _check_arg(value, ok: bool, field: str, allowed: str) -> None:
    """The API's argument checks: the CLI's flags reach the same functions, so a bad value gets
    the same message from either (field names the flag's argument)."""
    if not ok:
        raise InputError(f"got {value!r:.80}", field=field, allowed=allowed)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_trace(trace: str | Path | None, fmt: str = "auto", max_requests: int | None = None,
               rate_scale_factor: float | None = None, options: dict | None = None) -> Workload:
    """A trace file (None: the bundled default), optionally rate-scaled and cut to its first
    max_requests requests; `options` go to the format's loader (e.g. a length-only trace's
    rate_per_s)."""
    _check_arg(trace, trace is None or isinstance(trace, (str, Path)), "trace",
               "a trace file path (str or pathlib.Path), or None for the bundled trace")
    _check_arg(max_requests, max_requests is None or (_is_int(max_requests) and max_requests >= 1),
               "--max-requests", "an integer >= 1, or none for the whole trace")
    if isinstance(trace, str):
        trace = Path(trace).expanduser()
    _check_arg(options, options is None or isinstance(options, dict), "options",
               "a dict of the format loader's options, or None")
    if options and trace is None:
        raise InputError("the bundled trace takes no loader options", field="options", allowed="a trace file")
    wl = load_bundled(DEFAULT_TRACE) if trace is None else load_workload(trace, fmt, **(options or {}))
    stream = trace is not None and is_stream(trace)  # read once: no result can name it to rebuild
    if rate_scale_factor is not None and rate_scale_factor != 1.0:
        wl = rate_scale(wl, rate_scale_factor)
    if max_requests is not None:
        wl = request_limit(wl, max_requests)
    wl.spec = None if stream else {"trace": DEFAULT_TRACE if trace is None else str(Path(trace).resolve()), "format": fmt,
               **({"options": dict(options)} if options else {}),
               **({"rate_scale": rate_scale_factor} if rate_scale_factor not in (None, 1.0) else {}),
               **({"max_requests": max_requests} if max_requests is not None else {})}
    return wl


def run(cfg: SimConfig, workload: Workload, out_dir: str | Path | None = None, step_trace: str | Path | None = None,
        progress=None, executor=None, overwrite: bool = False) -> Results:
    """Simulate; with out_dir, write the result folder (checked and locked before simulating: an
    existing folder servesim did not write is refused, an earlier result replaced only with overwrite).
    The step trace file follows the same rule, checked before simulating too."""
    _check_arg(cfg, isinstance(cfg, SimConfig), "cfg", "a servesim.simulator.config.SimConfig")
    _check_arg(workload, isinstance(workload, Workload), "workload",
               "a Workload, e.g. servesim.api.load_trace(path) or load_trace(None) for the bundled trace")
    for name, value in (("out_dir", out_dir), ("step_trace", step_trace)):
        _check_arg(value, value is None or isinstance(value, (str, Path)), name, "a path (str or pathlib.Path) or None")
    _check_arg(overwrite, isinstance(overwrite, bool), "overwrite", "true or false")
    if step_trace is not None:
        from servesim.simulator.outfile import check_output_file

        step_trace = check_output_file(step_trace, overwrite=overwrite, flag="step_trace")
    with collector_paused():  # simulator/collector.py: a run leaves next to no cyclic garbage
        if out_dir is None:
            return _run(cfg, workload, None, step_trace, progress, executor, overwrite)
        with claim_output(out_dir, overwrite=overwrite) as out:  # out: ~ expanded
            return _run(cfg, workload, out, step_trace, progress, executor, overwrite)


def _run(cfg, workload, out_dir, step_trace, progress, executor, overwrite) -> Results:
    trace_buf = io.StringIO() if step_trace is not None else None
    engine = build_engine(cfg, workload, executor=executor, step_trace=trace_buf, progress=progress)
    engine.retire_finished_records()  # nothing below reads a record: each leaves at its finish, as columns
    res = engine.run()
    # Nothing reads the run's per-request records again: they become the requests table a chunk at a
    # time and go (a 1 M-request run holds both whole otherwise, ~0.3 GB each).
    res.metrics.columns(release=True)
    release_freed_heap()  # the records' memory, before the summary's and the files' arrays
    summary = build_summary(engine.cfg, res, len(workload.requests))
    if has_sessions(workload.requests):  # per-session figures (simulator/session_metrics.py)
        summary["sessions"] = session_summary(workload.requests, res.metrics.columns().requests,
                                              engine.turns.num_abandoned if engine.turns is not None else 0)
    add_gateway_figures(summary, engine.gateway, engine.cfg, workload, res.metrics.columns().requests)
    release_freed_heap()  # the summary's scratch arrays, before the result files' own
    meta = {"name": workload.name, "source": str(workload.source), "num_requests": len(workload.requests),
            "attribution": workload.attribution, "spec": workload.spec}
    if step_trace is not None:
        from servesim.oracle_io import write_jsonl_atomic
        import json

        write_jsonl_atomic(step_trace, (json.loads(x) for x in trace_buf.getvalue().splitlines()))
    written = None
    if out_dir is not None:  # claimed by run(): replacing an earlier result was allowed there
        from servesim.identity import run_identity

        trace = (workload.spec or {}).get("trace")
        identity = run_identity(cfg.seed, [trace] if trace else [])
        written = write_results(out_dir, engine.cfg, res, summary, meta, overwrite=True, identity=identity)
    cols = res.metrics.columns()  # built once: the summary, the result files and Results share them
    warn_rejected(cols.requests)
    return Results(summary, cols.requests, cols.steps, cols.timeseries(summary["sim_duration_s"]), written)
