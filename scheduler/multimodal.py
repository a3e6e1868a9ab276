"""A request's multimodal items (vLLM's MultiModalFeatureSpec with its PlaceholderRange), flattened.

An item is a run of `length` placeholder tokens at `offset` in the prompt whose embeddings the
encoder computes (an image's patches after merging). `mm_hash` names the item's content: two items
with equal hashes share one encoder-cache entry, and it keys the prefix-cache blocks the item covers
(vLLM's `identifier`). Every placeholder token is an embedding (vLLM's `is_embed` None, which is
what Qwen2.5-VL, Gemma 3 and Llama 4 image items carry), so an item's embeddings equal its length.

An encoder-decoder model (Whisper) carries its encoder input the same way in vLLM 0.19.1 (one
item, `mm_position` offset 0, length = the encoder's tokens), but those tokens are not decoder
prompt tokens: the decoder reads the encoder's states through cross-attention. Such an item has
`in_prompt=False`; it is the request's only item and starts at offset 0 (vLLM asserts both).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MultiModalFeatureSpec:
    """One multimodal item of a request (vLLM: mm_position.offset / .length, identifier)."""

    offset: int  # index of the item's first placeholder token in the prompt
    length: int  # placeholder tokens (= encoder embeddings: is_embed is None)
    mm_hash: str  # content hash: equal hashes share the encoder cache entry
    modality: str = "image"
    # False: an encoder-decoder model's encoder input (not placeholders in the decoder prompt)
    in_prompt: bool = True

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError(f"multimodal item offset must be >= 0, got {self.offset}")
        if self.length < 1:
            raise ValueError(f"multimodal item length must be >= 1, got {self.length}")
        if not self.mm_hash:
            raise ValueError("multimodal item mm_hash must be a non-empty string")

    @property
    def num_embeds(self) -> int:
        """vLLM's PlaceholderRange.get_num_embeds() with is_embed None."""
        return self.length

    @property
    def end(self) -> int:
        """One past the item's last placeholder token."""
        return self.offset + self.length


def check_mm_features(request_id: str, features: tuple[MultiModalFeatureSpec, ...],
                      num_prompt_tokens: int) -> str | None:
    """What is wrong with a request's items (sorted by offset, inside the prompt, not overlapping:
    vLLM's processor produces them so and its scheduler assumes it), or None."""
    if any(not item.in_prompt for item in features):
        if len(features) != 1 or features[0].offset != 0:
            return (f"request {request_id!r}: an encoder-decoder request carries exactly one encoder input "
                    f"(in_prompt false) at offset 0, got {len(features)} item(s) starting at {features[0].offset}")
        return None
    prev_end = 0
    for i, item in enumerate(features):
        if item.offset < prev_end:
            return (f"request {request_id!r}: multimodal item {i} at offset {item.offset} overlaps or precedes "
                    f"the previous item (which ends at {prev_end}); items must be sorted and disjoint")
        if item.end > num_prompt_tokens:
            return (f"request {request_id!r}: multimodal item {i} spans tokens [{item.offset}, {item.end}) "
                    f"past the prompt's end ({num_prompt_tokens} tokens)")
        prev_end = item.end
    return None


def mm_extra_keys(features: tuple[MultiModalFeatureSpec, ...], start: int, end: int) -> list[bytes]:
    """The prefix-cache extra keys of block [start, end): (mm_hash, offset - start) of every item it
    overlaps (vLLM's _gen_mm_extra_hash_keys), so identical placeholder ids of different images, or of
    one image at different places in the block, never share KV."""
    keys = []
    for item in features:
        if not item.in_prompt:
            continue  # encoder-decoder: prefix caching is off (vLLM), the item keys no block
        if item.offset >= end:
            break
        if item.end > start:
            keys.append(b"M" + item.mm_hash.encode() + b"@%d" % (item.offset - start))
    return keys
