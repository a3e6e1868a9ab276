"""Private blocks (scheduler/kv/block_pool.py): a request whose key root is its own caches its full
blocks outside the hash map until it could look them up itself (a preemption) or another request
with the same root appears. Checked against the reference with every block in the map: the same
requests keyed by hashing their ids (no key root, so nothing is private), step by step in
lockstep -- every schedule's block ids, preemptions and finishes, the pool's counts and the
prefix-cache stats each update reports -- and a router's probe of the cache.
"""

from __future__ import annotations

import hashlib
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.scheduler import ModelRunnerOutput, Request, SamplingParams, TokenProvenance, TokenSegment
from sched_helpers import make_sched

BLOCK = 4


def _stream_id(source: bytes, pos: int) -> int:
    return int.from_bytes(hashlib.sha256(source + pos.to_bytes(8, "little")).digest()[:4], "little") >> 1


def _out_source(rid: str) -> bytes:
    return b"out:" + rid.encode()


def _request(sched, rid: str, runs: list[tuple[bytes, int, int]], max_tokens: int, keyed: bool,
             arrival_s: float = 0.0, priority: int = 0, **kw) -> Request:
    ids = [_stream_id(src, start + i) for src, start, n in runs for i in range(n)]
    provenance = TokenProvenance(tuple(TokenSegment(*r) for r in runs), _out_source(rid)) if keyed else None
    return Request(rid, array("i", ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   arrival_time=arrival_s, priority=priority, block_hasher=sched.block_hasher,
                   token_provenance=provenance, **kw)


class Twin:
    """One scheduler keyed by provenance (private caching on), one by hashed ids (reference)."""

    def __init__(self, **cfg) -> None:
        self.keyed = make_sched(block_size=BLOCK, enable_prefix_caching=True, **cfg)
        self.hashed = make_sched(block_size=BLOCK, enable_prefix_caching=True, **cfg)
        self.depth = 2 if cfg.get("async_scheduling") else 1
        self.in_flight: list = []
        self.seen = {"private": 0, "ended": False, "preempted_hits": 0}

    def add(self, rid: str, runs, max_tokens: int, t: float, priority: int = 0, **kw) -> None:
        for s, keyed in ((self.keyed, True), (self.hashed, False)):
            s.add_request(_request(s, rid, runs, max_tokens, keyed, t, priority, **kw), now_s=t)
        self._compare()

    def probe(self, runs) -> None:
        ids = [_stream_id(src, start + i) for src, start, n in runs for i in range(n)]
        prov = TokenProvenance(tuple(TokenSegment(*r) for r in runs), None)
        a = self.keyed.cached_prefix_tokens(ids, provenance=prov)
        b = self.hashed.cached_prefix_tokens(ids)
        assert a == b, (a, b)
        self._compare()

    def abort(self, rid: str, t: float) -> None:
        for s in (self.keyed, self.hashed):
            s.finish_requests(rid, now_s=t)
        self._compare()

    def step(self, t: float) -> None:
        outs = (self.keyed.schedule(now_s=t), self.hashed.schedule(now_s=t))
        assert _decisions(outs[0]) == _decisions(outs[1])
        self.seen["private"] = max(self.seen["private"], self.keyed.kv_cache_manager.block_pool.num_private_cached)
        # whether each request samples is the schedule's (a later schedule may change the flag)
        samples = tuple({rid: not s.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens}
                        for s, out in zip((self.keyed, self.hashed), outs))
        self.in_flight.append((outs, samples))
        while self.in_flight and (len(self.in_flight) >= self.depth or not outs[0].num_scheduled_tokens):
            self._update(*self.in_flight.pop(0), t)
        self._compare()

    def drain(self, t: float) -> None:
        while self.in_flight:
            self._update(*self.in_flight.pop(0), t)
        self._compare()

    def _update(self, outs, samples, t: float) -> None:
        results = []
        for s, out, sample in zip((self.keyed, self.hashed), outs, samples):
            ids = list(out.num_scheduled_tokens)
            sampled = []
            for rid in ids:
                r = s.requests.get(rid)
                # output k of rid is position k of its output stream (what its provenance declares)
                sampled.append([_stream_id(_out_source(rid), r.num_output_tokens)] if r is not None and sample[rid]
                               else [])
            eco = s.update_from_output(out, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled),
                                       now_s=t)
            outputs = [(o.request_id, o.new_token_ids, o.finish_reason) for o in eco.outputs]
            results.append((eco.scheduler_stats, outputs, eco.finished_req_ids))
        assert results[0] == results[1]  # the prefix-cache stats of the update included
        stats = results[0][0]
        if stats is not None:
            self.seen["preempted_hits"] += stats.prefix_cache_stats.preempted_hits

    def _compare(self) -> None:
        a, b = self.keyed.kv_cache_manager, self.hashed.kv_cache_manager
        assert a.block_pool.get_num_cached_blocks() == b.block_pool.get_num_cached_blocks()
        assert a.block_pool.get_num_free_blocks() == b.block_pool.get_num_free_blocks()
        assert [x.block_id for x in a.block_pool.free_block_queue.get_all_free_blocks()] == \
            [x.block_id for x in b.block_pool.free_block_queue.get_all_free_blocks()]
        self.seen["ended"] = self.seen["ended"] or not a.private_caching
        self.keyed.check_invariants()
        self.hashed.check_invariants()


def _decisions(out) -> tuple:
    new = tuple((nr.req_id, nr.block_ids, nr.num_computed_tokens) for nr in out.scheduled_new_reqs)
    cached = out.scheduled_cached_reqs
    return (dict(out.num_scheduled_tokens), new, tuple(cached.req_ids), tuple(map(str, cached.new_block_ids)),
            tuple(cached.num_computed_tokens), tuple(sorted(out.preempted_req_ids)),
            tuple(sorted(out.finished_req_ids)))


# --- hand-built cases: each path, with what it must have done ---------------------------------------
def _fresh(i: int, n: int) -> list[tuple[bytes, int, int]]:
    return [(b"req:%d" % i, 0, n)]


def test_private_requests_stay_out_of_the_map_and_count_as_cached():
    tw = Twin(num_blocks=40, max_num_batched_tokens=64, max_model_len=128)
    for i in range(3):
        tw.add(f"r{i}", _fresh(i, 18), 6, 0.0)
    for k in range(4):
        tw.step(0.1 * (k + 1))
    tw.drain(1.0)
    pool = tw.keyed.kv_cache_manager.block_pool
    assert tw.keyed.kv_cache_manager.private_caching
    assert pool.num_private_cached > 0 and len(pool.cached_block_hash_to_block) == 0
    assert pool.get_num_cached_blocks() == tw.hashed.kv_cache_manager.block_pool.get_num_cached_blocks() > 0


def test_a_preempted_private_request_hits_its_own_blocks_when_it_resumes():
    """A pool too small for both: the later request preempts the earlier one (priority), which
    resumes on its own blocks that are still cached: they were published when it was preempted."""
    tw = Twin(num_blocks=12, max_num_batched_tokens=64, max_model_len=64, policy="priority")
    tw.add("low", _fresh(1, 20), 16, 0.0, priority=1)
    for k in range(3):
        tw.step(0.1 * (k + 1))
    tw.add("high", _fresh(2, 16), 3, 0.5, priority=0)
    for k in range(40):
        tw.step(1.0 + 0.1 * k)
    tw.drain(9.0)
    assert tw.keyed.num_preemptions_total > 0
    assert tw.seen["preempted_hits"] > 0  # the resumed request found its own blocks
    assert tw.seen["private"] > 0


def test_a_second_request_with_the_same_root_publishes_every_private_block():
    tw = Twin(num_blocks=60, max_num_batched_tokens=64, max_model_len=128)
    tw.add("turn1", [(b"session:s", 0, 24)], 8, 0.0)
    tw.add("other", _fresh(5, 20), 4, 0.0)
    for k in range(12):
        tw.step(0.1 * (k + 1))
    tw.drain(2.0)
    assert tw.keyed.kv_cache_manager.private_caching
    # the next turn starts with the first one's 24 ids: it must hit them
    tw.add("turn2", [(b"session:s", 0, 30)], 4, 2.5)
    assert not tw.keyed.kv_cache_manager.private_caching
    assert tw.keyed.kv_cache_manager.block_pool.num_private_cached == 0
    tw.step(3.0)
    tw.drain(3.1)
    assert tw.seen["ended"]


def test_a_pinned_turn_stays_private_until_the_next_turn_publishes_it():
    """Continuum pins a finished turn's blocks for its job's next turn: the pinned (finished,
    private) blocks are published when the next turn, which shares their root, arrives."""
    tw = Twin(num_blocks=60, max_num_batched_tokens=64, max_model_len=128, policy="continuum")
    tw.add("t1", [(b"session:j", 0, 24)], 4, 0.0, job_id="j", is_last_step=False)
    for k in range(8):
        tw.step(0.1 * (k + 1))
    tw.drain(1.0)
    kvm = tw.keyed.kv_cache_manager
    assert tw.keyed.policy.held_request_ids() == {"t1"} and kvm.block_pool.num_private_cached > 0
    tw.add("t2", [(b"session:j", 0, 36)], 4, 1.2, job_id="j", is_last_step=True)
    assert not kvm.private_caching
    for k in range(8):
        tw.step(1.3 + 0.1 * k)
    tw.drain(3.0)


def test_reset_prefix_cache_forgets_private_blocks_too():
    tw = Twin(num_blocks=40, max_num_batched_tokens=64, max_model_len=128)
    tw.add("a", _fresh(1, 30), 3, 0.0)
    for k in range(6):
        tw.step(0.1 * (k + 1))
    tw.drain(1.0)
    pool = tw.keyed.kv_cache_manager.block_pool
    assert pool.num_private_cached > 0 and not tw.keyed.has_unfinished_requests()
    assert tw.keyed.reset_prefix_cache() and tw.hashed.reset_prefix_cache()
    assert pool.num_private_cached == 0 and pool.get_num_cached_blocks() == 0
    tw.add("b", _fresh(2, 30), 3, 2.0)  # a new private request after the reset
    for k in range(6):
        tw.step(2.1 + 0.1 * k)
    tw.drain(3.0)
    assert pool.num_private_cached > 0


def test_a_router_probe_finds_private_blocks():
    """cached_prefix_tokens (prefix_aware routing) asks with a throwaway request before the real one
    arrives: a matching root publishes first, so the probe sees the blocks."""
    tw = Twin(num_blocks=60, max_num_batched_tokens=64, max_model_len=128)
    tw.add("a", [(b"group:g", 0, 40)], 4, 0.0)
    for k in range(6):
        tw.step(0.1 * (k + 1))
    tw.drain(1.0)
    tw.probe([(b"group:g", 0, 48)])
    assert tw.keyed.cached_prefix_tokens([_stream_id(b"group:g", i) for i in range(48)],
                                         provenance=TokenProvenance((TokenSegment(b"group:g", 0, 48),))) == 40
    tw.probe([(b"fresh", 0, 48)])


# --- random sequences in lockstep ------------------------------------------------------------------
_SOURCES = [b"s0", b"s1", b"s2"]
_op = st.one_of(
    # add: a fresh stream of its own (private) or one of a few shared ones, prompt length, max_tokens
    st.tuples(st.just("add"), st.sampled_from([None, None, None, 0, 1, 2]), st.integers(1, 40),
              st.integers(1, 12), st.integers(0, 2)),
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("probe"), st.sampled_from([None, 0, 1, 2]), st.integers(2, 40)),
)
_configs = st.fixed_dictionaries({
    "num_blocks": st.integers(6, 40),
    "max_num_batched_tokens": st.sampled_from([8, 16, 64]),
    "max_num_seqs": st.integers(1, 6),
    "policy": st.sampled_from(["fcfs", "priority", "continuum"]),
    "async_scheduling": st.booleans(),
})


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_configs, st.lists(_op, min_size=1, max_size=70))
def test_random_sequences_match_the_reference_step_by_step(cfg, ops):
    tw = Twin(max_model_len=64, **cfg)
    t, n = 0.0, 0
    for o in ops:
        t += 0.1
        if o[0] == "add":
            _, shared, plen, max_tokens, prio = o
            runs = _fresh(n, plen) if shared is None else [(_SOURCES[shared], 0, plen)]
            # a shared stream is a job's (continuum pins its non-final turns)
            job = {} if shared is None else {"job_id": f"j{shared}", "is_last_step": prio == 0}
            tw.add(f"r{n}", runs, max_tokens, t, prio, **job)
            n += 1
        elif o[0] == "step":
            tw.step(t)
        elif o[0] == "abort":
            tw.abort(f"r{o[1]}", t)
        else:
            _, shared, plen = o
            tw.probe(_fresh(1000, plen) if shared is None else [(_SOURCES[shared], 0, plen)])
    tw.drain(t + 1.0)
