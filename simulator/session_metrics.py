"""Per-session metrics of a run whose workload has sessions (requests with a session_id): what an
agent's user waits for, beside the per-request latencies.

- a session is *complete* when every one of its requests finished (none rejected, timed out, or never
  sent because an earlier answer was missing);
- completion_s: first turn's send -> last turn's last token, over complete sessions;
- a turn's index is its position among its session's requests in workload order (turn k of a
  linear session; in a tree of branches, arrival order);
- cache_hit_rate_by_turn: prefix-cache hit tokens / prompt tokens of the finished turns of each
  index (MAX_TURN_BUCKETS indices, the deeper ones together under "<N>+"): how much of a growing
  context the cache still held when the next turn came.

`session_table` has one row per session for a reader who wants more than the summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from servesim.simulator.metrics import stats
from servesim.traces.spec_columns import SpecColumns
from servesim.traces.workload import RequestSpec

MAX_TURN_BUCKETS = 16  # turn indices reported one by one; deeper turns share the last bucket


def has_sessions(requests: Sequence[RequestSpec]) -> bool:
    return SpecColumns.of(requests).any_set("session_id")


def _turn_rows(specs: Sequence[RequestSpec], table: Any) -> dict[str, np.ndarray]:
    """Per workload request with a session: its session, turn index and what the run recorded
    (NaN / 0 for a request the run never saw)."""
    ids = list(table["request_id"])
    row_of = {rid: i for i, rid in enumerate(ids)}
    finish = np.asarray(table["finish_s"], dtype=float)
    arrival = np.asarray(table["arrival_s"], dtype=float)
    cached = np.asarray(table["num_cached_tokens"], dtype=np.int64)
    reasons = list(table["finish_reason"])
    seen: dict[str, int] = {}
    cols: dict[str, list] = {k: [] for k in ("session", "turn", "arrival_s", "finish_s", "prompt_len", "cached", "done")}
    for spec in specs:
        if spec.session_id is None:
            continue
        k = seen[spec.session_id] = seen.get(spec.session_id, -1) + 1
        i = row_of.get(spec.request_id)
        ok = i is not None and reasons[i] is not None and reasons[i] != "abort" and not np.isnan(finish[i])
        cols["session"].append(spec.session_id)
        cols["turn"].append(k)
        cols["arrival_s"].append(arrival[i] if i is not None else np.nan)
        cols["finish_s"].append(finish[i] if ok else np.nan)
        cols["prompt_len"].append(spec.prompt_len)
        cols["cached"].append(int(cached[i]) if ok else 0)
        cols["done"].append(ok)
    return {k: np.asarray(v) for k, v in cols.items()}


def session_table(specs: Sequence[RequestSpec], table: Any):
    """One row per session: turns (in the workload, finished), start_s, end_s, completion_s (None
    unless complete), prompt and cached tokens of its finished turns, cache_hit_rate. `table` is a
    run's requests table (Columns or a pandas DataFrame)."""
    import pandas as pd

    rows = pd.DataFrame(_turn_rows(specs, table))
    g = rows.groupby("session", sort=False)
    out = pd.DataFrame({
        "num_turns": g.size(), "num_turns_finished": g["done"].sum(),
        "start_s": g["arrival_s"].min(), "end_s": g["finish_s"].max(),
        "prompt_tokens": rows["prompt_len"].where(rows["done"], 0).groupby(rows["session"], sort=False).sum(),
        "cached_tokens": g["cached"].sum(),
    })
    complete = out["num_turns_finished"] == out["num_turns"]
    out["completion_s"] = (out["end_s"] - out["start_s"]).where(complete)
    out["cache_hit_rate"] = out["cached_tokens"] / out["prompt_tokens"].where(out["prompt_tokens"] > 0)
    return out.rename_axis("session_id").reset_index()


def session_summary(specs: Sequence[RequestSpec], table: Any, num_turns_abandoned: int = 0) -> dict[str, Any]:
    """The summary's "sessions" section (module docstring)."""
    rows = _turn_rows(specs, table)
    sessions, inverse = np.unique(rows["session"], return_inverse=True)
    n = len(sessions)
    num_turns = np.bincount(inverse, minlength=n)
    num_done = np.bincount(inverse, weights=rows["done"], minlength=n)
    complete = num_done == num_turns
    start = np.full(n, np.inf)
    np.minimum.at(start, inverse, np.where(np.isnan(rows["arrival_s"]), np.inf, rows["arrival_s"]))
    end = np.full(n, -np.inf)
    np.maximum.at(end, inverse, np.where(np.isnan(rows["finish_s"]), -np.inf, rows["finish_s"]))
    by_turn: dict[str, float | None] = {}
    bucket = np.minimum(rows["turn"], MAX_TURN_BUCKETS - 1)
    for b in range(int(bucket.max()) + 1 if len(bucket) else 0):
        sel = (bucket == b) & rows["done"]
        prompt = int(rows["prompt_len"][sel].sum())
        name = str(b) if b < MAX_TURN_BUCKETS - 1 else f"{b}+"
        by_turn[name] = float(rows["cached"][sel].sum()) / prompt if prompt else None
    done = rows["done"]
    prompt_done = int(rows["prompt_len"][done].sum())
    return {
        "num_sessions": n,
        "num_complete": int(complete.sum()),
        "num_turns_abandoned": num_turns_abandoned,
        "turns": stats(num_turns),
        "completion_s": stats((end - start)[complete]),
        "cache_hit_rate": float(rows["cached"][done].sum()) / prompt_done if prompt_done else None,
        "cache_hit_rate_by_turn": by_turn,
    }


def session_summary_line(summary: dict) -> str | None:
    """The terminal line of a run with sessions (None without): what `replay` and `cluster` print."""
    s = summary.get("sessions")
    if s is None:
        return None
    done, rate = s["completion_s"], s["cache_hit_rate"]
    line = f"sessions {s['num_complete']}/{s['num_sessions']} complete"
    if s["num_turns_abandoned"]:
        line += f" ({s['num_turns_abandoned']} turns never sent: an earlier answer was missing)"
    if done["count"]:
        line += f", completion p50 {done['p50']:.2f} s, p90 {done['p90']:.2f} s"
    if rate is not None:
        line += f"; cache hit rate of the turns {100 * rate:.1f} %"
    return line
