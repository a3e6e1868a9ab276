"""Compare two step traces in the oracle schema field by field; print the first differences."""

from __future__ import annotations

import json
import sys


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def diff_traces(a: list[dict], b: list[dict], max_report: int = 5) -> list[str]:
    problems = []
    if len(a) != len(b):
        problems.append(f"step count differs: {len(a)} vs {len(b)}")
    for i, (ra, rb) in enumerate(zip(a, b)):
        keys = list(dict.fromkeys(list(ra) + list(rb)))
        for k in keys:
            va, vb = ra.get(k, "<missing>"), rb.get(k, "<missing>")
            if k == "num_scheduled_tokens":  # order matters too
                va, vb = list(va.items()) if isinstance(va, dict) else va, list(vb.items()) if isinstance(vb, dict) else vb
            if va != vb:
                problems.append(f"record {i} (step {ra.get('step')}): field {k!r}: {str(va)[:300]} != {str(vb)[:300]}")
                break
        if len(problems) >= max_report:
            break
    return problems


if __name__ == "__main__":
    probs = diff_traces(load(sys.argv[1]), load(sys.argv[2]))
    print("\n".join(probs) if probs else "identical")
    sys.exit(1 if probs else 0)
