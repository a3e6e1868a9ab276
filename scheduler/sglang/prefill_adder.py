"""PrefillAdder: picks the requests of one prefill batch under SGLang's three token budgets.

* rem_total_tokens: free + evictable KV tokens, minus what is promised: every running request's
  reserved decode space (min(remaining max_new_tokens, clip) * new_token_ratio), plus for each
  request admitted this round its input and min(max_new_tokens, clip) future tokens.
* rem_input_tokens: tokens one prefill batch may compute (max_prefill_tokens).
* rem_chunk_tokens: the chunk budget (chunked_prefill_size); a request that does not fit becomes
  the one chunked request and continues next round.
With mixed chunk on, the running batch's decode tokens are charged to all three up front.
Requests with ignore_eos and no radix cache take SGLang's add_one_req_ignore_eos path, which
simulates future decode steps exactly instead of using the ratio estimate.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.scheduler.sglang.memory import SGLangMemory
from servesim.scheduler.sglang.radix_cache import TreeNode

if TYPE_CHECKING:
    from servesim.scheduler.request import Request
    from servesim.scheduler.sglang.config import SGLangConfig

IGNORE_EOS_RESERVE_TOKENS = 1  # per request, in the ignore_eos simulation


class AddReqResult(enum.Enum):
    CONTINUE = enum.auto()  # keep adding
    NO_TOKEN = enum.auto()  # out of KV budget: the batch is full
    OTHER = enum.auto()  # another budget ran out


@dataclass(slots=True)
class RoundInput:
    """A waiting request's input for this round (SGLang's init_next_round_input)."""

    prefix_pages: list[int]  # cached pages it starts from
    node: TreeNode | None  # end of the cached prefix (locked while it runs)
    prefix_len: int  # tokens already in KV before this round
    extend_len: int  # tokens left to compute
    host_node: TreeNode | None = None  # HiCache: end of the host-only part of the match
    host_hit_len: int = 0  # HiCache: host-only tokens beyond prefix_len (SGLang's host_hit_length)


@dataclass(slots=True)
class Admission:
    request: Request
    prefix_len: int  # tokens in KV before this step
    extend_len: int  # tokens computed this step
    continuing: bool  # the chunked request (already holds KV and was reported before)


class PrefillAdder:
    def __init__(self, cfg: SGLangConfig, memory: SGLangMemory, running: list, ghosts: list,
                 new_token_ratio: float, mixed_decode_tokens: int,
                 entry_seq: dict[str, int], preempt: Callable[[Request], None]) -> None:
        self.cfg = cfg
        self.memory = memory
        self.page_size = memory.page_size
        self.running = running  # the scheduler's running list (priority preemption edits it)
        self.ghosts = ghosts  # finished requests still counted in SGLang's running batch
        self.new_token_ratio = new_token_ratio
        self.clip = cfg.clip_max_new_tokens
        self.rem_input_tokens = cfg.max_prefill_tokens - mixed_decode_tokens
        self.rem_chunk_tokens: int | None = (
            cfg.chunked_prefill_size - mixed_decode_tokens if cfg.enable_chunked_prefill else None)
        self.rem_total_token_offset = float(mixed_decode_tokens)
        self.cur_rem_token_offset = float(mixed_decode_tokens)
        self.rem_total_token_offset += sum(self._running_offset(r) for r in running + ghosts)
        self.entry_seq = entry_seq
        self._preempt = preempt
        self.can_run_list: list[Admission] = []
        self.preempt_list: list[Request] = []
        self.new_chunked_req: Request | None = None
        self.req_states: list[tuple[float, int]] | None = None  # ignore_eos simulation
        self.log_hit_tokens = 0
        self.log_input_tokens = 0

    # --- budgets ---------------------------------------------------------------------------------
    def _running_offset(self, r: Request) -> float:
        """Reserved decode space of a running request."""
        return min(r.max_tokens - r.num_output_tokens, self.clip) * self.new_token_ratio

    @property
    def rem_total_tokens(self) -> float:
        return self.memory.available_and_evictable() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self.memory.available_and_evictable() - self.cur_rem_token_offset

    def ceil_paged_tokens(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, prefix_len: int, extend_len: int, max_new_tokens: int) -> None:
        extend_len = self.ceil_paged_tokens(extend_len)
        self.rem_total_token_offset += extend_len + max_new_tokens
        self.cur_rem_token_offset += extend_len
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_len

    # --- the chunked request -----------------------------------------------------------------------
    def add_chunked_req(self, req: Request) -> Request | None:
        """Give the chunked request its next chunk; returns it while chunks remain."""
        assert self.rem_chunk_tokens is not None, "a chunked request exists only with chunked prefill on"
        rem = min(self.rem_chunk_tokens, int(self.rem_total_tokens))
        if rem <= 0:
            return req  # no room this round: it keeps its place (SGLang would schedule 0 tokens)
        extend = req.num_tokens - req.num_computed_tokens
        truncated = extend > rem
        extend = min(extend, rem)
        self.can_run_list.append(Admission(req, req.num_computed_tokens, extend, continuing=True))
        self._update_prefill_budget(0, extend, 0 if truncated else min(req.max_tokens, self.clip))
        return req if truncated else None

    # --- waiting requests --------------------------------------------------------------------------
    def add_one_req(self, req: Request, rnd: RoundInput) -> AddReqResult:
        if self.cfg.prefill_max_requests is not None and len(self.can_run_list) >= self.cfg.prefill_max_requests:
            return AddReqResult.OTHER
        if req.sampling_params.ignore_eos and not self.memory.cache_enabled:
            return self._add_one_req_ignore_eos(req, rnd)
        total = rnd.extend_len + min(max(req.max_tokens - req.num_output_tokens, 0), self.clip)
        input_tokens = self.ceil_paged_tokens(rnd.extend_len)
        if total >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if input_tokens >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        tree = self.memory.tree
        if rnd.node is not None:
            tree.inc_lock_ref(rnd.node)  # its own prefix cannot be evicted to make room for it
        try:
            if total >= self.rem_total_tokens or not self._state_available():
                return AddReqResult.NO_TOKEN
            if rnd.host_node is not None and rnd.host_hit_len > 0 and self.memory.start_load_back(
                    req.request_id, rnd.host_node):
                # SGLang's add_one_req calls init_load_back here and runs the request in this batch,
                # its forward waiting on the load stream layer by layer; here it waits for the
                # load and is scheduled once loading_check acknowledges it (docs/SGLANG_MODEL.md).
                return self.budget_state()
            if self.rem_chunk_tokens is None or input_tokens <= self.rem_chunk_tokens:
                self._admit(req, rnd, rnd.extend_len)
                self._update_prefill_budget(rnd.prefix_len, input_tokens, min(req.max_tokens, self.clip))
            else:
                trunc = self.rem_chunk_tokens // self.page_size * self.page_size  # whole pages
                if trunc <= 0:
                    return AddReqResult.OTHER
                self._admit(req, rnd, trunc)
                self.new_chunked_req = req
                self._update_prefill_budget(rnd.prefix_len, trunc, 0)
        finally:
            if rnd.node is not None:
                tree.dec_lock_ref(rnd.node)
        return self.budget_state()

    def _state_available(self) -> bool:
        """Hybrid models: a Mamba state slot is free or evictable for a new request (SGLang's
        rem_mamba_slots gate; its HybridReqToTokenPool otherwise asserts on an empty pool)."""
        return self.memory.mamba_pool is None or self.memory.mamba_schedulable() >= 1

    def _admit(self, req: Request, rnd: RoundInput, extend_len: int) -> None:
        self.memory.admit(req.request_id, rnd.prefix_pages, rnd.node, rnd.prefix_len)
        self.can_run_list.append(Admission(req, rnd.prefix_len, extend_len, continuing=False))

    def _add_req_state(self, states: list[tuple[float, int]], r: Request, insert_sorted: bool = False) -> None:
        ratio = 1.0 if r.sampling_params.ignore_eos else self.new_token_ratio
        tokens_left = r.max_tokens * ratio - r.num_output_tokens
        if tokens_left <= 0:
            return
        state = (tokens_left, r.num_prompt_tokens + r.num_output_tokens)
        if not insert_sorted:
            states.append(state)
            return
        i = 0
        while i < len(states) and states[i][0] < tokens_left:
            i += 1
        states.insert(i, state)

    def _add_one_req_ignore_eos(self, req: Request, rnd: RoundInput) -> AddReqResult:
        """Admit only if, finishing the requests in order of remaining tokens, KV never runs out."""
        need = self.ceil_paged_tokens(rnd.extend_len)
        if need > min(self.cur_rem_tokens, self.rem_total_tokens) or not self._state_available():
            return AddReqResult.NO_TOKEN
        states = self.req_states
        if states is None:
            states = self.req_states = []
            self._add_req_state(states, req)
            for r in self.running + self.ghosts + [a.request for a in self.can_run_list]:
                self._add_req_state(states, r)
            states.sort(key=lambda s: s[0])
        else:
            self._add_req_state(states, req, insert_sorted=True)
        cur_rem = self.cur_rem_tokens - need
        freed = 0
        for i, (tokens_left, tokens_occupied) in enumerate(states):
            bs = len(states) - i
            if cur_rem + freed - tokens_left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return AddReqResult.NO_TOKEN
            freed += tokens_occupied
        if self.rem_chunk_tokens is None or rnd.extend_len <= self.rem_chunk_tokens:
            self._admit(req, rnd, rnd.extend_len)
            self._update_prefill_budget(0, rnd.extend_len, min(req.max_tokens, self.clip))
        else:
            if self.rem_chunk_tokens <= 0:
                return AddReqResult.OTHER
            self._admit(req, rnd, self.rem_chunk_tokens)
            self.new_chunked_req = req
            self._update_prefill_budget(0, self.rem_chunk_tokens, 0)
        return self.budget_state()

    # --- priority preemption -----------------------------------------------------------------------
    def preempt_to_schedule(self, req: Request, rnd: RoundInput) -> bool:
        """Preempt running requests whose priority is worse by more than the threshold, least
        important and newest first, until their reserved space covers `req`."""
        cfg = self.cfg
        sign = 1 if cfg.schedule_low_priority_values_first else -1
        valid = [r for r in self.running if r not in self.preempt_list and not r.is_finished()]
        valid.sort(key=lambda r: (-sign * r.priority, -self.entry_seq[r.request_id]))
        min_tokens_to_remove = rnd.extend_len + min(req.max_tokens, self.clip) - self.rem_total_tokens
        chosen: list[Request] = []
        for r in valid:
            if (r.priority - req.priority) * sign <= cfg.priority_scheduling_preemption_threshold:
                break  # sorted: nobody later is preemptible either
            chosen.append(r)
            min_tokens_to_remove -= self._running_offset(r)
            if min_tokens_to_remove <= 0:
                break
        if not chosen or min_tokens_to_remove > 0:
            return False
        for r in chosen:
            self.rem_total_token_offset -= self._running_offset(r)
            self._preempt(r)
        self.preempt_list.extend(chosen)
        return True
