"""Canonical request and workload types: every loader and generator produces these.

Token ids are never materialised at load time (a 12k-request Mooncake trace would be ~150 M
tokens); `RequestSpec.token_ids()` builds them on demand, deterministically, from whatever
sharing information the trace has (see `traces.tokens` for the id streams):

1. real ids (`prompt_token_ids`) when the trace has them;
2. Mooncake `prefix_hash_ids`: block i of `prefix_block_len` tokens is a pure function of
   (hash id, offset), so two requests sharing k leading hash ids share exactly their first
   min(k * prefix_block_len, prompt lens) tokens, at any vLLM block size;
3. a shared-prefix group: the first `prefix_len` tokens are a pure function of (group, position);
4. everything else comes from a per-request stream keyed by `request_id`, or by `session_id`
   for multi-turn sessions, indexed by absolute position. A later turn of a session therefore
   re-reads exactly the earlier turn's prompt *and* output tokens (`output_token_ids()`), which
   is real prefix growth without storing any ids.

The GPU runner's vocabulary is smaller than 2**31: use `token_ids_mod(vocab_size)`.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from servesim.scheduler.multimodal import MultiModalFeatureSpec, check_mm_features
from servesim.traces.errors import InputError
from servesim.traces.tokens import (
    TOKEN_ID_LIMIT,
    group_stream,
    hash_block_streams,
    runs_tokens,
    stream_source,
    stream_tokens,
    text_stream,
)

DEFAULT_PREFIX_BLOCK_LEN = 512  # Mooncake hash-id block size in tokens


@dataclass(slots=True)
class RequestSpec:
    request_id: str
    arrival_time_s: float  # seconds since trace start (>= 0)
    prompt_len: int  # prompt tokens (>= 1)
    output_len: int  # tokens generated; the request finishes at this length (ignore_eos)
    prompt_token_ids: tuple[int, ...] | None = None  # real token ids when the trace has them
    prefix_hash_ids: tuple[int, ...] | None = None  # Mooncake ids, one per prefix_block_len tokens
    prefix_block_len: int = DEFAULT_PREFIX_BLOCK_LEN  # tokens per prefix hash id
    prefix_group: int | None = None  # shared-prefix group id (synthetic/canonical traces)
    prefix_len: int = 0  # tokens of the group's shared prefix at the start of the prompt
    priority: int = 0  # lower runs first under the priority policy
    session_id: str | None = None  # multi-turn session / agentic job id (Continuum job_id)
    is_last_turn: bool = True  # False for non-final turns of a session
    lora_id: int | None = None
    arrival_step: int | None = None  # only for step-indexed workloads (the vLLM oracle format)
    timeout_s: float | None = None  # the client gives up this long after sending (None: the run's client.timeout_s)
    # Structured output: the request's grammar compiles this long before it can be scheduled
    # (simulator/structured_output.py); None: no grammar.
    grammar_compile_ms: float | None = None
    # Streaming input (a vLLM resumable session, simulator/streaming_input.py): more prompt chunks
    # of these token counts arrive these many seconds after the request; None: one prompt.
    input_chunk_offsets_s: tuple[float, ...] | None = None
    input_chunk_lens: tuple[int, ...] | None = None
    # Multimodal items (images) in the prompt, sorted by offset: each a run of placeholder tokens the
    # vision encoder fills (scheduler/multimodal.py); () for a text-only request.
    mm_items: tuple[MultiModalFeatureSpec, ...] = ()
    # A closed-loop session turn (simulator/sessions.py): sent think_time_s (a user's think time or a
    # tool call's latency) after its client has the answer of request parent_request_id; its
    # arrival_time_s is then only a lower bound (the parent's plus think_time_s). Both None: the
    # request is sent at arrival_time_s.
    parent_request_id: str | None = None
    think_time_s: float | None = None
    # Who sent it and which SLO class it is judged by (simulator/gateway/: fair queuing, rate limits,
    # priority mapping; summaries break every metric down by both). None: the "default" one.
    tenant: str | None = None
    slo_class: str | None = None

    def __post_init__(self) -> None:
        # Normalise containers: tuples (hashable, immutable); an empty hash-id list means none.
        if self.prompt_token_ids is not None and not isinstance(self.prompt_token_ids, tuple):
            self.prompt_token_ids = tuple(self.prompt_token_ids)
        if self.prefix_hash_ids is not None:
            self.prefix_hash_ids = tuple(self.prefix_hash_ids) or None
        if self.input_chunk_offsets_s is not None:
            self.input_chunk_offsets_s = tuple(self.input_chunk_offsets_s) or None
        if self.input_chunk_lens is not None:
            self.input_chunk_lens = tuple(self.input_chunk_lens) or None
        if not isinstance(self.mm_items, tuple):
            self.mm_items = tuple(self.mm_items)
        problem = self._problem()
        if problem is not None:
            field_name, message, allowed = problem
            raise InputError(
                f"request {self.request_id!r}: {message}", field=field_name, allowed=allowed
            )

    def _problem(self) -> tuple[str, str, str] | None:
        """First invariant violated, as (field, message, allowed); None when the spec is valid."""
        if not isinstance(self.request_id, str) or not self.request_id:
            return "request_id", f"got {self.request_id!r}", "a non-empty string"
        if not (self.arrival_time_s >= 0.0 and math.isfinite(self.arrival_time_s)):
            return "arrival_time_s", f"got {self.arrival_time_s!r}", "a finite number >= 0"
        if self.prompt_len < 1:
            return "prompt_len", f"got {self.prompt_len}", "an integer >= 1"
        if self.output_len < 1:
            return "output_len", f"got {self.output_len}", "an integer >= 1"
        ids = self.prompt_token_ids
        if ids is not None and len(ids) != self.prompt_len:
            msg = f"{len(ids)} token ids but prompt_len is {self.prompt_len}"
            return "prompt_token_ids", msg, "exactly prompt_len ids"
        if self.prefix_block_len < 1:
            return "prefix_block_len", f"got {self.prefix_block_len}", "an integer >= 1"
        hashes = self.prefix_hash_ids
        if hashes is not None:
            max_blocks = -(-self.prompt_len // self.prefix_block_len)
            if len(hashes) > max_blocks:
                msg = f"{len(hashes)} hash ids cover more than prompt_len {self.prompt_len}"
                return "prefix_hash_ids", msg, f"at most ceil(prompt_len/{self.prefix_block_len})"
        if not 0 <= self.prefix_len <= self.prompt_len:
            msg = f"prefix_len {self.prefix_len} with prompt_len {self.prompt_len}"
            return "prefix_len", msg, "0 <= prefix_len <= prompt_len"
        if self.prefix_len > 0 and self.prefix_group is None:
            return "prefix_group", "prefix_len > 0 needs a prefix_group", "an integer group id"
        if self.prefix_group is not None and self.prefix_group < 0:
            return "prefix_group", f"got {self.prefix_group}", "an integer >= 0 or none"
        session = self.session_id
        if session is not None and (not isinstance(session, str) or not session):
            return "session_id", f"got {self.session_id!r}", "a non-empty string or none"
        for name in ("tenant", "slo_class"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                return name, f"got {value!r}", "a non-empty string or none"
        if self.arrival_step is not None and self.arrival_step < 0:
            return "arrival_step", f"got {self.arrival_step}", "an integer >= 0 or none"
        if self.timeout_s is not None and not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            return "timeout_s", f"got {self.timeout_s!r}", "a finite number of seconds > 0, or none"
        ms = self.grammar_compile_ms
        if ms is not None and not (isinstance(ms, (int, float)) and ms >= 0 and math.isfinite(ms)):
            return "grammar_compile_ms", f"got {ms!r}", "a finite number of milliseconds >= 0, or none"
        if (self.parent_request_id is None) != (self.think_time_s is None):
            return ("think_time_s", "parent_request_id and think_time_s go together",
                    "both set (a closed-loop session turn) or both none")
        if self.parent_request_id is not None:
            problem = self._turn_problem()
            if problem is not None:
                return problem
        if self.mm_items:
            problem = check_mm_features(self.request_id, self.mm_items, self.prompt_len)
            if problem is not None:
                return "mm_items", problem.split(": ", 1)[1], "items sorted by offset, disjoint, inside the prompt"
        return self._chunks_problem()

    def _turn_problem(self) -> tuple[str, str, str] | None:
        parent, think = self.parent_request_id, self.think_time_s
        if not isinstance(parent, str) or not parent or parent == self.request_id:
            return "parent_request_id", f"got {parent!r}", "another request's id (a non-empty string)"
        if isinstance(think, bool) or not isinstance(think, (int, float)) or not (think >= 0 and math.isfinite(think)):
            return "think_time_s", f"got {think!r}", "a finite number of seconds >= 0"
        if self.session_id is None:
            return "session_id", "a closed-loop turn without a session", "the session id its turns share"
        return None

    def _chunks_problem(self) -> tuple[str, str, str] | None:
        offsets, lens = self.input_chunk_offsets_s, self.input_chunk_lens
        if (offsets is None) != (lens is None) or (offsets is not None and len(offsets) != len(lens or ())):
            return ("input_chunk_lens", f"{len(offsets or ())} offsets but {len(lens or ())} lengths",
                    "one length per input chunk offset")
        if offsets is None or lens is None:
            return None
        prev = 0.0
        for t in offsets:
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > prev):
                return "input_chunk_offsets_s", f"got {offsets!r:.60}", "finite seconds > 0, strictly increasing"
            prev = t
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lens):
            return "input_chunk_lens", f"got {lens!r:.60}", "integers >= 1"
        if self.grammar_compile_ms is not None:
            return "input_chunk_lens", "a streaming-input session with a grammar", "one of the two"
        return None

    def _stream_key(self) -> int:
        """Key of the per-request (or per-session) token stream."""
        if self.session_id:
            return text_stream("session:" + self.session_id)
        return text_stream("req:" + self.request_id)

    def token_array(self) -> np.ndarray:
        """Prompt token ids as an int64 numpy array (see the module docstring for the rules)."""
        if self.prompt_token_ids is not None:
            return np.asarray(self.prompt_token_ids, dtype=np.int64)
        return runs_tokens(self._runs())

    def token_segments(self) -> tuple[tuple[bytes, int, int], ...] | None:
        """Where token_array()'s ids come from, as (stream identity, first position, count) runs in
        prompt order (the scheduler's TokenSegment fields); None for real ids, which only hashing
        can compare. Every id is a pure function of its stream and position (traces.tokens), so
        equal runs mean equal ids, and the prefix cache can key blocks by these runs alone."""
        if self.prompt_token_ids is not None:
            return None
        return tuple([(stream_source(key), start, n) for key, start, n in self._runs()])

    def plain_stream_key(self) -> int | None:
        """The key of the one stream a plain synthetic prompt (no real ids, shared prefix or image)
        reads from position 0: its request's or session's; None for any other prompt. The common
        case, read at every arrival (simulator/request_factory.py): what _runs' walk gives."""
        if self.prompt_token_ids is not None or self.prefix_hash_ids or self.prefix_group is not None \
                or self.mm_items:
            return None
        return self._stream_key()

    def _runs(self) -> list[tuple[int, int, int]]:
        """The synthetic prompt as (stream key, first position, count) runs, in order: Mooncake hash
        ids (one run each) or a shared-prefix group, then the request's (or session's) own stream."""
        n, covered = self.prompt_len, 0
        plain = self.plain_stream_key()
        if plain is not None:
            return [(plain, 0, n)]
        runs: list[tuple[int, int, int]] = []
        if self.prefix_hash_ids:
            for key in hash_block_streams(self.prefix_hash_ids):
                take = min(self.prefix_block_len, n - covered)
                if take <= 0:
                    break
                runs.append((key, 0, take))
                covered += take
        elif self.prefix_group is not None and self.prefix_len > 0:
            runs.append((group_stream(self.prefix_group), 0, self.prefix_len))
            covered = self.prefix_len
        for item in self.mm_items:  # an image's placeholders: one stream per image (equal images, equal ids)
            if not item.in_prompt:
                continue  # an encoder-decoder model's encoder input: no decoder prompt tokens
            if item.offset < covered:
                continue  # inside a shared prefix: the prefix's ids stand
            if item.offset > covered:
                runs.append((self._stream_key(), covered, item.offset - covered))
            runs.append((text_stream("image:" + item.mm_hash), 0, item.length))
            covered = item.end
        if covered < n:
            runs.append((self._stream_key(), covered, n - covered))
        return runs

    def token_ids(self) -> list[int]:
        """Prompt token ids (len == prompt_len), each in [0, 2**31)."""
        if self.prompt_token_ids is not None:
            return list(self.prompt_token_ids)
        return self.token_array().tolist()

    def token_id_array(self) -> array | tuple[int, ...]:
        """Prompt token ids as array('i'): what the simulator hands the scheduler (4 bytes a token,
        no boxed Python ints; the same ids as token_ids()). Real ids stay the trace's tuple (the
        scheduler's Request picks their compact form)."""
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        ids = array("i")  # generated ids are in [0, 2**31): they fit int32
        ids.frombytes(self.token_array().astype("=i4").tobytes())
        return ids

    def token_ids_mod(self, vocab_size: int) -> list[int]:
        """Prompt token ids folded into a model vocabulary (what the GPU runner feeds the model).

        Equal ids stay equal, so prefix sharing is preserved; distinct ids may collide, which for
        vocab_size >= ~1000 leaves a chance of a spurious 16-token block match that is negligible.
        """
        if not 1 <= vocab_size <= TOKEN_ID_LIMIT:
            raise InputError(f"vocab_size {vocab_size}", field="vocab_size", allowed="1..2**31")
        return (self.token_array() % vocab_size).tolist()

    def output_token_ids(self) -> list[int]:
        """Deterministic ids for the `output_len` generated tokens.

        They continue the request's (or session's) stream at positions prompt_len.., so when a
        simulator appends these as the "generated" tokens, the next turn of the same session, whose
        prompt re-reads that stream, hits the KV blocks written during this turn's decode.
        """
        key = self._stream_key()
        return stream_tokens(key, self.prompt_len, self.prompt_len + self.output_len).tolist()
