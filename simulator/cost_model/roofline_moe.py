"""The roofline's routed experts and their dispatch (mixed into RooflineCostModel, roofline.py).

A step's MoE layers: a measured FusedMoE curve where one covers the deployment (moe_tables.py),
else the roofline of the expected work under uniform top-k routing; under data parallelism the
dispatch/combine of vLLM's --all2all-backend (moe_comm.py). docs/COST_MODELS.md, "Mixture-of-Experts".
"""

from __future__ import annotations

from servesim.traces.errors import InputError

from .moe_comm import MoeDeployment, moe_comm
from .moe_tables import moe_curve


class RooflineMoeMixin:
    """RooflineCostModel's MoE methods; the state is the model's own (its __slots__)."""

    __slots__ = ()

    def _precompute_experts(self, c_exp: float, wx: float, moe_frac: float) -> None:
        """Routed experts: a measured FusedMoE curve when one covers this deployment, else the
        roofline of the expected work under uniform top-k routing (docs/COST_MODELS.md, MoE)."""
        m, tp, ep, b = self.model, self.tp, self.params.expert_parallel_size, self.model.dtype_bytes
        if m.num_experts % ep:
            raise InputError(f"{m.num_experts} experts do not split over {ep} expert-parallel ranks",
                             field="expert_parallel_size")
        # vLLM's FusedMoEParallelConfig: with expert parallelism whole experts split over the EP
        # ranks; without it every expert's width splits over all tp x dp GPUs (TP flattened
        # across the DP group, flatten_tp_across_dp_and_pcp)
        moe_tp, moe_ep = (1, ep) if ep > 1 else (tp * self._dp, 1)
        curve = moe_curve(m, self.gpu, moe_tp, moe_ep, self.params.moe_distribution) \
            if self.params.moe_table else None
        self._moe_table = None if curve is None else (curve, moe_frac) + self._routing_correction(curve, moe_ep)
        # dispatch + combine of the DP ranks' tokens, per MoE layer (vLLM --all2all-backend)
        lat, eff = self.params.collective_latency_s, self.params.interconnect_efficiency
        self._a2a = moe_comm(self.params.all2all_backend, MoeDeployment(
            m, self.gpu, tp, ep, self._dp, interconnect_efficiency=eff, latency_s=lat,
            use_tables=lat is None and eff is None, collectives_profile=self.params.collectives_profile))
        self.moe_comm_source = "none (one DP rank)" if self._a2a is None else self._a2a.source
        self.moe_source = "roofline" if curve is None else \
            f"measured (aiconfigurator moe_perf, moe_tp={moe_tp} moe_ep={moe_ep}, {self.params.moe_distribution})"
        if curve is not None:
            return
        h, inter = m.hidden_size, m.intermediate_size // moe_tp
        expert_elems = 3 * h * inter  # gate_up + down of one expert on this rank
        # (local experts, P(an expert is picked by a token), FLOPs per routed token, bytes per
        #  expert, activation bytes per routed token, routed tokens per token on this rank, ...)
        self._moe = (m.num_experts // moe_ep, m.experts_per_token / m.num_experts,
                     2.0 * expert_elems, expert_elems * wx, (2 * h + 3 * inter) * b,
                     m.experts_per_token / moe_ep, c_exp, moe_frac)

    def _routing_correction(self, curve, moe_ep: int) -> tuple[float, float, float]:
        """(experts E, pick probability k/E, seconds per active expert s) to move the balanced
        table to uniform top-k routing, or s = 0 for no correction.

        aiconfigurator's ``balanced`` rows spread a step's T·k routed rows evenly, so a small
        step touches min(T·k, E) distinct experts; under independent routing it touches
        E·(1 − (1 − k/E)^T) on average (docs/COST_MODELS.md, MoE). A decode-sized FusedMoE call
        is bound by reading the active experts' weights, so each expert the balanced kernel
        touched beyond that costs the table's own slope over its first E/k tokens (one more
        expert per k more rows), s = (t(E/k) − t(1)) / (E − k). Only for the TP-split layout
        (every rank holds every expert); EP and the power-law table are used as measured."""
        m = self.model
        e, k = m.num_experts, m.experts_per_token
        if (not self.params.moe_uniform_routing or moe_ep != 1 or self.params.moe_distribution != "balanced"
                or e < 2 * k):
            return float(e), k / e, 0.0
        s = (curve(e / k) - curve(1.0)) / (e - k)
        return float(e), k / e, max(s, 0.0)

    def _moe_parts(self, tokens: int, tokens_moe: int) -> tuple[float, float]:
        """Seconds of one layer's routed experts over ``tokens_moe`` tokens (every DP rank's), and
        of this rank's dispatch + combine of its ``tokens``; both weighted by the MoE layers' share."""
        if self._moe_table is not None:
            curve, frac, experts, p_pick, per_expert = self._moe_table
            t = curve(tokens_moe)
            if per_expert:  # balanced table -> uniform routing: fewer distinct experts touched
                t -= per_expert * (min(tokens_moe * p_pick, 1.0) * experts
                                   - experts * (1.0 - (1.0 - p_pick) ** tokens_moe))
            gemm = frac * t
        else:
            experts, p_pick, flops, wbytes, abytes, top_k, c, frac = self._moe
            # Expected distinct experts hit when tokens route uniformly (each picks top_k).
            active = experts * (1.0 - (1.0 - p_pick) ** tokens_moe)
            routed = tokens_moe * top_k
            gemm = frac * (max(routed * flops * c, (active * wbytes + routed * abytes) * self._m)
                           + 2 * self._ko)
        a2a = self._a2a
        return gemm, 0.0 if a2a is None else frac * a2a.seconds(tokens, tokens_moe)

    def wave_correction_s(self, num_tokens: int, wave_tokens: int) -> float:
        """Seconds to add to ``step_time_s`` of a step of ``num_tokens`` tokens on one DP rank of a
        lockstep wave whose MoE layers hold ``wave_tokens`` tokens in all (WaveCostModel):
        step_time_s alone assumes balanced ranks, ``data_parallel_size x num_tokens``."""
        if self._dp == 1 or (self._moe_table is None and self._moe is None):
            return 0.0
        gemm, a2a = self._moe_parts(num_tokens, wave_tokens)
        gemm0, a2a0 = self._moe_parts(num_tokens, num_tokens * self._dp)
        return self.model.num_layers * ((gemm + a2a) - (gemm0 + a2a0))

