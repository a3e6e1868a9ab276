"""Triton kernels of the paged-attention ops (``backend="triton"``).

Interpreter vs GPU: ``@triton.jit`` (ours and triton.language's own helpers
such as ``tl.zeros``/``tl.sum``) picks the Triton interpreter or the GPU
compiler once, when the defining module is imported, from
``TRITON_INTERPRET``. On a CPU machine set ``TRITON_INTERPRET=1`` before
triton is first imported (``gpu_runner.ops.use_triton_interpreter()``); the
ahead-of-time compiler (``gpu_runner.aot``) needs the opposite and runs in a
subprocess with the variable cleared.

Cache layout, per layer: key_cache and value_cache of shape
[num_blocks, block_size, num_kv_heads, head_dim], head_dim contiguous.
Block 0 is vLLM's null block. All address arithmetic on block ids, token
indices and slots is int64 (block_id * stride can exceed 2**31).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def reshape_and_cache_kernel(
    key_ptr, value_ptr,  # [T, KVH, D]
    key_cache_ptr, value_cache_ptr,  # [NB, BS, KVH, D]
    slot_mapping_ptr,  # [T] int64
    stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
    stride_kc_blk, stride_kc_slot, stride_kc_head,
    stride_vc_blk, stride_vc_slot, stride_vc_head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
):
    # One program per token: copies its [KVH, D] key and value rows.
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:  # padding token
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HEADS_PAD).to(tl.int64)  # [HP]
    offs_d = tl.arange(0, DIM_PAD)  # [DP]
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)  # [HP, DP]
    k = tl.load(key_ptr + tok * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :], mask=mask)
    kc = key_cache_ptr + block * stride_kc_blk + offset * stride_kc_slot
    vc = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_slot
    tl.store(kc + offs_h[:, None] * stride_kc_head + offs_d[None, :], k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc + offs_h[:, None] * stride_vc_head + offs_d[None, :], v.to(value_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, pid, BLOCK_Q: tl.constexpr):
    """Binary search: the last sequence s whose first query block index is <= pid."""
    lo = tl.zeros([], dtype=tl.int32)
    hi = tl.zeros([], dtype=tl.int32) + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_kv_tile(table_row, k_head, v_head, k_pos, k_ok, offs_d, d_ok, stride_k_blk, stride_k_slot,
                  stride_v_blk, stride_v_slot, BLOCK_SIZE: tl.constexpr):
    """One key tile through the block table: K as [DP, N] (ready for q @ k), V as [N, DP]; masked keys
    take block 0 (vLLM's null block) and load as zeros."""
    block = tl.load(table_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)  # [N]
    offset = (k_pos % BLOCK_SIZE).to(tl.int64)  # [N]
    k_off = block * stride_k_blk + offset * stride_k_slot  # [N]
    v_off = block * stride_v_blk + offset * stride_v_slot  # [N]
    k = tl.load(k_head + k_off[None, :] + offs_d[:, None], mask=d_ok[:, None] & k_ok[None, :], other=0.0)
    v = tl.load(v_head + v_off[:, None] + offs_d[None, :], mask=k_ok[:, None] & d_ok[None, :], other=0.0)
    return k, v


@triton.jit
def _online_softmax_step(s, v, m_i, l_i, acc, UPCAST: tl.constexpr):
    """Fold one tile of base-2 scores s [M, N] (masked ones -inf) and its values v [N, DP] into the
    running max m_i, denominator l_i and output acc (flash attention); returns the three updated."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [M]
    m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows with no key yet stay finite
    p = tl.exp2(s - m_safe[:, None])  # [M, N]
    alpha = tl.exp2(m_i - m_safe)  # [M]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if UPCAST:
        acc += tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc += tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def unified_attention_kernel(
    q_ptr, key_cache_ptr, value_cache_ptr, out_ptr,  # q/out [T, H, D]; caches [NB, BS, KVH, D]
    query_start_loc_ptr,  # [S + 1] int32
    seq_lens_ptr,  # [S] int32
    block_table_ptr,  # [S, MB] int32
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    num_seqs,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_k_blk, stride_k_slot, stride_k_head,
    stride_v_blk, stride_v_slot, stride_v_head,
    stride_bt_seq,
    QUERIES_PER_KV: tl.constexpr,  # H // KVH
    BLOCK_SIZE: tl.constexpr,  # cache block size
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per program = BLOCK_Q tokens x QUERIES_PER_KV heads (+ masked pad rows)
    BLOCK_Q: tl.constexpr,  # query tokens per program, BLOCK_M // QUERIES_PER_KV
    TILE_N: tl.constexpr,  # keys per inner iteration
    UPCAST: tl.constexpr,  # both dots in exact fp32 (fp32 inputs; bf16 under the interpreter)
):
    # Grid: (total_q_blocks, KVH). Query block b of sequence s has the global
    # index query_start_loc[s] // BLOCK_Q + s + b; the ranges of consecutive
    # sequences never overlap, and the gaps between them are idle programs.
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, num_seqs, pid, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = pid - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DIM_PAD)
    q_idx = q_block * BLOCK_Q + offs_m // QUERIES_PER_KV  # [M] token index within the sequence
    head = (kv_head * QUERIES_PER_KV + offs_m % QUERIES_PER_KV).to(tl.int64)  # [M]
    row_ok = (offs_m < BLOCK_Q * QUERIES_PER_KV) & (q_idx < q_len)  # [M]
    d_ok = offs_d < HEAD_DIM  # [DP]
    tok = (q_start + q_idx).to(tl.int64)  # [M]
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + tok[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
                mask=q_mask, other=0.0)  # [M, DP]
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = context_len + q_idx  # [M]
    kv_len = context_len + tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len)  # keys this block needs

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    offs_n = tl.arange(0, TILE_N)
    table_row = block_table_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head = key_cache_ptr + kv_head.to(tl.int64) * stride_k_head
    v_head = value_cache_ptr + kv_head.to(tl.int64) * stride_v_head
    for t in range(0, tl.cdiv(kv_len, TILE_N)):
        k_pos = t * TILE_N + offs_n  # [N]
        k_ok = k_pos < kv_len  # [N]
        k, v = _load_kv_tile(table_row, k_head, v_head, k_pos, k_ok, offs_d, d_ok, stride_k_blk, stride_k_slot,
                             stride_v_blk, stride_v_slot, BLOCK_SIZE)
        if UPCAST:
            s = tl.dot(q, k.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = s * qk_scale  # [M, N], log2 domain
        allowed = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :] & row_ok[:, None]
        m_i, l_i, acc = _online_softmax_step(tl.where(allowed, s, float("-inf")), v, m_i, l_i, acc, UPCAST)
    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    out_off = tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :]
    tl.store(out_ptr + out_off, acc.to(out_ptr.dtype.element_ty), mask=q_mask)


def interpreting() -> bool:
    """True when the kernels were wrapped for the interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.jit import JITFunction

    return not isinstance(unified_attention_kernel, JITFunction)


def _check_device(*tensors: torch.Tensor) -> None:
    if not interpreting() and any(t.device.type == "cpu" for t in tensors):
        raise RuntimeError("triton backend on CPU tensors needs TRITON_INTERPRET=1 set before triton is "
                           "first imported (gpu_runner.ops.use_triton_interpreter()), or backend='torch'")


def upcast_dots(dtype: torch.dtype, interpret: bool) -> bool:
    """fp32 inputs: exact fp32 dots (no TF32). bf16 under the interpreter: its bf16 dot returns
    garbage silently (triton 3.7), so upcast; fp16 runs the native path there too."""
    return dtype == torch.float32 or (interpret and dtype == torch.bfloat16)


def reshape_and_cache_constexprs(num_kv_heads: int, head_dim: int, block_size: int) -> dict[str, int]:
    """Compile-time parameters of reshape_and_cache_kernel (shared with gpu_runner.aot)."""
    return dict(NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
                HEADS_PAD=triton.next_power_of_2(num_kv_heads), DIM_PAD=triton.next_power_of_2(head_dim))


def unified_attention_constexprs(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, interpret: bool
) -> dict[str, int | bool]:
    """Compile-time parameters of unified_attention_kernel (shared with gpu_runner.aot).

    BLOCK_M rows per program = BLOCK_Q query tokens x (H // KVH) heads of one kv
    head, padded to a power of two >= 16 (tl.dot's minimum); keys in tiles of 32.
    """
    qpk = num_heads // num_kv_heads
    block_m = max(16, triton.next_power_of_2(qpk))
    return dict(QUERIES_PER_KV=qpk, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
                DIM_PAD=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_Q=block_m // qpk,
                TILE_N=32, UPCAST=upcast_dots(dtype, interpret))


def reshape_and_cache(
    key: torch.Tensor,  # [T, KVH, D]
    value: torch.Tensor,  # [T, KVH, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding
) -> None:
    _check_device(key, key_cache)
    for t in (key, value, key_cache, value_cache):
        assert t.stride(-1) == 1, "head_dim must be contiguous"
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        **reshape_and_cache_constexprs(num_kv_heads, head_dim, key_cache.shape[1]),
    )


def unified_attention(
    q: torch.Tensor,  # [T, H, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    out: torch.Tensor,  # [T, H, D]
    query_start_loc: torch.Tensor,  # [S + 1] int32
    seq_lens: torch.Tensor,  # [S] int32
    block_table: torch.Tensor,  # [S, MB] int32
    scale: float,
) -> None:
    _check_device(q, key_cache)
    for t in (q, key_cache, value_cache, out):
        assert t.stride(-1) == 1, "head_dim must be contiguous"
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_seqs = key_cache.shape[2], seq_lens.shape[0]
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    if num_tokens == 0 or num_seqs == 0:
        return
    constexprs = unified_attention_constexprs(num_heads, num_kv_heads, head_dim, key_cache.shape[1], q.dtype,
                                              interpreting())
    # one program per (query block, kv head); see the kernel for the block numbering
    grid = (num_tokens // constexprs["BLOCK_Q"] + num_seqs, num_kv_heads)
    unified_attention_kernel[grid](
        q, key_cache, value_cache, out, query_start_loc, seq_lens, block_table,
        float(scale) * LOG2E, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_table.stride(0),
        **constexprs,
    )
