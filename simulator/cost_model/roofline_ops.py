"""The roofline's per-op prices and breakdown (mixed into RooflineCostModel, roofline.py).

Not on the stepping path: the `profiled` fitter fills the ops it did not measure with op_time_s
and attention_coefficients; breakdown splits one step's time by component (reports, tests).
"""

from __future__ import annotations

from .base import StepShape

_DENSE_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
_HEAD_OPS = ("embedding", "final_norm", "lm_head", "sampler")


class RooflineOpsMixin:
    """RooflineCostModel's per-op access; the state is the model's own (its __slots__)."""

    __slots__ = ()

    # ---- per-op access (the `profiled` fitter fills unmeasured ops with these) ---------------
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

    # ---- introspection --------------------------------------------------------------------
    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per component for the whole step (sums to :meth:`step_time_s`)."""
        if self._mla_decode is not None:
            out: dict[str, float] = {}
            self._mla_step(shape, out)
            return out
        tokens, pairs, kv_tokens = self._work(shape.num_new_tokens, shape.num_context_tokens)
        if tokens == 0:
            return {}
        parts = self._layer_parts(tokens, pairs, kv_tokens)
        layers = self.model.num_layers
        out = {name: layers * v for name, v in zip(("gemm", "attention", "elementwise",
                                                      "allreduce"), parts)}
        out.update(zip(("embedding", "final_norm", "lm_head", "sampler"),
                       self._head_parts(tokens, shape.num_sampled)))
        return out
