"""Is this the workload the measured run replayed? Checked before simulating anything.

`servesim validate RUN --workload W` used to replay whatever W was and report the errors of two
unrelated request streams (thousands of per cent) with exit status 0. A workload matches a run when

- they have the same number of requests,
- every measured request maps to a workload request (by request id when the two share ids,
  else by the measured id's trailing number = the line of the workload file, as pairing does),
- each pair has the same prompt length and output length.

A mismatch is refused with the first differing request, so the user sees which file is wrong.
"""

from __future__ import annotations

from servesim.traces.errors import InputError
from servesim.traces.workload import Workload

from .runs import MeasuredRun


def check_workload_matches(run: MeasuredRun, wl: Workload, workload_path: str) -> None:
    meas = run.requests
    specs = {r.request_id: r for r in wl.requests}
    if len(meas) != len(wl.requests):
        raise InputError(f"the workload does not match the run: the run has {len(meas)} requests, the workload "
                         f"{len(wl.requests)}", path=str(workload_path), field="--workload",
                         allowed=f"the workload file run {run.name} replayed")
    by_id = bool(len(meas)) and bool(meas["request_id"].astype(str).isin(specs.keys()).all())
    for row in meas.itertuples(index=False):
        spec = specs.get(str(row.request_id)) if by_id else _by_index(row, wl)
        if spec is None:
            raise InputError(f"the workload does not match the run: measured request {row.request_id!r} has no "
                             "workload request (no shared id, no workload line number)", path=str(workload_path),
                             field="--workload", allowed=f"the workload file run {run.name} replayed")
        for col in ("prompt_len", "output_len"):
            measured, given = int(getattr(row, col)), int(getattr(spec, col))
            if measured != given:
                raise InputError(f"the workload does not match the run: first differing request is measured "
                                 f"{row.request_id!r} = workload {spec.request_id!r}: {col} {measured} in the run, "
                                 f"{given} in the workload", path=str(workload_path), field="--workload",
                                 allowed=f"the workload file run {run.name} replayed")


def _by_index(row, wl: Workload):
    index = row.workload_index
    if index is None or index != index:  # missing / NaN
        return None
    index = int(index)
    return wl.requests[index] if 0 <= index < len(wl.requests) else None
