"""Test helpers for the paged-attention ops: random paged batches and a loop oracle.

``make_paged_batch`` builds a vLLM-style batch whose unused cache slots,
null block (block 0) and unused block-table entries (which point at block 0)
hold NaN, so any unmasked load shows up as NaN in the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class PagedBatch:
    q: torch.Tensor  # [T + P, H, D]; the last P rows are padding tokens of no sequence
    key: torch.Tensor  # [T + P, KVH, D]; new tokens' keys
    value: torch.Tensor  # [T + P, KVH, D]
    key_cache: torch.Tensor  # [NB, BS, KVH, D]; cached prefix written, everything else NaN
    value_cache: torch.Tensor  # [NB, BS, KVH, D]
    slot_mapping: torch.Tensor  # [T + P] int64; -1 for the padding tokens
    query_start_loc: torch.Tensor  # [S + 1] int32
    seq_lens: torch.Tensor  # [S] int32
    block_table: torch.Tensor  # [S, MB] int32; unused entries = 0 (null block)
    num_padding: int  # P

    @property
    def num_real_tokens(self) -> int:
        return int(self.query_start_loc[-1])


def make_paged_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    num_padding: int = 0,
    spare_table_cols: int = 1,
    seed: int = 0,
) -> PagedBatch:
    """Sequence s has seq_lens[s] tokens of context, the last query_lens[s] of them new.

    Physical blocks are a random permutation of 1..NB-1 (plus spare blocks that
    stay NaN); the prefix of every sequence is written directly, the new
    tokens' K/V are left to ``reshape_and_cache``.
    """
    assert len(query_lens) == len(seq_lens) and all(0 < q <= s for q, s in zip(query_lens, seq_lens))
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = 1 + sum(blocks_per_seq) + 2  # null block + used + 2 spare
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(seq_lens), max(blocks_per_seq) + spare_table_cols, dtype=torch.int32)
    for s, n in enumerate(blocks_per_seq):
        table[s, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    num_tokens = sum(query_lens) + num_padding
    slots = []
    for s, (n_q, n_s) in enumerate(zip(query_lens, seq_lens)):
        pos = torch.arange(n_s)
        blk, off = table[s, pos // block_size].long(), pos % block_size
        ctx = n_s - n_q
        key_cache[blk[:ctx], off[:ctx]] = torch.randn(ctx, num_kv_heads, head_dim, generator=gen).to(dtype)
        value_cache[blk[:ctx], off[:ctx]] = torch.randn(ctx, num_kv_heads, head_dim, generator=gen).to(dtype)
        slots.append(blk[ctx:] * block_size + off[ctx:])
    slots.append(torch.full((num_padding,), -1, dtype=torch.long))

    def randn(*shape_: int) -> torch.Tensor:
        return torch.randn(*shape_, generator=gen).to(dtype)

    return PagedBatch(
        q=randn(num_tokens, num_heads, head_dim),
        key=randn(num_tokens, num_kv_heads, head_dim),
        value=randn(num_tokens, num_kv_heads, head_dim),
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=torch.cat(slots),
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=table,
        num_padding=num_padding,
    )


def naive_attention(
    q: torch.Tensor,  # [T, H, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    query_start_loc: torch.Tensor,  # [S + 1]
    seq_lens: torch.Tensor,  # [S]
    block_table: torch.Tensor,  # [S, MB]
    scale: float,
) -> torch.Tensor:  # [T, H, D] fp32; rows of no sequence are 0
    """Token-by-token, head-by-head loop: the oracle of the vectorised reference."""
    out = torch.zeros(q.shape, dtype=torch.float32)
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    for s in range(seq_lens.shape[0]):
        start, end, n_s = int(query_start_loc[s]), int(query_start_loc[s + 1]), int(seq_lens[s])
        for i, tok in enumerate(range(start, end)):
            pos = n_s - (end - start) + i
            keys_pos = range(pos + 1)
            blocks = [int(block_table[s, j // block_size]) for j in keys_pos]
            k = torch.stack([key_cache[b, j % block_size] for b, j in zip(blocks, keys_pos)]).float()  # [L, KVH, D]
            v = torch.stack([value_cache[b, j % block_size] for b, j in zip(blocks, keys_pos)]).float()
            for h in range(q.shape[1]):
                w = torch.softmax((k[:, h // group] @ q[tok, h].float()) * scale, dim=0)  # [L]
                out[tok, h] = w @ v[:, h // group]
    return out


def simple_metadata(
    context_lens: list[int],  # per sequence: tokens already in the cache
    query_lens: list[int],  # per sequence: new tokens this step
    block_tables: list[list[int]],  # per sequence: its physical block ids (enough for context + query)
    block_size: int,
    num_padding: int = 0,
    device: torch.device | str = "cpu",
):
    """(positions [T + P] int64, AttentionMetadata) for one step; padding tokens get slot -1, position 0."""
    from servesim.gpu_runner.ops.metadata import AttentionMetadata

    positions, slots = [], []
    for ctx, n, blocks in zip(context_lens, query_lens, block_tables):
        for p in range(ctx, ctx + n):
            positions.append(p)
            slots.append(blocks[p // block_size] * block_size + p % block_size)
    positions += [0] * num_padding
    slots += [-1] * num_padding
    width = max(len(b) for b in block_tables)
    table = torch.zeros(len(block_tables), width, dtype=torch.int32)
    for s, blocks in enumerate(block_tables):
        table[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32,
                                     device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=table.to(device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return torch.tensor(positions, dtype=torch.long, device=device), meta
