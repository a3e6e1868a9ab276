"""CPython's iteration order of `set(ids)` for str ids under PYTHONHASHSEED=0, computed, not observed.

vLLM turns some id collections into sets and then acts on them in set-iteration order:
`Scheduler.finish_requests` frees the aborted requests' blocks in `set(request_ids)` order, and
`_update_from_kv_xfer_finished` frees in the order of `KVConnectorOutput.finished_recving` /
`finished_sending` (sets). The order of frees is the order of the free queue, hence which block
ids later requests get. A str's hash depends on the interpreter's hash seed, so vLLM's decisions
depend on PYTHONHASHSEED; the oracle pins PYTHONHASHSEED=0 (hash randomization off, SipHash key
all zeros).

To make the same decisions whatever seed *our* process runs under, we do not build a real set:
`set_order` replays CPython 3.11+'s str hash (SipHash-1-3 over the string's internal buffer,
key 0) and its set insertion (open addressing, 9 linear probes then perturbed jumps, resize to
4 x used at 60 % fill), and reads the table from slot 0 up, as `iter(set)` does.
"""

from __future__ import annotations

from collections.abc import Iterable

_M64 = (1 << 64) - 1
_MIN_SIZE = 8  # PySet_MINSIZE
_LINEAR_PROBES = 9
_PERTURB_SHIFT = 5


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    # One SipHash round: two half rounds with rotations (13, 16) and (17, 21).
    v0 = (v0 + v1) & _M64
    v2 = (v2 + v3) & _M64
    v1 = _rotl(v1, 13) ^ v0
    v3 = _rotl(v3, 16) ^ v2
    v0 = _rotl(v0, 32)
    v2 = (v2 + v1) & _M64
    v0 = (v0 + v3) & _M64
    v1 = _rotl(v1, 17) ^ v2
    v3 = _rotl(v3, 21) ^ v0
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash13(data: bytes, k0: int = 0, k1: int = 0) -> int:
    """SipHash-1-3 as CPython's Python/pyhash.c computes it (unsigned 64-bit result)."""
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    n = len(data)
    end = n - n % 8
    for i in range(0, end, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 ^= m
    b = ((n & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    v3 ^= b
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return (v0 ^ v1) ^ (v2 ^ v3)


def str_hash_seed0(s: str) -> int:
    """hash(s) under PYTHONHASHSEED=0, as an unsigned 64-bit value (what the set table probes with)."""
    if not s:
        return 0
    top = max(map(ord, s))
    # The buffer CPython hashes: 1, 2 or 4 bytes per character (PEP 393), little-endian.
    if top < 0x100:
        data = s.encode("latin-1")
    elif top < 0x10000:
        data = s.encode("utf-16-le")
    else:
        data = s.encode("utf-32-le")
    h = siphash13(data)
    if h == _M64:  # -1 is reserved for errors: CPython returns -2
        h = _M64 - 1
    return h


def _insert(table: list, mask: int, h: int, key: str) -> bool:
    """set_add_entry: place key; False when an equal key is already there."""
    i = h & mask
    perturb = h
    while True:
        probes = _LINEAR_PROBES if i + _LINEAR_PROBES <= mask else 0
        j = i
        while True:
            slot = table[j]
            if slot is None:
                table[j] = (h, key)
                return True
            if slot[0] == h and slot[1] == key:
                return False
            if probes == 0:
                break
            probes -= 1
            j += 1
        perturb >>= _PERTURB_SHIFT
        i = (i * 5 + 1 + perturb) & mask


def set_order(ids: Iterable[str]) -> list[str]:
    """The distinct ids in the order `iter(set(ids))` yields them under PYTHONHASHSEED=0."""
    if isinstance(ids, tuple) and len(ids) < 2:
        # A set of one id (or none) yields it alone whatever its hash: no hashing (a P/D hand-off
        # marks one request sent and one received, scheduler.py mark_kv_sent / mark_kv_received).
        return list(ids)
    mask = _MIN_SIZE - 1
    table: list = [None] * _MIN_SIZE
    used = 0
    for key in ids:
        h = str_hash_seed0(key)
        if not _insert(table, mask, h, key):
            continue
        used += 1
        if used * 5 >= mask * 3:  # fill == used: a fresh set has no dummies
            size = _MIN_SIZE
            minused = used * 2 if used > 50000 else used * 4
            while size <= minused:
                size <<= 1
            old, mask, table = table, size - 1, [None] * size
            for slot in old:
                if slot is not None:
                    _insert(table, mask, slot[0], slot[1])
    return [slot[1] for slot in table if slot is not None]
