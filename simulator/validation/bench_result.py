"""Validate against a `vllm bench serve --save-result` JSON (``servesim validate-bench``).

The result file records the client's settings (`request_rate`, `burstiness`, `max_concurrency`,
`num_prompts`) and, with `--save-detailed`, every request's `input_lens` / `output_lens` and
`errors`. We rebuild that workload: the recorded lengths in order, send times drawn the way
vllm bench draws them (gamma gaps, seeded: statistically the same, not the same instants, since
the file does not keep send times), the concurrency cap, and the OpenAI frontend in front of the
engine. The engine itself is whatever the user configures (model, GPU, TP, `--set`). The
comparison is on the aggregate figures the file has, under the same rules
(`simulator.bench_metrics`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from servesim.simulator.bench_metrics import bench_serve_result
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.traces.bench import BenchConfig, arrival_schedule
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload

COMPARED_PREFIXES = ("mean", "median", "p90", "p99")
COMPARED_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(slots=True)
class BenchResult:
    path: Path
    request_rate: float  # inf: all at once
    burstiness: float
    max_concurrency: int | None
    input_lens: list[int]
    output_lens: list[int]  # 0 for a failed request
    failed: list[bool]
    figures: dict[str, float]  # the file's *_ms statistics, completed, failed


def _number(data: dict, key: str, path: Path, default=None) -> float:
    value = data.get(key, default)
    if value in ("inf", "Infinity", None) and key == "request_rate":
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{path}: field {key!r} is {value!r}", field=key, allowed="a number") from None


def load_bench_result(path: str | Path) -> BenchResult:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a readable JSON file ({e})", field="RESULT",
                         allowed="a `vllm bench serve --save-result` JSON") from None
    if not isinstance(data, dict) or "completed" not in data:
        raise InputError(f"{path}: no 'completed' field", field="RESULT",
                         allowed="a `vllm bench serve --save-result` JSON")
    if "input_lens" not in data or "output_lens" not in data:
        raise InputError(f"{path}: no per-request input_lens/output_lens", field="RESULT",
                         allowed="a result saved with `vllm bench serve --save-result --save-detailed`")
    inputs, outputs = [int(x) for x in data["input_lens"]], [int(x) for x in data["output_lens"]]
    if len(inputs) != len(outputs) or not inputs:
        raise InputError(f"{path}: {len(inputs)} input_lens but {len(outputs)} output_lens", field="output_lens",
                         allowed="one entry per request in each")
    errors = data.get("errors") or [""] * len(inputs)
    failed = [bool(e) for e in errors]
    mc = data.get("max_concurrency")
    figures = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and (k.endswith("_ms") or k in ("completed", "failed"))}
    return BenchResult(path, _number(data, "request_rate", path), _number(data, "burstiness", path, 1.0),
                       int(mc) if mc not in (None, "null") else None, inputs, outputs, failed, figures)


def result_workload(result: BenchResult, seed: int) -> Workload:
    """The requests the client sent: recorded lengths, send times drawn as vllm bench draws them.
    A failed request has no recorded output length; it asks for the mean of the completed ones."""
    done = [o for o, f in zip(result.output_lens, result.failed) if not f and o > 0]
    fallback = max(int(round(np.mean(done))), 1) if done else 1
    n = len(result.input_lens)
    times = arrival_schedule(BenchConfig(num_prompts=n, request_rate=result.request_rate,
                                         burstiness=result.burstiness), np.random.default_rng(seed))
    specs = [RequestSpec(f"bench-{i}", float(times[i]), prompt_len=max(result.input_lens[i], 1),
                         output_len=result.output_lens[i] if result.output_lens[i] > 0 else fallback)
             for i in range(n)]
    return Workload(specs, name=result.path.stem, source=str(result.path))


def validate_bench(result: BenchResult, cfg: SimConfig) -> dict:
    """Simulate the result's workload on `cfg` (with the client's concurrency cap) and compare."""
    if result.max_concurrency is not None:
        cfg = replace(cfg, client=replace(cfg.client, max_concurrency=result.max_concurrency))
    res = build_engine(cfg, result_workload(result, cfg.seed)).run()
    sim = bench_serve_result(res.metrics.requests_frame(), percentiles=(50, 90, 99))
    rows = []
    keys = ["completed", "failed"] + [f"{p}_{m}_ms" for m in COMPARED_METRICS for p in COMPARED_PREFIXES]
    for key in keys:
        if key not in result.figures or sim.get(key) is None:
            continue
        meas, got = result.figures[key], float(sim[key])
        rows.append({"metric": key, "measured": meas, "simulated": got,
                     "rel_error": (got - meas) / meas if meas else None})
    return {"result": str(result.path), "num_requests": len(result.input_lens), "rows": rows}
