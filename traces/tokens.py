"""Deterministic synthetic token ids for traces that carry no real tokens.

Why: the scheduler's prefix cache hashes token ids per KV block, so a trace that only says "these
two requests share 3 Mooncake hash blocks" must become token lists whose first 3*512 tokens are
identical and whose other tokens differ. Every id here is a pure function of a *stream key* and a
*position*, computed with the SplitMix64 finaliser in numpy (vectorised, no global state, no
Python `hash()`, which is salted per process). Ids are in [0, 2**31).

Streams are domain-separated so that different kinds never collide by construction of the key:
- ``hash_block_streams(ids)``: Mooncake hash ids; position = offset inside the 512-token block.
- ``group_stream(g)``: shared-prefix group ``g``; position = token index in the prompt.
- ``text_stream(s)``: per request (or per session) stream keyed by a string id; position = token
  index in the conversation, so a later session turn re-reads the same tokens as earlier turns.
"""

from __future__ import annotations

import numpy as np

# The text streams' key and a stream's provenance identity are compiled with the scheduler's block
# keys (a plain prompt's segment is made from them at every arrival); imported from here as before.
from servesim.scheduler.block_keys import stream_source, text_stream  # noqa: F401

TOKEN_ID_LIMIT = 2**31  # ids are in [0, TOKEN_ID_LIMIT): fits int32 tensors and any signed index

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64 increment
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1

# Domain tags (arbitrary odd 64-bit constants) keep the three stream kinds apart.
_TAG_HASH_BLOCK = 0x6A09E667F3BCC909
_TAG_GROUP = 0xBB67AE8584CAA73B  # (the text streams' tag: scheduler/block_keys.py, with text_stream)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (wrap-around arithmetic is intended)."""
    z = z.copy()
    z ^= z >> np.uint64(30)
    z *= _MUL1
    z ^= z >> np.uint64(27)
    z *= _MUL2
    z ^= z >> np.uint64(31)
    return z


def _key_from_int(tag: int, value: int) -> int:
    """64-bit stream key from a domain tag and a non-negative integer id."""
    mixed = _mix(np.array([(tag ^ (value * 0x9E3779B97F4A7C15)) & _MASK64], dtype=np.uint64))
    return int(mixed[0])


def hash_block_streams(hash_ids: tuple[int, ...]) -> list[int]:
    """Stream keys of Mooncake hash ids: hash id h's block holds stream_tokens(key(h), 0, len)."""
    ids = np.asarray(hash_ids, dtype=np.uint64)
    return _mix((ids * _GOLDEN) ^ np.uint64(_TAG_HASH_BLOCK)).tolist()


def group_stream(group: int) -> int:
    """Stream key of a shared-prefix group."""
    return _key_from_int(_TAG_GROUP, group)


def stream_tokens(key: int, start: int, stop: int) -> np.ndarray:
    """Token ids of stream `key` at positions [start, stop), as int64 in [0, 2**31)."""
    positions = np.arange(start, stop, dtype=np.uint64)
    z = _mix(np.uint64(key) + (positions + np.uint64(1)) * _GOLDEN)
    return (z >> np.uint64(33)).astype(np.int64)


def runs_tokens(runs: list[tuple[int, int, int]]) -> np.ndarray:
    """Token ids of (stream key, first position, count) runs laid end to end, as int64: each run is
    stream_tokens(key, first, first + count), all computed in one vectorised pass (a Mooncake prompt
    has a run per hash id)."""
    if len(runs) == 1:
        key, start, n = runs[0]
        return stream_tokens(key, start, start + n)
    keys = np.array([k for k, _, _ in runs], dtype=np.uint64)
    starts = np.array([s for _, s, _ in runs], dtype=np.int64)
    lens = np.array([n for _, _, n in runs], dtype=np.int64)
    offsets = np.cumsum(lens) - lens  # where each run starts in the output
    positions = (np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - offsets, lens)).astype(np.uint64)
    z = _mix(np.repeat(keys, lens) + (positions + np.uint64(1)) * _GOLDEN)
    return (z >> np.uint64(33)).astype(np.int64)