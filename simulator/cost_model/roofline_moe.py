"""The roofline's routed experts and their dispatch: `RooflineMoe`, owned by RooflineCostModel.

A step's MoE layers: a measured FusedMoE curve where one covers the deployment (moe_tables.py);
else the roofline of the expected work under uniform top-k routing, scaled by a measured kernel's
efficiency curve (achieved / roofline time by tokens per expert, moe_tables.py) of this GPU or one
of its generation in the experts' weight format, or the bare roofline where no curve fits; under
data parallelism the dispatch/combine of vLLM's --all2all-backend (moe_comm.py).
docs/COST_MODELS.md, "Mixture-of-Experts".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from servesim.traces.errors import InputError

from ..specs import GpuSpec, HostSpec, ModelSpec
from ..specs.precision import bytes_per_element, gemm_efficiency, gemm_peak_tflops
from .moe_comm import MoeDeployment, moe_comm
from .moe_tables import moe_curve, moe_efficiency

if TYPE_CHECKING:  # roofline.py imports this module
    from .roofline_params import RooflineParams


def expert_gemm_rates(gpu: GpuSpec, fmt: str, compute_efficiency: float) -> tuple[float, float]:
    """(seconds per FLOP, bytes per weight) of expert GEMMs with weights in ``fmt``: the tensor-core
    rate of the format (specs/precision.py) at the fitted efficiency."""
    peak = gemm_peak_tflops(gpu, fmt) * 1e12 * gemm_efficiency(gpu, fmt, compute_efficiency)
    return 1.0 / peak, bytes_per_element(fmt)


def expert_roofline(model: ModelSpec, moe_tp: int, moe_ep: int, s_per_flop: float, bytes_per_weight: float
                    ) -> tuple[int, float, float, float, float, float, float]:
    """One rank's routed experts as roofline terms: (local experts, P(an expert is picked by a
    token), FLOPs per routed row, bytes per expert, activation bytes per routed row, routed rows per
    token on this rank, seconds per FLOP)."""
    h, inter = model.hidden_size, model.intermediate_size // moe_tp
    expert_elems = 3 * h * inter  # gate_up + down of one expert on this rank
    return (model.num_experts // moe_ep, model.experts_per_token / model.num_experts, 2.0 * expert_elems,
            expert_elems * bytes_per_weight, (2 * h + 3 * inter) * model.dtype_bytes,
            model.experts_per_token / moe_ep, s_per_flop)


def expert_roofline_s(terms: tuple, tokens: float, active: float, s_per_byte: float, overhead_s: float) -> float:
    """Seconds of one FusedMoE call on one rank over ``tokens`` tokens that touch ``active`` of its
    experts: max(compute, weight + activation traffic) plus two kernel overheads (``terms``:
    :func:`expert_roofline`). The one formula the cost model and tools/build_moe_tables.py use."""
    _, _, flops, wbytes, abytes, rows_per_token, c = terms
    routed = tokens * rows_per_token
    return max(routed * flops * c, (active * wbytes + routed * abytes) * s_per_byte) + 2 * overhead_s


class RooflineMoe:
    """One MoE model's routed-expert and dispatch prices per layer. Built once with the cost model;
    every field is fixed after construction. Exactly one of ``table`` (a measured curve) and
    ``roofline`` (the expected work's roofline) is set; ``efficiency`` (a measured achieved /
    roofline ratio by tokens per expert) scales the roofline where one fits."""

    __slots__ = ("table", "roofline", "efficiency", "_a2a", "_m", "_ko", "source", "comm_source",
                 "engine_version", "_frac")

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, params: RooflineParams, s_per_flop: float,
                 bytes_per_weight: float, moe_frac: float, s_per_byte: float, kernel_overhead_s: float,
                 host: HostSpec | None = None) -> None:
        """``params``: the model's RooflineParams; ``s_per_flop``/``bytes_per_weight``: the expert
        GEMMs' format; ``moe_frac``: the MoE layers' share of the layers; ``s_per_byte`` and
        ``kernel_overhead_s``: the GEMM memory rate and overhead the dense GEMMs use."""
        m, ep, dp = model, params.expert_parallel_size, params.data_parallel_size
        if m.num_experts % ep:
            raise InputError(f"{m.num_experts} experts do not split over {ep} expert-parallel ranks",
                             field="expert_parallel_size")
        self._m, self._ko, self._frac = s_per_byte, kernel_overhead_s, moe_frac
        # vLLM's FusedMoEParallelConfig: with expert parallelism whole experts split over the EP
        # ranks; without it every expert's width splits over all tp x dp GPUs (TP flattened
        # across the DP group, flatten_tp_across_dp_and_pcp)
        moe_tp, moe_ep = (1, ep) if ep > 1 else (tp * dp, 1)
        measured = moe_curve(m, gpu, moe_tp, moe_ep, params.moe_distribution) if params.moe_table else None
        # (curve, frac, experts E, pick probability k/E, seconds per active expert s)
        self.table: tuple[Callable[[float], float], float, float, float, float] | None = None \
            if measured is None else (measured.curve, moe_frac) + _routing_correction(m, params, measured.curve, moe_ep)
        # dispatch + combine of the DP ranks' tokens, per MoE layer (vLLM --all2all-backend)
        lat, eff = params.collective_latency_s, params.interconnect_efficiency
        self._a2a = moe_comm(params.all2all_backend, MoeDeployment(
            m, gpu, tp, ep, dp, host=host, interconnect_efficiency=eff, latency_s=lat,
            use_tables=lat is None and eff is None, collectives_profile=params.collectives_profile))
        self.comm_source = "none (one DP rank)" if self._a2a is None else self._a2a.source
        self.roofline: tuple | None = None
        self.efficiency: Callable[[float], float] | None = None
        if measured is not None:
            self.source = f"{measured.source}, moe_tp={moe_tp} moe_ep={moe_ep}, {params.moe_distribution}"
            self.engine_version = measured.engine_version
            return
        self.roofline = expert_roofline(m, moe_tp, moe_ep, s_per_flop, bytes_per_weight)
        fit = moe_efficiency(m, gpu) if params.moe_table else None
        self.efficiency = None if fit is None else fit.curve
        self.source = "roofline" if fit is None else f"roofline x {fit.source}"
        self.engine_version = None if fit is None else fit.engine_version

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
            terms = self.roofline
            experts, p_pick, frac = terms[0], terms[1], self._frac
            # Expected distinct experts hit when tokens route uniformly (each picks top_k).
            active = experts * (1.0 - (1.0 - p_pick) ** tokens_moe)
            gemm = expert_roofline_s(terms, tokens_moe, active, self._m, self._ko)
            eff = self.efficiency
            if eff is not None:  # measured achieved/roofline ratio at this many tokens per expert
                gemm *= eff(tokens_moe * p_pick)
            gemm *= frac
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
