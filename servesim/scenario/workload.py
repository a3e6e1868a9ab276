"""The `workload:` section: a trace file, a synthetic generator whose parameters mirror
`traces.synthetic_config.SyntheticConfig` one to one, or `vllm bench serve`'s generated traffic whose
parameters mirror `traces.bench.BenchConfig` (what `replay --dataset-name` writes into config.yaml).

    workload: {trace: ../traces/data/mooncake_conversation_first5min.jsonl.gz, max_requests: 300}
    workload: {trace: sharegpt-300}                      # a bundled sample, by name
    workload: {generator: poisson, num_requests: 500, arrival: {rate_per_s: 8}}
    workload: {bench: {dataset_name: random, num_prompts: 200, request_rate: 8.0}, seed: 0}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim.scenario.schema import check_keys, convert, unknown_key
from servesim.scenario.source import Marks
from servesim.scheduler.registry import unknown_name_message
from servesim.traces.errors import InputError

TRACE_KEYS: dict[str, Any] = {"trace": str, "format": str, "options": dict}
GENERATOR_KEYS: dict[str, Any] = {"generator": str, "seed": int | None}
BENCH_KEYS: dict[str, Any] = {"bench": dict, "seed": int | None}
KINDS = ("trace", "generator", "bench")
# Transforms that apply to either kind, in this order: rate, then time limit, then request count.
COMMON_KEYS: dict[str, Any] = {"rate_scale": float | None, "time_limit_s": float | None,
                               "max_requests": int | None}
SMOKE_MAX_REQUESTS = 16  # --smoke: every variant replays at most this many requests


@dataclass(slots=True)
class WorkloadSpec:
    """A resolved, validated workload description: what a worker needs to rebuild the requests."""

    trace: str | None = None  # absolute path of a trace file, or a bundled trace name
    format: str = "auto"  # trace format (traces.available_formats)
    options: dict[str, Any] = field(default_factory=dict)  # format loader options
    generator: str | None = None  # synthetic generator name (traces.available_generators)
    params: dict[str, Any] = field(default_factory=dict)  # SyntheticConfig as plain data
    seed: int = 0  # generator rng seed (also the bench traffic's, as `replay --seed` sets it)
    bench: dict[str, Any] | None = None  # traces.bench.BenchConfig as plain data, seed excluded
    rate_scale: float | None = None  # 2.0 = twice the traffic
    time_limit_s: float | None = None  # keep arrivals before this time, seconds
    max_requests: int | None = None  # keep the first N requests

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        keep = (("trace", "format", "options") if self.trace is not None else ("bench", "seed")
                if self.bench is not None else ("generator", "params", "seed"))
        return {k: v for k, v in out.items() if k in keep or (k in COMMON_KEYS and v is not None)}

    def to_scenario(self) -> dict[str, Any]:
        """The `workload:` section that reproduces this spec (trace paths absolute)."""
        out = self.to_dict()
        params = out.pop("params", None)
        if params is not None:
            out = {"generator": out.pop("generator"), **params, **out}
        if not out.get("options"):
            out.pop("options", None)
        return out

    def smoke(self) -> WorkloadSpec:
        """The same workload cut to a few requests (CI and quick looks)."""
        limit = min(self.max_requests or SMOKE_MAX_REQUESTS, SMOKE_MAX_REQUESTS)
        params, bench = self.params, self.bench
        if self.generator is not None:  # cut inside the generator, so sessions end on a last turn
            params = {**params, "num_requests": min(params.get("num_requests") or limit, limit)}
        if bench is not None:
            bench = {**bench, "num_prompts": min(bench.get("num_prompts") or limit, limit)}
        return dataclasses.replace(self, max_requests=limit, params=params, bench=bench)


def parse_workload(data: Any, default_seed: int, marks: Marks) -> WorkloadSpec:
    """Validate the `workload:` mapping; errors name file, line and key."""
    from servesim.traces.synthetic import available_generators
    from servesim.traces.synthetic_config import SyntheticConfig

    path = ("workload",)
    if not isinstance(data, dict):
        raise marks.error("expected a mapping with `trace:`, `generator:` or `bench:`", path)
    if sum(kind in data for kind in KINDS) != 1:
        raise marks.error("give exactly one of `trace:` (a file), `generator:` (synthetic) and `bench:` "
                          "(vllm bench serve's traffic)", path)
    common = {k: convert(data[k], hint, path + (k,), marks) for k, hint in COMMON_KEYS.items() if k in data}
    _check_transforms(common, marks)
    if "bench" in data:
        return _parse_bench(data, common, default_seed, marks)
    if "trace" in data:
        for key in data:
            if key not in TRACE_KEYS and key not in COMMON_KEYS:
                raise unknown_key(key, [*TRACE_KEYS, *COMMON_KEYS], path, marks)
        values = {k: convert(data[k], hint, path + (k,), marks) for k, hint in TRACE_KEYS.items() if k in data}
        spec = WorkloadSpec(trace=_resolve_trace(values["trace"], marks), format=values.get("format", "auto"),
                            options=dict(values.get("options") or {}), **common)
        _check_format(spec, marks)
        return spec
    synth = {k: v for k, v in data.items() if k not in GENERATOR_KEYS and k not in COMMON_KEYS}
    allowed = [*GENERATOR_KEYS, *COMMON_KEYS, *(f.name for f in dataclasses.fields(SyntheticConfig))]
    for key in synth:
        if key not in allowed:
            raise unknown_key(key, allowed, path, marks)
    check_keys(synth, SyntheticConfig, path, marks)
    name = convert(data["generator"], str, path + ("generator",), marks)
    if name not in available_generators():
        raise marks.error(unknown_name_message("generator", name, available_generators()), path + ("generator",),
                          allowed=", ".join(available_generators()))
    seed = convert(data.get("seed"), int | None, path + ("seed",), marks)
    spec = WorkloadSpec(generator=name, params=synth, seed=default_seed if seed is None else seed, **common)
    _check_generator(spec, marks)
    return spec


def _parse_bench(data: dict, common: dict, default_seed: int, marks: Marks) -> WorkloadSpec:
    """`bench:` holds BenchConfig's fields (the `replay --dataset-name` flags, underscored); the
    traffic is built now so an impossible value fails before anything runs."""
    from servesim.traces.bench import BenchConfig

    path = ("workload",)
    for key in data:
        if key not in BENCH_KEYS and key not in COMMON_KEYS:
            raise unknown_key(key, [*BENCH_KEYS, *COMMON_KEYS], path, marks)
    params = convert(data["bench"], dict, path + ("bench",), marks)
    fields = [f.name for f in dataclasses.fields(BenchConfig) if f.name != "seed"]
    for key in params:
        if key not in fields:
            raise unknown_key(key, fields, path + ("bench",), marks)
    seed = convert(data.get("seed"), int | None, path + ("seed",), marks)
    try:
        BenchConfig(**params)
    except (InputError, TypeError) as exc:
        where = (exc.field or "").lstrip("-").replace("-", "_") if isinstance(exc, InputError) else ""
        raise marks.error(exc.detail if isinstance(exc, InputError) else str(exc),
                          ("workload", "bench", *([where] if where else [])),
                          allowed=exc.allowed if isinstance(exc, InputError) else None) from None
    return WorkloadSpec(bench=dict(params), seed=default_seed if seed is None else seed, **common)


def _check_transforms(common: dict, marks: Marks) -> None:
    for key, low in (("rate_scale", 0.0), ("time_limit_s", 0.0)):
        if common.get(key) is not None and common[key] <= low:
            raise marks.error(f"must be > 0, got {common[key]}", ("workload", key))
    if common.get("max_requests") is not None and common["max_requests"] < 1:
        raise marks.error(f"must be >= 1, got {common['max_requests']}", ("workload", "max_requests"))


def _resolve_trace(value: str, marks: Marks) -> str:
    """A path relative to the file that wrote `trace:`, or a bundled sample's name."""
    from servesim.traces.bundled import available_bundled_traces

    mark = marks.near(("workload", "trace"))
    base = Path(mark.file).parent if mark and mark.line is not None else Path.cwd()
    candidate = (base / value).expanduser()
    if candidate.is_file():
        return str(candidate.resolve())
    if value in available_bundled_traces():
        return value
    raise marks.error(f"trace file not found: {candidate}", ("workload", "trace"),
                      allowed="a trace file (relative to the scenario) or a bundled trace: "
                              + ", ".join(available_bundled_traces()))


def _check_format(spec: WorkloadSpec, marks: Marks) -> None:
    from servesim.traces.formats import available_formats

    if spec.format != "auto" and spec.format not in available_formats():
        raise marks.error(f"unknown trace format {spec.format!r}", ("workload", "format"),
                          allowed="auto, " + ", ".join(available_formats()))


def _check_generator(spec: WorkloadSpec, marks: Marks) -> None:
    """Build the SyntheticConfig now so an impossible parameter fails before anything runs."""
    from servesim.traces.synthetic_config import SyntheticConfig, config_from_dict

    try:
        config_from_dict(SyntheticConfig, spec.params)
    except InputError as exc:
        parts = tuple(p for p in (exc.field or "").split(".") if p)
        raise marks.error(exc.detail, ("workload", *parts), allowed=exc.allowed) from None


def build_workload(spec: WorkloadSpec):
    """The Workload a variant replays (runs in the worker)."""
    import numpy as np

    from servesim.traces.bundled import available_bundled_traces, load_bundled
    from servesim.traces.formats import load_workload
    from servesim.traces.synthetic import make_workload
    from servesim.traces.transforms import rate_scale, request_limit, time_limit

    if spec.trace is not None:
        if spec.trace in available_bundled_traces() and not Path(spec.trace).is_file():
            wl = load_bundled(spec.trace, **spec.options)
        else:
            wl = load_workload(spec.trace, spec.format, **spec.options)
    elif spec.bench is not None:
        from servesim.traces.bench import BenchConfig, bench_workload

        wl = bench_workload(BenchConfig(**spec.bench, seed=spec.seed))
    else:
        wl = make_workload(spec.generator, spec.params, np.random.default_rng(spec.seed))
    if spec.rate_scale is not None:
        wl = rate_scale(wl, spec.rate_scale)
    if spec.time_limit_s is not None:
        wl = time_limit(wl, spec.time_limit_s)
    if spec.max_requests is not None:
        wl = request_limit(wl, spec.max_requests)
    wl.spec = spec.to_scenario()
    return wl
