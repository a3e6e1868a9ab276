"""Executors turn a SchedulerOutput into sampled tokens and a step time.

`execute(scheduler_output) -> (model_runner_output, step_time_s)` is the interface shared with the GPU
runner. The simulated executor asks a cost model for the GPU time of the step's exact batch.
"""

from __future__ import annotations

from typing import Protocol

from scheduler.output import ModelRunnerOutput, SchedulerOutput
from simulator.cost_model.base import CostModel, StepShape
from simulator.tokens import TokenSource


class Executor(Protocol):
    def execute(self, scheduler_output: SchedulerOutput) -> tuple[ModelRunnerOutput, float]: ...


class BatchTracker:
    """Worker-side view of each request (prompt length, tokens computed, outputs so far).

    It is rebuilt from SchedulerOutputs only, like vLLM's persistent batch, so both executors derive
    the step's composition and the sampled tokens the same way.
    """

    def __init__(self, tokens: TokenSource, num_spec_tokens: int = 0) -> None:
        self.tokens = tokens
        self.num_spec_tokens = num_spec_tokens
        self.num_tokens: dict[str, int] = {}  # req_id -> known tokens (prompt + outputs), worker view
        self.num_out: dict[str, int] = {}  # req_id -> output tokens sampled so far

    def prepare(self, so: SchedulerOutput) -> tuple[StepShape, list[str], list[bool]]:
        """The step's shape, request order, and which requests sample (not partial prefill chunks)."""
        for rid in so.finished_req_ids:
            self.num_tokens.pop(rid, None)
            self.num_out.pop(rid, None)
        computed = {}
        for nr in so.scheduled_new_reqs:
            computed[nr.req_id] = nr.num_computed_tokens
            self.num_tokens[nr.req_id] = len(nr.prompt_token_ids)
            self.num_out.setdefault(nr.req_id, 0)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
        req_ids = list(so.num_scheduled_tokens)
        new, ctx, sample = [], [], []
        for rid in req_ids:
            n = so.num_scheduled_tokens[rid]
            c = computed[rid]
            new.append(n)
            ctx.append(c)
            # A request samples when the step reaches the end of the tokens the worker knows: the
            # scheduler's is_prefill_chunk rule. Steps execute in order, so with async scheduling the
            # worker already holds the tokens that were placeholders when this step was scheduled.
            sample.append(c + n >= self.num_tokens[rid])
        return StepShape(tuple(new), tuple(ctx), sum(sample)), req_ids, sample

    def sample(self, so: SchedulerOutput, req_ids: list[str], sample: list[bool]) -> ModelRunnerOutput:
        sampled: list[list[int]] = []
        drafts_next: dict[str, list[int]] | None = {} if self.num_spec_tokens else None
        spec = so.scheduled_spec_decode_tokens
        for rid, do in zip(req_ids, sample):
            if not do:
                sampled.append([])
                continue
            k = self.num_out[rid]
            n_drafts = len(spec.get(rid, ()))
            n_acc = self.tokens.num_accepted(rid, k, n_drafts) if n_drafts else 0
            toks = [self.tokens.token(rid, k + j) for j in range(n_acc + 1)]
            sampled.append(toks)
            self.num_out[rid] = k + len(toks)
            self.num_tokens[rid] += len(toks)
            if drafts_next is not None:
                drafts_next[rid] = self.tokens.drafts(rid, k + len(toks), self.num_spec_tokens)
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled, drafts_next)


class SimExecutor:
    """Simulated GPU: sampled tokens from the shared token source, time from a cost model."""

    def __init__(self, cost_model: CostModel, tokens: TokenSource, num_spec_tokens: int = 0) -> None:
        self.cost_model = cost_model
        self.batch = BatchTracker(tokens, num_spec_tokens)
        self.last_shape: StepShape | None = None

    def execute(self, scheduler_output: SchedulerOutput) -> tuple[ModelRunnerOutput, float]:
        shape, req_ids, sample = self.batch.prepare(scheduler_output)
        self.last_shape = shape
        step_s = self.cost_model.step_time_s(shape) if req_ids else 0.0
        return self.batch.sample(scheduler_output, req_ids, sample), step_s
