"""The roofline's attention work of a step: query-key pairs and KV tokens read by an average layer,
sliding-window layers included (pure arithmetic on the batch; the roofline prices it, roofline.py).
"""

from __future__ import annotations

from itertools import compress

from .base import batch_sums
from .decode_skew import max_decode_context

_ONE_NE = (1).__ne__


def layer_work(new: tuple[int, ...], ctx: tuple[int, ...], skew_alpha: float, win_frac: float,
               window: int | None) -> tuple[int, float, float, float]:
    """(tokens, query-key pairs, KV tokens read, skew KV tokens) of an average layer:
    full-attention layers and sliding-window layers (``win_frac`` of the model's layers, each
    seeing ``window`` keys) blended by their share. Skew KV tokens: how many more the decodes
    would read all at the longest decode's context (the imbalance term, cost_model/decode_skew.py;
    0 when ``skew_alpha`` is 0)."""
    tokens, ctx_sum, nd, kd, npf, ptok, pc, cc = batch_sums(new, ctx)
    # causal query-key pairs: decodes see context + 1, chunks c * cached + c(c+1)/2
    pairs, kv_tokens = kd + nd + pc + 0.5 * (cc + ptok), ctx_sum + tokens
    skew_kv = nd * max_decode_context(new, ctx, npf) - kd if skew_alpha and nd > 1 else 0
    f = win_frac
    if f:
        assert window is not None  # sliding layers have a window (ModelSpec)
        wpairs, wkv = windowed_work(window, new, ctx, (pairs, kv_tokens), ctx_sum, tokens, npf)
        pairs, kv_tokens = f * wpairs + (1.0 - f) * pairs, f * wkv + (1.0 - f) * kv_tokens
        skew_kv = (1.0 - f) * skew_kv  # full-attention layers only: windowed ones cap every context
    return tokens, pairs, kv_tokens, skew_kv


def windowed_work(window: int, new: tuple[int, ...], ctx: tuple[int, ...], full: tuple[float, int],
                  ctx_sum: int, tokens: int, n_prefill: int) -> tuple[float, int]:
    """(query-key pairs, KV tokens read) with a sliding attention window of ``window`` keys;
    ``full`` is the unwindowed work, returned as is when no request reaches past the window."""
    if not ctx or max(ctx) + (tokens if n_prefill else 1) <= window:  # (an empty batch too)
        return full
    # Every request reads min(c, window) cached tokens plus its n new ones; a decode (n = 1)
    # sees min(c + 1, window) keys. min(c, t) summed = sum(c) - the excess over t, which
    # only the long contexts have: found by a C-level filter, not a Python loop.
    long = list(filter((window - 1).__lt__, ctx))  # contexts >= window
    excess = sum(long) - (window - 1) * len(long)  # over window - 1; over window: - len(long)
    kv = ctx_sum - (excess - len(long)) + tokens
    pairs = float(ctx_sum - excess + len(new))
    if n_prefill:  # prefill-like requests: swap in the exact form
        for i in compress(range(len(new)), map(_ONE_NE, new)):
            n, c = new[i], ctx[i]
            pairs -= min(c, window - 1) + 1
            f = min(max(window - c, 0), n)  # queries that still see their whole prefix
            pairs += f * c + 0.5 * f * (f + 1) + (n - f) * window
    return pairs, kv
