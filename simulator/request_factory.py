"""The scheduler's Request built from a workload's RequestSpec when it reaches the engine.

A trace's real ids are used as they are; a synthetic prompt's ids are built only if something
reads them (the simulated engine reads their count and, with provenance keys, nothing else). With
`prefix_cache_keys: provenance` a request carries where its ids come from (TokenProvenance), so
its KV blocks are keyed without hashing them (scheduler/block_keys.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from servesim.scheduler import LazyTokenIds, Request, SamplingParams, SchedulerConfig, TokenProvenance, TokenSegment
from servesim.scheduler.block_keys import stream_source
from servesim.scheduler.encoder_cache import compute_mm_encoder_budget
from servesim.simulator.executor import Executor
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


class RequestFactory:
    def __init__(self, executor: Executor, keys_from_provenance: bool) -> None:
        self.executor = executor  # knows each request's output id stream (or that it is not known)
        self.keys_from_provenance = keys_from_provenance
        # request id -> a Request whose prompt keys the next one made with that id takes
        # (Request.take_prompt_keys: a P/D hand-off, simulator/cluster/pd_keys.py key_donor)
        self.key_donors: dict[str, Request] = {}

    def make(self, spec: RequestSpec, now: float, structured_output: bool = False, resumable: bool = False) -> Request:
        donor = self.key_donors.pop(spec.request_id, None) if self.key_donors else None
        req = Request(spec.request_id, prompt_ids(spec), SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
                      arrival_time=now, priority=spec.priority, lora_id=spec.lora_id,
                      job_id=spec.session_id, is_last_step=spec.is_last_turn,
                      # add_request keys its blocks (a donor's keys are this provenance's)
                      token_provenance=self.provenance(spec) if donor is None else None,
                      structured_output=structured_output, resumable=resumable,
                      mm_features=spec.mm_items)
        if donor is not None:
            req.take_prompt_keys(donor)
        return req

    def provenance(self, spec: RequestSpec, outputs: bool = True) -> TokenProvenance | None:
        """Where spec's ids come from, for keying its KV blocks without hashing them (None: hash
        them; real ids, or prefix_cache_keys: token_ids). `outputs` False: the prompt's alone,
        all that a lookup of the prompt's blocks reads (scheduler/prefix_lookup.py keys its probe
        by the provenance's head)."""
        if not self.keys_from_provenance:
            return None
        segments = _LAST.segments_of(spec)
        if segments is None:
            return None
        return TokenProvenance(segments, self.executor.output_token_source(spec.request_id) if outputs else None)


class _LastSegments:
    """The prompt segments of the last spec asked about. A prefix-aware router asks every replica
    about one spec in turn (Engine.token_provenance), and the segments are a function of the spec
    alone (RequestSpec.token_segments; specs are not changed in place). Holds the spec, so its
    identity cannot be reused by another object while it is the key."""

    __slots__ = ("spec", "segments")

    def __init__(self) -> None:
        self.spec: RequestSpec | None = None
        self.segments: tuple[TokenSegment, ...] | None = None

    def segments_of(self, spec: RequestSpec) -> tuple[TokenSegment, ...] | None:
        if spec is not self.spec:
            plain = spec.plain_stream_key()  # (most prompts: token_segments' one run, made here compiled)
            if plain is not None:
                self.segments = (TokenSegment(stream_source(plain), 0, spec.prompt_len),)
            else:
                runs = spec.token_segments()
                self.segments = None if runs is None else tuple([TokenSegment(r[0], r[1], r[2]) for r in runs])
            self.spec = spec
        return self.segments


_LAST = _LastSegments()


def check_multimodal(workload: Workload, engine: str, sched: SchedulerConfig, encoder_decoder: bool = False) -> None:
    """Refuse, naming the request, a multimodal item the engine could never run: SGLang's port has no
    encoder path; vLLM needs a multimodal model (scheduler.mm_max_tokens_per_item > 0: a text-only model
    gets no encoder budget, and vLLM's input processor refuses images for it) and every item within
    the encoder budget and cache (vLLM sizes both to at least the model's largest item). An
    encoder-decoder model (Whisper) takes exactly one encoder input per request; no other model takes one."""
    if not encoder_decoder and not workload.columns.any_set("mm_items"):
        return  # nothing to check (and 1 M specs not built to find that out)
    budget, cache = compute_mm_encoder_budget(sched)
    limit = min(budget, cache)
    size_of: dict[str, int] = {}  # one content, one size: the encoder cache's accounting relies on it
    for spec in workload.requests:
        _check_encoder_input(spec, encoder_decoder)
        for i, item in enumerate(spec.mm_items):
            if size_of.setdefault(item.mm_hash, item.num_embeds) != item.num_embeds:
                raise InputError(f"request {spec.request_id!r}: multimodal item {i} ({item.mm_hash!r}) has "
                                 f"{item.num_embeds} tokens, another request's item of that hash {size_of[item.mm_hash]}",
                                 field="mm_items", allowed="equal mm_hash, equal length (the same content)")
            if engine != "vllm":
                raise InputError(f"request {spec.request_id!r} has multimodal items; the {engine} engine has no "
                                 "encoder path", field="engine", allowed="vllm for multimodal requests")
            if item.num_embeds > limit:
                why = ("the model takes no multimodal input (scheduler.mm_max_tokens_per_item is 0)" if limit == 0
                       else f"the encoder budget ({budget}) and cache ({cache}) hold at most {limit}")
                raise InputError(f"request {spec.request_id!r}: multimodal item {i} has {item.num_embeds} tokens; {why}",
                                 field="scheduler.mm_max_tokens_per_item",
                                 allowed=f">= {item.num_embeds} (the model's largest item, e.g. 16384 for Qwen2.5-VL)")


def _check_encoder_input(spec: RequestSpec, encoder_decoder: bool) -> None:
    outside = sum(1 for item in spec.mm_items if not item.in_prompt)
    if encoder_decoder and (outside != 1 or len(spec.mm_items) != 1):
        raise InputError(f"request {spec.request_id!r}: an encoder-decoder model (Whisper) needs exactly one "
                         f"encoder input per request, got {len(spec.mm_items)} item(s), {outside} of them encoder "
                         "inputs", field="mm_items",
                         allowed='one item {"offset": 0, "length": N, "in_prompt": false} (the asr generator makes them)')
    if not encoder_decoder and outside:
        raise InputError(f"request {spec.request_id!r} has an encoder input (in_prompt false), which only an "
                         "encoder-decoder model takes", field="mm_items", allowed="hardware.model: whisper-large-v3")


def prompt_ids(spec: RequestSpec) -> Sequence[int] | LazyTokenIds:
    """A trace's real ids as they are; a synthetic prompt's ids, unbuilt until read."""
    if spec.prompt_token_ids is not None:
        return spec.token_id_array()
    return LazyTokenIds(spec.prompt_len, spec.token_id_array)
