"""Scheduling policies (waiting order, preemption victims, finish hooks), one file each.

See base.py for the contract; every module here registers itself in SCHEDULING_POLICIES.
"""

from servesim.scheduler.policies.base import SCHEDULING_POLICIES, PolicyFactory, SchedulingPolicy, make_policy

__all__ = ["SCHEDULING_POLICIES", "PolicyFactory", "SchedulingPolicy", "make_policy"]
