"""Images in synthetic requests (the `vlm` generator): how many tokens an image takes, and where.

Token count: Qwen2.5-VL's image processor (transformers, models/qwen2_vl/image_processing_qwen2_vl.py,
`smart_resize`; Qwen2.5-VL-7B-Instruct's preprocessor_config.json sets min_pixels 3136, max_pixels
12845056, patch_size 14, merge_size 2) resizes an image to multiples of patch_size * merge_size = 28
pixels within [min_pixels, max_pixels], keeping its aspect ratio; the vision tower cuts it into 14x14
patches and merges 2x2 of them into one language-model token. So an image of H x W pixels becomes
(H' / 14) * (W' / 14) / 4 placeholder tokens (1280x720 -> 1196; at most 16384), which is also the
number of encoder embeddings vLLM budgets for it.

Placement: a request's images follow its shared prefix (a system prompt) and precede its own text,
as a chat template puts a user turn's images before its question. An image drawn from the shared
pool carries the pool image's mm hash (vLLM hashes the pixels), so requests showing the same image
share its encoder-cache entry, and its placeholder ids come from one stream per image, so requests
with the same prefix and image share those KV blocks too (vLLM: equal placeholder ids, equal mm hash).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.traces.distributions import sample_values
from servesim.traces.errors import InputError
from servesim.traces.synthetic_config import ImageConfig
from servesim.traces.workload import RequestSpec


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL smart_resize (the same rule, re-implemented): both sides multiples of
    `factor`, the area within [min_pixels, max_pixels], the aspect ratio kept as closely as possible."""
    if min(height, width) < 1:
        raise InputError(f"image of {height}x{width} pixels", field="images", allowed="height and width >= 1")
    if max(height, width) / min(height, width) > 200:  # the processor's own refusal
        raise InputError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}",
                         field="images", allowed="images with an aspect ratio <= 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(height: int, width: int, cfg: ImageConfig) -> int:
    """Placeholder tokens (= encoder embeddings) of one image, as Qwen2.5-VL's processor counts them."""
    factor = cfg.patch_size * cfg.merge_size
    h_bar, w_bar = smart_resize(height, width, factor, cfg.min_pixels, cfg.max_pixels)
    return (h_bar // cfg.patch_size) * (w_bar // cfg.patch_size) // (cfg.merge_size * cfg.merge_size)


def max_image_tokens(cfg: ImageConfig) -> int:
    """The most tokens one image can take (max_pixels' worth): vLLM's max tokens per item."""
    factor = cfg.patch_size * cfg.merge_size
    return (cfg.max_pixels // (factor * factor)) * (factor * factor) // (cfg.patch_size ** 2 * cfg.merge_size ** 2)


def add_images(specs: list[RequestSpec], cfg: ImageConfig, rng: np.random.Generator) -> list[RequestSpec]:
    """The requests with images inserted after their shared prefix (prompt_len grows by their tokens)."""
    n = len(specs)
    counts = sample_values(cfg.images_per_request, n, rng, integer=True)
    total = int(counts.sum())
    heights = sample_values(cfg.height, total + cfg.num_shared_images, rng, integer=True)
    widths = sample_values(cfg.width, total + cfg.num_shared_images, rng, integer=True)
    shared = rng.random(total) < cfg.shared_fraction
    pool_pick = rng.integers(0, cfg.num_shared_images, total)
    pool_tokens = [image_tokens(int(heights[total + k]), int(widths[total + k]), cfg)
                   for k in range(cfg.num_shared_images)]
    out, j = [], 0
    for spec, count in zip(specs, counts.tolist()):
        items: list[MultiModalFeatureSpec] = []
        offset = spec.prefix_len
        for k in range(count):
            if shared[j]:
                mm_hash, length = f"shared-image-{int(pool_pick[j])}", pool_tokens[int(pool_pick[j])]
            else:
                mm_hash, length = f"{spec.request_id}-image-{k}", image_tokens(int(heights[j]), int(widths[j]), cfg)
            items.append(MultiModalFeatureSpec(offset, length, mm_hash))
            offset += length
            j += 1
        out.append(replace(spec, prompt_len=spec.prompt_len + offset - spec.prefix_len, mm_items=tuple(items)))
    return out
