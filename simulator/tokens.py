"""The shared token source lives with the scheduler's worker view (scheduler/worker.py) so the
simulated and GPU executors use the very same rule; re-exported here for simulator users."""

from servesim.scheduler.worker import TokenSource

__all__ = ["TokenSource"]
