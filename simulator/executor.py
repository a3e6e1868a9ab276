"""Executors turn a SchedulerOutput into sampled tokens and a step time.

`execute(scheduler_output) -> (model_runner_output, step_time_s)` is the interface shared with the GPU
runner (gpu_runner/runner.py). The simulated executor asks a cost model for the GPU time of the
step's exact batch; both use scheduler.worker.BatchTracker for what is sampled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.lazy_ids import RunTokens
from servesim.scheduler.worker import BatchTracker, TokenSource
from servesim.simulator.cost_model.base import (CostModel, StepShape, bulk_decode_pricer, bulk_verify_pricer,
                                                decode_step_times_s)
from servesim.simulator.cost_model.pipeline import PipelineCost
from servesim.simulator.sampling import SamplerCost


class Executor(Protocol):
    def execute(self, scheduler_output: SchedulerOutput) -> tuple[ModelRunnerOutput, float]:
        """Run one step: its sampled tokens, and its time in seconds."""
        ...

    def output_token_source(self, request_id: str) -> bytes | None:
        """The stream whose position k holds request_id's k-th output id whatever happens
        (block_keys.TokenProvenance.output_source), or None when the ids are not known in advance
        (e.g. a real model's greedy choice): their KV blocks are then keyed by hashing them."""
        ...


class SimExecutor:
    """Simulated GPU: sampled tokens from the shared token source, time from a cost model."""

    def __init__(self, cost_model: CostModel, tokens: TokenSource, num_spec_tokens: int = 0,
                 sampler: SamplerCost | None = None, pipeline: PipelineCost | None = None) -> None:
        self.cost_model = cost_model
        # Pipeline parallelism: each executed step's time per stage (last_stage_times_s) too.
        self.pipeline = pipeline
        self.last_stage_times_s: list[float] = []
        # What the requests' sampler path adds beyond the cost model's neutral sampler
        # (simulator/sampling.py); None leaves every step time the cost model's float.
        self.sampler = sampler if sampler is not None and sampler.s_per_row else None
        self.batch = BatchTracker(tokens, num_spec_tokens)
        self.last_shape: StepShape | None = None
        self._pricer_of: CostModel | None = None  # the cost model _pricer was resolved for
        self._pricer: Callable[[list[int], int], list[float] | None] | None = None
        self._verify_of: CostModel | None = None  # the cost model _verify was resolved for
        self._verify: Callable[[int, int, list[int]], list[float] | None] | None = None
        self._mm_items: dict[str, tuple[MultiModalFeatureSpec, ...]] = {}  # req_id -> its items, while unfinished

    def execute(self, scheduler_output: SchedulerOutput) -> tuple[ModelRunnerOutput, float]:
        req_ids, new, ctx, sample = self.batch.prepare(scheduler_output)
        # (sum of a generator: mypyc compiles it to a loop, not a call to the builtin)
        shape = StepShape(tuple(new), tuple(ctx), sum(1 for s in sample if s), self._encoder_tokens(scheduler_output))
        self.last_shape = shape
        extra_s = self.sampler.seconds(shape.num_sampled) if self.sampler is not None and shape.num_sampled else 0.0
        if self.pipeline is None:
            step_s = (self.cost_model.step_time_s(shape) if req_ids else 0.0) + extra_s
        else:  # the step's GPU time is its stages' (hand-offs included), priced once
            self.last_stage_times_s = self.pipeline.stage_times_s(shape, extra_s) if req_ids else \
                [0.0] * self.pipeline.pp
            step_s = sum(self.last_stage_times_s)
        return self.batch.sample(scheduler_output, req_ids, sample), step_s

    def _encoder_tokens(self, so: SchedulerOutput) -> tuple[int, ...]:
        """Placeholder tokens of each item the encoder runs this step (vLLM's num_encoder_tokens, in
        scheduled_encoder_inputs order). A request's items arrive with its first scheduling (as vLLM's
        NewRequestData carries mm_features) and are dropped when the output reports it finished."""
        items = self._mm_items
        for data in so.scheduled_new_reqs:
            if data.mm_features:
                items[data.req_id] = data.mm_features
        lengths = tuple([items[rid][i].length for rid, ids in so.scheduled_encoder_inputs.items() for i in ids]) \
            if so.scheduled_encoder_inputs else ()
        if items:
            for rid in so.finished_req_ids:
                items.pop(rid, None)
        return lengths

    def output_token_source(self, request_id: str) -> bytes | None:
        return self.batch.tokens.output_source(request_id)  # every output id comes from the source

    # --- macro-steps (simulator/fastpath/planner.py) ---------------------------------------------------
    def decode_step_times_s(self, num_context_tokens: list[int], num_steps: int) -> list[float]:
        """GPU time of each of num_steps plain decode steps of one batch whose contexts start at
        num_context_tokens and grow by one token a step: the very floats execute() would return."""
        model = self.cost_model
        if self._pricer_of is not model:  # resolved once per cost model (it is a public attribute)
            self._pricer_of, self._pricer = model, bulk_decode_pricer(model)
        times = decode_step_times_s(model, num_context_tokens, num_steps, self._pricer)
        if self.sampler is not None:  # every request samples one row a step: execute()'s sum
            extra = self.sampler.seconds(len(num_context_tokens))
            times = [t + extra for t in times]
        return times

    def mixed_step_time_s(self, num_new_tokens: list[int], num_context_tokens: list[int]) -> float:
        """GPU time of one step scheduling num_new_tokens[i] tokens on num_context_tokens[i]
        computed ones for each request, in that order, every one sampling and no encoder input (a
        run's first schedule where a prompt joins it): the very float execute() would return."""
        n = len(num_new_tokens)
        extra_s = self.sampler.seconds(n) if self.sampler is not None and n else 0.0
        shape = StepShape(tuple(num_new_tokens), tuple(num_context_tokens), n, ())
        return (self.cost_model.step_time_s(shape) if n else 0.0) + extra_s

    def verify_step_times_s(self, num_new_tokens: int, num_requests: int,
                            context_sums: list[int]) -> list[float] | None:
        """GPU time of verify steps of num_requests requests computing num_new_tokens tokens each,
        every one sampling, on contexts summing to context_sums[j]: the very floats execute()
        would return; None where the cost model has no bulk pricer for them (VerifyRunCostModel)."""
        model = self.cost_model
        if self._verify_of is not model:  # resolved once per cost model, as decode_step_times_s
            self._verify_of, self._verify = model, bulk_verify_pricer(model)
        if self._verify is None or self.pipeline is not None:
            return None
        times = self._verify(num_new_tokens, num_requests, context_sums)
        if times is None or self.sampler is None or not num_requests:
            return times
        extra = self.sampler.seconds(num_requests)  # execute()'s sum: every request samples
        return [t + extra for t in times]

    def sample_decode_run(self, req_ids: list[str], num_context_tokens: list[int], num_steps: int,
                          finished_req_ids: set[str], steps_each: list[int] | None = None) -> RunTokens:
        """Execute num_steps plain decode steps, the first handing over finished_req_ids: each
        request's sampled tokens, in step order (request i in the first steps_each[i] only), as
        positions of the token source's streams (built only where read: lazy_ids.py)."""
        self.batch.forget(finished_req_ids)
        last = ([c + num_steps - 1 for c in num_context_tokens] if steps_each is None else
                [c + num_steps - 1 for c, m in zip(num_context_tokens, steps_each) if m >= num_steps])
        n = len(last)
        self.last_shape = StepShape((1,) * n, tuple(last), n)
        return self.batch.sample_decode_run(req_ids, num_steps, steps_each)

    def admit_joined(self, req_id: str, num_prompt_tokens: int) -> None:
        """A request a run's first schedule admitted (DecodeRunEffects.joined): the worker learns
        it as execute() learns a step's new request."""
        self.batch.admit(req_id, num_prompt_tokens)

    def forget(self, finished_req_ids: set[str]) -> None:
        """A step's output handed these finished ids over (a macro-step's later step)."""
        self.batch.forget(finished_req_ids)

    def decode_step_output(self, req_ids: list[str], token_ids: list[int]) -> ModelRunnerOutput:
        """The ModelRunnerOutput of one plain decode step whose tokens were sampled in bulk."""
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, [[t] for t in token_ids], None)
