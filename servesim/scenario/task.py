"""One variant of a sweep as a unit of work: `VariantTask` in, `Outcome` out (`execute`).

Module-level and fed only picklable data, so it runs the same in this process, in a spawned pool
worker or on a Ray node. It never raises: a failing variant comes back as an `Outcome` with its
traceback (and an error.txt in its folder). The runner (runner.py) builds the tasks and picks a
backend; the backends (backends.py) call `execute`: both import this module, neither the other.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim.scenario import store
from servesim.scenario.workload import WorkloadSpec


@dataclass(slots=True)
class VariantTask:
    name: str  # result folder name
    cfg: Any  # SimConfig
    workload: WorkloadSpec
    extra_files: dict[str, bytes]  # variant.yaml: written with the results
    root: str | None  # write the folder here (shared filesystem); None: return the files
    # How the variant is simulated into (files, summary); None: one run (_simulate). A scenario with
    # `replicates:` sets servesim/replicates.py's variant_replicates (a module-level function, so the
    # task still pickles to a pool worker or a Ray node).
    simulate: Callable[[VariantTask], tuple[dict[str, bytes], dict]] | None = None


@dataclass(slots=True)
class Outcome:
    name: str
    status: str  # "ok" | "error" | "cached" (finished by an earlier run)
    error: str | None = None  # last line of the error, for the terminal
    wall_s: float = 0.0  # seconds this run spent on the variant
    files: dict[str, bytes] | None = None  # only when the task had no root
    summary: dict | None = None
    index: int = -1  # the variant's position in sweep order (set by the driver)
    params: dict = field(default_factory=dict)


def execute(task: VariantTask) -> Outcome:
    """Build the workload, simulate, collect the files; publish them when the task has a root."""
    t0 = time.perf_counter()
    try:
        files, summary = (task.simulate or _simulate)(task)
        status, error = "ok", None
    except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the sweep
        files = {"error.txt": traceback.format_exc().encode()}
        summary, status, error = None, "error", f"{type(exc).__name__}: {exc}"
    files.update(task.extra_files)
    wall = time.perf_counter() - t0
    if task.root is not None:
        store.publish(task.root, task.name, files)
        files = None
    return Outcome(task.name, status, error, wall, files, summary)


def _simulate(task: VariantTask) -> tuple[dict[str, bytes], dict]:
    from servesim.running import run
    from servesim.scenario.workload import build_workload

    wl = build_workload(task.workload)
    with tempfile.TemporaryDirectory(prefix=store.scratch_prefix()) as tmp:
        res = run(task.cfg, wl, out_dir=Path(tmp) / "run")
        files = store.read_files(Path(tmp) / "run")
    meta = _request_meta(wl)
    buf = io.BytesIO()
    meta.to_parquet(buf, index=False)
    files["request_meta.parquet"] = buf.getvalue()
    files["breakdown.json"] = json.dumps(breakdown(res.requests, meta), indent=1).encode()
    return files, res.summary


def _request_meta(wl):
    import pandas as pd

    return pd.DataFrame({
        "request_id": [r.request_id for r in wl.requests],
        "priority": [r.priority for r in wl.requests],
        "session_id": [r.session_id for r in wl.requests],
        "is_last_turn": [r.is_last_turn for r in wl.requests],
        "prefix_group": pd.array([r.prefix_group for r in wl.requests], dtype="Int64"),
    })


def breakdown(requests, meta) -> dict:
    """Metrics the aggregate summary hides: per priority class, and per multi-turn job."""
    from servesim.simulator.metrics import stats

    df = requests.merge(meta, on="request_id", how="left")
    done = df[df["finish_reason"].notna() & (df["output_len"] > 0)]
    out: dict[str, Any] = {}
    if df["priority"].nunique() > 1:
        out["by_priority"] = {
            str(p): {"num_finished": int(len(g)), "ttft_s": stats(g["ttft_s"]), "e2e_s": stats(g["e2e_s"])}
            for p, g in done.groupby("priority")}
    if df["session_id"].notna().any():
        jobs = df[df["session_id"].notna()].groupby("session_id")
        complete = jobs.filter(lambda g: g["finish_s"].notna().all()).groupby("session_id")
        jct = (complete["finish_s"].max() - complete["arrival_s"].min()).tolist()
        out["jobs"] = {"num_jobs": int(jobs.ngroups), "num_complete": len(jct), "completion_s": stats(jct)}
    return out


# --- the sweep driver ---------------------------------------------------------------------------
