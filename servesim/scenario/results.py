"""Reading results back: one run's folder as `Results`, a sweep's folder as `SweepResults`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from servesim.scenario import store


def load_results(folder: str | Path):
    """A run or variant folder (summary.json, requests.parquet, ...) as servesim.api.Results."""
    from servesim.running import Results

    folder = Path(folder)
    if not store.is_complete(folder):
        err = folder / "error.txt"
        why = err.read_text().strip().splitlines()[-1] if err.is_file() else "no summary.json"
        raise FileNotFoundError(f"{folder} holds no completed run ({why})")
    summary = store.load_json(folder / store.SUMMARY)
    return Results(summary, pd.read_parquet(folder / "requests.parquet"), _steps(folder, summary),
                   pd.read_csv(folder / "timeseries.csv"), folder)


def _steps(folder: Path, summary: dict) -> pd.DataFrame:
    """steps.parquet; a run that kept no step rows (step_rows: false) has none: no rows, its columns."""
    path = folder / "steps.parquet"
    from servesim.simulator.summary import step_rows_kept

    if step_rows_kept(summary) or path.is_file():
        return pd.read_parquet(path)
    from servesim.simulator.step_table import StepTable

    steps = StepTable().frame()
    if summary.get("cluster") is not None:
        steps.insert(0, "replica", pd.Series([], dtype="int64"))
    return steps


@dataclass(slots=True)
class SweepResults:
    table: pd.DataFrame  # sweep.parquet: one row per variant
    out_dir: Path
    axes: list[list[str]]  # the swept keys, one list per axis (several for a zip group)
    info: dict = field(default_factory=dict)  # sweep.json

    @property
    def failed(self) -> dict[str, str]:
        bad = self.table[self.table["status"] != "ok"]
        return dict(zip(bad["variant"], bad["error"]))

    @property
    def params(self) -> list[str]:
        return [k for axis in self.axes for k in axis]

    def variant(self, which: int | str):
        """Results of one variant, by row number or folder name."""
        name = self.table["variant"].iloc[which] if isinstance(which, int) else which
        return load_results(store.variant_dir(self.out_dir, name))

    def frames(self, kind: str = "requests") -> pd.DataFrame:
        """One table of every completed variant's requests (or steps, timeseries), with the
        variant's swept parameters as extra columns: ready for groupby / seaborn-style plots."""
        parts = []
        for _, row in self.table[self.table["status"] == "ok"].iterrows():
            res = self.variant(row["variant"])
            df = {"requests": res.requests, "steps": res.steps, "timeseries": res.timeseries}[kind].copy()
            for key in ["variant", *self.params]:
                df[key] = row[key]
            parts.append(df)
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def load_sweep(folder: str | Path) -> SweepResults:
    folder = Path(folder)
    if not (folder / "sweep.parquet").is_file():
        raise FileNotFoundError(f"{folder} holds no sweep.parquet (run `servesim run` first)")
    info = json.loads((folder / "sweep.json").read_text()) if (folder / "sweep.json").is_file() else {}
    axes = [a["keys"] for a in info.get("axes", [])]
    return SweepResults(pd.read_parquet(folder / "sweep.parquet"), folder, axes, info)
