"""The worker-side view shared by every executor (simulated or GPU): which requests sample in a step,
and which tokens they sample.

Output token k of a request is the vLLM oracle's rule (steptrace.oracle_token), so the scheduler sees
the same tokens, and the same prefix-cache block hashes, in every mode. Speculative decoding uses a
seeded per-position acceptance model: draft position i of the step whose first new output is the
request's k-th is accepted when u(seed, req_id, k, i) < acceptance[i] and every earlier position
was; u is a pure hash, so the outcome does not depend on who asks or in which order.
"""

from __future__ import annotations

import math
import zlib
from typing import Final

from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.oracle_trace import oracle_token
from servesim.scheduler.lazy_ids import RunTokens


def _crc32_table() -> list[int]:
    """zlib's CRC-32 (reflected, polynomial 0xEDB88320) a byte at a time: entry b is the register
    step for byte b."""
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    return table


# Final: compiled, a module global that may be rebound is a dict lookup at every read (tokens()
# read both per call: ~0.6 % of the hour)
_CRC32: Final[list[int]] = _crc32_table()
# A message's last byte: the register step and zlib's final complement in one entry (crc32 =
# _CRC32_LAST[(reg & 0xFF) ^ byte] ^ (reg >> 8): the complement distributes over the xor)
_CRC32_LAST: Final[list[int]] = [c ^ 0xFFFFFFFF for c in _CRC32]
_ZERO_DIGIT: Final = 48  # b"0"[0]
_COLON: Final = 58  # b":"[0]


class _StreamRegisters:
    """One request's zlib CRC-32 registers (TokenSource.tokens): after "req_id:", and after
    "req_id:" and the decimal digits of `tens` (position // 10) for the last tens asked:
    consecutive positions share it nine times in ten, so most ids cost one table step. And after
    the digits of `hundreds` (tens // 10) for the last ones asked: a new tens then costs one more."""

    __slots__ = ("after_prefix", "tens", "after_tens", "hundreds", "after_hundreds")

    def __init__(self, after_prefix: int) -> None:
        self.after_prefix = after_prefix
        self.tens = 0  # positions 0..9 have no digit before their last
        self.after_tens = after_prefix
        self.hundreds = 0  # positions 0..99 have no digit before their tens digit
        self.after_hundreds = after_prefix


class TokenSource:
    def __init__(self, seed: int = 0, acceptance: tuple[float, ...] = ()) -> None:
        self.seed = seed
        self.acceptance = tuple(acceptance)
        # req_id -> its CRC-32 registers (tokens()): most calls build one id (a stepped step's, a
        # run's last), and formatting and hashing the prefix and the tens digits was most of that
        self._registers: dict[str, _StreamRegisters] = {}
        # req_id -> its registers after "seed:req_id:" and the tens digits last asked (accepted_run:
        # a stepped verify step draws every request's acceptance, and a run each request's next
        # steps; formatting and hashing the prefix and the tens digits per call would be most of that)
        self._accept_registers: dict[str, _StreamRegisters] = {}
        # u >= p exactly when crc >= p * 2**32 (both sides scaled by a power of two: exact
        # floats), i.e. when the integer crc >= its ceiling
        self._limits = [math.ceil(p * 2**32) for p in self.acceptance]

    def _stream(self, req_id: str) -> _StreamRegisters:
        regs = self._registers.get(req_id)
        if regs is None:
            regs = self._registers[req_id] = _StreamRegisters(zlib.crc32(f"{req_id}:".encode()) ^ 0xFFFFFFFF)
        return regs

    def forget(self, req_id: str) -> None:
        """req_id is done: drop its cached registers (computed again if its ids are ever read)."""
        self._registers.pop(req_id, None)
        self._accept_registers.pop(req_id, None)

    def token(self, req_id: str, k: int) -> int:
        return oracle_token(req_id, k)

    def output_source(self, req_id: str) -> bytes:
        """The identity of req_id's output id stream (output k = position k; block_keys.TokenSegment):
        the ids depend on the request id alone."""
        return b"oracle:" + req_id.encode()

    def num_accepted(self, req_id: str, k: int, num_drafts: int) -> int:
        """Accepted drafts (always a prefix) when the step's first new output is the k-th: draft i
        is when u(seed, req_id, k, i) = crc32(b"seed:req_id:k:i") / 2**32 < acceptance[i] and every
        earlier one was (a run of one step)."""
        return self.accepted_run(req_id, k, 1, num_drafts, k + 1)[0]

    def accepted_run(self, req_id: str, k: int, num_steps: int, num_drafts: int, until_k: int) -> list[int]:
        """num_accepted of num_steps consecutive verify steps of num_drafts drafts each, the first
        one's first new output being the k-th (each next step's: k + 1 + accepted), fewer where a
        step would start at until_k or later (a request's max_tokens: it stops before): a run of
        steps drawn in bulk (simulator/fastpath/spec_runs.py). The same u as _uniform, by zlib's
        CRC-32 register arithmetic (as tokens()): "seed:req_id:" once, the digits of k // 10
        once a decade of positions (both kept between calls, until forget), then k's last
        digit, ":" and the draft's index."""
        table, last = _CRC32, _CRC32_LAST
        regs = self._accept_registers.get(req_id)
        if regs is None:
            regs = _StreamRegisters(zlib.crc32(f"{self.seed}:{req_id}:".encode()) ^ 0xFFFFFFFF)
            self._accept_registers[req_id] = regs
        limits = self._limits if num_drafts >= len(self._limits) else self._limits[:num_drafts]
        out: list[int] = []
        tens, after_tens = regs.tens, regs.after_tens
        for _step in range(num_steps):
            if k >= until_k:
                break
            t = k // 10
            if t != tens:
                after_tens = _after_tens(regs, t)
                tens = t
            reg = table[(after_tens ^ (_ZERO_DIGIT + k - t * 10)) & 0xFF] ^ (after_tens >> 8)
            reg = table[(reg ^ _COLON) & 0xFF] ^ (reg >> 8)
            # draft n < 10's u: one last byte after reg (its low byte xor a digit stays a byte)
            low, high = reg & 0xFF, reg >> 8
            n = 0
            for limit in limits:
                if n < 10:
                    crc = last[low ^ (_ZERO_DIGIT + n)] ^ high
                else:
                    crc = reg
                    for byte in b"%d" % n:
                        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
                    crc ^= 0xFFFFFFFF
                if crc >= limit:
                    break
                n += 1
            out.append(n)
            k += 1 + n
        return out

    def tokens(self, req_id: str, k: int, n: int) -> list[int]:
        """Output tokens k .. k + n - 1 of req_id (a run of decode steps samples them in bulk):
        oracle_token's crc32 of "req_id:k", continued byte by byte from the crc of "req_id:" (the
        same register arithmetic as zlib's). Positions that differ only in their last decimal digit
        share the register after the other digits, so most tokens cost one table step."""
        last = _CRC32_LAST
        regs = self._stream(req_id)
        out: list[int] = []
        pos, end = k, k + n
        while pos < end:
            tens = pos // 10
            reg = _after_tens(regs, tens)
            low, high = reg & 0xFF, reg >> 8
            stop = min(end, tens * 10 + 10)  # the positions sharing every digit but the last
            for digit in range(pos - tens * 10, stop - tens * 10):
                out.append(1000 + (last[low ^ (_ZERO_DIGIT + digit)] ^ high) % 40000)
            pos = stop
        return out

    def tokens_at(self, req_ids: list[str], positions: list[int]) -> list[int]:
        """Output token positions[i] of req_ids[i], for each i: one step of a run's batch in one
        call (tokens() per request built and dropped a list each, through a generic call)."""
        last = _CRC32_LAST
        out: list[int] = []
        for req_id, pos in zip(req_ids, positions):
            tens = pos // 10
            regs = self._stream(req_id)
            reg = regs.after_tens if tens == regs.tens else _after_tens(regs, tens)
            out.append(1000 + (last[(reg & 0xFF) ^ (_ZERO_DIGIT + pos - tens * 10)] ^ (reg >> 8)) % 40000)
        return out

    def drafts(self, req_id: str, k: int, num_spec_tokens: int) -> list[int]:
        """Drafts proposed after output k-1: the target's own next tokens, so acceptance is what
        the acceptance model says (a rejected draft is simply not used). oracle_token's ids,
        through tokens()' cached registers."""
        return self.tokens(req_id, k, num_spec_tokens)


def _after_tens(regs: _StreamRegisters, tens: int) -> int:
    """The CRC-32 register after "req_id:" and the decimal digits of tens (a position // 10; none
    for 0), kept in regs for the next position of the same tens."""
    if tens != regs.tens:
        table = _CRC32
        hundreds = tens // 10
        if hundreds != regs.hundreds:
            reg = regs.after_prefix
            if hundreds:
                # its decimal digits, the most significant first, by arithmetic (formatting them
                # is a generic call costing more than the hashing)
                div = 1
                while div * 10 <= hundreds:
                    div *= 10
                while div:
                    reg = table[(reg ^ (_ZERO_DIGIT + hundreds // div % 10)) & 0xFF] ^ (reg >> 8)
                    div //= 10
            regs.hundreds, regs.after_hundreds = hundreds, reg
        reg = regs.after_hundreds
        if tens:  # its last digit (its only one below 10)
            reg = table[(reg ^ (_ZERO_DIGIT + tens - hundreds * 10)) & 0xFF] ^ (reg >> 8)
        regs.tens, regs.after_tens = tens, reg
    return regs.after_tens


class _WorkerRequest:
    """What the worker knows of one request (one object, one lookup a step: two dicts of ints
    cost two lookups and two boxed stores per request per step)."""

    __slots__ = ("num_tokens", "num_out")

    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens  # tokens the worker knows (prompt + sampled)
        self.num_out = 0  # output tokens sampled so far


class BatchTracker:
    """Per-request worker state rebuilt from SchedulerOutputs only (like vLLM's persistent batch)."""

    def __init__(self, tokens: TokenSource, num_spec_tokens: int = 0) -> None:
        self.tokens = tokens
        self.num_spec_tokens = num_spec_tokens
        self._requests: dict[str, _WorkerRequest] = {}  # req_id -> its state

    def prepare(self, so: SchedulerOutput) -> tuple[list[str], list[int], list[int], list[bool]]:
        """(request order, new tokens, context tokens before the step, samples?) for this step."""
        self.forget(so.finished_req_ids)
        computed: dict[str, int] = {}  # the new requests' (then every one's, if out of order below)
        requests = self._requests
        for nr in so.scheduled_new_reqs:
            computed[nr.req_id] = nr.num_computed_tokens
            self.admit(nr.req_id, len(nr.prompt_token_ids))
        cached = so.scheduled_cached_reqs
        cached_ids, cached_computed = cached.req_ids, cached.num_computed_tokens
        num_cached, i = len(cached_ids), 0
        req_ids = list(so.num_scheduled_tokens)
        new, ctx, sample = [], [], []
        for rid, n in so.num_scheduled_tokens.items():
            # vLLM's scheduler lists its cached requests in the order it scheduled them, so they
            # come up here in order, new ones between them: read them off without a map
            if i < num_cached and cached_ids[i] == rid:
                c = cached_computed[i]
                i += 1
            else:
                if i < num_cached and rid not in computed:  # another order: map every cached one
                    for j in range(i, num_cached):
                        computed[cached_ids[j]] = cached_computed[j]
                    num_cached = i  # (the map answers from now on)
                c = computed[rid]
            new.append(n)
            ctx.append(c)
            # Samples when the step reaches the end of the tokens the worker knows: the scheduler's
            # is_prefill_chunk rule. Steps execute in order, so with async scheduling the worker
            # already holds the tokens that were placeholders when this step was scheduled.
            sample.append(c + n >= requests[rid].num_tokens)
        return req_ids, new, ctx, sample

    def admit(self, req_id: str, num_prompt_tokens: int) -> None:
        """A new request of a step (NewRequestData): its state, or, resumed after a preemption,
        the prompt it comes back with, its outputs kept."""
        state = self._requests.get(req_id)
        if state is None:
            self._requests[req_id] = _WorkerRequest(num_prompt_tokens)
        else:
            state.num_tokens = num_prompt_tokens

    def forget(self, finished_req_ids: set[str]) -> None:
        """Drop finished requests (what prepare() does with a step's finished_req_ids)."""
        tokens = self.tokens
        requests = self._requests
        for rid in finished_req_ids:
            requests.pop(rid, None)
            tokens.forget(rid)

    def sample_decode_run(self, req_ids: list[str], num_steps: int,
                          steps_each: list[int] | None = None) -> RunTokens:
        """num_steps plain decode steps of req_ids (one token each per step, no drafts): the
        tokens each request samples, in order, as positions of the token source's streams (built
        by whoever reads them: lazy_ids.py); the worker state advances as by num_steps
        sample()s. `steps_each`: request i takes part in only the first steps_each[i] of them."""
        first: list[int] = []
        counts: list[int] = []
        requests = self._requests
        for i, rid in enumerate(req_ids):
            n = num_steps if steps_each is None else min(steps_each[i], num_steps)
            state = requests[rid]
            first.append(state.num_out)
            counts.append(n)
            state.num_out += n
            state.num_tokens += n
        return RunTokens(self.tokens, req_ids, first, counts)

    def num_sampled(self, req_id: str) -> int:
        """Output tokens req_id has sampled so far (the next step's first new output is this one)."""
        return self._requests[req_id].num_out

    def sample_verify_run(self, req_ids: list[str], counts: list[int]) -> None:
        """A run of verify steps sampled counts[i] tokens for req_ids[i] (its accepted drafts plus one
        a step, drawn by TokenSource.accepted_run): the worker state advances as by its sample()s."""
        requests = self._requests
        for rid, n in zip(req_ids, counts):
            state = requests[rid]
            state.num_out += n
            state.num_tokens += n

    def sample(self, so: SchedulerOutput, req_ids: list[str], sample: list[bool],
               chosen: dict[str, int] | None = None) -> ModelRunnerOutput:
        """Sampled tokens per request; `chosen` overrides the first token (real greedy sampling)."""
        sampled: list[list[int]] = []
        drafts_next: dict[str, list[int]] | None = {} if self.num_spec_tokens else None
        spec = so.scheduled_spec_decode_tokens
        for rid, do in zip(req_ids, sample):
            if not do:
                sampled.append([])
                continue
            state = self._requests[rid]
            k = state.num_out
            n_drafts = len(spec.get(rid, ())) if spec else 0
            n_acc = self.tokens.num_accepted(rid, k, n_drafts) if n_drafts else 0
            if chosen is not None and rid in chosen:
                toks = [chosen[rid]]
                if drafts_next is not None:
                    drafts_next[rid] = self.tokens.drafts(rid, k + 1, self.num_spec_tokens)
            elif drafts_next is not None:  # the drafts are the outputs after these: one call for both
                ids = self.tokens.tokens(rid, k, n_acc + 1 + self.num_spec_tokens)
                toks = ids[:n_acc + 1]
                drafts_next[rid] = ids[n_acc + 1:]
            else:
                toks = self.tokens.tokens(rid, k, n_acc + 1)  # token(rid, k + j) for each j, in one call
            sampled.append(toks)
            state.num_out = k + len(toks)
            state.num_tokens += len(toks)
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled, drafts_next)
