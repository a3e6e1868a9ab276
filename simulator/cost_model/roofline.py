"""Analytic roofline step-time model: needs no measurements, only model and GPU specs.

Every kernel of a decoder layer costs ``max(flops / (peak * e_c), bytes / (bw * e_m)) + overhead``
for the exact batch of the step; a step is ``num_layers`` layers plus the embedding, final norm,
lm_head and sampler. Derivations and the calibration of the efficiency factors are in
docs/COST_MODELS.md.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from servesim.traces.errors import InputError

from ..kernel_impl import DenseRooflinePricer, decode_step_prices
from ..specs import GpuSpec, HostSpec, ModelSpec, host_for, layer_weight_elems, resolve_gpu, resolve_model
from ..specs.precision import bytes_per_element, gemm_efficiency, gemm_peak_tflops
from .base import StepShape, batch_sums, check_params, register_cost_model
from .collectives import Collectives, logits_gather_bytes_per_row, table_sources
from .decode_skew import CARRIED_SKEW_ALPHA, CARRIED_SKEW_SOURCE, GIVEN_SKEW_SOURCE, max_decode_context
from .mla_tables import mla_decode_grid
from .roofline_cross import CrossAttentionCost
from .roofline_hybrid import HybridLayers
from .roofline_moe import RooflineMoe, expert_gemm_rates
from .roofline_params import RooflineParams
from .roofline_vision import VisionCost
from .roofline_work import layer_work
from .table_versions import MeasuredTable, sources_engine_version, table_engine_version

_DENSE_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
_HEAD_OPS = ("embedding", "final_norm", "lm_head", "sampler")


@register_cost_model("roofline")
class RooflineCostModel:
    """Per-step roofline over the exact batch composition (see module docstring); its MoE layers
    are priced by the `RooflineMoe` it owns (roofline_moe.py)."""

    __slots__ = ("name", "model", "gpu", "host", "disable_custom_all_reduce", "tp", "params", "_c", "_ac", "_m", "_am", "_ko", "_ao",
                 "_gemms", "_moe", "_attn_flops_per_pair", "_kv_bytes_per_tok", "_q_bytes_per_tok",
                 "_ew_bytes_per_tok", "_ew_kernels", "_ar", "_ar_bytes_per_tok",
                 "collectives", "_head", "_gather", "_win_frac", "moe_source", "_dp",
                 "moe_comm_source", "_mla_decode", "attention_source", "_decode_fixed", "_dense",
                 "_skew_alpha", "skew_alpha_source", "_hybrid", "_vision", "_cross")

    def __init__(self, model: Any = None, gpu: Any = None, tp: int | None = 1, host: Any = None,
                 disable_custom_all_reduce: bool = False, **params: Any) -> None:
        if model is None or gpu is None:
            raise InputError("the roofline cost model needs both a model and a gpu",
                             field="model" if model is None else "gpu")
        check_params("roofline", params, {f.name for f in fields(RooflineParams)})
        self.name = "roofline"
        self.model: ModelSpec = resolve_model(model)
        self.gpu: GpuSpec = resolve_gpu(gpu)
        # the machine its collectives run on (None: the GPU's default host), and vLLM's switch
        self.host: HostSpec = host_for(self.gpu, host)
        self.disable_custom_all_reduce = disable_custom_all_reduce
        self.tp = 1 if tp is None else tp
        self.params = RooflineParams(**params)
        layer_weight_elems(self.model, self.tp)  # validates tp against the head count
        self._precompute()

    def _eff(self, field: str) -> float:
        value = getattr(self.params, field)
        return getattr(self.gpu, field) if value is None else value

    def _precompute(self) -> None:
        m, g, tp, b = self.model, self.gpu, self.tp, self.model.dtype_bytes
        # Inverse throughputs (seconds per FLOP / per byte) so the hot path only multiplies.
        # GEMMs run at the tensor-core rate of their weight format (specs/precision.py).
        e_c = self._eff("compute_efficiency")
        c_lin = 1.0 / (gemm_peak_tflops(g, m.weight_dtype) * 1e12 * gemm_efficiency(g, m.weight_dtype, e_c))
        self._c = 1.0 / (g.peak_flops * e_c)  # activation-dtype GEMMs (lm_head, router)
        self._ac = 1.0 / (g.peak_flops * self._eff("attention_compute_efficiency"))
        self._m = 1.0 / (g.peak_mem_bytes_per_s * self._eff("memory_efficiency"))
        self._am = 1.0 / (g.peak_mem_bytes_per_s * self._eff("attention_memory_efficiency"))
        self._ko = self.params.kernel_overhead_s
        self._ao = self.params.attention_overhead_s
        h, w = m.hidden_size, layer_weight_elems(m, tp)
        wb = bytes_per_element(m.weight_dtype)
        c_exp, wx = expert_gemm_rates(g, m.experts_dtype, e_c)
        qkv_out = w["qkv_proj"] // h
        layers = m.num_layers
        dense_frac, moe_frac = m.dense_mlp_layers / layers, m.num_moe_layers / layers
        # recurrent mixers, chunked attention, MLP-only layers (roofline_hybrid.py); None: all attention
        self._hybrid = HybridLayers(m, tp, self._ac, self._am, self._ko) \
            if {"mamba", "chunked_local", "mlp"} & set(m.layer_kinds) else None
        attn_frac = 1.0 if self._hybrid is None else self._hybrid.attn_frac
        # GEMMs as (FLOPs per token, weight bytes, activation bytes per token, s/FLOP, fraction
        # of layers that run it): the step costs num_layers x the layer-average.
        gemms = [(2.0 * w["qkv_proj"], w["qkv_proj"] * wb, (h + qkv_out) * b, c_lin, attn_frac),
                 (2.0 * w["o_proj"], w["o_proj"] * wb, (m.q_size // tp + h) * b, c_lin, attn_frac)]
        if self._hybrid is not None:
            gemms += self._hybrid.gemms(h, c_lin, wb)
        if dense_frac:
            inter = m.dense_mlp_width // tp
            gemms.append((2.0 * w["gate_up_proj"], w["gate_up_proj"] * wb, (h + 2 * inter) * b,
                          c_lin, dense_frac))
            gemms.append((2.0 * w["down_proj"], w["down_proj"] * wb, (inter + h) * b, c_lin,
                          dense_frac))
        self._moe: RooflineMoe | None = None
        self._dp = self.params.data_parallel_size
        self.moe_source = self.moe_comm_source = "none (dense)"
        if m.is_moe:
            gemms.append((2.0 * w["router"], w["router"] * b, (h + m.num_experts) * b, self._c,
                          moe_frac))
            if w["shared_experts"]:
                sh = m.shared_expert_intermediate_size // tp
                gemms.append((2.0 * w["shared_experts"], w["shared_experts"] * wb,
                              (2 * h + 3 * sh) * b, c_lin, moe_frac))
            self._moe = RooflineMoe(m, g, tp, self.params, c_exp, wx, moe_frac, self._m, self._ko, self.host)
            self.moe_source, self.moe_comm_source = self._moe.source, self._moe.comm_source
        self._gemms = tuple(gemms)
        self._precompute_attention(b)
        rates = (c_lin, self._m, self._ac, self._am, self._ko, self._ao)
        self._vision = None if m.vision is None else VisionCost(m.vision, tp, rates, b)  # a step's images
        # an encoder-decoder's cross-attention blocks (roofline_cross.py), priced step by step
        self._cross = CrossAttentionCost(m, tp, rates, b, wb) if m.cross_attention else None
        mlp_ew = dense_frac * m.dense_mlp_width + moe_frac * (
            m.experts_per_token * m.intermediate_size + m.shared_expert_intermediate_size)
        # Elementwise traffic per token: 2 RMSNorms (read+write h), rotary on q,k, SiLU*mul
        # (read 2*inter, write inter), 2 residual adds (read 2h, write h), KV-cache write.
        self._ew_bytes_per_tok = (4 * h + 2 * qkv_out + 3 * mlp_ew / tp + 6 * h) * b
        self._ew_kernels = self.params.elementwise_kernels_per_layer
        self._precompute_collectives(b)
        vocab = -(-m.vocab_size // tp)  # vocab-parallel lm_head shard
        self._head = (
            2.0 * h * vocab,  # lm_head FLOPs per sampled row
            h * vocab * b,  # lm_head weight bytes
            (h + vocab) * b,  # lm_head activation bytes per row
            3 * 4 * m.vocab_size,  # sampler: ~3 passes over fp32 logits per row
            2 * h * b,  # embedding gather / final norm bytes per token (read + write)
        )
        # All-gather of the vocab-parallel logits, seconds by sampled rows: the measured NCCL table of this
        # GPU and group size where one ships, else the ring link model (collectives.py)
        self._gather = self.collectives.logits_gather_curve(
            logits_gather_bytes_per_row(m.vocab_size, b)) if tp > 1 else None
        # batch size -> (gemm, elementwise, comm, head) of an all-decode step: every field above
        # is fixed after construction, so these are too (decode_step_times_s)
        self._decode_fixed: dict[int, tuple[float, float, float, float]] = {}
        self._dense = self._dense_pricer()

    def _dense_pricer(self) -> DenseRooflinePricer | None:
        """step_time_s as one compiled call (kernels.DenseRooflinePricer: the reference path's
        floats), or None where the reference path runs: sliding-window layers, an MLA decode table."""
        if self._win_frac or self._mla_decode is not None or self._hybrid is not None or self._cross is not None:
            return None
        f = float
        return DenseRooflinePricer(
            self.model.num_layers, [(f(a), f(b), f(c), f(d), f(e)) for a, b, c, d, e in self._gemms],
            self._m, self._ko, self._moe is not None,
            (f(self._attn_flops_per_pair), self._ac, self._am, self._ao, f(self._kv_bytes_per_tok),
             f(self._q_bytes_per_tok), self._skew_alpha), f(self._ew_bytes_per_tok), self._ew_kernels,
            (f(self._head[0]), f(self._head[1]), f(self._head[2]), f(self._head[3]), f(self._head[4])),
            self._c, self._gather is not None)

    def _precompute_attention(self, b: int) -> None:
        m, tp = self.model, self.tp
        heads = m.heads_per_gpu(tp)
        if m.mla is None:
            self._attn_flops_per_pair = 4.0 * heads * m.head_dim  # QK^T and PV, 2 FLOPs per MAC
        else:  # MLA prefill: QK^T over nope+rope dims, PV over v_head_dim
            self._attn_flops_per_pair = 2.0 * heads * (m.head_dim + m.mla.v_head_dim)
        # K and V (or the MLA latent) of one token in one layer, in the KV-cache format
        self._kv_bytes_per_tok = m.kv_elems_per_token_layer(tp) * m.kv_bytes_per_elem
        self._q_bytes_per_tok = 2 * heads * m.head_dim * b  # read Q, write O
        self._win_frac = m.num_sliding_layers / m.num_layers
        self._mla_decode = mla_decode_grid(m, self.gpu, tp) \
            if self.params.mla_table and m.mla is not None and not self._win_frac else None
        self.attention_source = "roofline" if self._mla_decode is None else \
            "MLA decode: measured (aiconfigurator generation_mla, vLLM 0.14); prefill: roofline"
        # The decodes' imbalance (cost_model/decode_skew.py): the FlashAttention profiles' alpha for
        # standard attention (vLLM's FLASH_ATTN backend); MLA runs other kernels nothing measured.
        if self.params.skew_alpha is not None:
            self._skew_alpha, self.skew_alpha_source = self.params.skew_alpha, GIVEN_SKEW_SOURCE
        elif m.mla is not None:
            self._skew_alpha, self.skew_alpha_source = 0.0, "none: MLA attention, no skew measurement"
        else:
            self._skew_alpha, self.skew_alpha_source = CARRIED_SKEW_ALPHA, CARRIED_SKEW_SOURCE

    @property
    def skew_alpha(self) -> float:
        """The decodes' imbalance factor in use (cost_model/decode_skew.py; skew_alpha_source: whence)."""
        return self._skew_alpha

    def _precompute_collectives(self, b: int) -> None:
        """TP all-reduce per call on the host: its measured tables on vLLM's custom-vs-NCCL path, or its
        bus-bandwidth model (collectives.py; interconnect_efficiency / collective_latency_s ask for it)."""
        lat, eff = self.params.collective_latency_s, self.params.interconnect_efficiency
        self.collectives = Collectives(self.gpu, self.tp, host=self.host,
                                       disable_custom_all_reduce=self.disable_custom_all_reduce,
                                       interconnect_efficiency=eff,
                                       latency_s=lat, use_tables=lat is None and eff is None,
                                       allreduce_profile=self.params.allreduce_profile,
                                       collectives_profile=self.params.collectives_profile)
        self._ar = self.collectives.allreduce_curve
        self._ar_bytes_per_tok = self.model.hidden_size * b  # the residual stream, one row/token

    # ---- hot path -------------------------------------------------------------------------
    def step_time_s(self, shape: StepShape) -> float:
        dense = self._dense
        if dense is None:
            return self.reference_step_time_s(shape)
        new, sampled = shape.num_new_tokens, shape.num_sampled
        experts = comm = gather = 0.0
        if self.tp > 1 or dense.has_moe:  # the parts priced by the model's curves, as _layer_parts
            tokens = sum(new)
            if tokens:
                comm = 2.0 * self._ar(tokens * self._ar_bytes_per_tok) if self.tp > 1 else 0.0
                a2a = 0.0
                if dense.has_moe:
                    experts, a2a = self._moe.parts(tokens, tokens * self._dp)
                comm = comm + a2a
        if self._gather is not None and sampled:
            gather = self._gather(sampled)
        t = dense.step_s(new, shape.num_context_tokens, sampled, experts, comm, gather)
        return t + self._vision.step_s(shape.num_encoder_tokens) if shape.num_encoder_tokens and self._vision else t

    def reference_step_time_s(self, shape: StepShape) -> float:
        """step_time_s in plain Python, every case (the compiled pricer is tested against it).
        Parts are added left to right, never by sum(): Python 3.12's sum() of floats compensates
        rounding, which would part these floats from the bulk prices' (decode_step_times_s)."""
        if self._mla_decode is not None:
            return self._mla_step(shape, None)
        tokens, pairs, kv_tokens, skew_kv = self._work(shape)
        if tokens == 0:
            return 0.0
        gemm, attn, elementwise, comm = self._layer_parts(tokens, pairs, kv_tokens, skew_kv)
        if self._hybrid is not None:
            attn = self._hybrid.layer_attention_s(attn, shape.num_new_tokens, shape.num_context_tokens)
        embed, norm, lm_head, sampler = self._head_parts(tokens, shape.num_sampled)
        t = self.model.num_layers * (gemm + attn + elementwise + comm) + (embed + norm + lm_head + sampler)
        if self._cross is not None:
            t += self._cross.step_s(shape.num_new_tokens, shape.num_encoder_tokens)
        return t + self._vision.step_s(shape.num_encoder_tokens) if shape.num_encoder_tokens and self._vision else t

    def _mla_step(self, shape: StepShape, out: dict | None) -> float:
        """An MLA model with a measured decode table: the decodes' attention is the table's
        (requests, mean context) point, the prefill-like requests' the roofline's (``out``: fill
        the breakdown instead of summing)."""
        tokens, ctx_sum, nd, kd, npf, ptok, pc, cc = batch_sums(shape.num_new_tokens,
                                                                shape.num_context_tokens)
        if tokens == 0:
            return 0.0
        gemm, attn, ew, comm = self._layer_parts(tokens, pc + 0.5 * (cc + ptok), ctx_sum - kd + ptok)
        if not npf:
            attn = 0.0
        if nd:
            mean = kd / nd
            kmax = max_decode_context(shape.num_new_tokens, shape.num_context_tokens, npf) \
                if self._skew_alpha and nd > 1 else 0
            if kmax > mean:  # the decodes' imbalance on the table (cost_model/decode_skew.py)
                t_mean, t_max = self._mla_decode.pair(nd, mean, kmax)
                attn += t_mean + self._skew_alpha * (t_max - t_mean) if t_max > t_mean else t_mean
            else:
                attn += self._mla_decode(nd, mean)
        layers = self.model.num_layers
        head = self._head_parts(tokens, shape.num_sampled)
        if out is not None:
            out.update(zip(("gemm", "attention", "elementwise", "allreduce"),
                           (layers * gemm, layers * attn, layers * ew, layers * comm)))
            out.update(zip(("embedding", "final_norm", "lm_head", "sampler"), head))
        embed, norm, lm_head, sampler = head
        return layers * (gemm + attn + ew + comm) + (embed + norm + lm_head + sampler)

    def decode_step_times_s(self, num_context_tokens: list[int], num_steps: int) -> list[float] | None:
        """A run of plain decode steps (DecodeRunCostModel): with full attention only, an
        all-decode step's work depends on the batch size and the context sum alone, so each step
        costs O(1); the same expressions as step_time_s, hence the same floats."""
        if self._win_frac or self._mla_decode is not None or self._hybrid is not None or self._cross is not None \
                or not num_context_tokens:
            return None  # windowed or hybrid work, or an MLA decode table: step by step
        n = len(num_context_tokens)
        ctx_sum = sum(num_context_tokens)
        num_layers = self.model.num_layers
        # Only attention changes along the run (n is fixed): the other parts are priced once per
        # batch size (a run is priced in chunks, and the next run often has the same n) and each
        # step adds them in _layer_parts' order ((gemm + attn) + elementwise) + comm, the order
        # step_time_s adds them, so every float is bit-identical to step_time_s.
        fixed = self._decode_fixed.get(n)
        if fixed is None:
            gemm, _, elementwise, comm = self._layer_parts(n, 0.0, 0)
            embed, norm, lm_head, sampler = self._head_parts(n, n)
            fixed = self._decode_fixed[n] = (gemm, elementwise, comm, embed + norm + lm_head + sampler)
        gemm, elementwise, comm, head = fixed
        # layer_work for all decodes: pairs = kd + nd + pc + 0.5 * (cc + ptok) with kd = ctx_sum, nd = n
        # and the rest 0, i.e. the int ctx_sum + n as a float; then _layer_parts' max, written out
        # (max(a, b) is a unless b > a): the loop is kernels.decode_step_prices (compiled by make).
        # The skew term's extra KV tokens, n * max - sum, stay fixed: every context grows by one.
        skew_kv = n * max(num_context_tokens) - ctx_sum if self._skew_alpha and n > 1 else 0
        return decode_step_prices(int(ctx_sum), n, num_steps, int(num_layers), gemm, elementwise, comm, head,
                                  self._attn_flops_per_pair, self._ac, self._am, self._ao,
                                  self._kv_bytes_per_tok, n * self._q_bytes_per_tok, self._skew_alpha,
                                  int(skew_kv))

    def verify_step_times_s(self, num_new_tokens: int, num_requests: int, context_sums: list[int]) -> list[float] | None:
        """Steps of num_requests requests computing num_new_tokens (> 1) tokens each and sampling,
        on contexts summing to context_sums[j] (VerifyRunCostModel: speculative decoding's verify
        steps): step_time_s's floats, bit for bit, from the batch size and the context sum alone
        (kernels.DenseRooflinePricer.verify_steps_s); None where step_time_s takes another path."""
        dense = self._dense
        if dense is None or num_new_tokens < 2 or num_requests < 1:
            return None
        tokens = num_requests * num_new_tokens
        experts = comm = gather = 0.0
        if self.tp > 1 or dense.has_moe:  # as step_time_s
            comm = 2.0 * self._ar(tokens * self._ar_bytes_per_tok) if self.tp > 1 else 0.0
            a2a = 0.0
            if dense.has_moe:
                experts, a2a = self._moe.parts(tokens, tokens * self._dp)
            comm = comm + a2a
        if self._gather is not None:
            gather = self._gather(num_requests)
        return dense.verify_steps_s(num_new_tokens, num_requests, context_sums, experts, comm, gather)

    def _work(self, shape: StepShape) -> tuple[int, float, float, float]:
        """(tokens, query-key pairs, KV tokens read, skew KV tokens) of an average layer (roofline_work.py;
        a hybrid model's: of an attention layer, roofline_hybrid.py)."""
        if self._hybrid is not None:
            return self._hybrid.work(shape.num_new_tokens, shape.num_context_tokens, self._skew_alpha)
        return layer_work(shape.num_new_tokens, shape.num_context_tokens, self._skew_alpha, self._win_frac,
                          self.model.sliding_window)

    def _layer_parts(self, tokens: int, pairs: float, kv_tokens: int, skew_kv: float = 0
                     ) -> tuple[float, float, float, float]:
        """Seconds of one layer: (GEMMs, attention, elementwise, all-reduce). Attention includes
        the decodes' imbalance: alpha of the way to the same attention with skew_kv more query-key
        pairs and KV tokens (the decodes all at the longest decode's context; decode_skew.py)."""
        m, ko = self._m, self._ko
        gemm = 0.0
        for flops, wbytes, abytes, c, frac in self._gemms:
            gemm += frac * (max(tokens * flops * c, (wbytes + tokens * abytes) * m) + ko)
        moe = self._moe
        if moe is not None:
            experts, a2a = moe.parts(tokens, tokens * self._dp)  # balanced DP: N x own tokens
            gemm += experts
        else:
            a2a = 0.0
        attn = max(pairs * self._attn_flops_per_pair * self._ac,
                   (kv_tokens * self._kv_bytes_per_tok + tokens * self._q_bytes_per_tok) * self._am)
        attn += self._ao
        if skew_kv:
            t_max = max((pairs + skew_kv) * self._attn_flops_per_pair * self._ac,
                        ((kv_tokens + skew_kv) * self._kv_bytes_per_tok + tokens * self._q_bytes_per_tok)
                        * self._am) + self._ao
            attn += self._skew_alpha * (t_max - attn)
        elementwise = tokens * self._ew_bytes_per_tok * m + self._ew_kernels * ko
        comm = 2.0 * self._ar(tokens * self._ar_bytes_per_tok) if self.tp > 1 else 0.0
        return gemm, attn, elementwise, comm + a2a

    def _head_parts(self, tokens: int, sampled: int) -> tuple[float, float, float, float]:
        """Seconds outside the layers: (embedding, final norm, lm_head, sampler)."""
        flops, wbytes, rbytes, sbytes, tbytes = self._head
        m, ko = self._m, self._ko
        embed = tokens * tbytes * m + ko
        norm = tokens * tbytes * m + ko
        if sampled == 0:
            return embed, norm, 0.0, 0.0
        lm_head = max(sampled * flops * self._c, (wbytes + sampled * rbytes) * m) + ko
        if self._gather is not None:  # gather the vocab-parallel logits
            lm_head += self._gather(sampled)
        sampler = sampled * sbytes * m + 2 * ko
        return embed, norm, lm_head, sampler

    def wave_correction_s(self, num_tokens: int, wave_tokens: int) -> float:
        """Seconds to add to ``step_time_s`` of a step of ``num_tokens`` tokens on one DP rank of a
        lockstep wave whose MoE layers hold ``wave_tokens`` tokens in all (WaveCostModel):
        step_time_s alone assumes balanced ranks, ``data_parallel_size x num_tokens``."""
        if self._dp == 1 or self._moe is None:
            return 0.0
        return self.model.num_layers * self._moe.wave_delta_s(num_tokens, wave_tokens, num_tokens * self._dp)

    def measured_tables(self) -> list[MeasuredTable]:
        """The measured tables this model prices with, each with the engine version it was
        measured on (table_versions.py): MoE kernels, MLA decode, DeepEP, TP collectives."""
        out = []
        if self._moe is not None and self._moe.engine_version is not None:
            out.append(MeasuredTable(f"MoE experts ({self.moe_source})", self._moe.engine_version))
        if self._mla_decode is not None:
            out.append(MeasuredTable("MLA decode attention (aiconfigurator generation_mla)",
                                     table_engine_version("mla_tables.json.gz", self.gpu.name) or "unknown"))
        if ": measured (aiconfigurator" in self.moe_comm_source:  # moe_comm's DeepEP table source
            out.append(MeasuredTable(f"MoE dispatch/combine ({self.moe_comm_source})",
                                     table_engine_version("deepep_tables.json.gz", self.gpu.name) or "unknown"))
        version = sources_engine_version(table_sources(self.gpu))
        if self.tp > 1 and self.collectives.source.custom_allreduce_max_bytes and version is not None:
            out.append(MeasuredTable(f"vLLM custom all-reduce ({self.gpu.name} tables)", version))
        return out

    # ---- per-op access (the `profiled` fitter fills the ops it did not measure with these) ---
    def op_time_s(self, op: str, count: float) -> float:
        """Seconds of one op: per layer for layer ops (``count`` = tokens), per step for
        embedding/final_norm (tokens) and lm_head/sampler (rows), one call for allreduce
        (``count`` = message bytes)."""
        if op in _DENSE_GEMMS[:2] or (op in _DENSE_GEMMS and not self.model.is_moe):
            flops, wbytes, abytes, c, _ = self._gemms[_DENSE_GEMMS.index(op)]
            return max(count * flops * c, (wbytes + count * abytes) * self._m) + self._ko
        if op == "moe":  # everything but the attention projections: router, experts, dense MLPs
            gemm, _, _, _ = self._layer_parts(count, 0.0, 0)
            return gemm - sum(self.op_time_s(g, count) for g in _DENSE_GEMMS[:2])
        if op == "elementwise":
            return count * self._ew_bytes_per_tok * self._m + self._ew_kernels * self._ko
        if op == "allreduce":
            return self._ar(count) if self.tp > 1 else 0.0
        if op in _HEAD_OPS:
            parts = self._head_parts(count, count) if op in ("lm_head", "sampler") else \
                self._head_parts(count, 0)
            return parts[_HEAD_OPS.index(op)]
        raise KeyError(op)

    def attention_coefficients(self) -> dict[str, float]:
        """The roofline attention of one layer as coefficients (serialised by `profiled`)."""
        return {"s_per_pair": self._attn_flops_per_pair * self._ac,
                "s_per_kv_token": self._kv_bytes_per_tok * self._am,
                "s_per_q_token": self._q_bytes_per_tok * self._am, "overhead_s": self._ao}

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per component for the whole step (sums to :meth:`step_time_s`)."""
        if self._mla_decode is not None:
            out: dict[str, float] = {}
            self._mla_step(shape, out)
            return out
        tokens, pairs, kv_tokens, skew_kv = self._work(shape)
        if tokens == 0:
            return {}
        gemm, attn, ew, comm = self._layer_parts(tokens, pairs, kv_tokens, skew_kv)
        if self._hybrid is not None:
            attn = self._hybrid.layer_attention_s(attn, shape.num_new_tokens, shape.num_context_tokens)
        out = {name: self.model.num_layers * v for name, v in zip(
            ("gemm", "attention", "elementwise", "allreduce"), (gemm, attn, ew, comm))}
        out.update(zip(_HEAD_OPS, self._head_parts(tokens, shape.num_sampled)))
        if self._cross is not None:
            out["cross_attention"] = self._cross.step_s(shape.num_new_tokens, shape.num_encoder_tokens)
        if shape.num_encoder_tokens and self._vision:
            out["vision_encoder"] = self._vision.step_s(shape.num_encoder_tokens)
        return out
