"""vLLM's CUDA-graph batch padding: a step runs the graph captured for the next capture size.

vLLM V1 (``-O2``, the default: ``cudagraph_mode = FULL_AND_PIECEWISE``) replays a FULL graph for
all-decode batches and PIECEWISE graphs for mixed batches; either way a step of ``n`` scheduled
tokens at most the largest capture size runs with ``n`` padded up to the next capture size
(``gpu_model_runner``: ``pad_for_cudagraph``), so the token-parallel kernels (GEMMs, norms,
activation, all-reduce) process the padded count. Attention and the lm_head/sampler see only the
real requests (logits are computed for the sampled rows after the graph).

Default sizes (vLLM ``VllmConfig._set_cudagraph_sizes``, documented under
``--max-cudagraph-capture-size``): ``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)`` with
``max = min(2 * max_num_seqs, 512, max_num_batched_tokens)``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from servesim.traces.errors import InputError


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """vLLM's default ``cudagraph_capture_sizes`` for these scheduler limits."""
    top = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += range(8, min(top + 1, 256), 8)
    if top >= 256:
        sizes += range(256, top + 1, 16)
    return tuple(sizes)


def check_capture_sizes(sizes: Sequence[int] | None) -> tuple[int, ...]:
    """Capture sizes as a sorted tuple of distinct positive ints (empty: no padding)."""
    if not sizes:
        return ()
    try:
        out = tuple(sorted({int(s) for s in sizes}))
    except (TypeError, ValueError):
        raise InputError(f"cudagraph_capture_sizes must be integers, got {sizes!r}",
                         field="cudagraph_capture_sizes") from None
    if out[0] < 1:
        raise InputError(f"cudagraph_capture_sizes must be >= 1, got {out[0]}",
                         field="cudagraph_capture_sizes", allowed="positive integers")
    return out


def padded_tokens(sizes: tuple[int, ...], tokens: int) -> int:
    """Tokens the step's graph processes: the next capture size, or ``tokens`` itself when it
    exceeds the largest one (vLLM then runs without a graph) or no sizes are set."""
    if not sizes or tokens > sizes[-1]:
        return tokens
    return sizes[bisect_left(sizes, tokens)]
