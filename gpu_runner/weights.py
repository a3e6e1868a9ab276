"""Model configs (with presets) and weight containers of the Llama-style decoder.

Weights are torch tensors in the ``torch.nn.functional.linear`` layout
([out_features, in_features]); Q/K/V and gate/up are fused. Random weights
are drawn from a seeded ``torch.Generator`` at the config's real shapes, and
only when asked for (the big presets are never materialised in tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch


@dataclass(frozen=True, slots=True)
class Llama3RopeScaling:
    """Llama-3.1 frequency-dependent rotary scaling (HF ``rope_type="llama3"``)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False  # lm_head reuses the embedding matrix
    qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen3)
    max_position: int = 4096
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: head_dim must be even for rotary embeddings")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        per_layer = (self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
                     + 3 * self.hidden_size * self.intermediate_size + 2 * self.hidden_size
                     + (2 * self.head_dim if self.qk_norm else 0))
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embed + self.hidden_size

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.kv_size * torch.empty((), dtype=dtype).element_size()


PRESETS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("tiny-llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position=1024),
        ModelConfig("llama-3.1-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                    num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0, max_position=131072,
                    rope_scaling=Llama3RopeScaling()),
        ModelConfig("llama-3.1-70b", vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
                    num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=500000.0, max_position=131072,
                    rope_scaling=Llama3RopeScaling()),
        ModelConfig("llama-2-7b", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32,
                    num_heads=32, num_kv_heads=32, head_dim=128, max_position=4096),
        ModelConfig("llama-2-70b", vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_layers=80,
                    num_heads=64, num_kv_heads=8, head_dim=128, max_position=4096),
        ModelConfig("qwen3-32b", vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_layers=64,
                    num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_eps=1e-6,
                    qk_norm=True, max_position=40960),
        # Mistral-7B v0.3 (v0.1 differs: vocab 32000, theta 1e4, 4096-token sliding window, not modelled).
        ModelConfig("mistral-7b", vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_layers=32,
                    num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1000000.0, max_position=32768),
        ModelConfig("smollm2-135m", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                    num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_embeddings=True,
                    max_position=8192),
    )
}


def preset(name: str, **overrides) -> ModelConfig:
    """A preset config, optionally with fields replaced (e.g. ``num_layers=2``)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor  # [hidden]
    qkv_proj: torch.Tensor  # [q_size + 2 * kv_size, hidden]; rows q | k | v, HF (rotate-half) rotary layout
    o_proj: torch.Tensor  # [hidden, q_size]
    mlp_norm: torch.Tensor  # [hidden]
    gate_up_proj: torch.Tensor  # [2 * intermediate, hidden]; rows gate | up
    down_proj: torch.Tensor  # [hidden, intermediate]
    q_norm: torch.Tensor | None = None  # [head_dim], qk_norm models only
    k_norm: torch.Tensor | None = None  # [head_dim], qk_norm models only


@dataclass(slots=True)
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor | None = None  # [vocab, hidden]; None = tied to embed
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # unused tensors of a checkpoint

    def to(self, dtype: torch.dtype, device: torch.device | str) -> ModelWeights:
        """Copy with every tensor cast (norm weights too; the model normalises in fp32)."""
        def cv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=device, dtype=dtype)

        layers = [LayerWeights(*(cv(getattr(lw, f.name)) for f in fields(LayerWeights))) for lw in self.layers]
        return ModelWeights(cv(self.embed), layers, cv(self.final_norm), cv(self.lm_head), dict(self.extra))


def random_weights(
    config: ModelConfig,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> ModelWeights:
    """Random weights at the config's shapes: linears N(0, 1/fan_in), norms 1 + N(0, 0.1^2)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype).mul_(std)

    def linear(out_f: int, in_f: int) -> torch.Tensor:
        return normal(out_f, in_f, std=1.0 / math.sqrt(in_f))

    def norm(n: int) -> torch.Tensor:
        return normal(n, std=0.1).add_(1.0)

    c = config
    layers = [
        LayerWeights(
            attn_norm=norm(c.hidden_size),
            qkv_proj=linear(c.q_size + 2 * c.kv_size, c.hidden_size),
            o_proj=linear(c.hidden_size, c.q_size),
            mlp_norm=norm(c.hidden_size),
            gate_up_proj=linear(2 * c.intermediate_size, c.hidden_size),
            down_proj=linear(c.hidden_size, c.intermediate_size),
            q_norm=norm(c.head_dim) if c.qk_norm else None,
            k_norm=norm(c.head_dim) if c.qk_norm else None,
        )
        for _ in range(c.num_layers)
    ]
    embed = normal(c.vocab_size, c.hidden_size, std=1.0)
    lm_head = None if c.tie_embeddings else linear(c.vocab_size, c.hidden_size)
    return ModelWeights(embed=embed, layers=layers, final_norm=norm(c.hidden_size), lm_head=lm_head)
