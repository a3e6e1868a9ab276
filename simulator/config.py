"""Simulation configuration: nested dataclasses that YAML mirrors one to one, validated on construction."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.scheduler.sglang import SGLangConfig
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.frontend import FrontendConfig
from servesim.simulator.gateway.config import GatewayConfig
from servesim.simulator.kv_offload import KvOffloadConfig
from servesim.simulator.sampling import SamplingConfig
from servesim.simulator.structured_output import StructuredOutputConfig
from servesim.traces.errors import InputError


PREFIX_CACHE_KEYS = ("provenance", "token_ids")


@dataclass(slots=True)
class HardwareConfig:
    model: str = "llama-3.1-8b"  # model id or alias (see simulator/specs/models.yaml)
    gpu: str = "h100"  # GPU id or alias (see simulator/specs/gpus.yaml)
    tp: int = 1  # tensor-parallel degree
    pp: int = 1  # pipeline-parallel degree (vLLM --pipeline-parallel-size): stages of tp GPUs each
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory vLLM may use (weights + KV + activations)
    activation_reserve_gib: float = 2.0  # per GPU: activations, CUDA graphs, allocator slack
    # The machine the GPUs sit in (simulator/specs/hosts.yaml: link, P2P, measured collectives);
    # None: the GPU's default host.
    host: str | None = None
    # vLLM --disable-custom-all-reduce (ParallelConfig.disable_custom_all_reduce): NCCL for every
    # all-reduce, as when vLLM turns its custom all-reduce off itself (no P2P, > 2 PCIe GPUs, ...).
    disable_custom_all_reduce: bool = False

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise InputError(f"tp must be >= 1, got {self.tp}", field="hardware.tp")
        if isinstance(self.pp, bool) or not isinstance(self.pp, int) or self.pp < 1:
            raise InputError(f"got {self.pp!r}", field="hardware.pp", allowed="an integer >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InputError("must be in (0, 1]", field="hardware.gpu_memory_utilization")
        if self.activation_reserve_gib < 0:
            raise InputError("must be >= 0", field="hardware.activation_reserve_gib")
        if not isinstance(self.disable_custom_all_reduce, bool):
            raise InputError(f"expected true or false, got {self.disable_custom_all_reduce!r}",
                             field="hardware.disable_custom_all_reduce")
        if self.host is not None:
            self._check_host()

    def _check_host(self) -> None:
        """The host exists and holds this GPU (an unknown GPU is check_startup's to report)."""
        from servesim.simulator.specs import find_gpu, host_for, resolve_host  # specs import config's users

        if not isinstance(self.host, str):
            raise InputError(f"expected a host id, got {self.host!r}", field="hardware.host")
        try:
            gpu = find_gpu(self.gpu)
            host_for(gpu, self.host) if gpu is not None else resolve_host(self.host)
        except InputError as exc:
            raise InputError(exc.detail, field="hardware.host", allowed=exc.allowed) from None


@dataclass(slots=True)
class CostModelConfig:
    name: str = "roofline"  # registry name: roofline | profiled | ...
    params: dict[str, Any] = field(default_factory=dict)  # model-specific parameters (e.g. path)
    cpu_overhead: CpuOverheadConfig = field(default_factory=CpuOverheadConfig)


@dataclass(slots=True)
class SpecDecodeConfig:
    # Probability that draft position i is accepted given positions < i were (empty: no spec decode).
    acceptance: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        self.acceptance = tuple(float(p) for p in self.acceptance)
        if any(not 0 <= p <= 1 for p in self.acceptance):
            raise InputError("acceptance probabilities must be in [0, 1]", field="spec_decode.acceptance")


@dataclass(slots=True)
class SloConfig:
    ttft_s: float = 2.0  # a request meets the SLO when TTFT <= ttft_s ...
    tpot_s: float = 0.1  # ... and TPOT <= tpot_s ...
    e2e_s: float | None = None  # ... and E2E <= e2e_s when set (vllm bench's e2el SLO)

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0 or (self.e2e_s is not None and self.e2e_s <= 0):
            raise InputError("SLO thresholds must be > 0", field="slo")


STRANDED_POLICIES = ("abort", "wait")


@dataclass(slots=True)
class LivenessConfig:
    """The watchdog (simulator/liveness.py): a run whose requests make no progress (no output token,
    no request finished) for this many engine steps, or this long on the simulated clock while
    requests are unfinished, stops with a diagnosis instead of running forever."""

    max_steps_without_progress: int = 100_000
    max_sim_s_without_progress: float = 3600.0
    # A request the scheduler can never admit as the engine stands (SchedulerInterface.stranded_request):
    # "abort" it (status "aborted", reject_reason "stranded_<why>") and go on, or "wait" on it as
    # vLLM 0.19.1 does (the watchdog then stops the run with StallError). docs/LIVENESS.md.
    stranded_requests: str = "abort"

    def __post_init__(self) -> None:
        if self.stranded_requests not in STRANDED_POLICIES:
            raise InputError(f"got {self.stranded_requests!r}", field="liveness.stranded_requests",
                             allowed=" or ".join(repr(p) for p in STRANDED_POLICIES))
        if self.max_steps_without_progress < 1:
            raise InputError("must be >= 1", field="liveness.max_steps_without_progress")
        if not self.max_sim_s_without_progress > 0:
            raise InputError("must be > 0", field="liveness.max_sim_s_without_progress")


@dataclass(slots=True)
class ClientConfig:
    """How benchmark clients behave (applies to every request without its own `timeout_s`)."""

    timeout_s: float | None = None  # give up (the server aborts the request) after this long; None: wait forever
    max_concurrency: int | None = None  # requests in flight at most (vllm bench --max-concurrency); None: no cap

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and (isinstance(self.max_concurrency, bool)
                                                 or not isinstance(self.max_concurrency, int)
                                                 or self.max_concurrency < 1):
            raise InputError(f"got {self.max_concurrency!r}", field="client.max_concurrency",
                             allowed="an integer >= 1, or null")
        if self.timeout_s is not None and not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0
                                               and math.isfinite(self.timeout_s)):
            raise InputError(f"got {self.timeout_s!r}", field="client.timeout_s",
                             allowed="a finite number of seconds > 0, or null")


@dataclass(slots=True)
class SimConfig:
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    # vLLM 0.19 turns async scheduling on by default (VllmConfig resolves None to True);
    # max_model_len None = the model's max_position_embeddings, as vLLM derives it.
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(max_model_len=None,
                                                                               async_scheduling=True))
    cache: CacheConfig = field(default_factory=CacheConfig)
    # True: cache.num_gpu_blocks is derived from GPU memory the way vLLM does (kv_capacity.py);
    # setting cache.num_gpu_blocks explicitly (YAML or --set) turns this off.
    derive_num_gpu_blocks: bool = True
    cost_model: CostModelConfig = field(default_factory=CostModelConfig)
    spec_decode: SpecDecodeConfig = field(default_factory=SpecDecodeConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    engine: str = "vllm"  # scheduler engine (simulator/scheduler_kinds/): vllm | sglang
    # The engine release simulated (a run's recorded version in validate): measured kernel tables
    # from another (major, minor) release are warned about, never re-priced (cost_model/table_versions.py).
    engine_version: str = "0.19.1"
    # SGLang-only knobs (engine: sglang); None fields inherit the shared scheduler/cache settings.
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    seed: int = 0
    # Exact macro-steps (simulator/fastpath/planner.py): runs of provably plain decode steps advanced in
    # one call; results are byte-identical to stepping. False steps one by one (for debugging).
    macro_steps: bool = True
    # How the prefix cache keys a synthetic prompt's blocks (scheduler/block_keys.py): "provenance"
    # derives the keys from the trace's id streams without hashing ids; "token_ids" hashes every
    # block's ids as vLLM does. Hits and misses are identical; real token ids are always hashed.
    prefix_cache_keys: str = "provenance"
    # False: each step's row is folded into the summary's step figures and the 1-second series as the
    # run goes, then dropped (simulator/step_fold.py): no steps.parquet, the same summary and series.
    # For runs of ~10^8 steps (a day of a busy fleet), whose rows would not fit in memory.
    step_rows: bool = True
    # Deprecated: the old sync-only fast-forward, replaced by macro_steps (True turns them on).
    fast_forward: bool = False
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    # The OpenAI server in front of the engine (off: in-process runs) and the clients' behaviour.
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    # The sampling parameters the requests run with (client's over the server's generation config):
    # top-p sends vLLM's sampler down its sort path, priced per sampled row (simulator/sampling.py).
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # The CPU KV tier (vLLM's --kv-offloading-size: the OffloadingConnector), off by default.
    kv_offload: KvOffloadConfig = field(default_factory=KvOffloadConfig)
    # Requests that wait for a grammar to compile before they can run (simulator/structured_output.py).
    structured_output: StructuredOutputConfig = field(default_factory=StructuredOutputConfig)
    # Admission and flow control in front of the engine, tenants and SLO classes (simulator/gateway/).
    gateway: GatewayConfig = field(default_factory=GatewayConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.engine_version, str) or not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", self.engine_version):
            raise InputError(f"got {self.engine_version!r}", field="engine_version",
                             allowed="a release number such as 0.19.1")
        if self.spec_decode.acceptance and self.scheduler.num_spec_tokens != len(self.spec_decode.acceptance):
            raise InputError(
                f"spec_decode.acceptance has {len(self.spec_decode.acceptance)} entries but "
                f"scheduler.num_spec_tokens is {self.scheduler.num_spec_tokens}", field="spec_decode.acceptance")
        if self.scheduler.num_spec_tokens and not self.spec_decode.acceptance:
            raise InputError("num_spec_tokens > 0 needs spec_decode.acceptance (one probability per position)",
                             field="spec_decode.acceptance")
        if self.fast_forward and self.macro_steps is False:
            # The two ask for opposite things: refuse rather than let the deprecated alias win.
            raise InputError("fast_forward (deprecated) turns macro-steps on, but macro_steps is false",
                             field="fast_forward", allowed="leave fast_forward out (macro_steps alone decides)")
        if self.fast_forward:
            import warnings

            warnings.warn("fast_forward is deprecated: macro_steps (on by default) replaces it; "
                          "fast_forward: true now turns macro_steps on", DeprecationWarning, stacklevel=3)
            self.macro_steps = True
            self.fast_forward = False
        if self.structured_output.rate > 0 and self.engine != "vllm":
            raise InputError("grammar compilation waits are modelled for vLLM's scheduler only",
                             field="structured_output.rate", allowed="0 with engine: sglang")
        if self.prefix_cache_keys not in PREFIX_CACHE_KEYS:
            raise InputError(f"got {self.prefix_cache_keys!r}", field="prefix_cache_keys",
                             allowed=" | ".join(PREFIX_CACHE_KEYS))
        if not isinstance(self.step_rows, bool):
            raise InputError(f"expected true or false, got {self.step_rows!r}", field="step_rows")
        if not isinstance(self.macro_steps, bool):
            raise InputError(f"expected true or false, got {self.macro_steps!r}", field="macro_steps")
        from servesim.simulator.startup import check_startup  # imports the specs (a cycle at module level)

        check_startup(self)  # what vLLM refuses at start-up, whichever way the config was built


def to_dict(obj: Any) -> Any:
    """Plain dict/list form of a config tree (for config.yaml)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
