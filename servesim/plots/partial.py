"""A sweep that did not finish (interrupted, or still running elsewhere) read for plotting from what it
published: sweep.json names every variant, and each finished variant's folder is complete (a variant
is published whole, servesim/scenario/store.py), so the table is those variants' summaries; the
others are rows with status "error" and why (their error.txt, or "not run")."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

NOT_RUN = "not run (the sweep did not finish)"


def partial_sweep(folder: str | Path):
    """SweepResults of a sweep folder without sweep.parquet, built from sweep.json and the variant
    folders; an InputError when there is no sweep.json either."""
    from servesim.scenario import store
    from servesim.scenario.results import SweepResults
    from servesim.scenario.table import flatten
    from servesim.traces.errors import InputError

    root = Path(folder)
    try:
        info = json.loads((root / "sweep.json").read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"no readable sweep.json ({exc})", path=str(root),
                         allowed="the --out folder of `servesim run`") from None
    rows = []
    for v in info.get("variants", []):
        vdir = store.variant_dir(root, v["name"])
        row = {"variant": v["name"], "label": v.get("label", v["name"]),
               **{k: json.dumps(x, separators=(",", ":")) if isinstance(x, (list, dict)) else x
                  for k, x in (v.get("params") or {}).items()}}
        if store.is_complete(vdir):
            row.update(status="ok", error=None, **flatten(store.load_json(vdir / store.SUMMARY)))
            if (vdir / "breakdown.json").is_file():
                row.update(flatten(store.load_json(vdir / "breakdown.json")))
        else:
            err = vdir / "error.txt"
            lines = err.read_text().strip().splitlines() if err.is_file() else []
            row.update(status="error", error=lines[-1] if lines else NOT_RUN)
        rows.append(row)
    table = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["variant", "label", "status", "error"])
    return SweepResults(table, root, [a["keys"] for a in info.get("axes", [])], info)
