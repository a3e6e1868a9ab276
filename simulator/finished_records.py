"""Finished requests' records kept as columns (FinishedRecords), from each finish on.

A RequestRecord, its boxed floats and its token-time array cost ~0.5 kB a request, and a run holds
every one to the end (1 M requests: ~0.5 GB, and the heap they fragment). A caller that reads no
record after the run (running.py's replay, which turns them into the requests table) lets the
recorder move each completed request's record here at its finish (MetricsRecorder.retire_finished):
its values into one array per field, its token times onto one flat array. The requests table is
then built from these columns and the records still live, row by row in arrival order, through
the very code that builds it from records (request_table.request_part), so the table is the same.

Only a completed request moves (finish reason set, not "abort", neither timed out nor rejected):
nothing writes its record after its finish, except the frontend's output delay at the end of the
run, which `delay` applies to the columns as delay_outputs does to a record. Missing floats are
stored as NaN and read back as None (a recorded time is never NaN).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from servesim.simulator.columns import Columns, FlatList
from servesim.simulator.request_records import RequestRecord
from servesim.simulator.request_table import REQUEST_COLUMNS, JoinedRows, gaps_of, mark_pool_aborts, request_part

_GATHER_ROWS = 65_536  # rows whose token times are gathered into row order at once (pooled_gaps)
_FLOATS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "grammar_wait_s", "input_wait_s")
_INTS = ("order", "prompt_len", "output_len_target", "num_preemptions", "num_cached_tokens")


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _or_none(value: float) -> float | None:
    return None if value != value else value  # NaN stands for None


class FinishedRecords:
    """Completed requests' records as columns, in finish order (`order`: each one's arrival
    index, its row in the requests table)."""

    __slots__ = ("request_ids", "finish_reasons", "floats", "ints", "token_times_s", "num_tokens")

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.finish_reasons: list[str | None] = []
        self.floats: dict[str, array] = {name: array("d") for name in _FLOATS}
        self.ints: dict[str, array] = {name: array("q") for name in _INTS}
        self.token_times_s = array("d")  # every request's token times, laid end to end
        self.num_tokens = array("q")  # each request's count of them

    def __len__(self) -> int:
        return len(self.request_ids)

    def takes(self, rec: RequestRecord) -> bool:
        """Whether rec is complete for good (nothing writes it after its finish)."""
        return (rec.finish_s is not None and rec.finish_reason is not None and rec.finish_reason != "abort"
                and rec.status is None and rec.reject_reason is None)

    def add(self, rec: RequestRecord) -> None:
        """Move a completed record in (takes(rec) holds; the caller drops the record)."""
        self.request_ids.append(rec.request_id)
        self.finish_reasons.append(rec.finish_reason)
        f, i = self.floats, self.ints
        f["arrival_s"].append(rec.arrival_s)
        f["first_scheduled_s"].append(_or_nan(rec.first_scheduled_s))
        f["first_token_s"].append(_or_nan(rec.first_token_s))
        f["finish_s"].append(_or_nan(rec.finish_s))
        f["grammar_wait_s"].append(_or_nan(rec.grammar_wait_s))
        f["input_wait_s"].append(_or_nan(rec.input_wait_s))
        i["order"].append(rec.order)
        i["prompt_len"].append(rec.prompt_len)
        i["output_len_target"].append(rec.output_len_target)
        i["num_preemptions"].append(rec.num_preemptions)
        i["num_cached_tokens"].append(rec.num_cached_tokens)
        self.token_times_s.extend(rec.token_times_s)
        self.num_tokens.append(len(rec.token_times_s))

    def last_finish_s(self) -> float | None:
        return max(self.floats["finish_s"]) if self.request_ids else None

    def delay(self, delay_s: float) -> None:
        """Every output reaches the client delay_s later (MetricsRecorder.delay_outputs): the same
        float64 addition per value, on the columns."""
        for name in ("first_token_s", "finish_s"):
            values = np.frombuffer(self.floats[name], dtype=np.float64) + delay_s  # NaN stays NaN
            self.floats[name] = array("d", values.tobytes())
        times = np.frombuffer(self.token_times_s, dtype=np.float64) + delay_s
        self.token_times_s = array("d", times.tobytes())

    def starts(self) -> np.ndarray:
        """Where each request's token times begin in token_times_s (one more: the end)."""
        out = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.num_tokens, dtype=np.int64), out=out[1:])
        return out

    def record(self, index: int, start: int) -> RequestRecord:
        """Request `index`'s record as it was at its finish (its times from `start` in token_times_s)."""
        f, i = self.floats, self.ints
        n = self.num_tokens[index]
        return RequestRecord(
            self.request_ids[index], f["arrival_s"][index], i["prompt_len"][index], i["output_len_target"][index],
            first_scheduled_s=_or_none(f["first_scheduled_s"][index]),
            first_token_s=_or_none(f["first_token_s"][index]), finish_s=_or_none(f["finish_s"][index]),
            token_times_s=self.token_times_s[start:start + n], num_preemptions=i["num_preemptions"][index],
            num_cached_tokens=i["num_cached_tokens"][index], finish_reason=self.finish_reasons[index],
            grammar_wait_s=_or_none(f["grammar_wait_s"][index]), input_wait_s=_or_none(f["input_wait_s"][index]),
            order=i["order"][index])


class ArrivalRows:
    """The requests table's rows in arrival order (`order`), from the records still live and those
    retired into `finished`: each row's token times, and its record built a chunk at a time."""

    def __init__(self, live: list[RequestRecord], finished: FinishedRecords) -> None:
        self.live = live
        self.finished = finished
        self.num_finished = len(finished)
        orders = np.concatenate([np.frombuffer(finished.ints["order"], dtype=np.int64),
                                 np.fromiter((r.order for r in live), dtype=np.int64, count=len(live))])
        self.perm = np.argsort(orders, kind="stable")  # row -> index (finished first, then live)
        self._starts = finished.starts()

    def __len__(self) -> int:
        return len(self.perm)

    def pooled_gaps(self) -> FlatList:
        """pooled_gaps over every row's record, in row order (the same values: the same token
        times laid end to end in the same order)."""
        live_lens = np.fromiter((len(r.token_times_s) for r in self.live), dtype=np.int64, count=len(self.live))
        lens = np.concatenate([np.frombuffer(self.finished.num_tokens, dtype=np.int64), live_lens])
        times = np.frombuffer(self.finished.token_times_s, dtype=np.float64)
        if live_lens.any():  # (copied only then: live rows with tokens are few, timed-out ones)
            times = np.concatenate([times, np.frombuffer(b"".join([r.token_times_s for r in self.live]))])
        starts = np.concatenate([self._starts[:-1], self._starts[-1] + np.cumsum(live_lens) - live_lens])
        row_lens, row_starts = lens[self.perm], starts[self.perm]
        out = np.empty(int(row_lens.sum()))
        at = 0
        for a in range(0, len(row_lens), _GATHER_ROWS):  # a chunk's index at a time, not every token's
            rl, rs = row_lens[a:a + _GATHER_ROWS], row_starts[a:a + _GATHER_ROWS]
            n = int(rl.sum())  # a row's k-th time is times[row_start + k]
            out[at:at + n] = times[np.repeat(rs - (np.cumsum(rl) - rl), rl) + np.arange(n, dtype=np.int64)]
            at += n
        del times
        return gaps_of(row_lens, out)

    def records(self, start: int, stop: int) -> list[RequestRecord]:
        """Rows start..stop-1 as records (a retired one built anew from its columns)."""
        nf, live, finished, starts = self.num_finished, self.live, self.finished, self._starts
        return [finished.record(k, int(starts[k])) if k < nf else live[k - nf]
                for k in self.perm[start:stop].tolist()]


def retired_table(live: list[RequestRecord], finished: FinishedRecords, release: bool, chunk_rows: int) -> Columns:
    """The requests table (REQUEST_COLUMNS) of a run whose completed records were retired into
    `finished` (MetricsCollector.request_columns): request_part's rows, a chunk at a time, from the
    rows in arrival order. The retired rows are all completed, so the row path (by_row) is taken as
    for the live ones alone; every row's gaps are pooled in row order, the table's flat buffer
    unless by_row (then each row's gaps are views of it, as request_columns' are)."""
    mark_pool_aborts(live)
    by_row = any(r.status == "timed_out" or r.reject_reason is not None for r in live)
    rows = ArrivalRows(live, finished)
    pooled = rows.pooled_gaps()
    flat = {} if by_row else {"itl_s": pooled}
    itls = None if release and not by_row else pooled.row_list()
    joined = JoinedRows(len(rows))
    for a in range(0, len(rows), max(chunk_rows, 1)):
        b = min(a + chunk_rows, len(rows))
        joined.add(request_part(rows.records(a, b), None if itls is None else itls[a:b], by_row))
    return Columns(joined.data, REQUEST_COLUMNS, sorted(joined.all_none or ()), flat)
