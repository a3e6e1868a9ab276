"""vLLM 0.19.1's EncoderDecoderCacheManager (v1/core/encoder_cache_manager.py): the encoder-input
accounting of an encoder-decoder model (Whisper).

Nothing is shared: each request's encoder input is computed for it alone (check_and_update_cache
never hits), its slots are taken when the encoder runs it and given back once the request has a
computed decoder token (the cross-attention KV holds the encoder's states from then on). The
hashes of the items allocated in one step are reported freed at the second get_freed_mm_hashes()
after it, as vLLM's `allocated` -> `to_free` -> returned hand-over does (the runner frees its copy
before it runs the model, so the entry must outlive the step that computed it).

vLLM 0.19.1 gives the slots back unconditionally: `_free_encoder_inputs` runs after every step
that scheduled the request, and once it has a computed token each call adds the input's embeddings
again (so do `free()` on finish and the frees after a failed allocation). num_free_slots therefore
climbs past cache_size after the first decode step, and from then on only the compute budget
limits the encoder. This port does the same (parity: the scheduler's decisions read the counter);
`usage` is clamped to [0, 1]. Invariant: num_free_slots >= 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.encoder_cache import EncoderCacheStats

if TYPE_CHECKING:
    from servesim.scheduler.config import CacheConfig, SchedulerConfig
    from servesim.scheduler.request import Request


class EncoderDecoderCacheManager:
    """The EncoderCache contract (scheduler/encoder_cache.py) for encoder-decoder models."""

    def __init__(self, cache_size: int) -> None:
        self.cache_size = cache_size
        self.num_free_slots = cache_size
        self.allocated: list[str] = []  # mm hashes allocated since the last get_freed_mm_hashes()
        self.to_free: list[str] = []  # reported freed at the next get_freed_mm_hashes()
        self.stats = EncoderCacheStats()

    @property
    def num_freeable_slots(self) -> int:
        """No entry outlives its request's reference here: freeable is free."""
        return self.num_free_slots

    def check_and_update_cache(self, request: Request, input_id: int) -> bool:
        return False  # encoder outputs are never shared between requests

    def can_allocate(self, request: Request, input_id: int, encoder_compute_budget: int,
                     num_embeds_to_schedule: int) -> bool:
        num_embeds = request.mm_features[input_id].num_embeds
        if num_embeds > encoder_compute_budget:
            return False
        return num_embeds + num_embeds_to_schedule <= self.num_free_slots

    def allocate(self, request: Request, input_id: int) -> None:
        item = request.mm_features[input_id]
        self.num_free_slots -= item.num_embeds
        self.allocated.append(item.mm_hash)
        self.stats.queries += item.num_embeds

    def get_cached_input_ids(self, request: Request) -> list[int]:
        """Every item of the request (vLLM returns them all: freeing one not held is a no-op here)."""
        return list(range(len(request.mm_features)))

    def free_encoder_input(self, request: Request, input_id: int) -> None:
        # Unconditional, as vLLM 0.19.1 (module docstring).
        self.num_free_slots += request.mm_features[input_id].num_embeds

    def free(self, request: Request) -> None:
        for input_id in range(len(request.mm_features)):
            self.free_encoder_input(request, input_id)

    def get_freed_mm_hashes(self) -> list[str]:
        to_free, self.to_free, self.allocated = self.to_free, self.allocated, []
        return to_free

    @property
    def usage(self) -> float:
        if self.cache_size == 0:
            return 0.0
        return min(max((self.cache_size - self.num_free_slots) / self.cache_size, 0.0), 1.0)

    def take_stats(self) -> EncoderCacheStats | None:
        if not self.stats.queries:
            return None
        stats, self.stats = self.stats, EncoderCacheStats()
        return stats

    def check(self, live_request_ids: set[str]) -> str | None:
        """What breaks the invariant (module docstring), or None."""
        if self.num_free_slots < 0:
            return f"encoder-decoder cache: free slots {self.num_free_slots} < 0"
        return None


def check_encoder_decoder_config(scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
    """What vLLM 0.19.1 forces for an encoder-decoder model (SchedulerConfig.__post_init__ with
    is_encoder_decoder, and prefix caching off), refused here when a config says otherwise: the
    simulator's model resolution sets these for such a model, so a mismatch is a caller's error."""
    wrong = []
    if scheduler_config.enable_chunked_prefill:
        wrong.append("scheduler.enable_chunked_prefill must be false")
    if not scheduler_config.disable_chunked_mm_input:
        wrong.append("scheduler.disable_chunked_mm_input must be true")
    if scheduler_config.long_prefill_token_threshold:
        wrong.append("scheduler.long_prefill_token_threshold must be 0")
    if cache_config.enable_prefix_caching:
        wrong.append("cache.enable_prefix_caching must be false")
    if scheduler_config.mm_max_tokens_per_item <= 0:
        wrong.append("scheduler.mm_max_tokens_per_item must be the encoder's input length (> 0)")
    if wrong:
        raise ValueError("an encoder-decoder model (cross_attention KV cache groups), as vLLM 0.19.1 runs it: "
                         + "; ".join(wrong))


def check_request_inputs(request: Request, encoder_decoder: bool, encoder_budget: int, encoder_cache_size: int) -> None:
    """Refuse (ValueError, naming the request) items of the wrong kind for the model (an
    encoder-decoder model takes exactly its encoder input, in_prompt false; a decoder-only model
    only prompt items) and an item larger than the encoder budget or cache, which would stall its
    request forever. vLLM never meets one (both are at least the model's largest item, and its
    processor makes no larger one)."""
    items = request.mm_features
    rid = request.request_id
    if encoder_decoder:
        if len(items) != 1 or items[0].in_prompt:
            raise ValueError(f"request {rid!r}: an encoder-decoder model needs exactly one encoder input "
                             "(an item with in_prompt false)")
    elif any(not item.in_prompt for item in items):
        raise ValueError(f"request {rid!r}: an encoder input (in_prompt false) needs an encoder-decoder "
                         "model (cross_attention KV cache groups)")
    limit = min(encoder_budget, encoder_cache_size)
    for i, item in enumerate(items):
        if item.num_embeds > limit:
            raise ValueError(
                f"request {rid!r}: multimodal item {i} has {item.num_embeds} embeddings, more than the encoder "
                f"budget ({encoder_budget}) or encoder cache ({encoder_cache_size}) holds (0: the model takes no "
                "multimodal input); raise scheduler.mm_max_tokens_per_item to the model's largest item")
