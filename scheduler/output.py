"""Boundary types between the scheduler and the executors (simulated or GPU)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servesim.scheduler.kv.manager import PrefixCacheStats
from servesim.scheduler.lazy_ids import LazyTokenIds
from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.scheduler.request import SamplingParams

if TYPE_CHECKING:
    from servesim.scheduler.encoder_cache import EncoderCacheStats
    from servesim.scheduler.sglang.hicache import HiCacheStats


@dataclass(slots=True)
class NewRequestData:
    """A request scheduled for the first time (the worker has no state for it yet)."""

    req_id: str
    prompt_token_ids: Sequence[int] | LazyTokenIds  # the request's compact array, or its unbuilt ids
    # (scheduler/request.py: len() builds nothing, iterating builds them)
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]  # group -> block ids of the whole request so far
    num_computed_tokens: int  # tokens already in KV (prefix-cache hit) before this step
    lora_id: int | None = None
    mm_features: tuple[MultiModalFeatureSpec, ...] = ()  # its multimodal items (the worker encodes them)


@dataclass(slots=True)
class CachedRequestData:
    """Deltas for requests the worker already knows (running, or resumed after preemption)."""

    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)  # back after preemption: replace blocks
    new_token_ids: list[list[int]] = field(default_factory=list)  # only with pipeline parallelism
    # req_id -> all token ids (a copy: vLLM's req.all_token_ids.copy()), only for requests not
    # scheduled in the previous step; in the request's own compact form (an int array, or a list
    # for ids beyond int64), so a sync pipeline's alternating batches copy bytes, not boxed ints;
    # SGLang's unbuilt ids stay unbuilt until read (Request.all_token_ids_copy).
    all_token_ids: dict[str, array | list[int] | LazyTokenIds] = field(default_factory=dict)
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)  # None: no new blocks
    num_computed_tokens: list[int] = field(default_factory=list)  # before this step's tokens
    num_output_tokens: list[int] = field(default_factory=list)  # incl. async placeholders

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens this step, in scheduling order
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]  # req_id -> draft token ids verified this step
    num_common_prefix_blocks: list[int]  # per KV group, blocks shared by every request holding KV
    finished_req_ids: set[str]  # finished since the previous schedule(): the worker frees them
    preempted_req_ids: set[str]
    num_invalid_spec_tokens: dict[str, int] | None = None
    # The connector's plan for the worker (build_connector_meta), None without a connector.
    kv_connector_metadata: object | None = None
    # Structured output (vLLM): a scheduled request that samples this step needs a grammar bitmask;
    # async: one whose previous step's tokens are still in flight (the bitmask waits for them).
    has_structured_output_requests: bool = False
    pending_structured_output_tokens: bool = False
    # Multimodal: req_id -> indices of its items the encoder runs this step (scheduling order), and
    # the mm hashes evicted from the encoder cache since the previous step (the worker drops them).
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    free_encoder_mm_hashes: list[str] = field(default_factory=list)

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls([], CachedRequestData(), {}, 0, {}, [], set(), set())


@dataclass(slots=True)
class KVConnectorOutput:
    """KV transfers the worker-side connector saw complete (vLLM's KVConnectorOutput).

    vLLM holds both as sets and acts on them in set-iteration order; here they are sequences in
    the order the worker reported them, and the scheduler replays the set order (scheduler/pyset).
    """

    finished_recving: tuple[str, ...] = ()  # loads into WAITING_FOR_REMOTE_KVS requests that landed
    finished_sending: tuple[str, ...] = ()  # finished requests whose KV the remote side has read


@dataclass(slots=True)
class ModelRunnerOutput:
    """What the executor returns for one step."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]  # per request; empty for a partial prefill chunk
    # req_id -> draft tokens proposed for the next step (spec decode), if any.
    draft_token_ids: dict[str, list[int]] | None = None
    kv_connector_output: KVConnectorOutput | None = None


@dataclass(slots=True)
class SpecDecodingStats:
    num_spec_tokens: int  # configured drafts per step
    num_drafts: int = 0  # requests that verified drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # position -> accepted count (acceptance by draft position)
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1


@dataclass(slots=True)
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int  # waiting + skipped_waiting
    kv_cache_usage: float  # fraction of usable blocks in use
    prefix_cache_stats: PrefixCacheStats
    spec_decoding_stats: SpecDecodingStats | None = None
    num_pinned_reqs: int = 0  # Continuum
    # SGLang's HiCache (scheduler/sglang/hicache.py HiCacheStats): host-tier hits and bytes copied
    # since the previous stats; None for schedulers without a host tier.
    hicache_stats: HiCacheStats | None = None
    connector_prefix_cache_stats: PrefixCacheStats | None = None  # with a KV connector only
    encoder_cache_usage: float = 0.0  # fraction of the encoder cache's slots held (vLLM's)
    encoder_cache_stats: EncoderCacheStats | None = None  # encoder-cache lookups since the last stats


@dataclass(slots=True)
class RequestOutput:
    """Per-request result of update_from_output (or of an abort / ignore)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | "repetition" | None
    num_cached_tokens: int  # prefix-cache hit at admission (0 if never admitted)
    stop_reason: int | str | None = None
    # Set on a request the scheduler refused at add_request (take_ignored_outputs): the rule it
    # failed, in the admission vocabulary (simulator/liveness.py REJECT_REASONS).
    reject_reason: str | None = None


@dataclass(slots=True)
class EngineCoreOutputs:
    outputs: list[RequestOutput]
    scheduler_stats: SchedulerStats | None = None
    finished_req_ids: list[str] = field(default_factory=list)  # in finishing order
