"""The ``profiled`` cost model: step time from per-op tables fitted to real measurements.

Step time = num_layers * (dense ops at the step's token count + attention for the step's exact
composition + 2 all-reduces) + embedding/final-norm (tokens) + lm_head/sampler (sampled rows), and
under TP the logits all-gather (sampled rows) where the lm_head is a bare GEMM (see
:func:`_logits_gather_rows`).
The tables are produced by :func:`simulator.cost_model.fit.fit` and stored as one JSON file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from servesim.traces.errors import InputError

from ..specs import default_host, host_for, resolve_gpu, resolve_model
from .base import StepShape, batch_sums, check_params, register_cost_model
from .collectives import Collectives, logits_gather_bytes_per_row
from .cudagraph import check_capture_sizes, padded_tokens
from .decode_skew import (CARRIED_SKEW_ALPHA, CARRIED_SKEW_SOURCE, GIVEN_SKEW_SOURCE, MEASURED_SKEW_SOURCE,
                          NO_SKEW_SOURCE, check_skew_alpha, max_decode_context)
from .interp import Curve, NestedGrid

FORMAT = "servesim-profiled-cost-model"
VERSION = 1


class FittedCostModel:
    """Evaluates a fitted profile; construct with :meth:`load` or from :func:`fit`."""

    __slots__ = ("name", "data", "model", "gpu", "tp", "_layers", "_dense", "_tok", "_rows",
                 "_ar", "_ar_bytes_per_tok", "_attn_kind", "_attn", "_attn_decode", "_prefix_axis",
                 "_coef", "_skew_alpha", "_graph_sizes", "logits_gather_source", "allreduce_source",
                 "host", "skew_alpha_source")

    def __init__(self, data: dict[str, Any], *, host: Any = None, disable_custom_all_reduce: bool = False,
                 collectives_profile: str | Path | None = None) -> None:
        """``host`` (default: the GPU's default host), ``disable_custom_all_reduce`` and
        ``collectives_profile`` (this host's measured collectives) price the TP collectives the
        fit did not measure on the run's host (:func:`_allreduce_curve`)."""
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise InputError(f"not a {FORMAT} v{VERSION} file", field="format")
        self.name = "profiled"
        self.data = data
        self.model, self.gpu, self.tp = data["model"], data["gpu"], int(data["tp"])
        self._layers = int(data["num_layers"])
        self._ar_bytes_per_tok = int(data["hidden_size"]) * int(data["dtype_bytes"])
        ops = data.get("ops", {})
        self._dense = self._combine(ops, "layer")
        self._tok = self._combine(ops, "tokens")
        self._rows = self._combine(ops, "rows")
        self.host = host_for(data["gpu"], host).name
        group = Collectives(data["gpu"], self.tp, host=host, disable_custom_all_reduce=disable_custom_all_reduce,
                            collectives_profile=collectives_profile) if self.tp > 1 else None
        gather, self.logits_gather_source = _logits_gather_rows(data, group)
        if gather is not None:  # folded into the rows curve: still one lookup per step
            self._rows = gather if self._rows is None else Curve.combine([self._rows, gather], [1, 1])
        own_figures = group is not None and (disable_custom_all_reduce or collectives_profile is not None
                                             or self.host != default_host(data["gpu"]).name)
        self._ar, self.allreduce_source = _allreduce_curve(data, group if own_figures else None)
        self._coef = data.get("step_regression")
        self._graph_sizes: tuple[int, ...] = ()  # vLLM CUDA-graph capture sizes; () = no padding
        self._load_attention(data.get("attention") or {"kind": "none"})

    @staticmethod
    def _combine(ops: dict, scope: str) -> Curve | None:
        chosen = [(Curve.from_dict(o["curve"]), o["calls"]) for o in ops.values()
                  if o["scope"] == scope]
        if not chosen:
            return None
        return Curve.combine([c for c, _ in chosen], [w for _, w in chosen])

    def _load_attention(self, attn: dict) -> None:
        self._attn_kind = attn["kind"]
        self._attn = self._attn_decode = None
        self._prefix_axis = False
        if self._attn_kind == "mixed":
            self._attn = NestedGrid.from_dict(attn["grid"])
        elif self._attn_kind == "split":
            if attn.get("prefill"):
                self._attn = NestedGrid.from_dict(attn["prefill"])
                self._prefix_axis = bool(attn.get("prefill_has_prefix"))
            if attn.get("decode"):
                self._attn_decode = NestedGrid.from_dict(attn["decode"])
        elif self._attn_kind == "roofline":
            c = attn["coefficients"]
            self._attn = (c["s_per_pair"], c["s_per_kv_token"], c["s_per_q_token"], c["overhead_s"])
        elif self._attn_kind != "none":
            raise InputError(f"unknown attention kind {self._attn_kind!r}", field="attention")
        self._skew_alpha, self.skew_alpha_source = self._default_skew_alpha(attn.get("skew_alpha"))

    def _prices_decode_attention(self) -> bool:
        return self._coef is None and (self._attn_kind in ("mixed", "roofline") or self._attn_decode is not None)

    def _default_skew_alpha(self, measured: Any) -> tuple[float, str]:
        """The decode-skew factor and its source (cost_model/decode_skew.py): the profile's own
        measurement (a mixed table whose profiler ran the skew sweep), else the one carried from the
        vLLM FlashAttention profiles where this fit's attention is vLLM's, else none."""
        if not self._prices_decode_attention():
            return 0.0, "none: this fit prices no decode attention"
        if measured is not None and self._attn_kind == "mixed":
            return check_skew_alpha(measured), MEASURED_SKEW_SOURCE
        if any(str(f).startswith("vllm") for f in self.metadata.get("frameworks", ())):
            return CARRIED_SKEW_ALPHA, CARRIED_SKEW_SOURCE
        return 0.0, NO_SKEW_SOURCE

    @property
    def skew_alpha(self) -> float:
        return self._skew_alpha

    def set_skew_alpha(self, alpha: float) -> None:
        """Override the decode-skew factor (0 disables the term); a fit that prices decode
        attention only (a mixed table, a split table with decode rows, roofline attention)."""
        value = check_skew_alpha(alpha)
        if value and not self._prices_decode_attention():
            raise InputError("skew_alpha applies to a fit that prices decode attention (a mixed table, a "
                             "split table with decode rows, or roofline attention); this model's attention "
                             f"is '{self._attn_kind}'" + (" without decode rows" if self._attn_kind == "split" else ""),
                             field="skew_alpha")
        self._skew_alpha, self.skew_alpha_source = value, GIVEN_SKEW_SOURCE

    @property
    def cudagraph_capture_sizes(self) -> tuple[int, ...]:
        return self._graph_sizes

    def set_cudagraph_sizes(self, sizes) -> None:
        """Pad each step's token count to vLLM's next CUDA-graph capture size for the
        token-parallel ops (cost_model/cudagraph.py); empty or None turns padding off."""
        self._graph_sizes = check_capture_sizes(sizes)

    # ---- hot path -------------------------------------------------------------------------
    def step_time_s(self, shape: StepShape) -> float:
        new, ctx = shape.num_new_tokens, shape.num_context_tokens
        tokens, ctx_sum, nd, kd, npf, ptok, pc, cc = batch_sums(new, ctx)
        if tokens == 0:
            return 0.0
        # the longest decode's context, for the imbalance term (0: no term this step)
        kmax = max_decode_context(new, ctx, npf) if self._skew_alpha and nd > 1 else 0
        return self._price_s(tokens, ctx_sum, nd, kd, npf, ptok, pc, cc, kmax, shape.num_sampled)

    def decode_step_times_s(self, num_context_tokens: list[int], num_steps: int) -> list[float] | None:
        """A run of plain decode steps (DecodeRunCostModel): every context grows by one a step,
        so the step's sums and its longest context follow from the first step's without building
        a shape; the same _price_s call as step_time_s, hence the same floats."""
        n = len(num_context_tokens)
        if not n:
            return None
        ctx_sum = sum(num_context_tokens)
        skew = bool(self._skew_alpha) and n > 1
        kmax = max(num_context_tokens) if skew else 0
        price = self._price_s
        return [price(n, ctx_sum + n * j, n, ctx_sum + n * j, 0, 0, 0, 0, kmax + j if skew else 0, n)
                for j in range(num_steps)]

    def _price_s(self, tokens: int, ctx_sum: int, nd: int, kd: int, npf: int, ptok: int, pc: int, cc: int,
                 kmax: int, num_sampled: int) -> float:
        """Seconds of a step from batch_sums' statistics, the longest decode context (0: no
        imbalance term) and the sampled rows."""
        if self._coef is not None:
            return self._step_regression(npf, ptok, pc, cc, nd, kd)
        if self._attn_kind == "mixed":
            layer = self._mixed_attention_s(npf, pc, cc, nd, kd, kmax)
        else:
            layer = self._attention_s(npf, ptok, pc, cc, nd, kd, tokens, ctx_sum, kmax)
        # GEMMs, norms, activation and all-reduce run on the graph's padded batch; attention and
        # the sampled rows only on the real requests.
        graph = padded_tokens(self._graph_sizes, tokens) if self._graph_sizes else tokens
        if self._dense is not None:
            layer += self._dense(graph)
        if self._ar is not None:
            layer += 2.0 * self._ar(graph * self._ar_bytes_per_tok)
        total = self._layers * layer
        if self._tok is not None:
            total += self._tok(graph)
        if num_sampled and self._rows is not None:
            total += self._rows(num_sampled)
        return total

    def _attention_s(self, npf: int, ptok: int, pc: int, cc: int, nd: int, kd: int,
                     tokens: int, ctx_sum: int, kmax: int) -> float:
        """Attention on a split table or the roofline coefficients; the decodes' imbalance term
        (cost_model/decode_skew.py) is alpha of the way from the decodes at their mean context
        to the decodes all at the longest decode's context, kmax (0: no term)."""
        kind = self._attn_kind
        if kind == "split":
            t = 0.0
            if npf and self._attn is not None:
                if self._prefix_axis:
                    chunk = math.sqrt(cc)
                    t += self._attn(1, chunk, pc / chunk)
                else:  # table without cached prefixes: npf sequences of equal causal work
                    work = pc + 0.5 * (cc + ptok)
                    t += self._attn(npf, math.sqrt(2.0 * work / npf), 0)
            if nd and self._attn_decode is not None:
                mean = kd / nd
                if kmax > mean:  # unequal contexts (all equal: the table point itself)
                    t_mean, t_max = self._attn_decode.pair(nd, mean, kmax)
                    t += t_mean + self._skew_alpha * (t_max - t_mean) if t_max > t_mean else t_mean
                else:
                    t += self._attn_decode(nd, mean)
            return t
        if kind == "roofline":
            spp, spk, spq, overhead = self._attn
            pairs = pc + 0.5 * (cc + ptok) + kd + nd
            kv = ctx_sum + tokens
            t = max(pairs * spp, kv * spk + tokens * spq) + overhead
            extra = nd * kmax - kd  # the decodes at the longest decode's context read more
            if kmax and extra > 0:
                t_max = max((pairs + extra) * spp, (kv + extra) * spk + tokens * spq) + overhead
                t += self._skew_alpha * (t_max - t)
            return t
        return 0.0

    def _mixed_attention_s(self, npf: int, pc: int, cc: int, nd: int, kd: int, kmax: int) -> float:
        """Attention on the mixed table, with the decode-skew term (cost_model/decode_skew.py).

        All prefill-like requests become one equivalent chunk that keeps the quadratic work
        (chunk^2 summed) and the chunk x prefix work of the real batch; the decodes are looked up
        at their mean context, which keeps the total KV read. The table holds decodes of one
        shared context; a real batch of unequal contexts runs longer (tile padding, SMs waiting
        for the longest sequence), and a profile's skew sweep measured how far the time moves
        from the mean-context point toward the max-context point: alpha of the way (this
        profile's own alpha where it ran the sweep, else the carried one).
        """
        chunk = math.sqrt(cc) if npf else 0.0
        prefix = pc / chunk if npf else 0.0
        mean = kd / nd if nd else 0.0
        if kmax > mean:  # unequal contexts (kmax 0: no term; all equal: the table point itself)
            t_mean, t_max = self._attn.pair(chunk, prefix, nd, mean, kmax)
            return t_mean + self._skew_alpha * (t_max - t_mean) if t_max > t_mean else t_mean
        return self._attn(chunk, prefix, nd, mean)

    def _step_regression(self, npf: int, ptok: int, pc: int, cc: int, nd: int, kd: int) -> float:
        pre, dec = self._coef.get("prefill"), self._coef.get("decode")
        t = 0.0
        if npf and pre:
            t += pre[0] + pre[1] * ptok + pre[2] * (pc + 0.5 * (cc + ptok))
        if nd and dec:
            t += dec[0] + dec[1] * nd + dec[2] * (kd + nd)
        if npf and nd and pre and dec:
            t -= min(pre[0], dec[0])  # one forward pass: the fixed cost is paid once
        return t

    # ---- persistence ----------------------------------------------------------------------
    @property
    def metadata(self) -> dict:
        return self.data.get("metadata", {})

    @property
    def fit_error(self) -> dict:
        """Per op: origin, number of points, MAPE on the profile rows and on held-out points."""
        return self.metadata.get("fit_error", {})

    def save(self, path: str | Path) -> None:
        """Write atomically: a temp file in the same folder, then rename over the target."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.data, fh, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path, **host: Any) -> "FittedCostModel":
        """The fitted file at ``path``; ``host`` keywords as the constructor takes them."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"cannot read fitted cost model: {exc}", path=str(path)) from None
        try:
            return cls(data, **host)
        except InputError as exc:
            if exc.path is not None:  # another file's error (a collectives_profile): as it was
                raise
            raise InputError(exc.detail, path=str(path), field=exc.field, allowed=exc.allowed) from None
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed fitted cost model ({exc!r})", path=str(path)) from None


def _logits_gather_rows(data: dict[str, Any], group: Collectives | None) -> tuple[Curve | None, str]:
    """(seconds of the TP logits all-gather by sampled rows, or None; where it comes from).

    Priced at load time from the host's collectives (``group``, collectives.py), so fitted files
    need no refit. Added only where the fitted lm_head is a GEMM-kernel lookup (origin "gemm
    kernels", aiconfigurator): a roofline-filled lm_head already holds the roofline's gather, and a
    measured one (LLMServingSim's vLLM profiler times vLLM's LogitsProcessor module) the real gather."""
    origin = data.get("metadata", {}).get("fit_error", {}).get("lm_head", {}).get("origin", "")
    if group is None or not origin.startswith("gemm kernels"):
        return None, "none" if group is None else f"in the lm_head ({origin or 'no lm_head op'})"
    vocab = data.get("vocab_size") or resolve_model(data["model"]).vocab_size
    curve = group.logits_gather_curve(logits_gather_bytes_per_row(int(vocab), int(data["dtype_bytes"])))
    return curve, group.source.allgather


def _allreduce_curve(data: dict[str, Any], group: Collectives | None) -> tuple[Curve | None, str]:
    """(the TP all-reduce per call by bytes, or None at TP 1; where it comes from).

    The fitted file's curve (measured, or filled from the GPU's default host's tables when the
    profile had no all-reduce rows: ``fit_error.allreduce``) holds for runs on that host with
    vLLM's custom all-reduce as it was measured. ``group`` is given when the run differs (another
    host, ``disable_custom_all_reduce``, a ``collectives_profile``): its all-reduce, on vLLM's path
    there, replaces the file's."""
    if not data.get("allreduce"):
        return None, "none (one GPU)"
    if group is not None:
        return group.allreduce_curve, group.source.allreduce
    err = data.get("metadata", {}).get("fit_error", {}).get("allreduce", {})
    origin = err.get("origin", "measured")
    return Curve.from_dict(data["allreduce"]["curve"]), \
        f"fitted file ({origin}" + (f": {err['source']})" if err.get("source") else ")")


@register_cost_model("profiled")
def make_profiled(model: Any = None, gpu: Any = None, tp: int | None = None,
                  path: str | Path | None = None, host: Any = None, disable_custom_all_reduce: bool = False,
                  **params: Any) -> FittedCostModel:
    """Load a fitted file; model/gpu/tp, when given, must match what it was fitted for.
    ``collectives_profile=`` (this host's measured collectives) prices its TP collectives."""
    check_params("profiled", params, {"skew_alpha", "cudagraph_capture_sizes", "collectives_profile"})
    if path is None:
        raise InputError("the profiled cost model needs path=<fitted .json from `servesim fit`>",
                         field="path")
    fitted = FittedCostModel.load(path, host=host, disable_custom_all_reduce=disable_custom_all_reduce,
                                  collectives_profile=params.get("collectives_profile"))
    wanted = {"model": model and resolve_model(model).name, "gpu": gpu and resolve_gpu(gpu).name,
              "tp": tp}
    for key, value in wanted.items():
        have = getattr(fitted, key)
        if value is not None and value != have:
            raise InputError(f"fitted for {key}={have}, but {key}={value} was requested",
                             path=str(path), field=key)
    if params.get("skew_alpha") is not None:
        fitted.set_skew_alpha(params["skew_alpha"])
    fitted.set_cudagraph_sizes(params.get("cudagraph_capture_sizes"))
    return fitted
