"""The simulator's tightest numeric loops, one step each, as plain functions of floats and ints.

Why a module of their own: a macro-step prices and times every step of a run one by one (the
floats must be the stepping loop's, so the recurrences cannot be vectorised), ~0.23 us a step
each in CPython; on the 32-replica cluster benchmark they were a tenth of the run. Written with
nothing but typed locals so that mypyc compiles them to C doubles and ints (tools/compile_kernels.py;
simulator/kernel_impl.py picks the build or this module): the same IEEE operations in the same
order, so the compiled functions return the very floats these do (tests/test_kernels.py).

Stdlib only, no imports of ours: the compiled copy is loaded on its own.
"""

from __future__ import annotations


def step_timeline(now: float, gpu_s: list[float], num_in_flight: int, cpu_s: float, later_s: float,
                  deadline_s: float, free_at: float) -> tuple[list[float], list[float], list[float]]:
    """(schedule times, GPU end times, update times) of the steps priced in gpu_s that fit before
    `later_s` (every update strictly before it) and `deadline_s` (every schedule strictly before
    it), with the stepping loop's arithmetic: start = max(t + cpu_s, GPU free), end = start + gpu,
    and the clock reaches a time as t + (due - t) (SimPy's timeout). The update after schedule j is
    step j's own (num_in_flight 0: sync) or the previous step's (async, whose end was free_at)."""
    pending = free_at  # async: end of the step the next update applies
    t = now
    sched_t: list[float] = []
    ends: list[float] = []
    upd_t: list[float] = []
    for g in gpu_s:
        if not t < deadline_s:
            break
        start = t + cpu_s
        if free_at > start:  # max(t + cpu_s, free_at), as Python's max picks
            start = free_at
        end = start + g
        due = pending if num_in_flight else end
        u = t + (due - t) if due > t else t
        if not u < later_s:
            break
        sched_t.append(t)
        ends.append(end)
        upd_t.append(u)
        free_at = end
        pending = end
        t = u
    return sched_t, ends, upd_t


def decode_step_prices(ctx_sum: int, n: int, num_steps: int, num_layers: int, gemm_s: float,
                       elementwise_s: float, comm_s: float, head_s: float, flops_per_pair: float,
                       attn_c: float, attn_m: float, attn_o: float, kv_bytes_per_tok: float,
                       q_bytes: float) -> list[float]:
    """The roofline's GPU time of num_steps all-decode steps of n requests whose contexts sum to
    ctx_sum at the first and grow by n a step (RooflineCostModel.decode_step_times_s, which
    prices a batch's fixed parts once): per layer, attention is the larger of its compute and
    memory times plus its overhead; a step adds ((gemm + attention) + elementwise) + comm per
    layer, then the head, in the order step_time_s sums them."""
    out: list[float] = []
    for _ in range(num_steps):
        kv_tokens = ctx_sum + n
        compute = (kv_tokens + 0.0) * flops_per_pair * attn_c
        memory = (kv_tokens * kv_bytes_per_tok + q_bytes) * attn_m
        attn = (memory if memory > compute else compute) + attn_o
        out.append(num_layers * (gemm_s + attn + elementwise_s + comm_s) + head_s)
        ctx_sum += n
    return out
