"""Llama-style decoder over the paged-attention ops.

embedding -> N x [RMSNorm -> QKV (-> per-head q/k RMSNorm for Qwen3) -> rotary
-> write K/V to the paged cache -> unified attention -> o_proj -> residual ->
RMSNorm -> SwiGLU MLP -> residual] -> final RMSNorm; ``compute_logits`` applies
the (optionally tied) lm_head to the rows the caller selects.

Rotary embeddings use the HF "rotate-half" (GPT-NeoX) convention: dims i and
i + head_dim/2 form a pair. Weights loaded from llama.cpp's GGUF are
un-permuted to this layout by ``gpu_runner.gguf_loader``.

Importing this module does not import triton: ``backend="torch"`` runs on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from servesim.gpu_runner.ops import Backend, backend_module
from servesim.gpu_runner.ops.metadata import AttentionMetadata
from servesim.gpu_runner.memory import check_fits
from servesim.gpu_runner.weights import LayerWeights, Llama3RopeScaling, ModelConfig, ModelWeights, random_weights


@dataclass(slots=True)
class LayerKVCache:
    key: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]; block 0 = null block
    value: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]


def rope_inv_freq(config: ModelConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """Inverse rotary frequencies [head_dim / 2] fp32, with Llama-3.1 scaling if configured."""
    exps = torch.arange(0, config.head_dim, 2, dtype=torch.float64, device=device) / config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** exps)  # [D/2]
    if config.rope_scaling is not None:
        inv_freq = _llama3_scale(inv_freq, config.rope_scaling)
    return inv_freq.float()


def _llama3_scale(inv_freq: torch.Tensor, s: Llama3RopeScaling) -> torch.Tensor:
    # Wavelengths longer than original/low_freq_factor are slowed by `factor`,
    # shorter than original/high_freq_factor kept; smooth interpolation between.
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    mid = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    return torch.where((wavelen <= low_wavelen) & (wavelen >= high_wavelen), mid, scaled)


def apply_rotary(
    x: torch.Tensor,  # [T, heads, D]
    cos: torch.Tensor,  # [T, 1, D/2] fp32
    sin: torch.Tensor,  # [T, 1, D/2] fp32
) -> torch.Tensor:  # [T, heads, D], dtype of x
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama RMSNorm: normalise in fp32, cast back, scale by weight. x [..., N], weight [N]."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class LlamaModel:
    """Decoder with its own paged KV caches (``allocate_kv_cache``)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, *, backend: Backend = "torch") -> None:
        self.config = config
        self.weights = weights
        self.backend = backend
        self._ops = backend_module(backend)  # validates the name; imports triton only for "triton"
        self.dtype = weights.embed.dtype
        self.device = weights.embed.device
        self.scale = config.head_dim ** -0.5
        self.inv_freq = rope_inv_freq(config, self.device)  # [D/2] fp32
        self.kv_caches: list[LayerKVCache] = []

    @classmethod
    def random(
        cls,
        config: ModelConfig,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        backend: Backend = "torch",
    ) -> LlamaModel:
        """Random weights at the config's shapes; refused before allocating when they do not fit
        in the device's free memory (gpu_runner/memory.py)."""
        check_fits(config, dtype, device)
        return cls(config, random_weights(config, seed=seed, dtype=dtype, device=device), backend=backend)

    def allocate_kv_cache(
        self,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> list[LayerKVCache]:
        """Zeroed caches for every layer (replacing any previous ones); block 0 is the null block."""
        c = self.config
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        kw = dict(dtype=dtype or self.dtype, device=device or self.device)
        self.kv_caches = [LayerKVCache(torch.zeros(shape, **kw), torch.zeros(shape, **kw)) for _ in range(c.num_layers)]
        return self.kv_caches

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        """Run the T scheduled tokens; writes their K/V into the caches."""
        if len(self.kv_caches) != self.config.num_layers:
            raise RuntimeError("call allocate_kv_cache() before forward()")
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]  # [T, 1, D/2]
        hidden = F.embedding(input_ids, self.weights.embed)  # [T, hidden]
        for lw, cache in zip(self.weights.layers, self.kv_caches):
            hidden = hidden + self._attention(rms_norm(hidden, lw.attn_norm, self.config.rms_eps),
                                              lw, cache, cos, sin, attn_metadata)
            hidden = hidden + self._mlp(rms_norm(hidden, lw.mlp_norm, self.config.rms_eps), lw)
        return rms_norm(hidden, self.weights.final_norm, self.config.rms_eps)

    def _attention(
        self,
        x: torch.Tensor,  # [T, hidden]
        lw: LayerWeights,
        cache: LayerKVCache,
        cos: torch.Tensor,  # [T, 1, D/2]
        sin: torch.Tensor,  # [T, 1, D/2]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        c = self.config
        t = x.shape[0]
        q, k, v = F.linear(x, lw.qkv_proj).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.reshape(t, c.num_heads, c.head_dim)  # [T, H, D]
        k = k.reshape(t, c.num_kv_heads, c.head_dim)  # [T, KVH, D]
        v = v.reshape(t, c.num_kv_heads, c.head_dim).contiguous()  # [T, KVH, D]
        if c.qk_norm:
            q, k = rms_norm(q, lw.q_norm, c.rms_eps), rms_norm(k, lw.k_norm, c.rms_eps)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        self._ops.reshape_and_cache(k, v, cache.key, cache.value, meta.slot_mapping)
        out = torch.zeros_like(q)  # [T, H, D]; rows of padding tokens stay 0
        self._ops.unified_attention(q, cache.key, cache.value, out, meta.query_start_loc, meta.seq_lens,
                                    meta.block_table, self.scale)
        return F.linear(out.reshape(t, c.q_size), lw.o_proj)

    @staticmethod
    def _mlp(x: torch.Tensor, lw: LayerWeights) -> torch.Tensor:  # x [T, hidden] -> [T, hidden]
        gate, up = F.linear(x, lw.gate_up_proj).chunk(2, dim=-1)  # [T, I] each
        return F.linear(F.silu(gate) * up, lw.down_proj)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] (the rows to sample from) -> logits [N, vocab] fp32."""
        head = self.weights.embed if self.weights.lm_head is None else self.weights.lm_head
        return F.linear(hidden, head).float()
