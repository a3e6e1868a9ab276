"""Property-based: random add / schedule / update / abort sequences keep every invariant."""

from __future__ import annotations

import io
import json

from hypothesis import HealthCheck, given, settings, strategies as st

from servesim.scheduler import ModelRunnerOutput, RequestStatus
from servesim.scheduler.decision_trace import StepTracer
from sched_helpers import make_sched, req

op = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 12), st.integers(0, 3), st.integers(0, 4)),
    st.tuples(st.just("step"), st.integers(0, 3)),
    st.tuples(st.just("abort"), st.integers(0, 30)),
)
configs = st.fixed_dictionaries({
    "num_blocks": st.integers(6, 40),
    "block_size": st.sampled_from([1, 2, 4, 8]),
    "max_num_batched_tokens": st.integers(8, 64),
    "max_num_seqs": st.integers(1, 8),
    "policy": st.sampled_from(["fcfs", "priority", "continuum"]),
    "enable_prefix_caching": st.booleans(),
    "enable_chunked_prefill": st.booleans(),
    "async_scheduling": st.booleans(),
    "num_spec_tokens": st.sampled_from([0, 0, 2]),
    "long_prefill_token_threshold": st.sampled_from([0, 0, 5]),
    "scheduler_reserve_full_isl": st.booleans(),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.lists(op, min_size=1, max_size=60))
def test_random_sequences_keep_invariants(cfg, ops):
    if not cfg["enable_chunked_prefill"]:
        cfg["max_num_batched_tokens"] = 64
    cfg["max_model_len"] = 64
    trace = io.StringIO()
    s = make_sched(**cfg)
    s.tracer = StepTracer(trace)
    n = 0
    in_flight = []
    t = 0.0
    for o in ops:
        t += 0.1
        if o[0] == "add":
            _, plen, max_tokens, prio, prefix = o
            tokens = [prefix * 100 + i for i in range(plen)]  # shared prefixes across requests
            s.add_request(req(s, f"r{n}", tokens, max_tokens=max_tokens, priority=prio,
                              arrival_time=t, job_id=f"j{prefix}", is_last_step=prio == 0), now_s=t)
            n += 1
        elif o[0] == "abort":
            s.finish_requests(f"r{o[1]}", now_s=t)
        else:
            out = s.schedule(now_s=t)
            sample = [not s.requests[r].is_prefill_chunk for r in out.num_scheduled_tokens]
            in_flight.append((out, sample))
            depth = 2 if cfg["async_scheduling"] else 1
            while in_flight and (len(in_flight) >= depth or not out.num_scheduled_tokens):
                _apply(s, *in_flight.pop(0), accept=o[1], now_s=t)
        s.check_invariants()
    while in_flight:
        _apply(s, *in_flight.pop(0), accept=0, now_s=t)
        s.check_invariants()
    for line in trace.getvalue().splitlines():
        rec = json.loads(line)
        assert rec["before"]["num_free_blocks"] <= cfg["num_blocks"] - 1


def _apply(s, out, sample, accept, now_s):
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid, do in zip(ids, sample):
        drafts = out.scheduled_spec_decode_tokens.get(rid, [])
        sampled.append([5] * (1 + min(accept, len(drafts))) if do else [])
    drafts_next = {rid: [9, 9] for rid in ids} if s.num_spec_tokens else None
    s.update_from_output(out, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled, drafts_next),
                         now_s=now_s)
    for r in s.running:
        assert r.status == RequestStatus.RUNNING
