"""The roofline's vision encoder: a step's images, priced by their encoder tokens.

`StepShape.num_encoder_tokens` holds the embeddings each multimodal item encoded this step
gives the language model; the ViT runs on ``patches_per_token`` patches per embedding
(specs/layer_kinds.py: Qwen2.5-VL's spatial merge 2x2, Gemma 3's 4x4 pooling, Llama 4's pixel
shuffle). Per layer of the tower, for s patches of an image:

* GEMMs (QKV + output: 4 h^2, the MLP: 3 h I gated or 2 h I): 2 FLOPs per weight and patch, the
  weights read once for the step's images together, as the language model's GEMMs are priced;
* attention, quadratic within each image: 4 s k h FLOPs (QK^T and PV) where each patch sees
  k = s keys, or k = min(s, window) in Qwen2.5-VL's windowed layers (window_size / patch_size
  patches per side; its fullatt_block_indexes layers see the whole image); Q, K, V and O read or
  written once (4 s h elements);
* elementwise: two norms, the activation and two residual adds, the roofline's per-token count;
* then the merger / projector once per embedding (specs/layer_kinds.py VisionSpec.weight_elems).

vLLM shards the tower over TP by default (mm_encoder_tp_mode "weights"), so FLOPs and weights
are divided by tp; its all-reduces are not priced. No measured table in ../shared covers encoder
attention (its README lists it as left out), so this is roofline only, at the GPU's GEMM and
attention efficiencies.
"""

from __future__ import annotations

from servesim.simulator.specs.layer_kinds import VisionSpec

_GEMMS_PER_LAYER = 4  # qkv, o, and the MLP's two (gated: its gate and up fused)
_EW_KERNELS_PER_LAYER = 5  # two norms, activation, two residual adds


class VisionCost:
    """Seconds to encode a step's multimodal items."""

    __slots__ = ("spec", "tp", "_c", "_m", "_ac", "_am", "_ko", "_ao", "_b")

    def __init__(self, spec: VisionSpec, tp: int, rates: tuple[float, float, float, float, float, float],
                 dtype_bytes: int) -> None:
        self.spec, self.tp, self._b = spec, tp, dtype_bytes
        self._c, self._m, self._ac, self._am, self._ko, self._ao = rates

    def step_s(self, num_encoder_tokens: tuple[int, ...]) -> float:
        """All of a step's items: their GEMMs batched, attention image by image."""
        if not num_encoder_tokens:
            return 0.0
        v, tp, b = self.spec, self.tp, self._b
        h, inter = v.hidden_size, v.intermediate_size
        patches = [n * v.patches_per_token for n in num_encoder_tokens]
        s_sum = sum(patches)
        layer_w = (4 * h * h + (3 if v.gated_mlp else 2) * h * inter) / tp
        gemm = max(2.0 * s_sum * layer_w * self._c, (layer_w * b + s_sum * (8 * h + 3 * inter) / tp * b) * self._m) \
            + _GEMMS_PER_LAYER * self._ko
        ew = s_sum * (10 * h + 3 * inter) * b * self._m + _EW_KERNELS_PER_LAYER * self._ko
        full_pairs = float(sum(s * s for s in patches))
        io = 4.0 * s_sum * h / tp * b
        attn_full = max(4.0 * full_pairs * h / tp * self._ac, io * self._am) + self._ao
        layers_full = v.depth
        total = v.depth * (gemm + ew)
        if v.window_patches:
            win_pairs = float(sum(s * min(s, v.window_patches) for s in patches))
            attn_win = max(4.0 * win_pairs * h / tp * self._ac, io * self._am) + self._ao
            layers_full = v.num_full_layers
            total += (v.depth - layers_full) * attn_win
        total += layers_full * attn_full
        merged = h * v.patches_per_token if not v.pooled else h
        rows = float(sum(num_encoder_tokens))
        merger_w = ((merged * merged if not v.pooled else 0) + merged * v.out_hidden_size) / tp
        if merger_w:  # an encoder-decoder's audio encoder has no projector
            total += max(2.0 * rows * merger_w * self._c, merger_w * b * self._m) + 2 * self._ko
        return total
