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

`PDDecodeRuns` is registered as "pd_decode" (scheduler/bulk/__init__.py), the name the P/D decode
schedulers declare (SchedulerCapabilities.decode_runs); it is a friend of `Scheduler` as its base
is, and reads `waiting`, `skipped_waiting`, `finished_recving_kv_req_ids` and the policy's name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.bulk.vllm import VllmDecodeRuns
from servesim.scheduler.request import RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.request import Request


class PDDecodeRuns(VllmDecodeRuns):
    """Implements scheduler.bulk.interface.DecodeRuns for a P/D decode-side vLLM scheduler."""

    def connector_passes_decode_steps(self) -> bool:
        """True when every waiting request is parked for a transfer that has not landed (module
        docstring): the next schedules pass them over, and the connector does nothing."""
        sched = self.scheduler
        if sched.waiting or sched.scheduler_config.policy != "fcfs":
            return False
        landed = sched.finished_recving_kv_req_ids
        return all(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and r.request_id not in landed
                   for r in sched.skipped_waiting)

    def anyone_admissible_waits(self) -> bool:
        """False while only parked requests wait: a seat or blocks freed inside a run admit none of
        them (they are promoted only when their transfer lands, which no run goes past)."""
        return not self.connector_passes_decode_steps() and super().anyone_admissible_waits()

    def _waiting_head(self, num_batch: int) -> Request | None:
        """No head while only parked requests wait: a schedule pops and puts them back unread."""
        if not self.scheduler.waiting and self.connector_passes_decode_steps():
            return None
        return super()._waiting_head(num_batch)
