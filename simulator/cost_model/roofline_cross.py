"""The roofline's cross-attention: an encoder-decoder model's decoder layers (Whisper) reading the
encoder's states.

Each decoder layer has, besides its self-attention (priced as any model's), a cross-attention
block (vLLM 0.19.1 models/whisper.py WhisperCrossAttention):

* q and o projections of the step's decoder tokens: 2 h q FLOPs each per token (q = heads x
  head_dim), weights read once per step;
* k and v projections of the encoder states, once, in the step that runs the request's encoder
  (its first decoder step): 2 h kv FLOPs each per encoder state, the states written to the cross
  KV cache;
* attention over the encoder's states: every decoder token sees all of them (no mask), 4 E d FLOPs
  per head (QK^T and PV) with E the encoder length, and each request reads its E cached K and V
  once per layer.

E is the model's encoder length (Whisper: max_source_positions, 1500; its feature extractor pads
every input to 30 s, so every request's encoder holds exactly that many states). Each part costs
``max(FLOPs x s/FLOP, bytes x s/byte) + a kernel overhead``, at the rates the roofline's own
GEMMs and attention use; the step pays num_layers of them. No measured table in ../shared covers
cross-attention, so this is roofline only.
"""

from __future__ import annotations

from servesim.simulator.specs.model_spec import ModelSpec


class CrossAttentionCost:
    """Seconds a step spends in the cross-attention blocks of every decoder layer."""

    __slots__ = ("_layers", "_enc_len", "_qo_w", "_kv_w", "_pair", "_kv_tok", "_q_tok", "_h", "_b", "_wb",
                 "_c", "_m", "_ac", "_am", "_ko", "_ao")

    def __init__(self, model: ModelSpec, tp: int, rates: tuple[float, float, float, float, float, float],
                 dtype_bytes: int, weight_bytes: float) -> None:
        assert model.vision is not None and model.cross_attention  # ModelSpec checks both
        self._layers = model.num_layers
        self._enc_len = model.vision.max_tokens_per_item
        h, heads, kv_heads = model.hidden_size, model.heads_per_gpu(tp), model.kv_heads_per_gpu(tp)
        q, kv = heads * model.head_dim, kv_heads * model.head_dim  # per GPU
        self._h, self._b, self._wb = h, dtype_bytes, weight_bytes
        self._qo_w = 2.0 * h * q  # q and o weight elements on one GPU
        self._kv_w = 2.0 * h * kv  # k and v
        self._pair = 4.0 * heads * model.head_dim  # FLOPs per (query, key) pair: QK^T and PV
        self._kv_tok = 2.0 * kv * dtype_bytes  # cached K and V of one encoder state
        self._q_tok = 2.0 * q * dtype_bytes  # a query read and its output written
        self._c, self._m, self._ac, self._am, self._ko, self._ao = rates

    def step_s(self, num_new_tokens: tuple[int, ...], num_encoder_tokens: tuple[int, ...]) -> float:
        n = sum(num_new_tokens)
        if n == 0:
            return 0.0
        h, b, m, c = self._h, self._b, self._m, self._c
        qo = max(2.0 * n * self._qo_w * c, (self._qo_w * self._wb + n * 2.0 * (h + self._qo_w / (2 * h)) * b) * m) \
            + 2 * self._ko
        enc = self._enc_len
        attn = max(n * enc * self._pair * self._ac,
                   (len(num_new_tokens) * enc * self._kv_tok + n * self._q_tok) * self._am) + self._ao
        layer = qo + attn
        e = sum(num_encoder_tokens)
        if e:  # the new requests' encoder states projected to K and V and written to the cross cache
            layer += max(2.0 * e * self._kv_w * c, (self._kv_w * self._wb + e * (h * b + self._kv_tok)) * m) \
                + 2 * self._ko
        return self._layers * layer
