"""Exact fast-forward over plain decode steps (SimConfig.fast_forward, off by default).

A step is "plain decode" when it provably is one: nothing waiting, every running request decodes
exactly one token, none of them can finish in it, its block allocations all succeed (so nothing is
preempted), and no arrival can land before it is scheduled. Such a step changes the scheduler,
the executor and the metrics in a fixed way, so we apply exactly those changes directly: the same
block allocations in the same order, the same token appends and hashes, the same step time from
the cost model, the same metric records -- without building a SchedulerOutput, a model-runner
output or the per-request bookkeeping around them. tests/test_sim_fast_forward.py proves equality
with plain stepping.
"""

from __future__ import annotations

from servesim.scheduler.oracle_trace import oracle_token
from servesim.simulator.cost_model.base import StepShape
from servesim.simulator.metrics import StepRecord


class FastForward:
    def __init__(self, engine) -> None:
        self.engine = engine
        sched = engine.scheduler
        cfg = engine.cfg
        from servesim.scheduler.scheduler import Scheduler
        from servesim.simulator.executor import SimExecutor

        # Exactly the sync vLLM scheduler (not async, not P/D, not another engine): past this
        # check its internals are known, so reading them is no probing.
        self.enabled = (
            type(sched) is Scheduler
            and sched.policy.fast_forward_safe and sched.tracer is None
            and cfg.scheduler.num_spec_tokens == 0
            and isinstance(engine.executor, SimExecutor)
            and engine.step_trace is None
            and sched.kv_cache_manager._single_full is not None
        )
        self.num_fast_steps = 0

    def try_step(self, now: float, next_arrival_s: float):
        """Apply the schedule half of a plain decode step; return (end_time, finish) or None.

        `finish()` applies the update half; the caller calls it once the clock reaches end_time.
        """
        e = self.engine
        sched = e.scheduler
        if not (now < next_arrival_s) or sched.waiting or sched.skipped_waiting or sched.finished_req_ids:
            return None
        running = sched.running
        n = len(running)
        if n == 0 or n > sched.max_num_scheduled_tokens:
            return None
        kvm = sched.kv_cache_manager
        mgr = kvm._single_full
        bs = kvm.block_size
        max_len = sched.max_model_len
        need = 0
        for r in running:
            c = r.num_computed_tokens
            p = r.sampling_params
            if (c != r.num_tokens - 1 or r.num_output_placeholders or r.is_prefill_chunk or r.spec_token_ids
                    or c > max_len - 2 or r.num_output_tokens + 1 >= r.max_tokens or r.num_tokens + 1 >= max_len
                    or p.stop_token_ids or (p.eos_token_id is not None and not p.ignore_eos)):
                return None
            need += max(0, -(-(c + 1) // bs) - len(mgr.req_to_blocks.get(r.request_id, ())))
        pool = kvm.block_pool
        if need > pool.free_block_queue.num_free_blocks:
            return None
        return self._schedule_half(now, running, kvm, mgr, bs)

    def _schedule_half(self, now, running, kvm, mgr, bs):
        e = self.engine
        sched = e.scheduler
        pool = kvm.block_pool
        caching = kvm.enable_caching
        ctx = []
        for r in running:  # the allocations schedule() would make, in its order
            c = r.num_computed_tokens
            ctx.append(c)
            blocks = mgr.req_to_blocks[r.request_id]
            n_new = -(-(c + 1) // bs) - len(blocks)
            if n_new > 0:
                blocks.extend(pool.get_new_blocks(n_new))
            if caching:
                mgr.cache_blocks(r, c + 1)
            r.num_computed_tokens = c + 1
        sched.prev_step_scheduled_req_ids = {r.request_id for r in running}
        n = len(running)
        step_rec = StepRecord(e.num_steps, now, 0.0, 0.0, n, 0, n, kvm.usage, n, 0, 0)
        e.metrics.steps.append(step_rec)
        e.num_steps += 1
        shape = StepShape((1,) * n, tuple(ctx), n)
        ex = e.executor
        ex.last_shape = shape
        gpu_s = ex.cost_model.step_time_s(shape)
        cpu_s = e.cpu.step_s(n, n)
        step_rec.gpu_time_s = gpu_s
        end = max(now + cpu_s, e._gpu_free_at) + gpu_s  # the same arithmetic as the stepping loop
        e._gpu_free_at = end
        self.num_fast_steps += 1
        reqs = list(running)

        def finish() -> None:
            t = e.env.now
            tracker = ex.batch
            for r in reqs:
                rid = r.request_id
                k = tracker.num_out[rid]
                tracker.num_out[rid] = k + 1
                tracker.num_tokens[rid] += 1
                r.append_output_token_ids(oracle_token(rid, k))
                e.metrics.on_tokens(rid, t, 1)
            kvm.make_prefix_cache_stats()  # no lookups happened; keep the per-step reset
            step_rec.duration_s = t - now
            sched.now_s = t
            if e.progress is not None and e.num_steps % 256 == 0:
                e.progress(t, e._num_done)

        return end, finish
