"""A stepped step's update applied in bulk where nobody stops (DecodeRuns.update_sampled_step):
a function of the vLLM bulk path (`VllmDecodeRuns`, a friend of the scheduler:
bulk/__init__.py), which reads the scheduler's requests, configuration and `_ignored` and changes
what update_from_output changes, through the same calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.bulk.interface import SampledStepUpdate
from servesim.scheduler.request import RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler


def update_sampled_step(sched: Scheduler, so: SchedulerOutput, mro: ModelRunnerOutput,
                        now_s: float) -> SampledStepUpdate | None:
    """update_from_output of a step none of whose requests stops (DecodeRuns.update_sampled_step).

    Proven before anything changes: every request the update reaches (scheduled, still
    there, unfinished) is RUNNING, samples at most one token, holds a placeholder for it
    (async) and no token to discard, and has no stop rule that could fire: no EOS or stop
    ids, and the token brings it below max_tokens and max_model_len (check_stop then answers
    False whatever min_tokens says). Then, in the step's order, as update_from_output does:
    the token appended, (async) the placeholder released and the blocks cached up to the
    computed tokens; then the statistics (make_stats)."""
    if (so.scheduled_spec_decode_tokens or mro.kv_connector_output is not None or mro.draft_token_ids
            or sched._ignored or not sched.log_stats):
        return None
    sampled, index, requests = mro.sampled_token_ids, mro.req_id_to_index, sched.requests
    if not sampled:
        return None
    is_async = sched.scheduler_config.async_scheduling
    max_len = sched.max_model_len
    batch: list[Request] = []
    ids: list[str] = []
    toks: list[int] = []
    for rid in so.num_scheduled_tokens:
        r = requests.get(rid)
        if r is None or r.is_finished():
            continue  # aborted while the step ran: update_from_output passes it over too
        new_ids = sampled[index[rid]]
        if not new_ids:
            continue  # a prefill chunk short of the prompt's end: nothing to apply
        sp = r.sampling_params
        if (len(new_ids) != 1 or r.status != RequestStatus.RUNNING or r.discard_latest_async_tokens
                or sp.stop_token_ids or (sp.eos_token_id is not None and not sp.ignore_eos)
                or r.num_tokens + 1 >= max_len or r.num_output_tokens + 1 >= r.max_tokens
                or (is_async and r.num_output_placeholders < 1)):
            return None
        batch.append(r)
        ids.append(rid)
        toks.append(new_ids[0])
    sched.now_s = now_s
    kv = sched.kv_cache_manager
    for r, tok in zip(batch, toks):
        r.append_output_token_ids(tok)
        if is_async:  # AsyncScheduler._update_request_with_output
            r.num_output_placeholders -= 1
            kv.cache_blocks(r, r.num_computed_tokens - r.num_output_placeholders)
    return SampledStepUpdate(ids, sched.make_stats(None))
