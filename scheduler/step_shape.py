"""The shape of one engine step: what the GPU computes, one entry per scheduled request.

Shared by every layer that prices or runs a step (the simulator's cost models and executor, the
GPU runner's calibration), so it lives in the lowest layer: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.scheduler.errors import InputError


@dataclass(slots=True, frozen=True)
class StepShape:
    """What the GPU computes in one engine step (one entry per scheduled request)."""

    num_new_tokens: tuple[int, ...]  # tokens computed this step: prefill chunk, 1 for decode, 1+k spec
    num_context_tokens: tuple[int, ...]  # tokens already in the KV cache before this step
    num_sampled: int  # requests that sample a token this step (rows through lm_head + sampler)
    # Encoder tokens of each multimodal item encoded this step (the step output's
    # scheduled_encoder_inputs, in request order); empty for text-only steps.
    num_encoder_tokens: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_requests(self) -> int:
        return len(self.num_new_tokens)

    def validate(self) -> None:
        """Check the invariants (not called on the hot path: the engine builds valid shapes)."""
        if len(self.num_new_tokens) != len(self.num_context_tokens):
            raise InputError("StepShape: num_new_tokens and num_context_tokens differ in length",
                             field="num_context_tokens")
        if any(n <= 0 for n in self.num_new_tokens):
            raise InputError("StepShape: every scheduled request computes at least one token",
                             field="num_new_tokens")
        if any(c < 0 for c in self.num_context_tokens):
            raise InputError("StepShape: context tokens cannot be negative", field="num_context_tokens")
        if any(n <= 0 for n in self.num_encoder_tokens):
            raise InputError("StepShape: every encoded multimodal item has at least one token",
                             field="num_encoder_tokens")
        if not 0 <= self.num_sampled <= len(self.num_new_tokens):
            raise InputError("StepShape: num_sampled must be between 0 and the number of requests",
                             field="num_sampled")


def decode_shape(batch_size: int, context_tokens: int) -> StepShape:
    """A pure-decode step: ``batch_size`` requests, each with ``context_tokens`` already cached."""
    return StepShape((1,) * batch_size, (context_tokens,) * batch_size, batch_size)


def prefill_shape(chunk_tokens: int, cached_tokens: int = 0, *, sampled: bool = True) -> StepShape:
    """One prefill chunk of ``chunk_tokens`` on top of ``cached_tokens`` (prefix hits or earlier chunks)."""
    return StepShape((chunk_tokens,), (cached_tokens,), 1 if sampled else 0)
