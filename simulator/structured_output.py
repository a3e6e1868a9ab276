"""Structured output in a simulated run: which requests need a grammar, and the grammar's compile
time as a timed blocker.

vLLM's EngineCore hands a structured-output request to StructuredOutputManager.grammar_init, which
compiles its grammar in a thread pool; the scheduler keeps the request in
WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR (skipped_waiting) until the compiled grammar is there
(scheduler/blocked_waits.py). Here the compile takes a per-request time on the simulated clock,
from the request's `grammar_compile_ms` trace field, or, for the share `rate` of the other requests
(a deterministic draw per request id and seed), the config's `grammar_compile_ms`. When it elapses
the engine calls Scheduler.mark_grammar_ready and wakes its loop.

The default compile time is a published measurement: XGrammar 0.1.10's median time to first mask
(TTFM p50 = 535,498 us, single-threaded, AMD EPYC 7V13, Llama 3 tokenizer) over JSONSchemaBench's
10,163 schemas (guidance-ai/jsonschemabench, maskbench/README.md). Not modelled: the thread pool's
width (compiles run side by side without limit) and the compiler's cache (a repeated schema
compiles again); the bitmask's per-step cost.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from servesim.traces.errors import InputError
from servesim.traces.spec_columns import SpecColumns
from servesim.traces.workload import RequestSpec

# JSONSchemaBench maskbench, XGrammar (default settings) TTFM p50, in ms (module docstring).
XGRAMMAR_TTFM_P50_MS = 535.498


@dataclass(slots=True)
class StructuredOutputConfig:
    """Requests that need a grammar beyond those the trace marks (`grammar_compile_ms`)."""

    rate: float = 0.0  # share of requests without the trace field that need a grammar (0: none)
    grammar_compile_ms: float = XGRAMMAR_TTFM_P50_MS  # their compile time

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, (int, float)) and 0.0 <= self.rate <= 1.0):
            raise InputError(f"got {self.rate!r}", field="structured_output.rate", allowed="a number in [0, 1]")
        ms = self.grammar_compile_ms
        if not (isinstance(ms, (int, float)) and ms >= 0 and math.isfinite(ms)):
            raise InputError(f"got {ms!r}", field="structured_output.grammar_compile_ms",
                             allowed="a finite number of milliseconds >= 0")


def _unit(key: str) -> float:
    """A number in [0, 1) from key (crc32 / 2**32): the same draw in every run and process."""
    return zlib.crc32(key.encode()) / 2.0**32


class GrammarTimes:
    """Each request's grammar compile time in seconds, or None when it needs no grammar."""

    __slots__ = ("_rate", "_default_s", "_seed")

    def __init__(self, cfg: StructuredOutputConfig, seed: int) -> None:
        self._rate, self._default_s, self._seed = cfg.rate, cfg.grammar_compile_ms / 1e3, seed

    @property
    def may_block(self) -> bool:
        """Whether requests without the trace field can need a grammar."""
        return self._rate > 0

    def compile_s(self, spec: RequestSpec, engine: str = "vllm", has_planner: bool = False) -> float | None:
        """Its compile time; refuses a grammar where the run cannot model it (SGLang's scheduler,
        or a fast path built before the request was seen: a cluster routes requests in)."""
        if spec.grammar_compile_ms is not None:
            compile_s: float | None = spec.grammar_compile_ms / 1e3
        elif self._rate > 0 and _unit(f"{self._seed}:{spec.request_id}:structured_output") < self._rate:
            compile_s = self._default_s
        else:
            return None
        if engine != "vllm" or has_planner:
            raise InputError(f"request {spec.request_id!r}: a grammar wait needs engine: vllm and, in a cluster, "
                             "macro_steps: false", field="grammar_compile_ms",
                             allowed="no grammar_compile_ms with engine: sglang or with a cluster's fast path")
        return compile_s

    @staticmethod
    def start_timer(env, compile_s: float, request_id: str, on_ready) -> None:
        """The compile runs (vLLM: in StructuredOutputManager's thread pool) while the request
        waits; on_ready(request_id) when it ends."""
        env.timeout(compile_s).callbacks.append(lambda _event: on_ready(request_id))


def workload_needs_grammar(cfg: StructuredOutputConfig, specs: Sequence[RequestSpec]) -> bool:
    """Whether any request of the run can wait for a grammar (the fast path declines then)."""
    return cfg.rate > 0 or SpecColumns.of(specs).any_set("grammar_compile_ms")
