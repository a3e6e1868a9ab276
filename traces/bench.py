"""Benchmark-client workloads: a `vllm bench serve` (or inference-perf) command line, one to one.

    wl = bench_workload(BenchConfig(dataset_name="random", num_prompts=500, request_rate=8.0,
                                    random_input_len=1024, random_output_len=128), rng)

Each dataset maps onto the existing synthetic generators (`traces.synthetic`), so the token streams,
prefix sharing and seeding are the ones every other synthetic workload uses:

- `random`: lengths uniform in [len * (1 - ratio), len * (1 + ratio)] (vllm bench's
  `--random-range-ratio`), after a `--random-prefix-len` prefix shared by every request;
- `sharegpt`: prompt/output lengths drawn from the bundled ShareGPT sample, or from
  `--dataset-path` (a raw ShareGPT JSON, traces/sharegpt.py, or any trace the registry reads);
  `--sharegpt-output-len` fixes the output;
- `sonnet`: vllm bench's sonnet shape: a `--sonnet-prefix-len` prefix shared by every request, a
  `--sonnet-input-len` prompt and a fixed `--sonnet-output-len`;
- `shared_prefix`: inference-perf's profile: `num_groups` system prompts of `system_prompt_len`
  tokens, each shared by `users_per_group` users; a request is its user's system prompt + that
  user's `question_len` question (the same every time the user comes round), output `output_len`;
  requests cycle through the users in order.

Arrivals follow vllm bench: the first request at t = 0, then gamma-distributed gaps with shape
`burstiness` and mean 1/`request_rate` (burstiness 1 is Poisson); `request_rate = inf` sends every
request at t = 0. `stages` (inference-perf) replaces both: consecutive (duration_s, rate) windows
of evenly spaced ("constant") or Poisson arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from servesim.traces.distributions import arrival_times
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload
from servesim.traces.synthetic_config import ArrivalConfig, DistConfig, PrefixConfig, SyntheticConfig
from servesim.traces.spec_columns import SpecColumns
from servesim.traces.workload import RequestSpec, Workload

DATASETS = ("random", "sharegpt", "sonnet", "shared_prefix")
STAGE_LOADS = ("constant", "poisson")


@dataclass(slots=True)
class StageConfig:
    duration_s: float  # how long the stage sends (s)
    rate_per_s: float  # requests per second during the stage

    def __post_init__(self) -> None:
        for name in ("duration_s", "rate_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise InputError(f"got {value!r}", field=f"stages.{name}", allowed="a finite number > 0")


@dataclass(slots=True)
class BenchConfig:
    dataset_name: str = "random"  # one of DATASETS
    num_prompts: int = 1000  # requests (stages: at most this many)
    request_rate: float = math.inf  # requests per second; inf: all at t = 0
    burstiness: float = 1.0  # gamma shape of the gaps (1: Poisson; < 1 burstier)
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    sharegpt_output_len: int | None = None
    sonnet_input_len: int = 550
    sonnet_output_len: int = 150
    sonnet_prefix_len: int = 200
    num_groups: int = 1  # shared_prefix: distinct system prompts
    users_per_group: int = 1  # shared_prefix: users sharing each system prompt
    system_prompt_len: int = 100
    question_len: int = 100
    output_len: int = 128
    stages: tuple[StageConfig, ...] = ()  # inference-perf load stages (replace request_rate)
    stage_load: str = "constant"  # arrivals inside a stage: constant | poisson
    seed: int = 0
    dataset_path: str | None = None  # sharegpt: the file its lengths come from (None: the bundled sample)

    def __post_init__(self) -> None:
        if self.dataset_name not in DATASETS:
            raise InputError(f"unknown dataset {self.dataset_name!r}", field="--dataset-name",
                             allowed=", ".join(DATASETS))
        if self.dataset_path is not None and self.dataset_name != "sharegpt":
            raise InputError(f"--dataset-path is not read by --dataset-name {self.dataset_name}",
                             field="--dataset-path", allowed="--dataset-name sharegpt, or no --dataset-name "
                                                             "(then the file is the trace)")
        if self.stage_load not in STAGE_LOADS:
            raise InputError(f"got {self.stage_load!r}", field="stage_load", allowed=", ".join(STAGE_LOADS))
        if not isinstance(self.num_prompts, int) or self.num_prompts < 1:
            raise InputError(f"got {self.num_prompts!r}", field="--num-prompts", allowed="an integer >= 1")
        if not (self.request_rate > 0):
            raise InputError(f"got {self.request_rate!r}", field="--request-rate", allowed="> 0, or inf")
        if not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise InputError(f"got {self.burstiness!r}", field="--burstiness", allowed="a finite number > 0")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise InputError(f"got {self.random_range_ratio!r}", field="--random-range-ratio",
                             allowed="a number in [0, 1)")
        for name in ("random_input_len", "random_output_len", "sonnet_input_len", "sonnet_output_len",
                     "num_groups", "users_per_group", "system_prompt_len", "question_len", "output_len"):
            if getattr(self, name) < 1:
                raise InputError(f"got {getattr(self, name)!r}", field=f"--{name.replace('_', '-')}",
                                 allowed="an integer >= 1")
        for name in ("random_prefix_len", "sonnet_prefix_len"):
            if getattr(self, name) < 0:
                raise InputError(f"got {getattr(self, name)!r}", field=f"--{name.replace('_', '-')}",
                                 allowed="an integer >= 0")
        if self.sonnet_prefix_len >= self.sonnet_input_len:
            raise InputError(f"{self.sonnet_prefix_len} >= --sonnet-input-len {self.sonnet_input_len}",
                             field="--sonnet-prefix-len", allowed="smaller than --sonnet-input-len")
        self.stages = tuple(s if isinstance(s, StageConfig) else StageConfig(**s) for s in self.stages)


def _lengths(n: int, ratio: float) -> DistConfig:
    if ratio == 0.0:
        return DistConfig("fixed", value=n)
    return DistConfig("uniform", low=max(int(n * (1 - ratio)), 1), high=int(n * (1 + ratio)))


def _synthetic(cfg: BenchConfig) -> SyntheticConfig:
    """The dataset's lengths and prefix sharing as a SyntheticConfig (arrivals set later)."""
    name = f"bench-{cfg.dataset_name}"
    if cfg.dataset_name == "random":
        prefix = (PrefixConfig(1, DistConfig("fixed", value=cfg.random_prefix_len))
                  if cfg.random_prefix_len else None)
        return SyntheticConfig(name=name, num_requests=cfg.num_prompts,
                               prompt_len=_lengths(cfg.random_input_len, cfg.random_range_ratio),
                               output_len=_lengths(cfg.random_output_len, cfg.random_range_ratio), prefix=prefix)
    if cfg.dataset_name == "sharegpt":
        from servesim.traces.bundled import DATA_DIR, BUNDLED_TRACES

        path = cfg.dataset_path or str(DATA_DIR / BUNDLED_TRACES["sharegpt-300"].filename)
        output = (DistConfig("fixed", value=cfg.sharegpt_output_len) if cfg.sharegpt_output_len
                  else DistConfig("empirical", path=path, column="output"))
        return SyntheticConfig(name=name, num_requests=cfg.num_prompts,
                               prompt_len=DistConfig("empirical", path=path, column="prompt"), output_len=output)
    if cfg.dataset_name == "sonnet":
        prefix = PrefixConfig(1, DistConfig("fixed", value=cfg.sonnet_prefix_len)) if cfg.sonnet_prefix_len else None
        return SyntheticConfig(name=name, num_requests=cfg.num_prompts,
                               prompt_len=DistConfig("fixed", value=cfg.sonnet_input_len - cfg.sonnet_prefix_len),
                               output_len=DistConfig("fixed", value=cfg.sonnet_output_len), prefix=prefix)
    return SyntheticConfig(name=name, num_requests=cfg.num_prompts,
                           prompt_len=DistConfig("fixed", value=cfg.question_len),
                           output_len=DistConfig("fixed", value=cfg.output_len))


def arrival_schedule(cfg: BenchConfig, rng: np.random.Generator) -> np.ndarray:
    """Send times (s) of at most num_prompts requests, ascending."""
    n = cfg.num_prompts
    if cfg.stages:
        times, start = [], 0.0
        for stage in cfg.stages:
            if cfg.stage_load == "constant":  # k / rate, exactly: no accumulated rounding
                t = np.arange(math.ceil(stage.duration_s * stage.rate_per_s - 1e-9)) / stage.rate_per_s
            else:
                t = arrival_times(ArrivalConfig("poisson", stage.rate_per_s), rng, duration_s=stage.duration_s)
            times.append(start + t)
            start += stage.duration_s
        return np.concatenate(times)[:n]
    if math.isinf(cfg.request_rate):
        return np.zeros(n)
    shape = cfg.burstiness
    gaps = rng.gamma(shape, 1.0 / (cfg.request_rate * shape), max(n - 1, 0))
    return np.concatenate(([0.0], np.cumsum(gaps)))


def bench_workload(cfg: BenchConfig, rng: np.random.Generator | None = None) -> Workload:
    """The workload a benchmark client with these arguments would send."""
    rng = rng if rng is not None else np.random.default_rng(cfg.seed)
    send_s = arrival_schedule(cfg, rng)
    synth = replace(_synthetic(cfg), num_requests=len(send_s), arrival=ArrivalConfig("constant", 1.0))
    base = make_workload("synthetic", synth, rng).columns
    if cfg.dataset_name == "shared_prefix":  # (a generator: the workload's columns take one spec at a time)
        specs = SpecColumns.of(_with_system_prompt(replace(spec, arrival_time_s=float(t)), i, cfg)
                               for i, (spec, t) in enumerate(zip(base, send_s)))
    else:  # only the arrival times change
        specs = base.with_arrival_times(send_s.tolist())
    return Workload(specs, name=f"bench-{cfg.dataset_name}", source=describe(cfg))


def _with_system_prompt(spec: RequestSpec, index: int, cfg: BenchConfig) -> RequestSpec:
    """Request `index` goes to user index mod (groups x users): its group's system prompt, then the
    user's own question. inference-perf draws one question per user and re-sends that same prompt
    every time the user comes round (shared_prefix_datagen.py: `prompts[data_index % len(prompts)]`;
    its multi-turn mode accumulates no context either, as BLIS's replays of real runs found), so the
    question tokens come from a stream keyed by the user (`session_id`) and a user's later requests
    hit the prefix cache up to their last full block, not only over the system prompt."""
    user = index % (cfg.num_groups * cfg.users_per_group)
    group = user // cfg.users_per_group
    return replace(spec, prompt_len=cfg.system_prompt_len + cfg.question_len, prefix_group=group,
                   prefix_len=cfg.system_prompt_len, session_id=f"shared-prefix-user-{user}")


def parse_goodput(items: list[str]) -> dict[str, float]:
    """`--goodput ttft:500 tpot:50 e2el:2000` (ms, as vllm bench) -> slo.* overrides in seconds."""
    keys = {"ttft": "slo.ttft_s", "tpot": "slo.tpot_s", "e2el": "slo.e2e_s"}
    out: dict[str, float] = {}
    for item in (x for arg in items for x in arg.split()):
        name, sep, value = item.partition(":")
        if not sep or name not in keys:
            raise InputError(f"got {item!r}", field="--goodput", allowed="ttft:MS, tpot:MS or e2el:MS")
        try:
            ms = float(value)
        except ValueError:
            raise InputError(f"got {item!r}", field="--goodput", allowed="a number of milliseconds") from None
        if not (math.isfinite(ms) and ms > 0):
            raise InputError(f"got {item!r}", field="--goodput", allowed="a number of milliseconds > 0")
        out[keys[name]] = ms / 1e3
    return out


def describe(cfg: BenchConfig) -> str:
    rate = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}"
    load = (" stages " + ",".join(f"{s.duration_s:g}s@{s.rate_per_s:g}" for s in cfg.stages)
            if cfg.stages else f" --request-rate {rate} --burstiness {cfg.burstiness:g}")
    path = f" --dataset-path {cfg.dataset_path}" if cfg.dataset_path else ""
    return f"bench --dataset-name {cfg.dataset_name}{path} --num-prompts {cfg.num_prompts}{load} --seed {cfg.seed}"


__all__ = ["BenchConfig", "StageConfig", "DATASETS", "bench_workload", "arrival_schedule", "describe",
           "parse_goodput"]
