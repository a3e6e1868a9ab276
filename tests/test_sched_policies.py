"""Scheduling policies are plug-ins: a toy policy in one class, registered by name, schedules a
hand-built case; schedule() and the other scheduler phases never name a policy."""

from __future__ import annotations

import bisect
import re
from pathlib import Path

import pytest

from sched_helpers import make_sched, req, step
from servesim.scheduler import SchedulerConfig
from servesim.scheduler.policies import SCHEDULING_POLICIES
from servesim.scheduler.policies.fcfs import FCFSPolicy
from servesim.scheduler.queues import RequestQueue


# --- the worked example of docs/ARCHITECTURE.md ("add a queue policy") -------------------------
def _prompt_key(r):
    return r.num_prompt_tokens, r.arrival_time, r.request_id


class ShortestPromptQueue(RequestQueue):
    """Waiting requests sorted by prompt length (then arrival, then id)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items = []

    def add_request(self, request) -> None:
        bisect.insort(self._items, request, key=_prompt_key)

    def pop_request(self):
        return self._items.pop(0)

    def peek_request(self):
        return self._items[0]

    def prepend_request(self, request) -> None:
        self.add_request(request)  # a sorted queue has no front to jump to

    def prepend_requests(self, requests) -> None:
        for r in requests:
            self.add_request(r)

    def remove_request(self, request) -> None:
        self._items.remove(request)

    def remove_requests(self, requests) -> None:
        drop = set(requests)
        self._items = [r for r in self._items if r not in drop]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(list(self._items))


@SCHEDULING_POLICIES.register("shortest_prompt_first")
class ShortestPromptFirst(FCFSPolicy):
    """FCFS in every respect but the waiting order."""

    queue_type = ShortestPromptQueue


# ------------------------------------------------------------------------------------------------
def _admission_order(**policy) -> tuple[list[str], object]:
    """long (40 tokens), short (8), mid (20) arrive together; one runs at a time: admission order."""
    s = make_sched(max_num_seqs=1, num_blocks=100, block_size=4, **policy)
    for rid, n in (("long", 40), ("short", 8), ("mid", 20)):
        s.add_request(req(s, rid, n, max_tokens=1), now_s=0.0)
    admitted = []
    for _ in range(3):
        out, _eco = step(s)
        admitted += [d.req_id for d in out.scheduled_new_reqs]
    return admitted, s


def test_toy_policy_registers_and_orders_admissions():
    admitted, s = _admission_order(policy="shortest_prompt_first")
    assert admitted == ["short", "mid", "long"]
    assert not s.has_unfinished_requests()


def test_fcfs_orders_the_same_case_by_arrival():
    admitted, _ = _admission_order()
    assert admitted == ["long", "short", "mid"]


def test_unknown_policy_suggests_the_closest():
    with pytest.raises(ValueError, match="unknown policy 'contiuum'; did you mean 'continuum'"):
        SchedulerConfig(policy="contiuum")


def test_builtin_policies_are_registered():
    assert {"fcfs", "priority", "continuum"} <= set(SCHEDULING_POLICIES.names())


def test_next_event_s_delegates_to_the_policy():
    s = make_sched(policy="continuum", block_size=4, num_blocks=50)
    assert s.next_event_s() is None
    r = req(s, "t1", 20, max_tokens=1, job_id="job", is_last_step=False)
    s.add_request(r, now_s=0.0)
    step(s)
    assert s.policy.pins and s.next_event_s() == s.policy.pins[0].unpin_at_s


# The scheduler phases branch on no policy: only scheduler/policies/ names one.
_PHASES = ["scheduler/_schedule.py", "scheduler/scheduler.py", "scheduler/invariants.py",
           "scheduler/decision_trace.py", "scheduler/oracle_trace.py", "scheduler/queues.py"]
_NAMES = re.compile(r"""["'](fcfs|priority|continuum)["']\s*(?!,\s*0\))|continuum""", re.IGNORECASE)


@pytest.mark.parametrize("path", _PHASES)
def test_scheduler_phases_name_no_policy(path):
    text = (Path(__file__).resolve().parents[1] / path).read_text()
    # `w.get("priority", 0)` reads a request's priority field from a workload, not a policy name.
    assert not _NAMES.findall(text), f"{path} names a policy"
