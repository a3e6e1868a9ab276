"""KV cache events (opt-in): what entered and left the prefix cache, for external indexers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class BlockStored:
    block_hashes: tuple[bytes, ...]  # hashes of the newly cached full blocks, in chain order
    parent_block_hash: bytes | None  # hash of the block before the first one; None at the start
    token_ids: tuple[int, ...]  # the tokens of those blocks, concatenated
    block_size: int  # tokens per block
    lora_id: int | None


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    block_hashes: tuple[bytes, ...]  # evicted from the prefix cache


@dataclass(slots=True, frozen=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
