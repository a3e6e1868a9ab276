"""Chained block hashes for prefix caching.

hash(block i) = H(hash(block i-1), the block's token ids, extra keys). Extra keys are the LoRA id
(every block) and the cache salt (first block only), so requests that must not share KV never
collide. Only full blocks are hashed; the hashes grow incrementally as tokens are appended.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from servesim.scheduler.registry import Registry

if TYPE_CHECKING:
    from servesim.scheduler.request import Request

HashFn = Callable[[bytes], bytes]

# The parent of the first block: a fixed seed so hashes are stable across runs and machines.
NONE_HASH = hashlib.sha256(b"servesim-none-hash").digest()


# Selected by CacheConfig.hash_algo (YAML `cache.hash_algo`); built-ins below.
HASH_FUNCTIONS: Registry[HashFn] = Registry("prefix-caching hash algorithm")


@HASH_FUNCTIONS.register("sha256")
def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@HASH_FUNCTIONS.register("blake2b")
def _blake2b(data: bytes) -> bytes:
    # 16-byte digest: faster than sha256, still collision-resistant for any realistic cache size.
    return hashlib.blake2b(data, digest_size=16).digest()


def get_hash_fn(name: str) -> HashFn:
    """The hash function named `name`; unknown: a ValueError with the valid names and a did-you-mean."""
    return HASH_FUNCTIONS.get(name)


def _token_bytes(token_ids: list[int] | array) -> bytes:
    if type(token_ids) is array:  # Request's own storage (scheduler/request.py::_compact_ids)
        if token_ids.typecode == "q":
            return token_ids.tobytes()
        token_ids = token_ids.tolist()  # int32 ids hash as int64, like any other list of ids
    try:
        return array("q", token_ids).tobytes()
    except OverflowError:  # ids beyond int64: fall back to a textual encoding
        return ",".join(map(str, token_ids)).encode()


def extra_keys_bytes(request: Request, start_token_idx: int) -> bytes:
    """Extra keys of the block starting at start_token_idx, as bytes (empty when none)."""
    parts = []
    if request.lora_id is not None:
        parts.append(b"L%d" % request.lora_id)
    if start_token_idx == 0 and request.cache_salt:
        parts.append(b"S" + request.cache_salt.encode())
    return b"|".join(parts)


def hash_block_tokens(
    hash_fn: HashFn, parent_block_hash: bytes | None, block_token_ids: list[int], extra: bytes = b""
) -> bytes:
    parent = parent_block_hash if parent_block_hash else NONE_HASH
    # Length-prefix the variable parts so no two (parent, tokens, extra) encode to the same bytes.
    tokens = _token_bytes(block_token_ids)
    return hash_fn(parent + len(tokens).to_bytes(4, "little") + tokens + extra)


def make_block_hasher(block_size: int, hash_fn: HashFn | str = "sha256"):
    """Return request -> list of hashes of its newly completed full blocks."""
    fn = get_hash_fn(hash_fn) if isinstance(hash_fn, str) else hash_fn

    def request_block_hasher(request: Request) -> list[bytes]:
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start + block_size > num_tokens:
            return []
        parent = request.block_hashes[-1] if request.block_hashes else None
        end = start + (num_tokens - start) // block_size * block_size
        span = request.all_token_ids[start:end]
        if type(span) is array and span.typecode != "q":
            # int32 storage: widen the new blocks once (ids hash as int64 bytes whatever the storage)
            span = array("q", span.tolist())
        new_hashes: list[bytes] = []
        for offset in range(0, end - start, block_size):
            extra = extra_keys_bytes(request, start + offset)
            parent = hash_block_tokens(fn, parent, span[offset : offset + block_size], extra)
            new_hashes.append(parent)
        return new_hashes

    request_block_hasher.block_size = block_size  # lets Request skip calls until a block completes
    return request_block_hasher
