"""Liveness: admission (what can never run is rejected at arrival) and the watchdog's diagnosis.

Admission is what vLLM's frontend does before a request reaches the engine core, plus one rule of
our own for a pool that can never hold the request:

    prompt_exceeds_max_model_len  prompt longer than max_model_len (vLLM: "The decoder prompt
                                  (length N) is longer than the maximum model length of M")
    no_room_to_generate           prompt exactly max_model_len long: not one output token fits
                                  (vLLM: "... plus the number of requested output tokens (at least
                                  1) is longer than the maximum model length of M")
    exceeds_max_model_len         vLLM engine: prompt + output_len (the client's max_tokens) longer
                                  than max_model_len: vLLM's OpenAI server answers 400 ("This
                                  model's maximum context length is M tokens. However, you
                                  requested K output tokens and your prompt contains N input
                                  tokens ..."; vllm/renderers/params.py TokenizeParams, 0.19.1)
    exceeds_kv_pool               prompt + output (capped at max_model_len) needs more KV blocks
                                  than the whole pool has: it could never be scheduled to the end
                                  (vLLM engine; SGLang clamps max_new_tokens to the pool itself and
                                  refuses only prompts that cannot fit, reported with this reason)

SGLang's engine keeps its own rule instead: it clamps max_new_tokens to what the context and the
pool leave (finish_reason "length").

The watchdog (Engine) counts steps and simulated seconds since the last progress (an output token,
or a request finished or rejected); past `liveness.max_steps_without_progress` or
`liveness.max_sim_s_without_progress` with requests unfinished, or when nothing is left that could
ever wake the engine, it raises StallError with `diagnose()`'s text.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.scheduler.interface import SchedulerInterface
from servesim.traces.errors import InputError

REJECT_REASONS = ("prompt_exceeds_max_model_len", "no_room_to_generate", "exceeds_max_model_len", "exceeds_kv_pool")


class StallError(InputError):
    """A run that can make no more progress (the watchdog's verdict, with its diagnosis). An
    InputError: the configuration and workload are what cannot progress, and the CLI reports it
    as an error (exit status 2), never a traceback."""

    def _format(self) -> str:
        return f"liveness watchdog stopped the run: {self.detail}"


@dataclass(slots=True, frozen=True)
class Admission:
    max_model_len: int
    block_size: int
    usable_blocks: int  # the pool less the null block
    extra_slots: int  # speculative + lookahead tokens a step may hold beyond the sequence
    full_groups: int = 1  # full-attention KV groups (1, or 0 for a sliding-window-only layout)
    window_blocks: int | None = None  # a sliding-window group's most blocks (window + one step's chunk)
    # False: the scheduler bounds requests by the pool and the context itself (SGLang clamps
    # max_new_tokens): neither the pool rule nor vLLM's API-server rule on prompt + max_tokens.
    pool_rule: bool = True
    # attention='groups': the most blocks of each group that does not grow with the sequence
    # (windows, chunks, Mamba state: scheduler/kv/kinds.py admission_shape)
    bounded_groups: tuple[int, ...] = ()

    @classmethod
    def of(cls, sched: SchedulerConfig, cache: CacheConfig, pool_rule: bool = True) -> Admission:
        """pool_rule False: the scheduler bounds requests by the pool itself (SGLang clamps
        max_new_tokens to what fits, and refuses prompts that cannot)."""
        if cache.attention == "groups":
            from servesim.scheduler.kv.kinds import admission_shape

            num_whole, bounded = admission_shape(cache.kv_cache_groups, sched.max_model_len,
                                                 sched.max_num_batched_tokens)
            return cls(sched.max_model_len, cache.block_size, cache.num_gpu_blocks - 1,
                       sched.num_spec_tokens + sched.num_lookahead_tokens, num_whole, None, pool_rule, bounded)
        window = None
        if cache.attention != "full":  # as simulator/startup.py sizes the window group
            window = -(-(cache.sliding_window - 1 + sched.max_num_batched_tokens) // cache.block_size) + 1
        return cls(sched.max_model_len, cache.block_size, cache.num_gpu_blocks - 1,
                   sched.num_spec_tokens + sched.num_lookahead_tokens, 0 if cache.attention == "sliding_window" else 1,
                   window, pool_rule)

    def blocks_needed(self, num_tokens: int) -> int:
        """KV blocks a request holding num_tokens slots needs at most, over all its groups."""
        blocks = -(-num_tokens // self.block_size)
        needed = self.full_groups * blocks
        if self.window_blocks is not None:
            needed += min(self.window_blocks, blocks)
        for b in self.bounded_groups:  # (usually none: no generator made at every arrival)
            needed += min(b, blocks)
        return needed

    def admitted_tokens(self) -> int:
        """The largest n such that reject_reason admits every request with output_len >= 1 and
        prompt_len + output_len <= n (0: none proven), so a caller can skip asking below it.

        Why (n - 1, 1) decides: with output_len >= 1 and a sum s <= n <= max_model_len, the prompt
        is shorter than max_model_len, so reject_reason's answer depends on s alone and only grows
        with it (blocks_needed is non-decreasing); (n - 1, 1) has the largest s and the largest
        prompt. The answer for (n - 1, 1) only grows with n too, hence the bisection."""
        lo, hi = 0, self.max_model_len  # lo: proven (vacuously for n < 2); hi: the most possible
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if mid < 2 or self.reject_reason(mid - 1, 1) is None:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def reject_reason(self, prompt_len: int, output_len: int) -> str | None:
        """Why a request can never run, or None when it can."""
        if prompt_len > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        if prompt_len == self.max_model_len:
            return "no_room_to_generate"
        if self.pool_rule and prompt_len + output_len > self.max_model_len:
            return "exceeds_max_model_len"
        if self.pool_rule:
            # KV slots it will hold at most: every token but the last sampled one, plus drafts.
            tokens = min(prompt_len + max(output_len, 1) - 1 + self.extra_slots, self.max_model_len)
            if self.blocks_needed(tokens) > self.usable_blocks:
                return "exceeds_kv_pool"
        return None


def diagnose(name: str, sched: SchedulerInterface, why: str, num_preemptions: int, limit: str, max_listed: int = 5) -> str:
    """The watchdog's message: which requests are stuck, in what state, and the likely cause."""
    stuck = [r for r in sched.requests.values() if not r.is_finished()]
    stuck.sort(key=lambda r: (-r.num_preemptions, r.request_id))
    listed = "; ".join(
        f"{r.request_id} ({r.status.name}, {r.num_computed_tokens}/{r.num_tokens} tokens computed, "
        f"{r.num_output_tokens} output, preempted {r.num_preemptions}x)" for r in stuck[:max_listed])
    more = f" and {len(stuck) - max_listed} more" if len(stuck) > max_listed else ""
    if num_preemptions:
        cause = (f"{num_preemptions} preemptions since the last progress: the requests keep preempting each "
                 "other (a livelock; vLLM's priority policy breaks ties by arrival time). A larger KV pool, "
                 "scheduler.scheduler_reserve_full_isl=true or fewer concurrent long prompts avoid it")
    elif (stranded := sched.stranded_request()) is not None:
        cause = (f"{stranded.request_id} can never be admitted ({stranded.reason}: {stranded.detail}) and blocks "
                 "the requests behind it, as in vLLM 0.19.1; liveness.stranded_requests=abort aborts it and goes on")
    else:
        cause = ("nothing could be scheduled: no waiting request can be admitted and nothing running can "
                 "advance (KV pool or token budget too small for these requests)")
    return f"{name}: {why}; {len(stuck)} unfinished request(s): {listed}{more}. Likely cause: {cause}. {limit}"
