"""sweep.parquet: one row per variant, its swept parameters and its summary metrics flattened
("ttft_s.p50", "throughput.output_tokens_per_s", "by_priority.0.ttft_s.p90", "jobs.completion_s.p50").

Rows are in sweep order and built only from files on disk, so a resumed sweep and a fresh one give
the same table; only the wall-time columns (WALL_COLUMNS) differ between runs.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from servesim.scenario import store
from servesim.scenario.model import Scenario, describe_params

WALL_COLUMNS = ("wall_time_s", "sim_speedup_x")  # the only columns that depend on the machine
ID_COLUMNS = ("variant", "config_hash", "status", "error", "label")


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def variant_row(scenario: Scenario, root: Path, index: int) -> dict[str, Any]:
    v = scenario.variants[index]
    folder = store.variant_dir(root, v.name)
    row: dict[str, Any] = {"variant": v.name, "config_hash": v.key, "label": describe_params(v.params)}
    row.update({k: _cell(val) for k, val in v.params.items()})
    if store.is_complete(folder):
        row.update(status="ok", error=None)
        row.update(flatten(store.load_json(folder / store.SUMMARY)))
        if (folder / "breakdown.json").is_file():
            row.update(flatten(store.load_json(folder / "breakdown.json")))
    else:
        err = folder / "error.txt"
        lines = err.read_text().strip().splitlines() if err.is_file() else ["not run"]
        row.update(status="error", error=lines[-1] if lines else "error")
    return row


def _cell(value: Any) -> Any:
    """Lists (e.g. acceptance probabilities) become their compact text, so a column has one type."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(",", ":"))
    return value


def build_table(scenario: Scenario, root: Path) -> pd.DataFrame:
    rows = [variant_row(scenario, Path(root), i) for i in range(len(scenario.variants))]
    df = pd.DataFrame(rows)
    first = [c for c in ID_COLUMNS if c in df.columns]
    params = [k for a in scenario.axes for k in a.keys if k in df.columns]
    rest = [c for c in df.columns if c not in first and c not in params]
    df = df[first + params + rest]
    for col in df.columns:  # judge a column by the Python values (pandas turns int + NaN into float)
        kinds = {type(r[col]) for r in rows if r.get(col) is not None and not _nan(r[col])}
        if len(kinds) > 1 and not kinds <= {int, float}:
            df[col] = df[col].map(lambda x: None if x is None or _nan(x) else str(x))
        elif kinds == {int}:
            df[col] = df[col].astype("Int64")  # counts stay integers next to failed (empty) rows
    return df


def _nan(x: Any) -> bool:
    return isinstance(x, float) and x != x


def write_table(scenario: Scenario, root: Path) -> pd.DataFrame:
    df = build_table(scenario, root)
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    store.write_atomic(Path(root) / "sweep.parquet", buf.getvalue())
    return df
