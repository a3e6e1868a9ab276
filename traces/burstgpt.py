"""BurstGPT (HPMLL/BurstGPT, CC-BY-4.0): Azure OpenAI GPT-3.5/GPT-4 request logs as CSV.

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    5,ChatGPT,472,18,490,Conversation log

- `Timestamp`: seconds since the start of the log (the trace's arrival time);
- `Model`: ChatGPT or GPT-4 (`model=` keeps one; vLLM's BurstGPT dataset keeps GPT-4);
- `Request tokens` / `Response tokens`: the prompt and output lengths. A row with 0 response tokens
  is a request that failed in the log: it is left out, as vLLM's BurstGPTDataset leaves it out
  (`gpt4_df["Response tokens"] > 0`); so is a row with 0 request tokens (nothing to prefill). The
  count left out is in the workload's source. Later files' extra columns (`Session ID`,
  `Elapsed time`) are read past.

A malformed cell (not a number, negative, a fraction) is an InputError naming file, line and column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servesim.scheduler.registry import unknown_name_message
from servesim.traces.errors import InputError
from servesim.traces.external import trace_name
from servesim.traces.registry import register_format
from servesim.traces.rows import check_sorted_column, float_column, int_column, read_csv
from servesim.traces.workload import RequestSpec, Workload

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
ATTRIBUTION = "BurstGPT (github.com/HPMLL/BurstGPT), CC-BY-4.0"


@register_format("burstgpt", signatures=(COLUMNS,), encodings=("csv",))
def load_burstgpt(path: Path, *, model: str | None = None, require_sorted: bool = True) -> Workload:
    """BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens (failed rows left out)."""
    table = read_csv(path, COLUMNS)
    times = float_column(table, "Timestamp", path, min_value=0.0)
    prompt = int_column(table, "Request tokens", path, min_value=0)
    output = int_column(table, "Response tokens", path, min_value=0)
    models = np.asarray(table["Model"], dtype=object)
    keep = (prompt > 0) & (output > 0)
    if model is not None:
        present = sorted(set(models.tolist()))
        if model not in present:
            raise InputError(unknown_name_message("model", model, present), path=str(path), field="model",
                             allowed=", ".join(present))
        keep &= models == model
    if require_sorted:
        check_sorted_column(times, path, "Timestamp",
                            "BurstGPT logs are sorted by Timestamp; pass require_sorted=False to sort on load")
    rows = np.flatnonzero(keep)
    if rows.size == 0:
        raise InputError("no request left: every row failed (0 tokens)" + (f" or is not {model}" if model else ""),
                         path=str(path), allowed="rows with Request tokens and Response tokens > 0")
    t0 = float(times[rows].min())
    requests = [RequestSpec(f"burstgpt-{int(i)}", float(times[i]) - t0, int(prompt[i]), int(output[i])) for i in rows]
    dropped = len(table) - rows.size
    source = str(path) + (f" (model {model})" if model else "") + (
        f", {dropped} rows left out (failed or another model)" if dropped else "")
    if require_sorted:
        return Workload(requests, name=trace_name(path), source=source, attribution=ATTRIBUTION)
    return Workload.from_unsorted(requests, name=trace_name(path), source=source, attribution=ATTRIBUTION)
