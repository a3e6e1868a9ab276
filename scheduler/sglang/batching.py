"""Batch formation (SGLang's get_new_batch_prefill / update_running_batch / retract_decode), mixed
into SGLangScheduler (scheduler.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servesim.scheduler.request import Request, RequestStatus
from servesim.scheduler.sglang.policy import QueueContext, calc_priority
from servesim.scheduler.sglang.prefill_adder import AddReqResult, Admission, PrefillAdder, RoundInput

if TYPE_CHECKING:
    from servesim.scheduler.sglang.scheduler import SGLangScheduler


@dataclass(slots=True)
class Batch:
    """One forward pass. kind: "extend" (prefill only), "mixed" (prefill + decode tokens), "decode"."""

    kind: str
    prefill: list[Admission] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)

    @property
    def is_extend(self) -> bool:
        return self.kind != "decode"  # SGLang's ForwardMode.is_extend() covers MIXED too

    def requests(self) -> list[Request]:
        return [a.request for a in self.prefill] + self.decode


class BatchingMixin:
    # --- prefill ---------------------------------------------------------------------------------
    def _round_input(self: SGLangScheduler, req: Request) -> RoundInput:
        """init_next_round_input: match the cache, keeping at least one token to compute."""
        pages, node, n, host_node, host_len = self.kv_cache_manager.match_with_host(req, req.num_tokens - 1)
        return RoundInput(pages, node, n, req.num_tokens - n, host_node, host_len)

    def _get_new_batch_prefill(self: SGLangScheduler, preempted: list[Request]) -> Batch | None:
        cfg = self.config
        # _get_new_batch_prefill_raw (v0.5 line) checks HiCache events first, before its early returns:
        # finished copies unlock their nodes and release the requests that waited for a load.
        self.kv_cache_manager.check_hicache_events()
        try_preemption = cfg.enable_priority_scheduling
        if try_preemption:
            self.batch_is_full = False  # give preemption a chance
        if self.batch_is_full and not self.running and not self.ghosts and self.chunked_req is None:
            self.batch_is_full = False  # liveness guard: nothing left that could clear it
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        running_bs = len(self.running) + len(self.ghosts)
        if cfg.max_running_requests - running_bs <= 0 and self.chunked_req is None and not try_preemption:
            self.batch_is_full = True
            return None
        calc_priority(cfg.schedule_policy, self.waiting,
                      QueueContext(cfg, self.kv_cache_manager, self.rng, self.entry_seq))
        mixed_tokens = running_bs if self._mixed_chunk else 0
        adder = PrefillAdder(cfg, self.kv_cache_manager, self.running, self.ghosts, self.new_token_ratio,
                             mixed_tokens, self.entry_seq, lambda r: self._retract(r, preempted))
        if self.chunked_req is not None:
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        self._fill_from_waiting(adder, try_preemption)
        if not adder.can_run_list:
            return None
        return self._make_prefill_batch(adder)

    @property
    def _mixed_chunk(self: SGLangScheduler) -> bool:
        return self.config.enable_mixed_chunk and self.config.enable_chunked_prefill is True

    def _fill_from_waiting(self: SGLangScheduler, adder: PrefillAdder, try_preemption: bool) -> None:
        cfg = self.config
        mem = self.kv_cache_manager
        for req in list(self.waiting):
            if mem.loading and mem.is_loading(req.request_id):
                continue  # HiCache: waits for its load from host (keeps its place in the queue)
            running_bs = len(self.running) + len(self.ghosts)
            if len(adder.can_run_list) >= cfg.max_running_requests - running_bs:
                self.batch_is_full = True
            if self.batch_is_full:
                if not try_preemption or not adder.preempt_to_schedule(req, self._round_input(req)):
                    break
            res = adder.add_one_req(req, self._round_input(req))
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    # With HiCache SGLang sets batch_is_full only when something can be served
                    # (_get_new_batch_prefill_raw), so a stalled load-back cannot block prefill.
                    self.batch_is_full = (mem.hicache is None or bool(adder.can_run_list)
                                          or bool(self.running))
                break
        if self.batch_is_full and not (adder.can_run_list or self.running or self.ghosts or self.chunked_req):
            # A priority preemption emptied the batch and admitted nothing in its place: the batch
            # is not full, and a stale flag would block prefill with nothing left to clear it.
            self.batch_is_full = False

    def _make_prefill_batch(self: SGLangScheduler, adder: PrefillAdder) -> Batch:
        mem = self.kv_cache_manager
        admitted = {id(a.request) for a in adder.can_run_list}
        m = sum(not a.continuing for a in adder.can_run_list)  # admitted from the waiting queue
        if all(id(r) in admitted for r in self.waiting[:m]):
            del self.waiting[:m]  # the usual case: the queue's head (one memmove, not a rebuild)
        else:
            self.waiting = [r for r in self.waiting if id(r) not in admitted]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        for a in adder.can_run_list:
            req = a.request
            if not a.continuing:
                if mem.cache_enabled:
                    self.prefix_cache_stats.record(req.num_tokens, a.prefix_len, req.num_preemptions > 0)
                    mem.take_host_hit(req.request_id, a.prefix_len, req.num_preemptions > 0)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = a.prefix_len
                if req.num_cached_tokens is None:
                    req.num_cached_tokens = a.prefix_len
            mem.grow(req.request_id, a.prefix_len + a.extend_len)
        batch = Batch("extend", list(adder.can_run_list))
        if self._mixed_chunk and (self.running or self.ghosts):
            self.ghosts.clear()  # filter_batch before mixing (batch_is_full is kept as it was)
            # SGLang mixes without a memory check and fails on OOM; we keep decode for later.
            if self.running and self._check_decode_mem(self.running):
                for r in self.running:
                    mem.grow(r.request_id, r.num_computed_tokens + 1)
                decoding: list[Request] = []  # the running batch rides along in this one
                batch.kind, batch.decode, self.running = "mixed", self.running, decoding
        return batch

    # --- decode ----------------------------------------------------------------------------------
    def _update_running_batch(self: SGLangScheduler, preempted: list[Request]) -> Batch | None:
        mem = self.kv_cache_manager
        initial_bs = len(self.running) + len(self.ghosts)
        self.ghosts.clear()  # filter_batch: finished requests leave the running batch here
        if not self.running:
            self.batch_is_full = False
            return None
        if not self._check_decode_mem(self.running):
            retracted, self.new_token_ratio = self._retract_decode()
            preempted.extend(retracted)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        if len(self.running) < initial_bs:
            self.batch_is_full = False
        if not self.running:
            return None
        for r in self.running:
            mem.grow(r.request_id, r.num_computed_tokens + self.num_decode_tokens)
        return Batch("decode", decode=list(self.running))

    def _check_decode_mem(self: SGLangScheduler, requests: list[Request]) -> bool:
        """check_decode_mem with SGLang's decode_mem_cache_buf_multiplier: 1, or with speculative
        decoding the draft and verify tokens (num_draft_tokens + topk * num_steps)."""
        k = self.config.speculative_num_steps
        return self.kv_cache_manager.check_decode_mem(requests, self.num_decode_tokens,
                                                      self.num_decode_tokens + k if k else 1)

    def _retract_decode(self: SGLangScheduler) -> tuple[list[Request], float]:
        """Retract until the rest fits one more decode step (at least one request goes).

        Victim: fewest output tokens, then longest prompt (SGLang sorts by (len(output_ids),
        -len(origin_input_ids)) descending and pops the tail). Returns the victims and the new
        new_token_ratio, estimated from how far the survivors actually decode."""
        order = sorted(self.running, key=lambda r: (r.num_output_tokens, -r.num_prompt_tokens), reverse=True)
        retracted: list[Request] = []
        first = True
        while first or not self._check_decode_mem(order):
            if len(order) == 1:
                break
            first = False
            victim = order.pop()
            retracted.append(victim)
            self._retract(victim, None)
        if len(order) == 1 and not self._check_decode_mem(order):
            self._abort(order.pop())  # even alone it cannot decode: SGLang aborts it
        keep = {id(r) for r in order}
        self.running = [r for r in self.running if id(r) in keep]
        decoded = sum(r.num_output_tokens for r in self.running)
        max_new = sum(r.max_tokens for r in self.running)
        ratio = (decoded + self.config.retract_decode_steps * len(self.running)) / (max_new + 1)
        return retracted, min(1.0, ratio)

    def _retract(self: SGLangScheduler, req: Request, preempted: list[Request] | None) -> None:
        """Free a running request's KV (no cache insert: the space is needed now) and queue it
        again at the back; it will recompute prompt + outputs. Also priority preemption."""
        self.kv_cache_manager.release(req, 0, insert=False)
        if req in self.running:
            self.running.remove(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.is_prefill_chunk = False
        req.num_preemptions += 1
        self.num_retractions_total += 1
        self._enqueue(req)
        if preempted is not None:
            preempted.append(req)
