"""AsyncScheduler: step N+1 is scheduled before step N's output is applied.

Sampled tokens of an in-flight step are unknown when the next step is scheduled, so each
scheduled non-chunk request gets output placeholders that count as computed; they are replaced
by real tokens in update_from_output, and blocks are cached only then.
"""

from __future__ import annotations

from typing import ClassVar

from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.scheduler.output import SchedulerOutput
from servesim.scheduler.request import Request, RequestStatus
from servesim.scheduler.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    max_steps_in_flight: ClassVar[int] = 2  # vLLM's batch queue: step N+1 scheduled while step N runs

    # Scheduler's signature spelt out: mypyc 2.4 miscompiles super().__init__(*args, **kwargs).
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 log_stats: bool = True, tracer=None) -> None:
        super().__init__(scheduler_config, cache_config, log_stats=log_stats, tracer=tracer)
        # Read-only draft placeholders; the worker fills in the real drafts. -1 is vLLM's value: no
        # sampler ever emits it, so a placeholder the worker did not replace is never accepted.
        self._spec_placeholders: list[int] = [-1] * self.num_spec_tokens

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        super()._update_after_schedule(out)
        spec = out.scheduled_spec_decode_tokens
        for rid in out.num_scheduled_tokens:
            request = self.requests[rid]
            if request.is_prefill_chunk:
                continue
            if request.structured_output_request is not None and request.num_output_placeholders > 0:
                out.pending_structured_output_tokens = True
            request.num_output_placeholders += 1 + (len(spec.get(rid, ())) if spec else 0)
            request.spec_token_ids = self._spec_placeholders

    def _update_request_with_output(self, request: Request, new_ids: list[int]) -> tuple[list[int], bool]:
        if request.discard_latest_async_tokens:
            request.discard_latest_async_tokens = False
            return [], False
        status_before = request.status
        new_ids, stopped = super()._update_request_with_output(request, new_ids)
        request.num_output_placeholders -= len(new_ids)
        assert request.num_output_placeholders >= 0
        if status_before == RequestStatus.RUNNING:  # a preempted request holds no blocks
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens - request.num_output_placeholders)
        return new_ids, stopped


def make_scheduler(scheduler_config, cache_config, **kwargs) -> Scheduler:
    cls = AsyncScheduler if scheduler_config.async_scheduling else Scheduler
    return cls(scheduler_config, cache_config, **kwargs)
