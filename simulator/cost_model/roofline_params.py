"""The roofline cost model's parameters (`RooflineParams`): efficiencies, per-kernel overheads, the
MoE and collectives options, each validated on construction (docs/COST_MODELS.md lists them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from servesim.traces.errors import InputError

from .decode_skew import check_skew_alpha
from .moe_comm import DEFAULT_ALL2ALL_BACKEND, check_all2all_backend
from .moe_tables import DISTRIBUTIONS


@dataclass(slots=True, frozen=True)
class RooflineParams:
    """Tunable knobs; an efficiency left as None takes the GPU spec's calibrated value."""

    compute_efficiency: float | None = None  # fraction of peak bf16 FLOP/s reached by GEMMs
    memory_efficiency: float | None = None  # fraction of peak DRAM bandwidth reached by GEMMs
    attention_compute_efficiency: float | None = None  # same for flash-attention prefill
    attention_memory_efficiency: float | None = None  # same for decode attention (KV reads)
    interconnect_efficiency: float | None = None  # fraction of link bandwidth an all-reduce gets
    collective_latency_s: float | None = None  # fixed cost per all-reduce, seconds
    kernel_overhead_s: float = 4e-6  # per GEMM / elementwise kernel: launch gap + tail, seconds
    attention_overhead_s: float = 1e-5  # per attention call (split-KV combine, metadata), seconds
    elementwise_kernels_per_layer: int = 5  # 2 norms, rotary, activation, KV-cache write
    expert_parallel_size: int = 1  # vLLM --enable-expert-parallel: experts split over this many ranks
    data_parallel_size: int = 1  # DP ranks whose tokens meet in every MoE layer (vLLM DP + EP)
    # vLLM --all2all-backend: how a DP deployment's MoE layers dispatch and combine (moe_comm.py)
    all2all_backend: str = DEFAULT_ALL2ALL_BACKEND
    # the measured MoE tables (moe_tables.py) where they cover the shape, else the roofline scaled by a
    # measured efficiency curve; False: the bare roofline
    moe_table: bool = True
    moe_distribution: str = "balanced"  # their routing: balanced (uniform) or power_law_1.01
    # Route tokens independently (uniform top-k): a step of T tokens touches E(1-(1-k/E)^T) of the
    # E experts, fewer than the balanced table's min(T k, E); False keeps the table as measured.
    moe_uniform_routing: bool = True
    # This host's all-reduce (nccl-tests all_reduce_perf output, or a profile with allreduce rows)
    # instead of the shipped tables / link model for the TP group (collectives.py).
    allreduce_profile: str | None = None
    # This host's collectives (calibrate --collectives output, or nccl-tests output): every op the
    # file holds replaces the shipped table / link model (host_collectives.py); the PP hand-off too.
    collectives_profile: str | None = None
    # MLA decode attention from the measured tables (mla_tables.py) where they cover the deployment;
    # off by default: their small-batch floor (~0.12-0.16 ms per layer) looks like eager-mode overhead.
    mla_table: bool = False
    # Decode-attention imbalance factor (cost_model/decode_skew.py): None = the one carried from the
    # vLLM FlashAttention profiles for standard attention, none for MLA; 0 turns the term off.
    skew_alpha: float | None = None

    def __post_init__(self) -> None:
        if self.skew_alpha is not None:
            object.__setattr__(self, "skew_alpha", check_skew_alpha(self.skew_alpha))
        if self.moe_distribution not in DISTRIBUTIONS:
            raise InputError(f"roofline: unknown moe_distribution {self.moe_distribution!r}",
                             field="moe_distribution", allowed=", ".join(DISTRIBUTIONS))
        check_all2all_backend(self.all2all_backend)
        if self.allreduce_profile is not None and self.collectives_profile is not None:
            raise InputError("give one host profile: collectives_profile reads the all-reduce rows too",
                             field="collectives_profile", allowed="collectives_profile alone")
        for f in ("expert_parallel_size", "data_parallel_size"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise InputError(f"roofline: {f} must be a positive integer", field=f)
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or isinstance(value, (str, bool)):
                continue
            if f.name.endswith("efficiency") and not 0 < value <= 1:
                raise InputError(f"roofline: {f.name} must be in (0, 1], got {value!r}", field=f.name)
            if value < 0:
                raise InputError(f"roofline: {f.name} must be >= 0, got {value!r}", field=f.name)

