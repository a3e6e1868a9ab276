"""Run one variant (in a worker process or a Ray task) and drive a whole sweep.

`execute()` is the unit of work: module-level and fed only picklable data, so it runs the same in
this process, in a spawned pool worker or on a Ray node. It never raises: a failing variant comes
back as an `Outcome` with its traceback (and an error.txt in its folder).
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

import yaml

from servesim.scenario import store
from servesim.traces.errors import InputError
from servesim.simulator.outdir import MARKER
from servesim.scenario.model import Scenario, Variant, describe_params
from servesim.scenario.workload import WorkloadSpec


@dataclass(slots=True)
class VariantTask:
    name: str  # result folder name
    cfg: Any  # SimConfig
    workload: WorkloadSpec
    extra_files: dict[str, bytes]  # variant.yaml: written with the results
    root: str | None  # write the folder here (shared filesystem); None: return the files


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
        files, summary = _simulate(task)
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

Progress = Callable[[Outcome, int, int], None]  # (outcome, number done, total)


def run_sweep(scenario: Scenario, out_dir: str | Path, *, backend: str = "local", workers: int | None = None,
              ray_address: str | None = None, progress: Progress | None = None) -> list[Outcome]:
    """Run every variant not already complete in out_dir; write sweep.parquet; return outcomes in
    sweep order. out_dir must be new, empty or a sweep folder (resumed); it is locked meanwhile, so a
    second run on it refuses instead of computing the same variants again."""
    from servesim.scenario.backends import get_backend
    from servesim.simulator.outdir import claim_output

    get_backend(backend)  # an unknown backend: refused before anything is written
    if ray_address and backend != "ray":
        raise InputError("--ray-address only applies to --backend ray", field="--ray-address")
    with claim_output(out_dir, resume="sweep") as root:
        root.mkdir(exist_ok=True)
        store.clean_staging(root)
        store.clean_dead_scratch()
        try:
            return _run_locked(scenario, root, backend, workers, ray_address, progress)
        finally:
            store.clean_staging(root)


def _run_locked(scenario: Scenario, root: Path, backend: str, workers: int | None, ray_address: str | None,
                progress: Progress | None) -> list[Outcome]:
    from servesim.scenario.backends import get_backend
    from servesim.scenario.table import write_table

    _write_header(scenario, root)
    total = len(scenario.variants)
    outcomes: dict[str, Outcome] = {}

    def done(outcome: Outcome) -> None:
        variant = by_name[outcome.name]
        outcome.index, outcome.params = variant.index, variant.params
        if outcome.files is not None:  # came back over the network: publish here
            store.publish(root, outcome.name, outcome.files)
            outcome.files = None
        outcomes[outcome.name] = outcome
        if progress is not None:
            progress(outcome, len(outcomes), total)

    by_name = {v.name: v for v in scenario.variants}
    tasks = []
    for v in scenario.variants:
        if v.error is not None:
            store.publish(root, v.name, {"error.txt": v.error.encode() + b"\n", **_extra(scenario, v)})
            done(Outcome(v.name, "error", v.error))
        elif store.is_complete(store.variant_dir(root, v.name)):
            done(Outcome(v.name, "cached"))
        else:
            tasks.append(VariantTask(v.name, v.cfg, v.workload, _extra(scenario, v), None))
    if tasks:
        get_backend(backend)(tasks, root, workers, ray_address, done)
    write_table(scenario, root)
    return [outcomes[v.name] for v in scenario.variants]


def _extra(scenario: Scenario, v: Variant) -> dict[str, bytes]:
    return {"variant.yaml": yaml.safe_dump(v.resolved(scenario), sort_keys=False).encode()}


def _write_header(scenario: Scenario, root: Path) -> None:
    axes = [{"keys": list(a.keys), "points": [list(p) for p in a.points]} for a in scenario.axes]
    info = {"scenario": scenario.name, "description": scenario.description, "source": scenario.source,
            "smoke": scenario.smoke, "axes": axes,
            "variants": [{"name": v.name, "params": v.params, "label": describe_params(v.params)}
                         for v in scenario.variants]}
    store.write_atomic(root / MARKER, "sweep\n")
    store.write_atomic(root / "sweep.json", json.dumps(info, indent=1, default=list) + "\n")
    store.write_atomic(root / "scenario.yaml", yaml.safe_dump(scenario.tree(), sort_keys=False))
