"""SGLang's bulk decode path (scheduler/bulk/sglang.py): a run applied at once leaves the
scheduler exactly as stepping schedule() and update_from_output() leaves it -- page ids and the free
pool's order, new_token_ratio (float for float), counters, tokens, queues, batch_is_full -- and the
horizon stops before anything a plain step cannot do (a finish, an eviction, a prefill, a merge)."""

from __future__ import annotations

import random

import pytest

from servesim.scheduler import ModelRunnerOutput, Request, SamplingParams
from servesim.scheduler.bulk.sglang_memory import SGLangMemoryRuns
from servesim.scheduler.lazy_ids import RunTokens
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.radix_cache import RadixCache
from sched_helpers import apply_due, decode_output, runs_of

BASE = dict(max_running_requests=16, chunked_prefill_size=256, enable_chunked_prefill=True, page_size=4,
            max_total_tokens=4000, enable_radix_cache=True, overlap_schedule=False, seed=0)


def make_sched(**kw) -> SGLangScheduler:
    return SGLangScheduler(SGLangConfig(**{**BASE, **kw}), 4096)


def token(rid: str, j: int) -> int:
    return 100 + (sum(map(ord, rid)) * 31 + j) % 500


class _Source:
    """token() as a run's id source (position j of a request's stream is its j-th output)."""

    def tokens(self, rid: str, k: int, n: int) -> list[int]:
        return [token(rid, k + j) for j in range(n)]

    def tokens_at(self, rids: list[str], positions: list[int]) -> list[int]:
        return [token(rid, k) for rid, k in zip(rids, positions)]


def run_tokens(reqs, k: int) -> RunTokens:
    """The k tokens each request of a run samples, unbuilt (scheduler/lazy_ids.py)."""
    return RunTokens(_Source(), [r.request_id for r in reqs],
                     [r.num_output_tokens + r.num_output_placeholders for r in reqs], [k] * len(reqs))


def mro_for(sched: SGLangScheduler, so) -> ModelRunnerOutput:
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = sched.requests.get(rid)
        sampled.append([] if r is not None and r.is_prefill_chunk else
                       [token(rid, r.num_output_tokens + r.num_output_placeholders - 1 if r else 0)])
    return ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled)


class Driver:
    """The engine loop's order: sync = (schedule, update); overlap = schedule N+1, then update N."""

    def __init__(self, sched: SGLangScheduler, overlap: bool):
        self.sched, self.overlap, self.in_flight = sched, overlap, []

    def step(self) -> None:
        so = self.sched.schedule()
        self.in_flight.append((so, mro_for(self.sched, so)))
        apply_due(self.sched, self.in_flight, 1 + self.overlap, so.total_num_scheduled_tokens == 0)

    def bulk(self, k: int) -> None:
        """A run of k steps through the bulk path, as simulator/fastpath/planner.py applies it."""
        sched = self.sched
        runs = runs_of(sched)
        reqs = runs.decode_run_requests()
        tokens = run_tokens(reqs, k)
        if not self.overlap:
            runs.schedule_decode_steps(reqs, k, tokens, 0.0)
        else:
            runs.schedule_decode_steps(reqs, 1, None, 0.0)
            old, mro = self.in_flight.pop(0)
            sched.update_from_output(old, mro)
            # the run's first update is the in-flight step's; its own tokens start one later
            runs.schedule_decode_steps(reqs, k - 1, tokens, 0.0)
            so = runs.decode_step_output(reqs)
            ids = [r.request_id for r in reqs]
            self.in_flight.append((so, decode_output(ids, tokens.at_step(k - 1))))
        sched.check_invariants()

    def bulk_through(self, k: int) -> int:
        """An overlap run of k steps through finishes, as simulator/fastpath/planner.py applies it (its
        batch shrinking: decode_run_steps, the extra forward); returns the requests it finished."""
        sched = self.sched
        runs = runs_of(sched)
        reqs = runs.decode_run_requests()
        each = runs.decode_run_steps(reqs, k)
        tokens = run_tokens(reqs, k)
        runs.schedule_decode_steps(reqs, 1, None, 0.0)
        old, mro = self.in_flight.pop(0)
        sched.update_from_output(old, mro)
        before = len(sched.requests)
        runs.schedule_decode_steps(reqs, k - 1, tokens, 0.0, [min(m, k) - 1 for m in each], [0.0] * (k - 1))
        kept = [i for i, m in enumerate(each) if m + 1 >= k]  # the last step: the extra forwards too
        ids = [reqs[i].request_id for i in kept]
        so = runs.decode_step_output([reqs[i] for i in kept])
        self.in_flight.append((so, decode_output(ids, tokens.at_step(k - 1, kept))))
        sched.check_invariants()
        return before - len(sched.requests)


def snapshot(sched: SGLangScheduler) -> dict:
    mem = sched.kv_cache_manager
    return {
        "reqs": {rid: (r.status, r.num_computed_tokens, r.num_output_placeholders, r.is_prefill_chunk,
                       list(r.output_token_ids), r.max_tokens) for rid, r in sched.requests.items()},
        "kv": {rid: (list(kv.pages), sorted(kv.private), kv.cached_len, kv.num_reported) for rid, kv in mem.reqs.items()},
        "free": list(mem.pool.free_pages), "evictable": mem.tree.evictable_size(),
        "running": [r.request_id for r in sched.running], "waiting": [r.request_id for r in sched.waiting],
        "ghosts": [r.request_id for r in sched.ghosts], "full": sched.batch_is_full,
        "ratio": sched.new_token_ratio, "finished": sorted(sched.finished_req_ids),
        "prev": sorted(sched.prev_step_scheduled_req_ids), "last": None if sched.last_batch is None else sched.last_batch.kind,
    }


def setup(overlap: bool, seed: int, **kw) -> tuple[Driver, Driver]:
    """Two identical schedulers, stepped until decoding with a full, steady batch."""
    rng = random.Random(seed)
    drivers = []
    for _ in range(2):
        sched = make_sched(overlap_schedule=overlap, **kw)
        r2 = random.Random(seed)
        for i in range(r2.randint(2, 10)):
            n = r2.randint(1, 60)
            sched.add_request(Request(f"r{i}", [1 + (i * 7 + j) % 50 for j in range(n)],
                                      SamplingParams(max_tokens=r2.randint(20, 200), ignore_eos=True)))
        drivers.append(Driver(sched, overlap))
    for _ in range(rng.randint(3, 12)):
        for d in drivers:
            d.step()
    return drivers[0], drivers[1]


def drive_both(plain: Driver, bulk: Driver, through: bool, rounds: int) -> int:
    """Step `plain` one step at a time and `bulk` by runs wherever its horizon allows, comparing
    their whole state before every decision and at the end; returns the runs applied (through
    finishes: the requests they finished)."""
    done = 0
    for _ in range(rounds):
        assert snapshot(plain.sched) == snapshot(bulk.sched)
        k = runs_of(bulk.sched).decode_run_horizon(64, len(bulk.in_flight), through_finishes=through)
        assert runs_of(plain.sched).decode_run_horizon(64, len(plain.in_flight), through_finishes=through) == k
        if k >= 2:
            for _ in range(k):
                plain.step()
            if through:
                done += bulk.bulk_through(k)
            else:
                bulk.bulk(k)
                done += 1
        else:
            plain.step()
            bulk.step()
        if not plain.sched.has_unfinished_requests() and not plain.in_flight:
            break
    assert snapshot(plain.sched) == snapshot(bulk.sched)
    return done


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_a_bulk_run_equals_stepping(overlap, seed):
    plain, bulk = setup(overlap, seed)
    assert drive_both(plain, bulk, through=False, rounds=40) > 0


@pytest.mark.parametrize("seed", range(12))
def test_an_overlap_run_through_finishes_equals_stepping(seed):
    """Requests finish inside the run (their extra forward scheduled, their pages released into
    the pool's back and the tree), the batch shrinks; everything equals stepping."""
    plain, bulk = setup(True, seed)
    if seed % 2 and not plain.sched.waiting:
        # A full batch with nothing waiting (its waiting request was aborted): the first filter
        # that drops a finished request clears the flag, inside the run as when stepping.
        plain.sched.batch_is_full = bulk.sched.batch_is_full = True
    assert drive_both(plain, bulk, through=True, rounds=60) > 0


def test_horizon_stops_before_the_update_that_finishes_a_request():
    for overlap in (False, True):
        _, d = setup(overlap, 3)
        sched = d.sched
        k = runs_of(sched).decode_run_horizon(10_000, len(d.in_flight))
        left = min(r.max_tokens - r.num_output_tokens - 1 for r in sched.running)
        assert 1 <= k <= left


def test_horizon_stops_before_a_step_that_would_retract():
    """A pool that runs out mid-run: cached pages are evicted inside the run (apply_decode_run
    replays it); the run ends before the step whose memory check would have to retract."""
    plain, bulk = setup(False, 5, max_total_tokens=400)
    mem = bulk.sched.kv_cache_manager
    pages = SGLangMemoryRuns(mem)
    running = bulk.sched.running
    k = runs_of(bulk.sched).decode_run_horizon(10_000, 0)
    room = len(mem.pool.free_pages) + mem.tree.evictable_size() // mem.page_size
    bound = min(r.max_tokens - r.num_output_tokens - 1 for r in running)
    assert k == bound or pages.run_pages(pages.first_alloc_steps(running), k + 1) > room  # one more would not fit
    assert pages.run_pages(pages.first_alloc_steps(running), k) <= room


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_runs_evict_cached_pages_as_stepping_does(overlap, seed):
    """A small pool whose free pages are all cached (finished requests, shared prefixes) and a
    stream of arrivals: runs evict from the tree at the steps stepping evicts, in LRU order, and
    take the freed pages; state equals stepping throughout."""
    rng = random.Random(seed)
    plain, bulk = (Driver(make_sched(overlap_schedule=overlap, max_total_tokens=500), overlap) for _ in range(2))
    evictions = []  # tokens freed by evictions inside bulk runs
    in_run = [False]

    class CountingTree(RadixCache):  # a subclass, not a patched method: the compiled tree has no __dict__
        def evict(self, num_tokens: int) -> int:
            freed = super().evict(num_tokens)
            if in_run[0]:
                evictions.append(freed)
            return freed

    mem = bulk.sched.kv_cache_manager
    assert not mem.tree.root.children  # swapped while empty
    mem.tree = CountingTree(mem.page_size, mem.pool)

    def flagged(apply):
        def run(k: int):
            in_run[0] = True
            try:
                return apply(k)
            finally:
                in_run[0] = False
        return run

    bulk.bulk, bulk.bulk_through = flagged(bulk.bulk), flagged(bulk.bulk_through)
    prefixes = [[rng.randint(1, 400) for _ in range(rng.choice([8, 24, 40]))] for _ in range(3)]
    runs = 0
    for wave in range(6):
        for i in range(rng.randint(1, 4)):
            tokens = rng.choice(prefixes) + [rng.randint(1, 400) for _ in range(rng.randint(1, 30))]
            max_tokens = rng.randint(10, 60)
            for d in (plain, bulk):
                d.sched.add_request(Request(f"w{wave}-{i}", tokens, SamplingParams(max_tokens=max_tokens,
                                                                                   ignore_eos=True)))
        runs += drive_both(plain, bulk, through=overlap, rounds=rng.randint(4, 12))
    runs += drive_both(plain, bulk, through=overlap, rounds=400)
    assert runs > 0 and sum(evictions) > 0


def test_waiting_request_needs_a_full_batch_and_no_ghost():
    plain, bulk = setup(False, 1, max_running_requests=2)
    sched = bulk.sched
    if sched.waiting and sched.batch_is_full and not sched.ghosts:
        assert runs_of(sched).decode_run_horizon(64, 0) >= 1
    sched.batch_is_full = False
    if sched.waiting:
        assert runs_of(sched).decode_run_horizon(64, 0) == 0  # the next schedule tries a prefill


def test_a_run_merges_the_last_prefill_batch_and_a_chunked_request_stops_runs():
    for overlap in (False, True):
        drivers = []
        for _ in range(2):
            sched = make_sched(overlap_schedule=overlap)
            sched.add_request(Request("a", list(range(1, 30)), SamplingParams(max_tokens=50, ignore_eos=True)))
            d = Driver(sched, overlap)
            d.step()  # a prefill: the next schedule merges it into the (empty) running batch
            drivers.append(d)
        plain, bulk = drivers
        sched = bulk.sched
        assert sched.last_batch.is_extend and not sched.running
        assert [r.request_id for r in runs_of(sched).decode_run_requests()] == ["a"]
        k = runs_of(sched).decode_run_horizon(64, len(bulk.in_flight))
        assert k == 50 - 1 - (0 if overlap else 1)  # sync: the prefill's token is already applied
        for _ in range(k):
            plain.step()
        bulk.bulk(k)
        assert snapshot(plain.sched) == snapshot(bulk.sched)
    sched2 = make_sched(chunked_prefill_size=8)
    sched2.add_request(Request("b", list(range(1, 30)), SamplingParams(max_tokens=50, ignore_eos=True)))
    Driver(sched2, False).step()
    assert sched2.chunked_req is not None and runs_of(sched2).decode_run_horizon(64, 0) == 0
