"""BatchTracker.prepare (scheduler/worker.py): each scheduled request's context and whether it samples,
whatever order the SchedulerOutput lists its cached requests in."""

from __future__ import annotations

import itertools

import pytest

from servesim.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from servesim.scheduler.request import SamplingParams
from servesim.scheduler.worker import BatchTracker, TokenSource


def _output(new: dict[str, tuple[int, int]], cached: list[tuple[str, int]], order: list[str],
            tokens: dict[str, int]) -> SchedulerOutput:
    """new: rid -> (prompt length, computed); cached: (rid, computed) in the listed order; order:
    num_scheduled_tokens' order; tokens: rid -> tokens this step."""
    data = CachedRequestData()
    for rid, computed in cached:
        data.req_ids.append(rid)
        data.num_computed_tokens.append(computed)
        data.new_block_ids.append(None)
        data.num_output_tokens.append(0)
    new_reqs = [NewRequestData(rid, list(range(n)), SamplingParams(max_tokens=8), ([],), computed)
                for rid, (n, computed) in new.items()]
    scheduled = {rid: tokens[rid] for rid in order}
    return SchedulerOutput(new_reqs, data, scheduled, sum(scheduled.values()), {}, [0], set(), set())


def _tracker_with(prompts: dict[str, int]) -> BatchTracker:
    """A tracker that already knows these requests (their prompts scheduled whole once)."""
    tracker = BatchTracker(TokenSource())
    first = _output({rid: (n, 0) for rid, n in prompts.items()}, [], list(prompts), prompts)
    tracker.prepare(first)
    return tracker


@pytest.mark.parametrize("cached_order", list(itertools.permutations(["a", "b", "c"])))
def test_contexts_follow_each_request_whatever_the_cached_order(cached_order):
    prompts = {"a": 10, "b": 20, "c": 30}
    computed = {"a": 10, "b": 12, "c": 30}  # b is mid-prefill; a and c decode
    tokens = {"a": 1, "b": 8, "c": 1, "n": 5}
    order = ["a", "b", "c", "n"]  # num_scheduled_tokens: the scheduler's order, a new one last
    tracker = _tracker_with(prompts)
    so = _output({"n": (5, 0)}, [(rid, computed[rid]) for rid in cached_order], order, tokens)
    req_ids, new, ctx, sample = tracker.prepare(so)
    assert req_ids == order
    assert new == [1, 8, 1, 5]
    assert ctx == [10, 12, 30, 0]
    assert sample == [True, True, True, True]  # b's 12 + 8 reaches its 20 prompt tokens


def test_new_requests_between_cached_ones_read_their_own_context():
    tracker = _tracker_with({"a": 16, "r": 16})
    # r comes back (resumed: listed cached, after a) with a new request admitted before it
    so = _output({"n": (40, 16)}, [("a", 16), ("r", 4)], ["a", "n", "r"], {"a": 1, "n": 24, "r": 6})
    req_ids, new, ctx, sample = tracker.prepare(so)
    assert (req_ids, new, ctx) == (["a", "n", "r"], [1, 24, 6], [16, 16, 4])
    assert sample == [True, True, False]  # r: 4 + 6 < its 16 tokens: a chunk, no sample


def test_a_request_listed_nowhere_is_an_error():
    tracker = _tracker_with({"a": 16})
    so = _output({}, [("a", 16)], ["a", "ghost"], {"a": 1, "ghost": 1})
    with pytest.raises(KeyError):
        tracker.prepare(so)
