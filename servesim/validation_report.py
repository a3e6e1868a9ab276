"""Validation reports: compare a measured run (or silicon rows) with the simulator, then write the
result folder with its pages. The comparison is `simulator/validation/`; this module is the writer,
one layer up, because the pages are drawn by `servesim/plots/validation.py` (all figures live in
`servesim/plots/`, and `simulator/` never imports `servesim/`).

    from servesim.validation_report import ValidateOptions, validate_run
    report = validate_run(RUN_DIR, WORKLOAD, ValidateOptions(), out_dir="runs/validate")
    report["per_request"]["e2e"]["median_ape"]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servesim.simulator.validation.closed_loop import ClosedLoopOptions, closed_loop_results
from servesim.simulator.validation.replay import ValidateOptions, compare_run, write_json_atomic

__all__ = ["ClosedLoopOptions", "ValidateOptions", "closed_loop_report", "validate_run"]


def validate_run(run_dir: str | Path, workload: str | Path, opts: ValidateOptions | None = None,
                 out_dir: str | Path | None = None) -> dict:
    """Replay RUN_DIR's workload with its settings; return (and write into `out_dir`: validation.json,
    the paired requests, the simulated time series and, with `opts.plots`, index.html) the report."""
    opts = opts or ValidateOptions()
    cmp = compare_run(run_dir, workload, opts)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "validation.json", cmp.report)
        cmp.paired.to_csv(out / "paired_requests.csv", index=False)
        cmp.simulated_timeseries.to_csv(out / "simulated_timeseries.csv", index=False)
        if opts.plots:
            from servesim.plots.validation import write_validation_page

            write_validation_page(out, cmp.report, cmp.paired, cmp.measured_timeseries, cmp.simulated_timeseries)
    return cmp.report


def closed_loop_report(rows: pd.DataFrame, opts: ClosedLoopOptions | None = None, out_dir: str | Path | None = None,
                       progress=None) -> dict:
    """Simulate each silicon row closed-loop; return (and write into `out_dir`: closed_loop.json, the
    rows as CSV, closed_loop.html) the report."""
    report = closed_loop_results(rows, opts, progress)
    if out_dir is not None:
        from servesim.plots.validation import write_closed_loop_page

        out = Path(out_dir)
        write_json_atomic(out / "closed_loop.json", report)
        pd.DataFrame(report["rows"]).to_csv(out / "closed_loop_rows.csv", index=False)
        write_closed_loop_page(out, report)
    return report
