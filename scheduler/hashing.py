"""Chained block hashes for prefix caching.

hash(block i) = H(hash(block i-1), the block's token ids, extra keys). Extra keys are the LoRA id
(every block), the mm hashes of the multimodal items a block overlaps, and the cache salt (first
block only), so requests that must not share KV never
collide. Only full blocks are hashed; the hashes grow incrementally as tokens are appended.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

# TokenSegment and TokenProvenance live in block_keys.py (compiled: one of each is built per
# arrival); they are imported from here as before.
from servesim.scheduler.block_keys import TokenProvenance, TokenSegment  # noqa: F401
from servesim.scheduler.multimodal import mm_extra_keys
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
    """The canonical bytes of one block's ids, whatever their storage.

    int32 when every id fits (the Request's usual storage, hashed without conversion), else
    int64, else text; hash_block_tokens length-prefixes them, so the three never meet.
    """
    if type(token_ids) is array and token_ids.typecode == "i":
        return token_ids.tobytes()
    try:
        return array("i", token_ids).tobytes()
    except OverflowError:
        pass
    try:
        return array("q", token_ids).tobytes()
    except OverflowError:  # ids beyond int64: a textual encoding
        return ",".join(map(str, token_ids)).encode()


def extra_keys_bytes(request: Request, start_token_idx: int, end_token_idx: int = 0) -> bytes:
    """Extra keys of the block [start_token_idx, end_token_idx), as bytes (empty when none)."""
    parts = []
    if request.lora_id is not None:
        parts.append(b"L%d" % request.lora_id)
    if request.mm_features:
        parts.extend(mm_extra_keys(request.mm_features, start_token_idx, end_token_idx))
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
    """Return request -> list of hashes of its newly completed full blocks.

    Equal to chaining `hash_block_tokens` block by block (tests/test_compact_memory.py checks the
    values). A Request keeps its ids as int32 whenever they fit (request.py::_compact_ids), which is
    the canonical encoding, so the fast path slices the storage's bytes per block without converting
    a single id: prompt hashing at arrival is the largest per-request cost of a prefix-cached replay.
    """
    fn = get_hash_fn(hash_fn) if isinstance(hash_fn, str) else hash_fn
    is_sha256 = fn is _sha256
    block_bytes = block_size * 4  # int32 ids
    length_prefix = block_bytes.to_bytes(4, "little")

    def request_block_hasher(request: Request) -> list[bytes]:
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start + block_size > num_tokens:
            return []
        end = start + (num_tokens - start) // block_size * block_size
        span = request.all_token_ids[start:end]
        if type(span) is not array or span.typecode != "i":  # some id beyond int32: per block
            return _hash_blocks(fn, request, span, start, block_size)
        data = span.tobytes()
        parent: bytes = request.block_hashes[-1] if request.block_hashes else NONE_HASH
        plain = request.lora_id is None and (start > 0 or not request.cache_salt) and not request.mm_features
        new_hashes: list[bytes] = []
        for offset in range(0, len(data), block_bytes):
            first = start + offset // 4
            extra = b"" if plain else extra_keys_bytes(request, first, first + block_size)
            payload = parent + length_prefix + data[offset : offset + block_bytes] + extra
            # the default algorithm called directly: a Python-level call per block costs as much as sha256
            parent = hashlib.sha256(payload).digest() if is_sha256 else fn(payload)
            new_hashes.append(parent)
        return new_hashes

    request_block_hasher.block_size = block_size  # lets Request skip calls until a block completes
    return request_block_hasher


def _hash_blocks(
    fn: HashFn, request: Request, span: list[int] | array, start: int, block_size: int
) -> list[bytes]:
    """The general path: each block encoded on its own (_token_bytes picks its width)."""
    parent = request.block_hashes[-1] if request.block_hashes else None
    new_hashes: list[bytes] = []
    for offset in range(0, len(span), block_size):
        extra = extra_keys_bytes(request, start + offset, start + offset + block_size)
        parent = hash_block_tokens(fn, parent, span[offset : offset + block_size], extra)
        new_hashes.append(parent)
    return new_hashes
