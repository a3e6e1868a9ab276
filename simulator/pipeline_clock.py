"""When each pipeline stage is free: the engine's timing of batches under pipeline parallelism.

With `hardware.pp` stages the engine keeps up to pp batches in flight (scheduler/config.py,
max_concurrent_batches). The engine core prepares batches one after another on its one CPU
thread (vLLM's step_with_batch_queue schedules and submits a batch, then the next while the queue
has room): a batch is ready when its CPU work, started once the previous batch's was done, ends.
It enters stage s once stage s finished the batch before it and the batch itself left stage s - 1;
it completes when it leaves the last stage, and its output is applied then. Stage times come from
the cost model (cost_model/pipeline.py).
"""

from __future__ import annotations

from servesim.simulator.executor import Executor, SimExecutor
from servesim.traces.errors import InputError


def pipeline_clock_for(pp: int, executor: Executor) -> PipelineClock | None:
    """The clock of an engine with pp stages (None for one stage); the executor must price stages."""
    if pp == 1:
        return None
    if not (isinstance(executor, SimExecutor) and executor.pipeline is not None):
        raise InputError("pipeline parallelism is simulated only, with stage times from the cost model "
                         "(the GPU runner runs one GPU)", field="hardware.pp", allowed="1 with this executor")
    return PipelineClock(pp)


class PipelineClock:
    """The stages' next free times, seconds on the simulation clock."""

    __slots__ = ("free_at_s", "cpu_free_at_s")

    def __init__(self, num_stages: int) -> None:
        self.free_at_s = [0.0] * num_stages
        self.cpu_free_at_s = 0.0  # the engine core's CPU: when it finishes preparing the last batch

    def submit(self, scheduled_s: float, cpu_s: float, stage_times_s: list[float]) -> float:
        """A batch scheduled at scheduled_s whose CPU preparation takes cpu_s: the time it leaves
        the last stage."""
        t = self.cpu_free_at_s = max(scheduled_s, self.cpu_free_at_s) + cpu_s
        free = self.free_at_s
        for s, busy_s in enumerate(stage_times_s):
            if free[s] > t:
                t = free[s]
            t += busy_s
            free[s] = t
        return t
