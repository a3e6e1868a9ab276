"""Prefix-cache keys from a request's token provenance, without reading its ids.

The usual key of block j is a chained hash of the ids in blocks 0..j (hashing.py). When the caller
knows where the ids come from (TokenProvenance, below: runs of deterministic id streams, e.g. a
synthetic trace's per-request stream, a shared-prefix group's stream, Mooncake hash-id blocks, and
the token source the outputs follow), the same equality follows from the provenance alone:

    base(0) = sha256(tag, extra keys, source 0, start 0)
    base(t) = sha256(base(t - 1), length of run t - 1, source t, start t)
    key(block) = base(t) + end of the block (8 bytes), t = the run holding the block's last id

Runs are normalised first (a run continuing its predecessor's stream where it stopped merges
into it), so base(t) says exactly which streams, from where and for how long, fill every position
before run t, and the block's end says how far run t goes. Equal keys therefore mean equal ids
up to the block's end; different keys mean a different stream or position somewhere, which by
TokenSegment's promise means different ids. So the cache hits and misses exactly as with hashed
ids, at two sha256 calls a request instead of one a block, and no id is ever read.

Blocks past the declared ids (outputs with no declared source) fall back to hashing their ids,
chained from the last key (Request.update_block_hashes).
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b
from typing import Final

try:  # CPython's own SHA-256: OpenSSL's digests, without its context set-up (most of a short hash's cost)
    from _sha256 import sha256 as _sha256
except ImportError:  # Python 3.12 on (its module is _sha2, outside 3.11's stdlib names), or built without it
    from hashlib import sha256 as _sha256


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


# A synthetic prompt's own stream (traces/tokens.py: a request's or session's ids) is keyed, and a
# stream named in a provenance, here, compiled: a plain prompt's segment is made at every arrival.
_TAG_TEXT: Final = 0x3C6EF372FE94F82B  # the text streams' domain tag (traces/tokens.py has the others)
_MASK64: Final = (1 << 64) - 1


def text_stream(ident: str) -> int:
    """Stream key of a request or session id (stable across processes and platforms)."""
    digest = blake2b(ident.encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(digest, "little") ^ _TAG_TEXT) & _MASK64


def stream_source(key: int) -> bytes:
    """The identity of stream `key` in a token provenance (TokenSegment.source): equal bytes
    exactly when the keys, hence every id of the streams, are equal."""
    return b"stream:" + key.to_bytes(8, "little")


_TAG: Final = b"servesim-provenance\x00"
# The end of a run that never ends (positions stay far below it). Below 2**62, so that compiled it
# stays a machine int: comparing a boxed int took ~6 % of extend_keys. It is never hashed (the open
# run is the last, and a base hashes its predecessor's length).
_OPEN: Final = 1 << 61


def _field(data: bytes) -> bytes:
    """A length-prefixed field: no two field sequences encode to the same bytes."""
    return len(data).to_bytes(4, "little") + data


# block_size -> the 8-byte ends of blocks 0, 1, ... ((j + 1) * block_size, little-endian): shared
# by every request, grown on demand (to_bytes per block was half of a key's cost). Final: the dict
# is only mutated, and compiled a rebindable global is a dictionary lookup at each read.
_ENDS: Final[dict[int, list[bytes]]] = {}


def _block_ends(block_size: int, num_blocks: int) -> list[bytes]:
    """The encoded ends of the first num_blocks blocks (at least; the list is shared)."""
    encoded = _ENDS.get(block_size)
    if encoded is None:
        encoded = _ENDS[block_size] = []
    if len(encoded) < num_blocks:
        encoded.extend([((j + 1) * block_size).to_bytes(8, "little")
                        for j in range(len(encoded), max(num_blocks, 2 * len(encoded)))])
    return encoded


def _seed(extra: bytes) -> bytes:
    """What base(0) chains from: the tag and the request's extra keys."""
    return _sha256(_TAG + _field(extra)).digest()


_PLAIN_SEED: Final = _seed(b"")  # most requests have no extra keys: their seed is hashed once


class BlockKeyPlan:
    """One request's normalised runs and their bases; hands out its blocks' keys in order."""

    __slots__ = ("ends", "bases", "declared_end")

    def __init__(self, prompt: tuple[TokenSegment, ...], num_prompt_tokens: int, open_source: bytes | None,
                 extra: bytes) -> None:
        """prompt: the prompt's segments in order, summing to num_prompt_tokens (at least one);
        open_source: the stream the outputs continue at its position 0 (None: not declared);
        extra: the request's extra keys (LoRA id, cache salt) as bytes, b"" when none.

        One pass: a segment continuing the open run's stream where it stopped extends it; any
        other closes the run (its base hashed) and opens the next."""
        self.ends: list[int] = []  # position after each run
        self.bases: list[bytes] = []
        self.declared_end = 0  # ids from here on are hashed from their values
        first = prompt[0]
        source, start, n = first.source, first.start, first.num_tokens
        base, prev_n = _seed(extra) if extra else _PLAIN_SEED, 0
        for k in range(1, len(prompt)):
            seg = prompt[k]
            if seg.source == source and start + n == seg.start:
                n += seg.num_tokens
                continue
            base = self._close(base, prev_n, source, start, n)
            prev_n = n
            source, start, n = seg.source, seg.start, seg.num_tokens
        base = self._close(base, prev_n, source, start, n)
        if self.declared_end != num_prompt_tokens:
            raise ValueError(f"token provenance covers {self.declared_end} ids, the prompt has {num_prompt_tokens}")
        if open_source is not None:  # output id k is position k of open_source: a run without end
            self._close(base, n, open_source, 0, _OPEN)

    def _close(self, base: bytes, prev_n: int, source: bytes, start: int, n: int) -> bytes:
        """Append the run (source, start, n) after a run of prev_n ids whose base is `base`: its
        base and end; the base."""
        base = _sha256(base + prev_n.to_bytes(8, "little") + _field(source)
                              + start.to_bytes(8, "little")).digest()
        self.declared_end = min(self.declared_end + n, _OPEN)
        self.ends.append(self.declared_end)
        self.bases.append(base)
        return base

    @property
    def root(self) -> bytes:
        """base(0): every key of the plan chains from it, so plans with different roots never
        produce an equal key."""
        return self.bases[0]

    def extend_keys(self, keys: list[bytes], num_tokens: int, block_size: int) -> None:
        """Append to `keys` (a request's block hashes so far) the keys of its next full blocks of
        block_size ids, up to num_tokens ids or the last declared id, whichever comes first."""
        stop = min(num_tokens, self.declared_end) // block_size
        j = len(keys)
        if j >= stop:
            return
        ends, bases = self.ends, self.bases
        encoded = _block_ends(block_size, stop)
        t = 0
        while j < stop:
            end = (j + 1) * block_size
            while ends[t] < end:  # the run holding the block's last id (position end - 1)
                t += 1
            # blocks j .. last - 1 all end inside run t (after the run before it ends, by the loop)
            last = min(stop, ends[t] // block_size)
            base = bases[t]
            if last - j == 1:  # a decode step's one new block: no list to extend from
                keys.append(base + encoded[j])
            else:  # a prompt's blocks: built from a slice (compiled, a list of known length), the
                # request's list grown once
                keys.extend([base + e for e in encoded[j:last]])
            j = last
