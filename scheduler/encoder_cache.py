"""Encoder inputs of multimodal requests: vLLM 0.19.1's EncoderCacheManager and the scheduler's
encoder-budget steps (v1/core/encoder_cache_manager.py, v1/core/sched/scheduler.py).

The cache holds encoder outputs (embeddings) by mm hash. `cached[mm_hash]` is the set of requests
referencing an entry; an entry nobody references sits in `freeable` (oldest first) and keeps its
slots until an allocation needs them, when it is evicted and its hash reported once in the next
SchedulerOutput's `free_encoder_mm_hashes`. Invariants: num_free_slots <= num_freeable_slots <=
cache_size; num_freeable_slots - num_free_slots = the slots of the entries in `freeable`.

Each schedule() spends one encoder compute budget (max_num_encoder_input_tokens, in embeddings) on
the items the scheduled token ranges reach; a request whose range reaches an item that cannot be
encoded this step (budget or cache exhausted) is cut just before the item (try_schedule_encoder_inputs).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from servesim.scheduler.config import SchedulerConfig
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler


@dataclass(slots=True)
class EncoderCacheStats:
    """Encoder-cache lookups since the last stats, in embeddings: `queries` = items a request needed
    (each counted once per request reference), `hits` = those served by an entry another request
    (or an earlier admission) had computed. Not a vLLM 0.19.1 metric (it reports only the usage)."""

    queries: int = 0
    hits: int = 0

    def merge(self, other: EncoderCacheStats) -> None:
        self.queries += other.queries
        self.hits += other.hits


class EncoderCache(Protocol):
    """What schedule() asks of an encoder cache (vLLM's EncoderCacheManager interface): the shared
    cache of decoder-only multimodal models below, or an encoder-decoder model's per-request
    accounting (scheduler/encoder_decoder_cache.py). Counters are in embeddings."""

    cache_size: int
    num_free_slots: int

    @property
    def num_freeable_slots(self) -> int:
        """Slots free or reclaimable by evicting unreferenced entries (>= num_free_slots)."""
        ...

    def check_and_update_cache(self, request: Request, input_id: int) -> bool:
        """Whether the item's output is already cached; if so the request now references it."""
        ...

    def can_allocate(self, request: Request, input_id: int, encoder_compute_budget: int,
                     num_embeds_to_schedule: int) -> bool:
        """Whether the item fits this step's remaining budget and the cache, after the items
        already chosen this step (num_embeds_to_schedule). May evict unreferenced entries."""
        ...

    def allocate(self, request: Request, input_id: int) -> None:
        """Reserve the item's slots: the encoder computes it this step."""
        ...

    def get_cached_input_ids(self, request: Request) -> list[int]:
        """The request's items that hold (or may hold) cache slots, for _free_encoder_inputs."""
        ...

    def free_encoder_input(self, request: Request, input_id: int) -> None:
        """The request no longer needs the item's output."""
        ...

    def free(self, request: Request) -> None:
        """The request finished, was aborted or preempted: drop everything it holds."""
        ...

    def get_freed_mm_hashes(self) -> list[str]:
        """Hashes the worker may drop, reported once (SchedulerOutput.free_encoder_mm_hashes)."""
        ...

    @property
    def usage(self) -> float:
        """Fraction of the cache in use, in [0, 1]."""
        ...

    def take_stats(self) -> EncoderCacheStats | None:
        """Lookups since the last call, or None when there were none."""
        ...

    def check(self, live_request_ids: set[str]) -> str | None:
        """The first broken invariant of the cache's counters (given the requests the scheduler
        still holds), or None: scheduler/invariants.py calls it after every step."""
        ...


def compute_mm_encoder_budget(cfg: SchedulerConfig) -> tuple[int, int]:
    """(encoder compute budget, encoder cache size) in embeddings: vLLM's compute_mm_encoder_budget.
    A text-only model (mm_max_tokens_per_item 0) gets neither; otherwise each is at least one item
    of the model's largest, so every item the model's processor can produce fits both."""
    max_item = cfg.mm_max_tokens_per_item
    if max_item == 0:
        return 0, 0
    budget = cfg.max_num_encoder_input_tokens
    cache = cfg.encoder_cache_size
    default = cfg.max_num_batched_tokens  # vLLM SchedulerConfig.__post_init__: both default to it
    return max(default if budget is None else budget, max_item), max(default if cache is None else cache, max_item)


class EncoderCacheManager:
    """vLLM's EncoderCacheManager: encoder outputs shared by mm hash, evicted oldest-unreferenced first."""

    def __init__(self, cache_size: int) -> None:
        self.cache_size = cache_size
        self.num_free_slots = cache_size
        self.num_freeable_slots = cache_size
        self.cached: dict[str, set[str]] = {}  # mm_hash -> ids of the requests referencing it
        self.freeable: OrderedDict[str, int] = OrderedDict()  # unreferenced: mm_hash -> embeddings
        self.freed: list[str] = []  # evicted since the last get_freed_mm_hashes()
        self.stats = EncoderCacheStats()

    def check_and_update_cache(self, request: Request, input_id: int) -> bool:
        """Whether the item's output is cached; if so the request now references it."""
        mm_hash = request.mm_features[input_id].mm_hash
        refs = self.cached.get(mm_hash)
        if refs is None:
            return False
        if not refs:  # unreferenced until now: no longer reclaimable
            self.num_freeable_slots -= self.freeable.pop(mm_hash)
        if request.request_id not in refs:
            num_embeds = request.mm_features[input_id].num_embeds
            self.stats.queries += num_embeds
            self.stats.hits += num_embeds
        refs.add(request.request_id)
        return True

    def can_allocate(self, request: Request, input_id: int, encoder_compute_budget: int,
                     num_embeds_to_schedule: int) -> bool:
        """Whether the item fits the budget and (after evicting unreferenced entries, which happens
        here even if the request is not scheduled after all, as in vLLM) the cache."""
        num_embeds = request.mm_features[input_id].num_embeds
        if num_embeds > encoder_compute_budget:
            return False
        num_embeds += num_embeds_to_schedule
        if num_embeds <= self.num_free_slots:
            return True
        if num_embeds > self.num_freeable_slots:
            return False
        while num_embeds > self.num_free_slots:
            mm_hash, num_free = self.freeable.popitem(last=False)
            del self.cached[mm_hash]
            self.freed.append(mm_hash)
            self.num_free_slots += num_free
        return True

    def allocate(self, request: Request, input_id: int) -> None:
        """Reserve the item's slots (can_allocate said yes): the encoder computes it this step."""
        item = request.mm_features[input_id]
        num_embeds = item.num_embeds
        assert self.num_free_slots >= num_embeds and self.num_freeable_slots >= num_embeds
        self.cached.setdefault(item.mm_hash, set()).add(request.request_id)
        self.num_free_slots -= num_embeds
        self.num_freeable_slots -= num_embeds
        self.stats.queries += num_embeds

    def get_cached_input_ids(self, request: Request) -> list[int]:
        """Indices of the request's items whose hash has an entry (referenced by it or not)."""
        return [i for i, item in enumerate(request.mm_features) if item.mm_hash in self.cached]

    def free_encoder_input(self, request: Request, input_id: int) -> None:
        """Drop the request's reference; an entry left unreferenced becomes freeable (kept until needed)."""
        item = request.mm_features[input_id]
        refs = self.cached.get(item.mm_hash)
        if not refs:
            return
        refs.discard(request.request_id)
        if not refs:
            self.freeable[item.mm_hash] = item.num_embeds
            self.num_freeable_slots += item.num_embeds

    def free(self, request: Request) -> None:
        """Drop every reference the request holds (finished, aborted or preempted)."""
        for input_id in self.get_cached_input_ids(request):
            self.free_encoder_input(request, input_id)

    def get_freed_mm_hashes(self) -> list[str]:
        freed, self.freed = self.freed, []
        return freed

    @property
    def usage(self) -> float:
        """Fraction of the cache's slots held (referenced or freeable): vLLM's encoder_cache_usage."""
        if self.cache_size == 0:
            return 0.0
        return (self.cache_size - self.num_free_slots) / self.cache_size

    def take_stats(self) -> EncoderCacheStats | None:
        """The lookups since the last call (None when there were none: text-only steps build nothing)."""
        if not self.stats.queries:
            return None
        stats, self.stats = self.stats, EncoderCacheStats()
        return stats

    def check(self, live_request_ids: set[str]) -> str | None:
        """Every entry holds its item's slots, the unreferenced ones are exactly `freeable`, and
        references come from requests still known."""
        if set(self.freeable) != {h for h, refs in self.cached.items() if not refs}:
            return "encoder cache: freeable entries != unreferenced entries"
        if not 0 <= self.num_free_slots <= self.num_freeable_slots <= self.cache_size:
            return f"encoder cache: free {self.num_free_slots}, freeable {self.num_freeable_slots}, size {self.cache_size}"
        if self.num_freeable_slots - self.num_free_slots != sum(self.freeable.values()):
            return "encoder cache: freeable slots - free slots != the slots of the freeable entries"
        for mm_hash, refs in self.cached.items():
            for rid in refs:
                if rid not in live_request_ids:
                    return f"encoder cache: {mm_hash} referenced by {rid}, which the scheduler no longer holds"
        return None


def try_schedule_encoder_inputs(self: Scheduler, request: Request, num_computed_tokens: int,
                                num_new_tokens: int, encoder_compute_budget: int) -> tuple[list[int], int, int]:
    """vLLM's Scheduler._try_schedule_encoder_inputs (no EC connector):
    (items to encode this step, num_new_tokens cut before the first item that cannot be, the budget
    left). An item is needed when [computed, computed + new) reaches into it; with EAGLE the drafter
    reads one token further (shift_computed_tokens)."""
    if num_new_tokens <= 0 or not request.mm_features:
        return [], num_new_tokens, encoder_compute_budget
    shift_computed_tokens = 1 if self.scheduler_config.use_eagle else 0
    ecm = self.encoder_cache_manager
    disable_chunked = self.scheduler_config.disable_chunked_mm_input
    encoder_decoder = self.is_encoder_decoder
    to_schedule: list[int] = []
    hashes_to_schedule: set[str] = set()
    num_embeds_to_schedule = 0
    for i, item in enumerate(request.mm_features):
        start_pos = item.offset
        if start_pos >= num_computed_tokens + num_new_tokens + shift_computed_tokens:
            break  # not reached this step (items are sorted by offset)
        if encoder_decoder:
            if num_computed_tokens > 0:
                continue  # the encoder ran before the first decoder token: its states are in the cross KV
        elif item.end <= num_computed_tokens:
            continue  # already in the decoder's KV
        elif item.mm_hash in hashes_to_schedule or ecm.check_and_update_cache(request, i):
            continue  # encoded by this request this step, or cached earlier
        if disable_chunked and num_computed_tokens < start_pos and (
                num_computed_tokens + num_new_tokens < item.end):
            # The item may not be split across steps: stop before it.
            num_new_tokens = max(0, start_pos - (num_computed_tokens + shift_computed_tokens))
            break
        if not ecm.can_allocate(request, i, encoder_compute_budget, num_embeds_to_schedule):
            # The encoder runs an item whole: schedule only the tokens before it (none when a
            # prefix-cache hit already reaches past its start).
            if num_computed_tokens + shift_computed_tokens < start_pos:
                num_new_tokens = start_pos - (num_computed_tokens + shift_computed_tokens)
            else:
                num_new_tokens = 0
            break
        # The scheduled part of the item holds no placeholder (EAGLE's shift reached it by one token):
        # nothing to encode yet. After can_allocate, whose evictions stand (vLLM's order).
        start_rel = max(0, num_computed_tokens - start_pos)
        end_rel = min(item.length, num_computed_tokens + num_new_tokens - start_pos)
        if end_rel - start_rel == 0:
            continue
        num_embeds_to_schedule += item.num_embeds
        encoder_compute_budget -= item.num_embeds
        hashes_to_schedule.add(item.mm_hash)
        to_schedule.append(i)
    return to_schedule, num_new_tokens, encoder_compute_budget


def cross_attention_tokens(self: Scheduler, request: Request, encoder_inputs: list[int] | None) -> int:
    """Encoder-decoder models: the slots the cross-attention groups get for the encoder inputs run
    this step (vLLM's num_encoder_tokens to allocate_slots); 0 for any other model."""
    if not encoder_inputs or not self.is_encoder_decoder:
        return 0
    return sum(request.mm_features[i].num_embeds for i in encoder_inputs)


def commit_encoder_inputs(self: Scheduler, st, request: Request, input_ids: list[int], budget_left: int) -> None:
    """The request was scheduled: its items are encoded this step (cache slots reserved) and the
    step's encoder budget is what try_schedule_encoder_inputs left. `st` is _schedule's _StepState."""
    st.scheduled_encoder_inputs[request.request_id] = input_ids
    for i in input_ids:
        self.encoder_cache_manager.allocate(request, i)
    st.encoder_budget = budget_left


def free_encoder_inputs(self: Scheduler, request: Request) -> None:
    """vLLM's Scheduler._free_encoder_inputs: after a step, drop the request's references to items
    its computed tokens have passed (their embeddings are in the KV cache now)."""
    ecm = self.encoder_cache_manager
    computed = request.num_computed_tokens
    encoder_decoder = self.is_encoder_decoder
    for input_id in ecm.get_cached_input_ids(request):
        # Encoder-decoder: done with the encoder input once a decoder token is computed.
        if (encoder_decoder and computed > 0) or request.mm_features[input_id].end <= computed:
            ecm.free_encoder_input(request, input_id)
