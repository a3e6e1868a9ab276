"""The schedulers' bulk decode operations (exact macro-steps), as owner objects beside them.

A bulk path proves how many of a scheduler's next steps are plain decode steps and applies them
at once, leaving exactly the state stepping leaves (the contract: `interface.DecodeRuns`). It is
a friend of the classes it serves: it reads and writes their private state, which no other code
outside them does, because a run replays their own step logic in bulk and must see what a step
sees. The right is declared here, member by member:

- `vllm.VllmDecodeRuns` on `Scheduler` / `AsyncScheduler` (scheduler/scheduler.py,
  _schedule.py): reads `running`, `waiting`, `skipped_waiting`, `policy`, `tracer`,
  `connector`, `scheduler_config` and the limits (`max_num_running_reqs`,
  `max_num_scheduled_tokens`, `max_model_len`, `max_loras`, `num_spec_tokens`,
  `num_lookahead_tokens`); calls `_select_waiting_queue` (the head a schedule would look at) and
  `_free_request` (a request finished inside a run); writes `now_s`, `running`,
  `finished_req_ids` and `prev_step_scheduled_req_ids` as schedule() and update_from_output()
  write them. Its functions in `joins.py` (who joins a run's first schedule), `heads.py` (a
  refused waiting head) and `sampled_update.py` (a step's update in bulk, which also reads
  `_ignored`) act with its rights, as do the verify runs of speculative decoding (`spec.py`,
  and `spec_join.py`: a prompt joining one, admitted by the public `schedule_behind`).
- `kv.KVDecodeRuns` on `KVCacheManager` (scheduler/kv/manager.py): reads `_single_full` (the one
  full-attention group's block tables and cached-block counts: the only layout a run replays),
  `block_pool` (its free queue: allocations pop it in order), `coordinator`, `enable_caching`,
  `block_size`, `max_model_len`; allocates and caches through the group manager and the pool as
  allocate_slots does, and records lookups through get_computed_blocks.
- `pd.PDDecodeRuns` on the P/D decode schedulers (simulator/cluster/pd_schedulers.py): vLLM's, with the
  requests parked for a KV transfer passed over; reads `waiting`, `skipped_waiting` and
  `finished_recving_kv_req_ids`.
- `sglang.SGLangDecodeRuns` on `SGLangScheduler` (scheduler/sglang/scheduler.py, batching.py):
  reads `running`, `waiting`, `ghosts`, `batch_is_full`, `chunked_req`, `last_batch`, `config`,
  `_pending` (an abort the next update reports); calls `_merge_last_batch` and `_finish`; writes
  `now_s`, `ghosts`, `batch_is_full`, `new_token_ratio`, `last_batch`, `finished_req_ids`,
  `prev_step_scheduled_req_ids`, `prefix_cache_stats` and registers the run's last step in
  `_steps` / `_recent`, as schedule() does.
- `sglang_memory.SGLangMemoryRuns` on `SGLangMemory` (scheduler/sglang/memory.py): takes pages
  from `pool`, evicts from `tree`, appends to the block tables in `reqs`, as grow() does.

Nothing in scheduler/ outside this package imports it: a scheduler works, and is complete,
without its bulk path. Only the simulator's fast path (exact macro-steps) builds one, through
`decode_runs_for`, chosen by the name the scheduler declares (`SchedulerCapabilities.decode_runs`),
never by its type: a subclass that changes what a step does (P/D) declares none
(tests/test_fastpath_boundary.py enforces both directions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.registry import Registry

if TYPE_CHECKING:
    from servesim.scheduler.bulk.interface import DecodeRuns, DecodeRunsFactory
    from servesim.scheduler.interface import SchedulerInterface


def _builtins() -> None:
    """The built-in owners, registered on the first lookup. Here, not in their modules: an owner's
    module has no import-time side effect (the build executes a compiled module's source again to
    check it: tests/test_compile_transform.py)."""
    from servesim.scheduler.bulk.pd import PDDecodeRuns
    from servesim.scheduler.bulk.sglang import SGLangDecodeRuns
    from servesim.scheduler.bulk.vllm import VllmDecodeRuns

    DECODE_RUNS.add("vllm", VllmDecodeRuns)
    DECODE_RUNS.add("sglang", SGLangDecodeRuns)
    DECODE_RUNS.add("pd_decode", PDDecodeRuns)


# name -> owner factory (SchedulerCapabilities.decode_runs names one)
DECODE_RUNS: Registry[DecodeRunsFactory] = Registry("bulk decode path", loader=_builtins)


def decode_runs_for(scheduler: SchedulerInterface) -> DecodeRuns | None:
    """The bulk decode path the scheduler declares (`capabilities.decode_runs`), built for it, or
    None when it declares none."""
    name = scheduler.capabilities.decode_runs
    return None if name is None else DECODE_RUNS.get(name)(scheduler)
