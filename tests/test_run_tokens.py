"""A run's output ids handed over unbuilt (scheduler/lazy_ids.py, Request.append_output_tokens_from):
whoever reads a request's ids gets exactly the ids stepping appends, in every order of runs, single
appends and reads; the vLLM scheduler's bulk runs with unbuilt ids leave every request as stepping
does (ids, counts, block keys)."""

from __future__ import annotations

import random

import pytest

from servesim.scheduler import (CacheConfig, LazyTokenIds, Request, SamplingParams,
                                SchedulerConfig, TokenProvenance, TokenSegment, check_stop, make_block_hasher,
                                make_scheduler)
from servesim.scheduler.oracle_trace import oracle_token
from servesim.scheduler.lazy_ids import RunTokens
from servesim.scheduler.worker import BatchTracker, TokenSource
from sched_helpers import apply_due, decode_output, runs_of

BLOCK = 4


def _prompt_ids(rid: str, n: int) -> list[int]:
    return [oracle_token("prompt:" + rid, j) for j in range(n)]


def _request(rid: str, n: int, lazy: bool, max_tokens: int = 10_000, **sp) -> Request:
    """A request keyed from its ids' provenance (its outputs: TokenSource's stream for it)."""
    prompt = LazyTokenIds(n, lambda: _prompt_ids(rid, n)) if lazy else _prompt_ids(rid, n)
    prov = TokenProvenance((TokenSegment(b"prompt:" + rid.encode(), 0, n),), TokenSource().output_source(rid))
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sp),
                   block_hasher=make_block_hasher(BLOCK), token_provenance=prov)


def _state(r: Request) -> tuple:
    return (list(r.output_token_ids), list(r.all_token_ids), r.num_tokens, r.num_output_tokens,
            list(r.block_hashes))


@pytest.mark.parametrize("seed", range(30))
def test_unbuilt_ids_read_back_as_appended(seed):
    """Random runs (unbuilt) and single appends (built), read at random points: the ids, counts
    and block keys equal a twin's that took every id built."""
    rng = random.Random(seed)
    source = TokenSource()
    n = rng.randint(1, 40)
    built, unbuilt = _request("a", n, lazy=rng.random() < 0.5), _request("a", n, lazy=rng.random() < 0.8)
    pos = 0  # position in the source's stream (a discarded async token skips one)
    for _ in range(rng.randint(1, 25)):
        op = rng.random()
        if op < 0.45:
            m = rng.randint(0, 30)
            built.append_output_token_ids(source.tokens("a", pos, m))
            unbuilt.append_output_tokens_from(source, pos, m)
            pos += m
        elif op < 0.8:
            tok = oracle_token("a", pos)
            built.append_output_token_ids(tok)
            unbuilt.append_output_token_ids(tok)
            pos += 1
        elif op < 0.9:
            pos += 1  # a token sampled and dropped (vLLM's discarded async token)
        elif op < 0.95:
            assert unbuilt.num_tokens == built.num_tokens and unbuilt.num_output_tokens == built.num_output_tokens
            if built.num_output_tokens:
                assert unbuilt.last_output_token_id() == built.output_token_ids[-1]
            assert unbuilt.block_hashes == built.block_hashes
        else:
            assert _state(unbuilt) == _state(built)  # reads build everything (the lazy prompt too)
    assert _state(unbuilt) == _state(built)


def test_the_last_id_is_built_alone_and_stop_rules_read_it():
    source = TokenSource()
    r = _request("s", 9, lazy=True, stop_token_ids=(oracle_token("s", 6),))
    r.append_output_tokens_from(source, 0, 5)
    assert r.last_output_token_id() == oracle_token("s", 4)
    assert not check_stop(r, 10_000)
    r.append_output_tokens_from(source, 5, 2)  # the run's last id is the stop token
    assert check_stop(r, 10_000) and r.stop_reason == oracle_token("s", 6)
    assert r.output_token_ids == source.tokens("s", 0, 7)


def test_a_new_source_builds_the_ids_of_the_old_one_first():
    a, b = TokenSource(), RunTokens.of_lists(["x"], [[5, 6, 7]])
    r = _request("x", 3, lazy=True)
    r.append_output_tokens_from(a, 0, 2)
    r.append_output_tokens_from(b.source, 0, 3)
    r.append_output_tokens_from(a, 10, 1)
    assert r.output_token_ids == a.tokens("x", 0, 2) + [5, 6, 7] + a.tokens("x", 10, 1)


def test_run_tokens_refuse_what_they_do_not_hold():
    tokens = RunTokens.of_lists(["x", "y"], [[1, 2], [3]])
    assert tokens.at_step(0) == [1, 3] and tokens.at_step(1, [0]) == [2] and tokens.ids(0, 2) == [1, 2]
    with pytest.raises(IndexError, match="step 1 of a run that samples 1"):
        tokens.token(1, 1)
    with pytest.raises(IndexError, match="2 ids of a run that samples 1"):
        tokens.ids(1, 2)

    class Short:
        def tokens(self, req_id, k, n):
            return [1] * (n - 1)

    r = _request("z", 3, lazy=True)
    r.append_output_tokens_from(Short(), 0, 3)
    with pytest.raises(ValueError, match="gave 2 ids for 3"):
        r.output_token_ids


# --- the vLLM scheduler's bulk runs, in lockstep with stepping ------------------------------------

class _CountingSource(TokenSource):
    """TokenSource counting the ids it builds."""

    def __init__(self) -> None:
        super().__init__()
        self.num_built = 0

    def tokens(self, req_id: str, k: int, n: int) -> list[int]:
        self.num_built += n
        return super().tokens(req_id, k, n)

    def tokens_at(self, req_ids: list[str], positions: list[int]) -> list[int]:
        self.num_built += len(req_ids)
        return super().tokens_at(req_ids, positions)


class _Driver:
    """The engine loop's order over a scheduler and a worker's BatchTracker (as SimExecutor)."""

    def __init__(self, async_: bool, seed: int):
        rng = random.Random(seed)
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=4096,
                             async_scheduling=async_)
        self.sched = make_scheduler(sc, CacheConfig(block_size=BLOCK, num_gpu_blocks=400))
        self.source = _CountingSource()
        self.worker = BatchTracker(self.source)
        self.depth = 2 if async_ else 1
        self.in_flight: list = []
        self.kept: dict[str, Request] = {}  # every request, finished ones too
        for i in range(rng.randint(2, 9)):
            r = _request(f"r{i}", rng.randint(1, 50), lazy=rng.random() < 0.8, max_tokens=rng.randint(20, 150))
            self.kept[r.request_id] = r
            self.sched.add_request(r)

    def step(self) -> None:
        so = self.sched.schedule()
        req_ids, _new, _ctx, sample = self.worker.prepare(so)
        self.in_flight.append((so, self.worker.sample(so, req_ids, sample)))
        apply_due(self.sched, self.in_flight, self.depth, so.total_num_scheduled_tokens == 0)

    def bulk(self, k: int) -> None:
        """A run of k plain decode steps through the bulk path, as simulator/fastpath/planner.py applies it."""
        sched = self.sched
        runs = runs_of(sched)
        reqs = runs.decode_run_requests() + runs.decode_run_joining().requests  # (joins: async only)
        ids = [r.request_id for r in reqs]
        if not self.in_flight:
            self.worker.forget(sched.finished_req_ids)
            runs.schedule_decode_steps(reqs, k, self.worker.sample_decode_run(ids, k), 0.0)
        else:
            self.worker.forget(sched.finished_req_ids)
            for r in runs.schedule_decode_steps(reqs, 1, None, 0.0).joined:  # the worker learns a new one
                self.worker.admit(r.request_id, r.num_prompt_tokens)
            tokens = self.worker.sample_decode_run(ids, k)
            old, mro = self.in_flight.pop(0)
            sched.update_from_output(old, mro)
            self.worker.forget(runs.schedule_decode_steps(reqs, k - 1, tokens, 0.0).finished)
            self.in_flight.append((runs.decode_step_output(reqs), decode_output(ids, tokens.at_step(k - 1))))
        sched.check_invariants()


def _counts(d: _Driver) -> dict:
    return {rid: (r.status, r.num_computed_tokens, r.num_output_placeholders, r.num_tokens, list(r.block_hashes))
            for rid, r in d.kept.items()}


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("read_each_round", [False, True])
def test_bulk_runs_with_unbuilt_ids_equal_stepping(async_, seed, read_each_round):
    """Counts and keys equal stepping's before every decision; the ids, read every round or only
    at the end (unbuilt ids of many runs and stepped ones interleaved), too."""
    plain, bulk = _Driver(async_, seed), _Driver(async_, seed)
    runs = 0
    for _ in range(200):
        assert _counts(plain) == _counts(bulk)
        if read_each_round:
            assert {rid: r.output_token_ids for rid, r in plain.kept.items()} == \
                   {rid: r.output_token_ids for rid, r in bulk.kept.items()}
        k = runs_of(bulk.sched).decode_run_horizon(32, len(bulk.in_flight))
        assert runs_of(plain.sched).decode_run_horizon(32, len(plain.in_flight)) == k
        if k >= 2:
            for _ in range(k):
                plain.step()
            bulk.bulk(k)
            runs += 1
        else:
            plain.step()
            bulk.step()
        if not plain.sched.has_unfinished_requests() and not plain.in_flight:
            break
    assert runs > 0
    if not read_each_round:  # the runs' ids are still unbuilt: only the stepped ones and each run's last
        assert bulk.source.num_built < plain.source.num_built
    assert {rid: _state(r) for rid, r in plain.kept.items()} == {rid: _state(r) for rid, r in bulk.kept.items()}
