"""The bulk decode path of a P/D decode-side scheduler (simulator/cluster/pd_schedulers.py): vLLM's, with the
requests whose KV is still on its way passed over.

A P/D decode scheduler is vLLM's with NixlConnector's scheduler side: a request handed over from
a prefill instance reserves blocks for its prompt at its first schedule and is parked in
WAITING_FOR_REMOTE_KVS (skipped_waiting) until its transfer lands. Between such events its steps
are vLLM's plain decode steps, and what the connector adds to them is provably nothing:
- build_connector_meta returns None at every schedule (RemotePrefillConnector: the transfer is
  driven outside the step), which decode_step_output's SchedulerOutput leaves as its default;
- update_connector_output runs only for a worker report (kv_connector_output), which the
  simulated executor never sends;
- each schedule walks skipped_waiting: a parked request whose KV has not landed
  (_try_promote_blocked: not in finished_recving_kv_req_ids) is popped and put back in order (an
  FCFS deque: step_skipped prepends each, prepend_requests' extendleft reverses them again) and
  changes nothing; it is never looked up in the prefix cache, so no schedule has a waiting head.
Only with nothing in `waiting` (a request there would reserve blocks and start a transfer) and the
FCFS policy (a priority queue's order is its heap's). A landing or a hand-off comes from outside:
the cluster bounds a run by the earliest time one can come (simulator/fastpath/pd_runs.py).

Joins (DecodeRuns.decode_run_joining). The schedule after a landing is the batch's plain decodes
and, in the waiting phase, the landed requests' promotion: each loaded its whole prompt, steps
back one token to sample (_try_promote_blocked) and is admitted computing that token, in blocks it
reserved when it was parked, so the step allocates nothing for it. An async run's first schedule
may be that step: the batch's decodes are applied in bulk, then the scheduler's own waiting phase
(Scheduler.schedule_behind) promotes and admits exactly the landed ones, passing the parked
ones over as above; from the next schedule on they are running requests decoding with the batch.
Only where every landed request qualifies (no preemption behind it, no multimodal input, its
blocks in place, a seat and a token for each) and the scheduler checks no LoRA slot and schedules
no lookahead.

`PDDecodeRuns` is registered as "pd_decode" (scheduler/bulk/__init__.py), the name the P/D decode
schedulers declare (SchedulerCapabilities.decode_runs); it is a friend of `Scheduler` as its base
is, and reads `waiting`, `skipped_waiting`, `finished_recving_kv_req_ids`, the policy's name and
the KV manager's block tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.bulk.interface import Joins
from servesim.scheduler.bulk.vllm import VllmDecodeRuns
from servesim.scheduler.request import RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.request import Request

_PARKED = RequestStatus.WAITING_FOR_REMOTE_KVS


class PDDecodeRuns(VllmDecodeRuns):
    """Implements scheduler.bulk.interface.DecodeRuns for a P/D decode-side vLLM scheduler."""

    def _joining(self) -> list[Request] | None:
        """The landed requests the next schedule admits (module docstring, "Joins"); [] when every
        waiting request is parked for a transfer that has not landed (the schedules pass them
        over and the connector does nothing); None otherwise."""
        sched = self.scheduler
        if sched.waiting or sched.scheduler_config.policy != "fcfs":
            return None
        landed = sched.finished_recving_kv_req_ids
        joining: list[Request] = []
        for r in sched.skipped_waiting:
            if r.status != _PARKED:
                return None
            if r.request_id in landed:
                joining.append(r)
        if not joining:
            return joining
        # (scheduler_reserve_full_isl's gate asks for blocks for the whole prompt: it holds them)
        if (sched.max_loras is not None or sched.num_lookahead_tokens
                or len(sched.running) + len(joining) > sched.max_num_running_reqs):
            return None
        kvm = sched.kv_cache_manager
        mgr = kvm._single_full
        if mgr is None:
            return None
        held, bs = mgr.req_to_blocks, kvm.block_size
        for r in joining:
            if (r.num_computed_tokens != r.num_tokens or r.num_preemptions or r.mm_features
                    or len(held.get(r.request_id, ())) < -(-r.num_tokens // bs)):
                return None
        return joining

    def _join_plan(self, batch: list[Request], joining: list[Request]) -> Joins | None:
        """Each landed request computes its prompt's last token (module docstring, "Joins")."""
        return Joins(joining, [r.num_tokens - 1 for r in joining], [1] * len(joining))

    def anyone_admissible_waits(self) -> bool:
        """False while only parked requests wait, and behind joins: a seat or blocks freed inside a
        run admit none of them (they are promoted only when their transfer lands, which no run goes
        past; the landed ones join at its first schedule)."""
        return self._joining() is None and super().anyone_admissible_waits()

    def _waiting_head(self, num_batch: int) -> Request | None:
        """No head while only parked requests wait (a schedule pops and puts them back unread), nor
        behind joins (the first schedule admits the landed ones, the later ones pass the rest)."""
        if self._joining() is not None:
            return None
        return super()._waiting_head(num_batch)
