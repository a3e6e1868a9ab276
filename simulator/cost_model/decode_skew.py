"""Decode-attention imbalance: the extra time of a batch of decodes of unequal contexts over the same
batch at their mean context, for every cost model that prices decode attention.

A decode-attention table (or the roofline's formula) prices ``n`` decodes at one shared context; a
step's decodes have different ones, and looking the table up at their mean keeps the KV bytes read
but not the kernel's imbalance. vLLM's FlashAttention decode path splits each sequence's KV into
the same number of splits, sized from the batch's longest sequence (flash-attention's
``num_splits_heuristic`` is fed ``max_seqlen_k``; vLLM 0.19 caps the splits at
``_DEFAULT_MAX_NUM_SPLITS_FOR_CUDA_GRAPH`` = 32 under full CUDA graphs), so the longest sequence's
CTAs set the kernel's tail whenever batch x KV heads x splits does not fill the SMs many times
over. LLMServingSim's vLLM 0.19 profiler measured the effect directly: it timed ~13,000 skewed
decode batches against the uniform-at-mean and uniform-at-max batches and fitted, per TP,

    t = t(n, mean) + alpha * (t(n, max) - t(n, mean))

(``meta.yaml -> skew_fit.per_tp.<tp>.alpha_default``). Every cost model applies that form.
Where alpha comes from, in order (the model's ``skew_alpha_source`` says which):

1. ``skew_alpha=`` given in the cost-model params (0 turns the term off);
2. the profile's own measured alpha (a fitted mixed table whose profiler ran the skew sweep);
3. a measured alpha carried from the profiles of the same attention backend (vLLM's FlashAttention):
   :data:`CARRIED_SKEW_ALPHA`, for fits of vLLM kernel tables and the roofline's standard attention;
4. none (0): backends nothing measured (MLA, fits of non-vLLM profiles).

A physically derived factor (split-KV wave quantisation from the SM count, the split heuristic and
the tile size) was not used: vLLM runs FA3 on Hopper (ahead-of-time scheduler metadata) and FA2
elsewhere, with different split rules, and the shared data hold only the pooled alphas, not the
skew sweep's batches, so such a form could not be checked against the measurements.
"""

from __future__ import annotations

from itertools import compress

from servesim.traces.errors import InputError

# Median of the per-TP alpha_default values the shared vLLM 0.19 FlashAttention profiles report
# (LLMServingSim profiler, /work/shared/data/gpu_profiles/llmservingsim/vllm_0.19_profiler/
# RTXPRO6000/*/*/bf16/meta.yaml skew_fit.per_tp): Llama-3.1-8B TP1 0.0543, TP2 0.0654; Qwen3-32B
# TP1 0.057, TP2 0.0649 (the RTX 4090 profile disabled the sweep). Median of the four: 0.06095.
CARRIED_SKEW_ALPHA_VALUES = (0.0543, 0.0654, 0.057, 0.0649)
CARRIED_SKEW_ALPHA = 0.06095
CARRIED_SKEW_SOURCE = ("carried from LLMServingSim's vLLM 0.19 FlashAttention profiles (median of the "
                       "per-TP skew_fit alpha_default of RTX PRO 6000 Llama-3.1-8B TP1/TP2, Qwen3-32B TP1/TP2)")
MEASURED_SKEW_SOURCE = "measured (the profile's skew sweep, skew_fit alpha_default)"
GIVEN_SKEW_SOURCE = "given (skew_alpha)"
NO_SKEW_SOURCE = "none: no skew measurement for this attention backend"

_ONE_EQ = (1).__eq__


def check_skew_alpha(alpha: object) -> float:
    """``alpha`` as a float in [0, 1], or InputError (field ``skew_alpha``)."""
    try:
        value = float(alpha)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"skew_alpha must be a number, got {alpha!r}", field="skew_alpha") from None
    if not 0.0 <= value <= 1.0:  # (NaN compares false: refused too)
        raise InputError(f"skew_alpha {value} is outside [0, 1]", field="skew_alpha", allowed="0 .. 1")
    return value


def max_decode_context(new: tuple[int, ...], ctx: tuple[int, ...], num_prefill: int) -> int:
    """The largest context among the decodes (requests computing one token) of a step that has at
    least one decode; ``num_prefill`` is the number of other requests (batch_sums' n_prefill).

    Hot path: two C-level passes (max, index) in the usual cases, when the longest context is a
    decode's; only a step whose longest context is a prefill's filters the decodes."""
    top = max(ctx)
    if not num_prefill or new[ctx.index(top)] == 1:
        return top
    return max(compress(ctx, map(_ONE_EQ, new)))
