"""The roofline's hybrid layers: recurrent mixers (Gated DeltaNet, Mamba2, Mamba1), chunked local
attention, and layers without attention (Nemotron-H's MLP-only layers).

A hybrid step is priced as the roofline prices every model, ``num_layers`` x the average layer, with
the average taken over the layer kinds (specs/layer_kinds.py):

* attention (full, sliding-window and chunked layers, ``attn_frac`` of the layers): the roofline's
  attention of one attention layer, its work blended over the three kinds; a chunked layer's query
  at position p sees the keys of its own chunk, ``p mod C + 1`` of them (vLLM's
  ChunkedLocalAttention, C = attention_chunk_size);
* recurrent mixers (``lin_frac``): their projections are GEMMs (:meth:`HybridLayers.gemms`); the
  conv1d and the recurrence are priced here, each ``max(FLOPs / compute, bytes / bandwidth)``
  at the attention efficiencies, plus a kernel overhead per kernel (conv1d, recurrence or scan,
  gated norm). The counts per token and head (P value dim, N state dim, C the kernel's chunk):

  - one decode token, GDN: 6 N P (q S, the delta S k, the rank-1 update); Mamba2: 4 N P (the state
    update and y = C h); Mamba1: 6 N per channel; each request reads and writes its state once;
  - a prefill chunk, GDN (FLA's chunk_gated_delta_rule, the WY form, C = 64 as vLLM's
    fla/ops/chunk.py): 6 C N + 4 C P + C^2/3 + 6 N P per token (K K^T, the triangular solve,
    W and U, Q K^T and its product with V, the inter-chunk state read, update and output), and the
    chunk states it writes (N P per C tokens); Mamba2 (the SSD algorithm, C = the config's
    chunk_size): 2 C P + 4 N P + 2 C N G / H per token; Mamba1's selective scan: 6 N per channel;
  - the conv1d: 2 K FLOPs per channel and token, its state (K - 1 columns) read and written per request.

Where the counts come from: Yang, Kautz, Hatamizadeh, "Gated Delta Networks" (arXiv:2412.06464,
section 3, the chunkwise WY algorithm); Dao and Gu, "Transformers are SSMs" (arXiv:2405.21060,
section 6, SSD's four steps); Gu and Dao, "Mamba" (arXiv:2312.00752, the selective scan); counted
as multiply-adds x 2. No measured table in ../shared holds these ops (its README: GDN / Mamba2
tables left out), so they are roofline only.
"""

from __future__ import annotations

from servesim.simulator.specs.layer_kinds import LinearAttentionSpec
from servesim.simulator.specs.model_spec import ModelSpec

from .roofline_work import layer_work

_MIXER_KERNELS = 3  # conv1d, the recurrence (or scan), the gated norm


def chunked_work(chunk: int, new: tuple[int, ...], ctx: tuple[int, ...]) -> tuple[float, int]:
    """(query-key pairs, KV tokens read) of chunked local attention with chunks of ``chunk``
    tokens: a query at position p sees p mod chunk + 1 keys; a request reads its current
    chunk's cached keys (c mod chunk) and its new ones."""
    half = chunk * (chunk + 1) // 2

    def seen(x: int) -> int:  # keys seen by the queries at positions 0 .. x-1
        q, r = divmod(x, chunk)
        return q * half + r * (r + 1) // 2

    pairs = kv = 0
    for n, c in zip(new, ctx):
        pairs += seen(c + n) - seen(c)
        kv += c % chunk + n
    return float(pairs), kv


class HybridLayers:
    """What a hybrid model's layers add to and take from the roofline's average layer."""

    __slots__ = ("attn_frac", "lin_frac", "win_frac", "chunk_frac", "window", "chunk", "lin", "tp",
                 "_ac", "_am", "_ko", "_b", "_state_b", "_conv_state_bytes", "_ssm_state_bytes")

    def __init__(self, model: ModelSpec, tp: int, ac: float, am: float, ko: float) -> None:
        layers = model.num_layers
        attn = model.num_attention_layers
        self.attn_frac = attn / layers
        self.lin_frac = model.count_layers("mamba") / layers
        self.win_frac = model.num_sliding_layers / attn
        self.chunk_frac = model.count_layers("chunked_local") / attn
        self.window, self.chunk = model.sliding_window, model.attention_chunk_size
        self.lin: LinearAttentionSpec | None = model.linear_attention
        self.tp, self._ac, self._am, self._ko, self._b = tp, ac, am, ko, model.dtype_bytes
        self._conv_state_bytes = self._ssm_state_bytes = self._state_b = 0
        if self.lin is not None:
            conv, temporal = self.lin.state_shapes(tp)
            cb, tb = self.lin.state_dtype_bytes(model.dtype_bytes)
            self._conv_state_bytes = conv[0] * conv[1] * cb
            self._ssm_state_bytes = temporal[0] * temporal[1] * (temporal[2] if len(temporal) > 2 else 1) * tb
            self._state_b = tb

    def gemms(self, hidden: int, c_lin: float, wb: float) -> list[tuple[float, float, float, float, float]]:
        """The mixers' projections as the roofline's GEMM tuples (FLOPs per token, weight bytes,
        activation bytes per token, s/FLOP, fraction of layers)."""
        if self.lin is None:
            return []
        proj_in, proj_out, _ = self.lin.weight_elems(hidden, self.tp)
        b = self._b
        return [(2.0 * proj_in, proj_in * wb, (hidden + proj_in // hidden) * b, c_lin, self.lin_frac),
                (2.0 * proj_out, proj_out * wb, (proj_out // hidden + hidden) * b, c_lin, self.lin_frac)]

    def work(self, new: tuple[int, ...], ctx: tuple[int, ...], skew_alpha: float) -> tuple[int, float, float, float]:
        """(tokens, pairs, KV tokens, skew KV tokens) of one attention layer, blended over its kinds."""
        tokens, pairs, kv, skew = layer_work(new, ctx, skew_alpha, self.win_frac, self.window)
        f = self.chunk_frac
        if f:
            assert self.chunk is not None  # chunked layers have a chunk (ModelSpec)
            cpairs, ckv = chunked_work(self.chunk, new, ctx)
            pairs, kv, skew = f * cpairs + (1.0 - f) * pairs, f * ckv + (1.0 - f) * kv, (1.0 - f) * skew
        return tokens, pairs, kv, skew

    def layer_attention_s(self, attn_s: float, new: tuple[int, ...], ctx: tuple[int, ...]) -> float:
        """The average layer's token mixing: attention in attn_frac of the layers, the recurrent
        mixer in lin_frac of them."""
        out = self.attn_frac * attn_s
        if self.lin_frac and new:
            out += self.lin_frac * self.mixer_s(new)
        return out

    def mixer_s(self, new: tuple[int, ...]) -> float:
        """Seconds of one recurrent-mixer layer (conv1d + recurrence) for the step's requests."""
        lin = self.lin
        assert lin is not None
        tokens, requests = sum(new), len(new)
        heads, p, n = lin.num_heads // self.tp, lin.head_dim, lin.state_size
        channels = lin.conv_dim // self.tp
        flops = 2.0 * lin.conv_kernel * channels * tokens
        # every request reads and writes its conv and temporal state once; activations in and out
        nbytes = 2.0 * requests * (self._conv_state_bytes + self._ssm_state_bytes) + 4.0 * tokens * channels * self._b
        decodes = new.count(1)
        prefill = tokens - decodes
        if lin.mamba_type == "gdn_attention":
            c = lin.chunk_size
            flops += heads * (6.0 * n * p * decodes + prefill * (6.0 * c * n + 4.0 * c * p + c * c / 3.0 + 6.0 * n * p))
            nbytes += heads * n * p * self._state_b * prefill / c  # the chunk states FLA writes
        elif lin.mamba_type == "mamba2":
            c, g = lin.chunk_size, lin.n_groups
            flops += heads * (4.0 * n * p * decodes + prefill * (2.0 * c * p + 4.0 * n * p + 2.0 * c * n * g / lin.num_heads))
        else:  # mamba1: channels x state, no chunks
            flops += 6.0 * n * (lin.intermediate_size // self.tp) * tokens
        return max(flops * self._ac, nbytes * self._am) + _MIXER_KERNELS * self._ko
