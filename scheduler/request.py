"""Request and its lifecycle states, with vLLM V1's field names.

One counter model: a request is only `num_computed_tokens` chasing `num_tokens_with_spec`. Whether it
is "prefilling" or "decoding" is never stored; metrics derive it.
"""

from __future__ import annotations

import enum
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from servesim.scheduler.block_keys import BlockKeyPlan
from servesim.scheduler.hashing import TokenProvenance, extra_keys_bytes
from servesim.scheduler.lazy_ids import LazyTokenIds, OutputIdSource, compact_ids
from servesim.scheduler.multimodal import MultiModalFeatureSpec, check_mm_features


class RequestStatus(enum.IntEnum):
    """Lifecycle states; every value above PREEMPTED is a finished state (as in vLLM)."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


# Blocked waiting states: the request sits in skipped_waiting until something outside promotes it.
BLOCKED_WAITING_STATES = frozenset(
    {
        RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
        RequestStatus.WAITING_FOR_REMOTE_KVS,
        RequestStatus.WAITING_FOR_STREAMING_REQ,
    }
)

FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ERROR: "error",
    RequestStatus.FINISHED_REPETITION: "repetition",
    # vLLM: a streaming session whose input chunk finished is "stop" to its client.
    RequestStatus.WAITING_FOR_STREAMING_REQ: "stop",
}


@dataclass(slots=True)
class SamplingParams:
    """The subset of vLLM's SamplingParams that the scheduler reads."""

    max_tokens: int = 16  # output tokens after which the request stops (length cap)
    min_tokens: int = 0  # no stop rule fires before this many output tokens
    ignore_eos: bool = False
    eos_token_id: int | None = None  # None: the model has no EOS (never stops on it)
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.min_tokens > self.max_tokens:  # vLLM's SamplingParams refuses this too
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}")
        self.stop_token_ids = tuple(self.stop_token_ids)


@dataclass(slots=True)
class StructuredOutputRequest:
    """A request's structured-output state as the scheduler reads it (vLLM's StructuredOutputRequest:
    its grammar is compiled asynchronously; the scheduler only asks whether it is ready)."""

    grammar_ready: bool = False  # vLLM: the grammar future has resolved


class BlockHasher(Protocol):
    """request -> hashes of its newly completed full blocks (hashing.make_block_hasher builds one)."""

    block_size: int  # tokens per hashed block: a request skips the call until a block completes

    def __call__(self, request: Request, /) -> list[bytes]:
        ...


class Request:
    """A request as the scheduler sees it. Mirrors vllm.v1.request.Request."""

    __slots__ = (
        "request_id", "priority", "sampling_params", "arrival_time", "lora_id", "cache_salt",
        "job_id", "is_last_step", "status", "stop_reason", "max_tokens",
        "num_prompt_tokens", "_output_token_ids", "_all_token_ids", "_lazy_prompt", "num_output_placeholders",
        "discard_latest_async_tokens", "spec_token_ids", "num_computed_tokens",
        "num_cached_tokens", "is_prefill_chunk", "num_preemptions",
        "num_external_computed_tokens", "block_hashes", "_block_hasher", "_hash_block_size", "_key_plan",
        "skip_reading_prefix_cache", "_out_source", "_out_pending", "mm_features",
        "structured_output_request", "resumable", "streaming_queue",
        "__weakref__",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | LazyTokenIds,  # copied (an array('i') or array('q') without
        # boxing ids), or built only when something reads them
        sampling_params: SamplingParams,
        arrival_time: float = 0.0,  # seconds (any epoch the caller uses); a priority tie-breaker
        priority: int = 0,  # lower runs first under the priority policy
        lora_id: int | None = None,  # LoRA adapter id (> 0); None = base model
        cache_salt: str | None = None,  # isolates this request's prefix cache entries
        block_hasher: BlockHasher | None = None,
        job_id: str | None = None,  # Continuum: the agentic job this turn belongs to
        is_last_step: bool = True,  # Continuum: False for non-final turns of a job
        token_provenance: TokenProvenance | None = None,  # where the ids come from: keys without hashing
        structured_output: bool = False,  # needs a grammar: waits for its compilation (blocked_waits.py)
        resumable: bool = False,  # a streaming-input session: more input chunks may follow
        mm_features: Sequence[MultiModalFeatureSpec] = (),  # multimodal items, sorted by offset
    ) -> None:
        if not len(prompt_token_ids):
            raise ValueError(f"request {request_id!r}: prompt_token_ids must not be empty")
        if lora_id is not None and lora_id <= 0:
            raise ValueError(f"request {request_id!r}: lora_id must be > 0 or None")
        self.request_id = request_id
        self.priority = priority
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.lora_id = lora_id
        self.cache_salt = cache_salt
        self.job_id = job_id
        self.is_last_step = is_last_step
        # vLLM's Request: a request with structured output starts blocked on its grammar.
        self.structured_output_request = StructuredOutputRequest() if structured_output else None
        self.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR if structured_output else RequestStatus.WAITING
        self.resumable = resumable
        # Input chunks (or None: the input stream closed) that arrived while the session ran.
        self.streaming_queue: deque | None = None
        self.stop_reason: int | str | None = None
        self.max_tokens = sampling_params.max_tokens
        # Prompt and output ids live once, in one array of machine ints (4 bytes a token while ids fit
        # int32, instead of a pointer plus a boxed int, twice): a queued long prompt is the simulator's
        # largest object. A lazy prompt leaves it None until read (outputs then live only in
        # _output_token_ids); invariant: num_tokens == num_prompt_tokens + len(_output_token_ids).
        self._lazy_prompt: LazyTokenIds | None = None
        self._all_token_ids: array | list[int] | None = None
        if isinstance(prompt_token_ids, LazyTokenIds):
            self._lazy_prompt = prompt_token_ids
        else:
            self._all_token_ids = compact_ids(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self._output_token_ids: list[int] = []
        self.mm_features: tuple[MultiModalFeatureSpec, ...] = _checked_mm_features(
            request_id, mm_features, self.num_prompt_tokens)
        # Output ids not built yet (append_output_tokens_from): (index into _output_token_ids, first
        # position in _out_source's stream, count), ascending; the list holds placeholders there.
        # Invariant: pending ids only while the prompt is lazy (_all_token_ids is None).
        self._out_source: OutputIdSource | None = None
        self._out_pending: list[tuple[int, int, int]] | None = None
        # Async scheduling: tokens scheduled whose ids are not known yet (counted as computed).
        self.num_output_placeholders = 0
        self.discard_latest_async_tokens = False
        self.spec_token_ids: list[int] = []
        self.num_computed_tokens = 0
        # Prefix-cache hit (tokens) at first admission; None until then (vLLM uses -1).
        self.num_cached_tokens: int | None = None
        self.is_prefill_chunk = False
        self.num_preemptions = 0
        self.num_external_computed_tokens = 0
        self.block_hashes: list[bytes] = []
        self._block_hasher = block_hasher
        # Tokens per hashed block: no hashing work until another full block exists (1 = always ask).
        # make_block_hasher's hashers carry it; None never raises AttributeError (costly per arrival).
        self._hash_block_size: int = 1 if block_hasher is None else block_hasher.block_size
        self.skip_reading_prefix_cache = False
        # Prefix-cache keys from the ids' provenance (block_keys.py) while it declares them.
        self._key_plan: BlockKeyPlan | None = None
        if token_provenance is not None and not self.mm_features:  # provenance keys carry no mm hashes
            extra = extra_keys_bytes(self, 0) if lora_id is not None or cache_salt else b""  # (b"": none)
            self._key_plan = BlockKeyPlan(token_provenance.prompt, self.num_prompt_tokens,
                                          token_provenance.output_source, extra)
        self.update_block_hashes()

    # --- token bookkeeping -------------------------------------------------------------------
    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        all_ids = self._all_token_ids
        if all_ids is None:  # lazy prompt: the outputs alone until something reads all the ids
            if isinstance(token_ids, int):
                self._output_token_ids.append(token_ids)
            else:
                self._output_token_ids.extend(token_ids)
            self.update_block_hashes()
            return
        try:
            if isinstance(token_ids, int):
                self._output_token_ids.append(token_ids)
                all_ids.append(token_ids)
            else:
                self._output_token_ids.extend(token_ids)
                if type(token_ids) is list and type(all_ids) is array:
                    all_ids.fromlist(token_ids)  # one C call (extend converts item by item)
                else:
                    all_ids.extend(token_ids)
        except OverflowError:  # an id beyond the array's type: a wider one (outputs are complete)
            self._all_token_ids = compact_ids([*all_ids[: self.num_prompt_tokens], *self._output_token_ids])
        self.update_block_hashes()

    def append_output_tokens_from(self, source: OutputIdSource, first: int, n: int) -> None:
        """Append output ids first .. first + n - 1 of source's stream for this request (a run of
        decode steps' tokens: lazy_ids.py), built only when something reads them. A request
        whose prompt ids are already built keeps every id built and takes them now."""
        if n <= 0:
            return
        if self._all_token_ids is not None:
            self.append_output_token_ids(source.tokens(self.request_id, first, n))
            return
        pending = self._out_pending
        if pending is None or self._out_source is not source:
            if pending:
                self._build_outputs()
            self._out_source = source
            self._out_pending = pending = []
        out = self._output_token_ids
        pending.append((len(out), first, n))
        out.extend([0] * n)  # placeholders: every reader builds the ids first (_build_outputs)
        self.update_block_hashes()

    def _build_outputs(self) -> None:
        """Put the unbuilt output ids in place of their placeholders."""
        pending, source = self._out_pending, self._out_source
        self._out_pending = None
        if not pending or source is None:
            return
        out = self._output_token_ids
        for index, first, n in pending:
            ids = source.tokens(self.request_id, first, n)
            if len(ids) != n:  # the source's contract; a wrong count would shift every later id
                raise ValueError(f"{self.request_id}: the token source gave {len(ids)} ids for {n}")
            out[index:index + n] = ids

    def continue_session(self, chunk_ids: Sequence[int]) -> None:
        """Streaming input (vLLM's _update_request_as_session): the computed tokens become the
        prompt (the last sampled token, never computed, is dropped), then the new chunk follows.
        Block hashes already computed stay as they are (vLLM only appends new ones)."""
        ids = [*self.all_token_ids[: self.num_computed_tokens], *chunk_ids]
        self._all_token_ids = compact_ids(ids)
        self._lazy_prompt = None
        self._output_token_ids = []
        self._out_source = self._out_pending = None
        self._key_plan = None  # the ids no longer follow the declared provenance
        self.num_prompt_tokens = len(ids)
        self.update_block_hashes()

    @property
    def key_root(self) -> bytes | None:
        """The first base of this request's provenance keys (block_keys.py): two requests' blocks
        can have equal prefix-cache keys only if their roots are equal. None when its keys are
        hashes of its ids."""
        plan = self._key_plan
        if plan is None or self._block_hasher is None or self._hash_block_size <= 1:
            return None
        return plan.root

    def take_prompt_keys(self, donor: Request) -> None:
        """Take `donor`'s key plan and its prompt blocks' keys instead of building them (a P/D
        hand-off: the decode side's request, built without provenance, of the prefill side's;
        simulator/cluster/pd_keys.py). The caller's promise: donor has this prompt's provenance, output
        source and extra keys and was keyed with this request's hasher block size, so its plan is
        the one this request would build (a pure function of them, never changed once built) and
        its first num_prompt_tokens // block size keys are what extend_keys would hand out here."""
        self._key_plan = donor._key_plan
        self.block_hashes = donor.block_hashes[: self.num_prompt_tokens // donor._hash_block_size]

    def attach_block_hasher(self, block_hasher: BlockHasher, block_size: int) -> None:
        """Key this request's blocks with the scheduler's hasher (a request built without one), now
        and as tokens are appended; block_size is its tokens per hashed block."""
        if self._block_hasher is not None:
            return
        self._block_hasher = block_hasher
        self._hash_block_size = block_size
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash the newly completed full blocks (block hashes grow with the tokens)."""
        if self._block_hasher is None:
            return
        num_tokens, block_size = self.num_prompt_tokens + len(self._output_token_ids), self._hash_block_size
        if num_tokens < (len(self.block_hashes) + 1) * block_size:
            return  # no new full block yet
        plan = self._key_plan
        if plan is not None and block_size > 1:  # the declared blocks' keys need no id read
            plan.extend_keys(self.block_hashes, num_tokens, block_size)
            if num_tokens < (len(self.block_hashes) + 1) * block_size:
                return
        self.block_hashes.extend(self._block_hasher(self))

    @property
    def prompt_token_ids(self) -> array | list[int] | LazyTokenIds:
        """The prompt ids (read when the request is first scheduled, not per step): a fresh copy,
        or the lazy prompt itself while its ids are unbuilt (immutable; len() builds nothing)."""
        if self._all_token_ids is None and self._lazy_prompt is not None:
            return self._lazy_prompt
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        if self._out_pending:
            self._build_outputs()
        return self._output_token_ids  # read-only by convention

    def last_output_token_id(self) -> int:
        """The latest output id (there is at least one)."""
        pending = self._out_pending
        if pending:
            index, first, n = pending[-1]
            if index + n == len(self._output_token_ids):  # the last id is unbuilt: build it alone
                assert self._out_source is not None
                return self._out_source.tokens(self.request_id, first + n - 1, 1)[0]
        return self._output_token_ids[-1]

    @property
    def all_token_ids(self) -> array | list[int]:
        """Prompt and output ids (read-only by convention; see lazy_ids.compact_ids for the type); a lazy
        prompt's ids are built here, once."""
        ids = self._all_token_ids
        if ids is None:
            assert self._lazy_prompt is not None
            prompt = self._lazy_prompt.ids()
            outputs = self.output_token_ids  # built: from here on every id is appended built
            if type(prompt) is array:
                ids = prompt[:]  # our own copy: the lazy prompt's ids may be shared with readers
                try:
                    ids.fromlist(outputs)  # all or nothing
                except OverflowError:  # an output id beyond the array's type: a wider one
                    ids = compact_ids([*prompt, *outputs])
            else:
                ids = [*prompt, *outputs]
            self._lazy_prompt = None
            self._all_token_ids = ids
        return ids

    def all_token_ids_copy(self) -> array | list[int] | LazyTokenIds:
        """A copy of all the ids as they are now (a step's CachedRequestData.all_token_ids). Ids not
        built stay unbuilt until the copy is read, which reads this request's first num_tokens ids
        then: these, unless continue_session replaced them (a streaming session's copy is made now)."""
        if self._all_token_ids is not None or self.resumable:
            return self.all_token_ids[:]
        n = self.num_tokens
        return LazyTokenIds(n, lambda: self.all_token_ids[:n])

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self._output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_prompt_tokens + len(self._output_token_ids) + len(self.spec_token_ids)

    @property
    def use_structured_output(self) -> bool:
        return self.structured_output_request is not None

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    def get_finished_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def __hash__(self) -> int:
        # Identity hash, spelt out: Python keeps object's hash for a class that defines __lt__ but
        # not __eq__; a mypyc-compiled class loses it (and requests live in sets). Its value, not a
        # call of object.__hash__ (~0.65 us compiled, ~1 % of the Azure hour): CPython hashes an
        # object by its address rotated right by 4 bits (_Py_HashPointer), which for an address
        # aligned to 16 bytes (every allocator CPython uses) is the address shifted.
        p = id(self)
        if p & 15 == 0:
            return p >> 4
        return object.__hash__(self)

    # --- priority-queue order: priority, then arrival_time, then request_id --------------------
    def __lt__(self, other: Request) -> bool:
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        return self.request_id < other.request_id

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )


def _checked_mm_features(request_id: str, mm_features: Sequence[MultiModalFeatureSpec],
                         num_prompt_tokens: int) -> tuple[MultiModalFeatureSpec, ...]:
    """The items as a tuple; ValueError for items out of order, overlapping or past the prompt."""
    items = tuple(mm_features)
    if items:
        problem = check_mm_features(request_id, items, num_prompt_tokens)
        if problem is not None:
            raise ValueError(problem)
    return items


def check_stop(request: Request, max_model_len: int) -> bool:
    """Apply vLLM's stop rules after a token was appended; sets status on stop.

    Order follows vLLM: min_tokens gates the stop rules; then EOS (unless ignore_eos), stop token
    ids, then the length caps (max_model_len, max_tokens). One deviation: min_tokens never holds a
    request past max_model_len (vLLM's frontend clamps max_tokens to the room left, so it cannot
    happen there; a request handed to the scheduler directly would otherwise outgrow its positions).
    """
    params = request.sampling_params
    if request.num_output_tokens < params.min_tokens:
        if request.num_tokens < max_model_len:
            return False
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    eos = not params.ignore_eos and params.eos_token_id is not None
    if eos or params.stop_token_ids:  # the last id is read only by a rule that needs it
        last = request.last_output_token_id()
        if eos and last == params.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last
            return True
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def append_until_stop(request: Request, new_ids: list[int], max_model_len: int) -> tuple[list[int], bool]:
    """Append sampled tokens one by one; at the first stop condition drop the rest (in place).

    Returns (the tokens kept, whether the request stopped)."""
    # A counter, not enumerate(new_ids, 1): mypyc compiles only one-argument enumerate to a loop
    # (with a start it builds an enumerate object per call: ~1 % of an hour's replay).
    n = 0
    for tok in new_ids:
        n += 1
        request.append_output_token_ids(tok)
        if check_stop(request, max_model_len):
            del new_ids[n:]
            return new_ids, True
    return new_ids, False
