"""The `vllm bench serve` traffic flags of `replay` (and `servesim.api.replay`): which workload they
ask for, and which combinations cannot apply.

With `--dataset-name` the workload is generated as `vllm bench serve` would (traces/bench.py). Without
it the flags act on TRACE (or `--dataset-path`, the same file):

- `--num-prompts N` keeps the first N requests (as `--max-requests`; give one of the two);
- `--request-rate R` (and `--burstiness B`) gives a length-only trace its arrivals: vllm bench's gaps,
  Poisson at B = 1, else gamma with shape B (CV 1/sqrt(B)), seeded with `--seed`; `inf` sends every
  request at t = 0. A trace with its own arrival times refuses it (`--rate-scale` scales those);
- `--max-concurrency` caps requests in flight at the client (`client.max_concurrency`, in either mode).

A flag that cannot apply is an InputError naming it, never ignored.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path

from servesim.traces.errors import InputError

RANDOM_FLAGS = ("random_input_len", "random_output_len", "random_range_ratio", "random_prefix_len")


@dataclass(slots=True)
class BenchFlags:
    """The flags as given on the command line (None: not given)."""

    dataset_name: str | None = None
    dataset_path: Path | None = None
    num_prompts: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    random: dict[str, float | int | None] = field(default_factory=dict)  # RANDOM_FLAGS as given

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise InputError(f"got {self.max_concurrency!r}", field="--max-concurrency", allowed="an integer >= 1")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise InputError(f"got {self.num_prompts!r}", field="--num-prompts", allowed="an integer >= 1")
        if self.request_rate is not None and not self.request_rate > 0:
            raise InputError(f"got {self.request_rate!r}", field="--request-rate", allowed="> 0, or inf")
        if self.burstiness is not None and not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise InputError(f"got {self.burstiness!r}", field="--burstiness", allowed="a finite number > 0")


def _given_random(flags: BenchFlags) -> list[str]:
    return ["--" + k.replace("_", "-") for k, v in flags.random.items() if v is not None]


def bench_workload_from_flags(flags: BenchFlags, seed: int, max_requests: int | None, rate_scale: float | None):
    """--dataset-name: the generated workload (its BenchConfig from the flags given)."""
    from servesim.traces.bench import BenchConfig, bench_workload

    for flag, value, instead in (("--max-requests", max_requests, "--num-prompts"),
                                 ("--rate-scale", rate_scale, "--request-rate")):
        if value is not None:
            raise InputError(f"{flag} applies to a TRACE; with --dataset-name the count and rate are "
                             f"{instead}", field=flag, allowed=instead)
    if flags.dataset_name != "random" and _given_random(flags):
        raise InputError(f"{_given_random(flags)[0]} shapes --dataset-name random, not {flags.dataset_name}",
                         field=_given_random(flags)[0], allowed="--dataset-name random")
    given = {k: v for k, v in flags.random.items() if v is not None}
    for name in ("num_prompts", "request_rate", "burstiness"):
        if getattr(flags, name) is not None:
            given[name] = getattr(flags, name)
    path = None if flags.dataset_path is None else str(flags.dataset_path.expanduser().resolve())
    wl = bench_workload(BenchConfig(dataset_name=flags.dataset_name, seed=seed, dataset_path=path, **given))
    # config.yaml's `workload: {bench: ...}` (servesim/scenario/workload.py) rebuilds the same traffic
    wl.spec = {"bench": {"dataset_name": flags.dataset_name, **given, **({"dataset_path": path} if path else {})},
               "seed": seed}
    return wl


def parse_trace_options(items: list[str]) -> dict:
    """`--trace-option start_s=36000 --trace-option all_clients=true`: the format loader's options,
    each value read as a YAML scalar (numbers, true/false, null, else text)."""
    import yaml

    out = {}
    for item in (x for arg in items for x in arg.split()):
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InputError(f"got {item!r}", field="--trace-option", allowed="KEY=VALUE, e.g. start_s=36000")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        out[key] = value if isinstance(value, (int, float, bool, str)) or value is None else text
    return out


def trace_workload_from_flags(flags: BenchFlags, trace: Path | None, fmt: str, seed: int,
                              max_requests: int | None, rate_scale: float | None, options: dict | None = None):
    """No --dataset-name: TRACE (or --dataset-path) loaded with the bench flags that apply to a trace
    and the format loader's `options` (--trace-option)."""
    from servesim.running import load_trace

    if _given_random(flags):
        raise InputError(f"{_given_random(flags)[0]} shapes a generated workload", field=_given_random(flags)[0],
                         allowed="with --dataset-name random")
    if flags.dataset_path is not None:
        if trace is not None:
            raise InputError("give either a TRACE or --dataset-path, not both", field="--dataset-path")
        trace = flags.dataset_path
    if flags.num_prompts is not None:
        if max_requests is not None:
            raise InputError("--num-prompts and --max-requests both cut the trace", field="--num-prompts",
                             allowed="one of the two")
        max_requests = flags.num_prompts
    if flags.burstiness is not None and flags.request_rate is None:
        raise InputError("--burstiness shapes the gaps --request-rate draws", field="--burstiness",
                         allowed="with --request-rate")
    options = dict(options or {})
    if flags.request_rate is not None:
        if rate_scale is not None:
            raise InputError("--request-rate sets a length-only trace's rate; --rate-scale scales a timed "
                             "trace's", field="--rate-scale", allowed="one of the two")
        rate = _rate_options(trace, fmt, flags.request_rate, flags.burstiness or 1.0, seed)
        both = sorted(set(rate) & set(options))
        if both:
            raise InputError(f"--trace-option {both[0]} and --request-rate both set the arrivals",
                             field="--trace-option", allowed="one of the two")
        options.update(rate)
    return load_trace(trace, fmt, max_requests, rate_scale, options=options or None)


def _rate_options(trace: Path | None, fmt: str, rate: float, burstiness: float, seed: int) -> dict:
    """The loader options that give a length-only trace vllm bench's arrivals; an InputError when
    the trace's format carries its own arrival times."""
    from servesim.traces.formats import sniff_format
    from servesim.traces.registry import get_format

    if trace is None:
        raise InputError("the bundled trace has its own arrival times (--rate-scale scales them)",
                         field="--request-rate", allowed="a length-only TRACE, or --dataset-name")
    name = sniff_format(trace) if fmt == "auto" else fmt
    params = inspect.signature(get_format(name).loader).parameters
    if "rate_per_s" not in params:
        raise InputError(f"a {name} trace has its own arrival times (--rate-scale scales them)",
                         path=str(trace), field="--request-rate",
                         allowed="a length-only trace (format lengths), or --dataset-name")
    if math.isinf(rate) or burstiness == 1.0:
        return {"rate_per_s": rate, "seed": seed}
    return {"rate_per_s": rate, "process": "gamma", "cv": 1.0 / math.sqrt(burstiness), "seed": seed}


def workload_from_flags(flags: BenchFlags, trace: Path | None, fmt: str, seed: int,
                        max_requests: int | None, rate_scale: float | None, options: dict | None = None):
    if flags.dataset_name is not None:
        if trace is not None:
            raise InputError("give either a TRACE or --dataset-name, not both", field="--dataset-name")
        if options:
            raise InputError("--trace-option applies to a TRACE's loader", field="--trace-option",
                             allowed="a TRACE (or --dataset-path without --dataset-name)")
        return bench_workload_from_flags(flags, seed, max_requests, rate_scale)
    return trace_workload_from_flags(flags, trace, fmt, seed, max_requests, rate_scale, options)


def traffic_of(flags: BenchFlags, workload):
    """What the result file records of the traffic (vllm bench's defaults where a flag was not given:
    rate inf, burstiness 1; num_prompts: the requests sent)."""
    from servesim.bench_serve import BenchTraffic

    return BenchTraffic(num_prompts=len(workload.requests),
                        request_rate=math.inf if flags.request_rate is None else flags.request_rate,
                        burstiness=1.0 if flags.burstiness is None else flags.burstiness,
                        max_concurrency=flags.max_concurrency)
