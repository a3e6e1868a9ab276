"""Attention metadata shared by the paged-attention ops, the model and the runner."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step inputs of the paged-attention ops (vLLM V1 layout).

    The T scheduled tokens are laid out sequence after sequence: the tokens of
    sequence s are rows query_start_loc[s] : query_start_loc[s + 1]. A
    sequence's new tokens are the *last* query_len positions of its context,
    so token i of sequence s sits at position seq_lens[s] - query_len + i.
    """

    slot_mapping: torch.Tensor  # [T] int64; block_id * block_size + offset, -1 = padding token (not written)
    query_start_loc: torch.Tensor  # [S + 1] int32; cumulative query lengths, query_start_loc[0] == 0
    seq_lens: torch.Tensor  # [S] int32; context length incl. the new tokens
    block_table: torch.Tensor  # [S, max_blocks_per_seq] int32; physical block ids, unused entries arbitrary
    max_query_len: int  # max over s of the query length
    max_seq_len: int  # max over s of seq_lens[s]

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])
