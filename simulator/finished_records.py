"""Finished requests' records kept as columns (FinishedRecords), from each finish on.

A RequestRecord, its boxed floats and its token-time array cost ~0.5 kB a request, and a run holds
every one to the end (1 M requests: ~0.5 GB, and the heap they fragment). A caller that reads no
record after the run (running.py's replay, which turns them into the requests table) lets the
recorder move each completed request's record here at its finish (MetricsRecorder.retire_finished):
its values onto one array per field, its token times onto one flat array. The requests table is
then built from these columns directly (retired_table): each column gathered into arrival order
(`order`) in one take, the records still live placed among them through the very code that builds
a table from records (request_table.request_part), so the table is the same.

Only a completed request moves (finish reason set, not "abort", neither timed out nor rejected):
nothing writes its record after its finish, except the frontend's output delay at the end of the
run, which `delay` applies to the columns as delay_outputs does to a record. Missing floats are
stored as NaN (a recorded time is never NaN: NaN here means None).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from servesim.simulator.columns import Columns, FlatList
from servesim.simulator.request_records import RequestRecord
from servesim.simulator.request_table import (REQUEST_COLUMNS, REQUEST_KINDS, SINCE_ARRIVAL, gather_gaps,
                                              mark_pool_aborts, request_part)


_FLOATS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "grammar_wait_s", "input_wait_s")
_INTS = ("prompt_len", "output_len_target", "num_preemptions", "num_cached_tokens")


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


class FinishedRecords:
    """Completed requests' records as columns, in finish order (`order`: each one's arrival
    index, its row in the requests table). One attribute per field: a finish appends to each."""

    __slots__ = ("request_ids", "finish_reasons", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
                 "grammar_wait_s", "input_wait_s", "order", "prompt_len", "output_len_target", "num_preemptions",
                 "num_cached_tokens", "token_times_s", "num_tokens")

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.finish_reasons: list[str | None] = []
        self.arrival_s = array("d")
        self.first_scheduled_s = array("d")  # NaN: None (likewise below)
        self.first_token_s = array("d")
        self.finish_s = array("d")
        self.grammar_wait_s = array("d")
        self.input_wait_s = array("d")
        self.order = array("q")
        self.prompt_len = array("q")
        self.output_len_target = array("q")
        self.num_preemptions = array("q")
        self.num_cached_tokens = array("q")
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
        self.arrival_s.append(rec.arrival_s)
        self.first_scheduled_s.append(_or_nan(rec.first_scheduled_s))
        self.first_token_s.append(_or_nan(rec.first_token_s))
        self.finish_s.append(_or_nan(rec.finish_s))
        self.grammar_wait_s.append(_or_nan(rec.grammar_wait_s))
        self.input_wait_s.append(_or_nan(rec.input_wait_s))
        self.order.append(rec.order)
        self.prompt_len.append(rec.prompt_len)
        self.output_len_target.append(rec.output_len_target)
        self.num_preemptions.append(rec.num_preemptions)
        self.num_cached_tokens.append(rec.num_cached_tokens)
        self.token_times_s.extend(rec.token_times_s)
        self.num_tokens.append(len(rec.token_times_s))

    def last_finish_s(self) -> float | None:
        return max(self.finish_s) if self.request_ids else None

    def delay(self, delay_s: float) -> None:
        """Every output reaches the client delay_s later (MetricsRecorder.delay_outputs): the same
        float64 addition per value, on the columns."""
        self.first_token_s = _shifted(self.first_token_s, delay_s)  # NaN stays NaN
        self.finish_s = _shifted(self.finish_s, delay_s)
        self.token_times_s = _shifted(self.token_times_s, delay_s)

    def starts(self) -> np.ndarray:
        """Where each request's token times begin in token_times_s (one more: the end)."""
        out = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.num_tokens, dtype=np.int64), out=out[1:])
        return out

    def part(self) -> tuple[dict[str, np.ndarray | list], list[str]]:
        """These rows of the requests table, in finish order, as request_part builds them from the
        records (completed rows: none is rejected or timed out): their columns but for those since
        arrival and the gaps (retired_table takes those on the whole table), and the float columns
        all missing in them."""
        times, starts = np.frombuffer(self.token_times_s, dtype=np.float64), self.starts()[:-1]
        lens = np.frombuffer(self.num_tokens, dtype=np.int64)
        tpot = np.full(len(self), np.nan)
        many = lens > 1  # (times[-1] - times[0]) / (n - 1): request_part's float64 operations
        tpot[many] = (times[starts[many] + lens[many] - 1] - times[starts[many]]) / (lens[many] - 1)
        data: dict[str, np.ndarray | list] = {
            "request_id": self.request_ids, "output_len": lens, "tpot_s": tpot, "finish_reason": self.finish_reasons,
            "status": ["completed"] * len(self), "reject_reason": [None] * len(self)}
        for name in _FLOATS:
            data[name] = np.frombuffer(getattr(self, name), dtype=np.float64)
        for name in _INTS:
            data[name] = np.frombuffer(getattr(self, name), dtype=np.int64)
        # NaN stands for None, so a column all NaN is one float_column finds all None
        all_none = [name for name in (*_FLOATS, "tpot_s") if len(self) and bool(np.isnan(data[name]).all())]
        return data, all_none


def _shifted(values: array, delay_s: float) -> array:
    return array("d", (np.frombuffer(values, dtype=np.float64) + delay_s).tobytes())


def retired_table(live: list[RequestRecord], finished: FinishedRecords, release: bool) -> Columns:
    """The requests table (REQUEST_COLUMNS) of a run whose completed records were retired into
    `finished` (MetricsCollector.request_columns), rows in arrival order: the retired rows'
    columns (FinishedRecords.part) and the live records' (request_part, through the row path
    when one of them timed out or was rejected: by_row), each column gathered into row order in
    one take; every row's gaps pooled in row order, the table's flat buffer unless by_row (then
    each row's gaps are views of it, as request_columns' are); the columns since arrival taken
    on the whole table; a float column all missing where it is in every part (as float_column
    says of the whole)."""
    mark_pool_aborts(live)
    by_row = any(r.status == "timed_out" or r.reject_reason is not None for r in live)
    nf = len(finished)
    orders = np.concatenate([np.frombuffer(finished.order, dtype=np.int64),
                             np.fromiter((r.order for r in live), dtype=np.int64, count=len(live))])
    perm = np.argsort(orders, kind="stable")  # row -> index (the retired rows first, then the live ones)
    pooled = _row_gaps(live, finished, perm)
    itls = None if release and not by_row else pooled.row_list()
    parts = [finished.part()] if nf else []
    live_rows: list[int] = []
    if live:
        rows_of = np.empty(len(perm), dtype=np.int64)
        rows_of[perm] = np.arange(len(perm))  # index -> row
        live_rows = rows_of[nf:].tolist()
        parts.append(request_part(live, None if itls is None else [itls[r] for r in live_rows], by_row))
    data: dict[str, np.ndarray | list] = {}
    order = perm.tolist()
    for name in REQUEST_COLUMNS:
        if name in SINCE_ARRIVAL:  # the same float64 subtraction per row as request_part's
            data[name] = data[SINCE_ARRIVAL[name]] - data["arrival_s"]
        elif name == "itl_s":
            if itls is not None:  # (a live row's own: a view, or [] for a row that timed out or was rejected)
                for row, itl in zip(live_rows, parts[-1][0][name] if live else []):
                    itls[row] = itl
                data[name] = itls
        elif name in REQUEST_KINDS:
            arrays = [part[name] for part, _ in parts]
            data[name] = (arrays[0] if len(arrays) == 1 else np.concatenate(arrays))[perm]
        else:  # a list column
            items: list = [v for part, _ in parts for v in part[name]] if len(parts) > 1 else list(parts[0][0][name])
            data[name] = list(map(items.__getitem__, order))
    all_none = set.intersection(*(set(missing) for _, missing in parts))
    all_none |= {name for name, event in SINCE_ARRIVAL.items() if event in all_none}
    return Columns(data, REQUEST_COLUMNS, sorted(all_none), {} if by_row else {"itl_s": pooled})


def _row_gaps(live: list[RequestRecord], finished: FinishedRecords, perm: np.ndarray) -> FlatList:
    """Every row's gaps in row order (perm: row -> index, the retired rows' then the live ones'),
    read from the retired rows' flat token times where they lie (the live rows' appended to a copy
    only when one has a token: few, timed out)."""
    live_lens = np.fromiter((len(r.token_times_s) for r in live), dtype=np.int64, count=len(live))
    starts = finished.starts()
    times = np.frombuffer(finished.token_times_s, dtype=np.float64)
    if live_lens.any():
        times = np.concatenate([times, np.frombuffer(b"".join([r.token_times_s for r in live]))])
    lens = np.concatenate([np.frombuffer(finished.num_tokens, dtype=np.int64), live_lens])
    starts = np.concatenate([starts[:-1], starts[-1] + np.cumsum(live_lens) - live_lens])
    return gather_gaps(times, starts[perm], lens[perm])
