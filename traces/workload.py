"""The workload: a trace's or generator's requests (RequestSpec, traces/request_spec.py), sorted by
arrival and kept as columns (traces/spec_columns.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servesim.traces.errors import InputError
from servesim.traces.request_spec import DEFAULT_PREFIX_BLOCK_LEN, RequestSpec  # noqa: F401  (re-exported)
from servesim.traces.spec_columns import SpecColumns

# A first arrival this late (about 3.2 years after the trace's start) can only be an absolute
# epoch time (1.7e9 s in 2024): the workload is rebased to start at it (Workload._rebase).
EPOCH_START_S = 1e8
# A workload spans at most this long (the simulated clock and its time series are sized by it).
MAX_SPAN_S = 1e8


@dataclass(slots=True)
class Workload:
    # sorted by (arrival_time_s, order in file); given as any sequence of specs, kept as columns
    # (traces/spec_columns.py: a spec is built when read, none is held for the run)
    requests: Sequence[RequestSpec]
    name: str
    source: str  # file path or generator description
    attribution: str | None = None
    # The scenario `workload:` mapping that rebuilds exactly these requests (trace path, format,
    # max_requests, ... or a generator with its parameters and seed), written into a result's
    # config.yaml; None for a workload built by hand, which a result cannot rebuild.
    spec: dict | None = None

    def __post_init__(self) -> None:
        columns = SpecColumns.of(self.requests)
        self.requests = columns
        times = columns.arrival_times_s
        if any(b < a for a, b in zip(times, times[1:])):
            raise InputError(
                f"workload {self.name!r}: requests are not sorted by arrival_time_s",
                field="arrival_time_s",
                allowed="non-decreasing arrival times (use Workload.from_unsorted)",
            )
        if times and times[0] >= EPOCH_START_S:
            columns = self._rebase(columns, times[0])
        times = columns.arrival_times_s
        if times and times[-1] - times[0] > MAX_SPAN_S:
            last = columns[-1]
            raise InputError(
                f"workload {self.name!r}: request {last.request_id!r} arrives at {last.arrival_time_s:.6g} s, "
                f"{last.arrival_time_s - times[0]:.3g} s after the first",
                field="arrival_time_s",
                allowed=f"arrivals within {MAX_SPAN_S:.0e} s (about {MAX_SPAN_S / 3.156e7:.0f} years) of the first",
            )

    def _rebase(self, columns: SpecColumns, first_s: float) -> SpecColumns:
        """Arrivals given as absolute epoch seconds (the usual slip when converting one's own logs)
        start the trace at its first arrival instead, with a note in `source` and on the log."""
        self.requests = columns = columns.with_arrival_times([t - first_s for t in columns.arrival_times_s])
        note = (f"arrival times rebased: the first was {first_s:.6g} s (absolute epoch seconds?), "
                "every arrival is now relative to it")
        self.source = f"{self.source} | {note}"
        logging.getLogger("servesim").warning("WARNING: %s: %s", self.name, note)
        return columns

    @classmethod
    def from_unsorted(
        cls, requests: list[RequestSpec], name: str, source: str, attribution: str | None = None
    ) -> Workload:
        """Sort stably by arrival time (ties keep their given order) and build the workload."""
        ordered = sorted(requests, key=lambda r: r.arrival_time_s)
        return cls(requests=ordered, name=name, source=source, attribution=attribution)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def columns(self) -> SpecColumns:
        """The requests as columns (what `requests` is once built): for readers of a field of
        every request, without building a spec per request."""
        columns = self.requests
        assert isinstance(columns, SpecColumns)  # (__post_init__ made it so)
        return columns

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (0 for an empty workload)."""
        times = self.columns.arrival_times_s
        return times[-1] if times else 0.0

    def summary(self) -> dict[str, float]:
        """Counts and means, for reports and sanity checks."""
        n = len(self.requests)
        if n == 0:
            return {"num_requests": 0}
        prompt = np.frombuffer(self.columns.prompt_lens, dtype=np.int64)
        output = np.frombuffer(self.columns.output_lens, dtype=np.int64)
        return {
            "num_requests": n,
            "duration_s": self.duration_s,
            "rate_per_s": (n - 1) / self.duration_s if self.duration_s > 0 else float("nan"),
            "mean_prompt_len": float(prompt.mean()),
            "mean_output_len": float(output.mean()),
            "max_prompt_len": int(prompt.max()),
            "max_output_len": int(output.max()),
        }
