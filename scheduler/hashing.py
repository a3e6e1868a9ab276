"""Chained block hashes for prefix caching.

hash(block i) = H(hash(block i-1), the block's token ids, extra keys). Extra keys are the LoRA id
(every block) and the cache salt (first block only), so requests that must not share KV never
collide. Only full blocks are hashed; the hashes grow incrementally as tokens are appended.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class TokenSegment:
    """`num_tokens` ids read from the id stream `source`, from its position `start` on.

    The caller's promise about streams: the id at a (source, position) never changes, and two
    different streams, or two different positions of one stream, never share a run of a block's
    worth of ids (true of seeded pseudo-random streams, which is what synthetic traces use; not of
    real text, whose ids are hashed instead)."""

    source: bytes  # the stream's identity: equal bytes, the same stream
    start: int  # position in the stream of the segment's first id (>= 0)
    num_tokens: int  # ids in the segment (>= 1)

    def __post_init__(self) -> None:
        if not isinstance(self.source, bytes) or not self.source:
            raise ValueError(f"TokenSegment.source must be non-empty bytes, got {self.source!r}")
        if self.start < 0 or self.num_tokens < 1:
            raise ValueError(f"TokenSegment needs start >= 0 and num_tokens >= 1, got {self.start}, {self.num_tokens}")


@dataclass(frozen=True, slots=True)
class TokenProvenance:
    """Where a request's token ids come from, so its prefix-cache keys follow from that alone.

    Two requests then get equal keys for a block exactly when the same streams at the same
    positions fill their ids up to the block's end, which (by TokenSegment's promise) is exactly
    when those ids are equal: the prefix cache hits and misses as with hashed ids, without reading
    or hashing a single id (scheduler/block_keys.py)."""

    prompt: tuple[TokenSegment, ...]  # the prompt's ids in order (num_tokens sum to its length)
    output_source: bytes | None = None  # output id k is position k of this stream; None: hash the outputs' ids

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("TokenProvenance.prompt must hold at least one segment")

    def head(self, num_tokens: int) -> TokenProvenance:
        """The provenance of a prompt made of the first num_tokens ids alone (no outputs): its
        blocks get the keys the whole request's first blocks get."""
        segments: list[TokenSegment] = []
        left = num_tokens
        for seg in self.prompt:
            if left <= 0:
                break
            segments.append(seg if seg.num_tokens <= left else TokenSegment(seg.source, seg.start, left))
            left -= seg.num_tokens
        return TokenProvenance(tuple(segments))


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
        plain = request.lora_id is None and (start > 0 or not request.cache_salt)
        new_hashes: list[bytes] = []
        for offset in range(0, len(data), block_bytes):
            extra = b"" if plain else extra_keys_bytes(request, start + offset // 4)
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
        extra = extra_keys_bytes(request, start + offset)
        parent = hash_block_tokens(fn, parent, span[offset : offset + block_size], extra)
        new_hashes.append(parent)
    return new_hashes
