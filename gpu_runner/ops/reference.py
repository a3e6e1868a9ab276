"""Vectorised torch reference of the paged-attention ops.

It is the test oracle of the Triton kernels and the CPU backend
(``backend="torch"``). Everything is computed in fp32 and cast to the
output dtype at the end. See ``docs/GPU_RUNNER.md`` for the cache layout.
"""

from __future__ import annotations

import torch


def reshape_and_cache(
    key: torch.Tensor,  # [T, KVH, D]
    value: torch.Tensor,  # [T, KVH, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    slot_mapping: torch.Tensor,  # [T] int64; -1 = padding token, skipped
) -> None:
    """Write each token's key/value into its cache slot (in place)."""
    block_size = key_cache.shape[1]
    keep = slot_mapping >= 0  # [T] bool
    slots = slot_mapping[keep].long()  # [T']
    blocks, offsets = slots // block_size, slots % block_size  # [T'], [T']
    key_cache[blocks, offsets] = key[keep].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[keep].to(value_cache.dtype)


def unified_attention(
    q: torch.Tensor,  # [T, H, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    out: torch.Tensor,  # [T, H, D]; rows of the scheduled tokens are overwritten
    query_start_loc: torch.Tensor,  # [S + 1] int32
    seq_lens: torch.Tensor,  # [S] int32
    block_table: torch.Tensor,  # [S, MB] int32
    scale: float,
) -> None:
    """Causal paged attention over prefill chunks and decodes in one call.

    Decode sequences (query length 1) are processed as one padded group;
    every other sequence on its own, so a long prefill never pads the decodes.
    """
    starts = query_start_loc.tolist()
    query_lens = [b - a for a, b in zip(starts[:-1], starts[1:])]
    decodes = [s for s, n in enumerate(query_lens) if n == 1]
    if decodes:
        _attend_group(decodes, q, key_cache, value_cache, out, query_start_loc, seq_lens, block_table, scale)
    for s, n in enumerate(query_lens):
        if n > 1:
            _attend_group([s], q, key_cache, value_cache, out, query_start_loc, seq_lens, block_table, scale)


def _attend_group(
    seqs: list[int],
    q: torch.Tensor,  # [T, H, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    out: torch.Tensor,  # [T, H, D]
    query_start_loc: torch.Tensor,  # [S + 1] int32
    seq_lens: torch.Tensor,  # [S] int32
    block_table: torch.Tensor,  # [S, MB] int32
    scale: float,
) -> None:
    device = q.device
    sid = torch.tensor(seqs, dtype=torch.long, device=device)  # [G]
    q_start = query_start_loc.long()[sid]  # [G]
    q_len = query_start_loc.long()[sid + 1] - q_start  # [G]
    s_len = seq_lens.long()[sid]  # [G]
    max_q, max_k = int(q_len.max()), int(s_len.max())
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    group = num_heads // num_kv_heads

    qi = torch.arange(max_q, device=device)  # [Lq]
    q_valid = qi[None, :] < q_len[:, None]  # [G, Lq]
    rows = torch.where(q_valid, q_start[:, None] + qi[None, :], 0)  # [G, Lq]
    q_pos = s_len[:, None] - q_len[:, None] + qi[None, :]  # [G, Lq]
    qg = q[rows].float().view(len(seqs), max_q, num_kv_heads, group, head_dim)  # [G, Lq, KVH, R, D]

    kpos = torch.arange(max_k, device=device)  # [Lk]
    k_valid = kpos[None, :] < s_len[:, None]  # [G, Lk]
    table_col = (kpos // block_size).clamp(max=block_table.shape[1] - 1)  # [Lk]
    blocks = torch.where(k_valid, block_table.long()[sid][:, table_col], 0)  # [G, Lk]
    offsets = (kpos % block_size)[None, :].expand_as(blocks)  # [G, Lk]
    zero = torch.zeros((), device=device)
    k = torch.where(k_valid[..., None, None], key_cache[blocks, offsets].float(), zero)  # [G, Lk, KVH, D]
    v = torch.where(k_valid[..., None, None], value_cache[blocks, offsets].float(), zero)  # [G, Lk, KVH, D]

    scores = torch.einsum("gqhrd,gnhd->ghrqn", qg, k) * scale  # [G, KVH, R, Lq, Lk]
    allowed = (kpos[None, None, :] <= q_pos[:, :, None]) & k_valid[:, None, :]  # [G, Lq, Lk]
    allowed = allowed | ~q_valid[:, :, None]  # padded query rows: keep softmax finite, result dropped
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # [G, KVH, R, Lq, Lk]
    o = torch.einsum("ghrqn,gnhd->gqhrd", probs, v).reshape(len(seqs), max_q, num_heads, head_dim)
    out[rows[q_valid]] = o[q_valid].to(out.dtype)  # [sum q_len, H, D]
