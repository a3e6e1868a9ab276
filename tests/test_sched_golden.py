"""Parity with the real vLLM 0.19.1 scheduler: replay every golden trace and compare every field.

The traces were recorded with ../shared/tools/vllm_oracle (tools/record_golden.py); each folder holds
the oracle's workload, its flags and its trace.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from scheduler.steptrace import StepTraceConfig, run_step_trace

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "trace.jsonl.gz").exists())


def _load(case: str):
    d = GOLDEN / case
    workload = [json.loads(x) for x in (d / "workload.jsonl").read_text().splitlines() if x.strip()]
    with gzip.open(d / "trace.jsonl.gz", "rt") as f:
        expected = [json.loads(x) for x in f if x.strip()]
    flags = json.loads((d / "config.json").read_text())["trace_flags"]
    return workload, expected, StepTraceConfig(**flags)


def test_at_least_twelve_golden_configs():
    assert len(CASES) >= 12


@pytest.mark.parametrize("case", CASES)
def test_golden_trace_matches_field_for_field(case):
    workload, expected, cfg = _load(case)
    ours = list(run_step_trace(workload, cfg))
    assert len(ours) == len(expected), f"{case}: {len(ours)} steps vs oracle {len(expected)}"
    for got, want in zip(ours, expected):
        assert list(got) == list(want), f"step {want['step']}: field order/set differs"
        for key in want:
            g, w = got[key], want[key]
            if key == "num_scheduled_tokens":  # the scheduler's order is part of the decision
                g, w = list(g.items()), list(w.items())
            assert g == w, f"{case} step {want['step']} field {key!r}: ours {g} != oracle {w}"
