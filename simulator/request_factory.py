"""The scheduler's Request built from a workload's RequestSpec when it reaches the engine.

A trace's real ids are used as they are; a synthetic prompt's ids are built only if something
reads them (the simulated engine reads their count and, with provenance keys, nothing else). With
`prefix_cache_keys: provenance` a request carries where its ids come from (TokenProvenance), so
its KV blocks are keyed without hashing them (scheduler/block_keys.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from servesim.scheduler import LazyTokenIds, Request, SamplingParams, TokenProvenance, TokenSegment
from servesim.simulator.executor import Executor
from servesim.traces.workload import RequestSpec


class RequestFactory:
    def __init__(self, executor: Executor, keys_from_provenance: bool) -> None:
        self.executor = executor  # knows each request's output id stream (or that it is not known)
        self.keys_from_provenance = keys_from_provenance

    def make(self, spec: RequestSpec, now: float) -> Request:
        return Request(spec.request_id, prompt_ids(spec), SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
                       arrival_time=now, priority=spec.priority, lora_id=spec.lora_id,
                       job_id=spec.session_id, is_last_step=spec.is_last_turn,
                       token_provenance=self.provenance(spec),  # add_request keys its blocks
                       mm_features=spec.mm_items)

    def provenance(self, spec: RequestSpec) -> TokenProvenance | None:
        """Where spec's ids come from, for keying its KV blocks without hashing them (None: hash
        them; real ids, or prefix_cache_keys: token_ids)."""
        runs = spec.token_segments() if self.keys_from_provenance else None
        if runs is None:
            return None
        return TokenProvenance(tuple([TokenSegment(*run) for run in runs]),
                               self.executor.output_token_source(spec.request_id))


def prompt_ids(spec: RequestSpec) -> Sequence[int] | LazyTokenIds:
    """A trace's real ids as they are; a synthetic prompt's ids, unbuilt until read."""
    if spec.prompt_token_ids is not None:
        return spec.token_id_array()
    return LazyTokenIds(spec.prompt_len, spec.token_id_array)
