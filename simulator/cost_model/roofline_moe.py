"""The roofline's routed experts and their dispatch: `RooflineMoe`, owned by RooflineCostModel.

A step's MoE layers: a measured FusedMoE curve where one covers the deployment (moe_tables.py),
else the roofline of the expected work under uniform top-k routing; under data parallelism the
dispatch/combine of vLLM's --all2all-backend (moe_comm.py). docs/COST_MODELS.md, "Mixture-of-Experts".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from servesim.traces.errors import InputError

from ..specs import GpuSpec, HostSpec, ModelSpec
from .moe_comm import MoeDeployment, moe_comm
from .moe_tables import moe_curve

if TYPE_CHECKING:  # roofline.py imports this module
    from .roofline import RooflineParams


class RooflineMoe:
    """One MoE model's routed-expert and dispatch prices per layer. Built once with the cost model;
    every field is fixed after construction. Exactly one of ``table`` (a measured curve) and
    ``roofline`` (the expected work's roofline) is set."""

    __slots__ = ("table", "roofline", "_a2a", "_m", "_ko", "source", "comm_source")

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, params: RooflineParams, s_per_flop: float,
                 bytes_per_weight: float, moe_frac: float, s_per_byte: float, kernel_overhead_s: float,
                 host: HostSpec | None = None) -> None:
        """``params``: the model's RooflineParams; ``s_per_flop``/``bytes_per_weight``: the expert
        GEMMs' format; ``moe_frac``: the MoE layers' share of the layers; ``s_per_byte`` and
        ``kernel_overhead_s``: the GEMM memory rate and overhead the dense GEMMs use."""
        m, ep, dp, b = model, params.expert_parallel_size, params.data_parallel_size, model.dtype_bytes
        if m.num_experts % ep:
            raise InputError(f"{m.num_experts} experts do not split over {ep} expert-parallel ranks",
                             field="expert_parallel_size")
        self._m, self._ko = s_per_byte, kernel_overhead_s
        # vLLM's FusedMoEParallelConfig: with expert parallelism whole experts split over the EP
        # ranks; without it every expert's width splits over all tp x dp GPUs (TP flattened
        # across the DP group, flatten_tp_across_dp_and_pcp)
        moe_tp, moe_ep = (1, ep) if ep > 1 else (tp * dp, 1)
        curve = moe_curve(m, gpu, moe_tp, moe_ep, params.moe_distribution) if params.moe_table else None
        # (curve, frac, experts E, pick probability k/E, seconds per active expert s)
        self.table: tuple[Callable[[float], float], float, float, float, float] | None = None \
            if curve is None else (curve, moe_frac) + _routing_correction(m, params, curve, moe_ep)
        # dispatch + combine of the DP ranks' tokens, per MoE layer (vLLM --all2all-backend)
        lat, eff = params.collective_latency_s, params.interconnect_efficiency
        self._a2a = moe_comm(params.all2all_backend, MoeDeployment(
            m, gpu, tp, ep, dp, host=host, interconnect_efficiency=eff, latency_s=lat,
            use_tables=lat is None and eff is None, collectives_profile=params.collectives_profile))
        self.comm_source = "none (one DP rank)" if self._a2a is None else self._a2a.source
        self.source = "roofline" if curve is None else \
            f"measured (aiconfigurator moe_perf, moe_tp={moe_tp} moe_ep={moe_ep}, {params.moe_distribution})"
        self.roofline: tuple[int, float, float, float, int, float, float, float] | None = None
        if curve is not None:
            return
        h, inter = m.hidden_size, m.intermediate_size // moe_tp
        expert_elems = 3 * h * inter  # gate_up + down of one expert on this rank
        # (local experts, P(an expert is picked by a token), FLOPs per routed token, bytes per
        #  expert, activation bytes per routed token, routed tokens per token on this rank, ...)
        self.roofline = (m.num_experts // moe_ep, m.experts_per_token / m.num_experts,
                         2.0 * expert_elems, expert_elems * bytes_per_weight, (2 * h + 3 * inter) * b,
                         m.experts_per_token / moe_ep, s_per_flop, moe_frac)

    def parts(self, tokens: int, tokens_moe: int) -> tuple[float, float]:
        """Seconds of one layer's routed experts over ``tokens_moe`` tokens (every DP rank's), and
        of this rank's dispatch + combine of its ``tokens``; both weighted by the MoE layers' share."""
        table = self.table
        if table is not None:
            curve, frac, experts, p_pick, per_expert = table
            t = curve(tokens_moe)
            if per_expert:  # balanced table -> uniform routing: fewer distinct experts touched
                t -= per_expert * (min(tokens_moe * p_pick, 1.0) * experts
                                   - experts * (1.0 - (1.0 - p_pick) ** tokens_moe))
            gemm = frac * t
        else:
            experts, p_pick, flops, wbytes, abytes, top_k, c, frac = self.roofline
            # Expected distinct experts hit when tokens route uniformly (each picks top_k).
            active = experts * (1.0 - (1.0 - p_pick) ** tokens_moe)
            routed = tokens_moe * top_k
            gemm = frac * (max(routed * flops * c, (active * wbytes + routed * abytes) * self._m)
                           + 2 * self._ko)
        a2a = self._a2a
        return gemm, 0.0 if a2a is None else frac * a2a.seconds(tokens, tokens_moe)

    def wave_delta_s(self, num_tokens: int, wave_tokens: int, balanced_tokens: int) -> float:
        """Seconds per layer that a lockstep wave of ``wave_tokens`` MoE tokens costs over a balanced
        one of ``balanced_tokens``, for a rank with ``num_tokens`` of its own."""
        gemm, a2a = self.parts(num_tokens, wave_tokens)
        gemm0, a2a0 = self.parts(num_tokens, balanced_tokens)
        return (gemm + a2a) - (gemm0 + a2a0)


def _routing_correction(m: ModelSpec, params: RooflineParams, curve: Callable[[float], float],
                        moe_ep: int) -> tuple[float, float, float]:
    """(experts E, pick probability k/E, seconds per active expert s) to move the balanced
    table to uniform top-k routing, or s = 0 for no correction.

    aiconfigurator's ``balanced`` rows spread a step's T·k routed rows evenly, so a small
    step touches min(T·k, E) distinct experts; under independent routing it touches
    E·(1 − (1 − k/E)^T) on average (docs/COST_MODELS.md, MoE). A decode-sized FusedMoE call
    is bound by reading the active experts' weights, so each expert the balanced kernel
    touched beyond that costs the table's own slope over its first E/k tokens (one more
    expert per k more rows), s = (t(E/k) − t(1)) / (E − k). Only for the TP-split layout
    (every rank holds every expert); EP and the power-law table are used as measured."""
    e, k = m.num_experts, m.experts_per_token
    if (not params.moe_uniform_routing or moe_ep != 1 or params.moe_distribution != "balanced"
            or e < 2 * k):
        return float(e), k / e, 0.0
    s = (curve(e / k) - curve(1.0)) / (e - k)
    return float(e), k / e, max(s, 0.0)
