"""Per-step scheduler trace (opt-in): one JSON line per schedule() call.

Each record holds a snapshot taken before the step (queue sizes, free and cached blocks, KV held by the policy),
the prefix-cache lookups of that step (one per waiting request considered), and the decision.
When no tracer is attached the scheduler pays a single `is None` check per step.
"""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.output import SchedulerOutput
    from servesim.scheduler.scheduler import Scheduler


class StepTracer:
    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.step = 0
        self._before: dict | None = None

    def snapshot(self, sched: Scheduler) -> None:
        pool = sched.kv_cache_manager.block_pool
        self._before = {
            "num_running": len(sched.running),
            "num_waiting": len(sched.waiting) + len(sched.skipped_waiting),
            "num_free_blocks": pool.get_num_free_blocks(),
            "num_cached_blocks": pool.get_num_cached_blocks(),
            "total_blocks": pool.num_gpu_blocks,
            **sched.policy.trace_fields(),  # KV the policy holds (pins), same keys for every policy
        }

    def decision(self, sched: Scheduler, st, out: SchedulerOutput) -> None:
        admitted = {r.request_id for r in st.new_reqs} | {r.request_id for r in st.resumed_reqs}
        lookups = [dict(ev, admitted=ev["req_id"] in admitted) for ev in st.prefix_events]
        rec = {
            "step": self.step,
            "time_s": sched.now_s,
            "before": self._before,
            "prefix_cache": lookups,
            "decision": {
                "new": [r.request_id for r in st.new_reqs],
                "resumed": [r.request_id for r in st.resumed_reqs],
                "running": [r.request_id for r in st.running_reqs],
                "preempted": [r.request_id for r in st.preempted_reqs],
                "num_scheduled_tokens": out.num_scheduled_tokens,
                "total_num_scheduled_tokens": out.total_num_scheduled_tokens,
            },
        }
        self.stream.write(json.dumps(rec) + "\n")
        self.step += 1
