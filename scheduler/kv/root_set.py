"""The key roots a KV cache manager has seen (KeyRootSet), kept without a Python object per root.

A set of bytes held one 65-byte object per request for the whole run, each allocated at its
arrival among the request's short-lived objects: 1 M requests' roots pinned nearly every arena
of the heap after the requests were gone (benchmarks/memory.py: ~0.15 GB of RSS never given back
on a 200 k-request run). Here each root is its first 62 bits (a sha256 digest's: uniform) in an
open-addressing table of machine words.

Two roots with the same first 62 bits read as one: `in` may say True for a root never added,
never False for one added. The manager's only use (KVCacheManager.note_lookup) is then to end
private caching early, which changes no lookup's result (block_pool.py, "Private blocks"): the
answer stays exact, at odds of about n^2 / 2^63 of costing its speed-up.
"""

from __future__ import annotations

from array import array

_FIRST_SLOTS = 1024  # a power of two


def _word(root: bytes) -> int:
    """The root's first 62 bits (little-endian), assembled byte by byte: in the compiled build a
    machine int throughout (int.from_bytes is a generic method call, ~10x the cost, and a
    prefix-aware router's probe asks every replica's set at every decision)."""
    word = (root[0] | root[1] << 8 | root[2] << 16 | root[3] << 24 | root[4] << 32 | root[5] << 40
            | root[6] << 48 | (root[7] & 0x3F) << 56)
    return word if word else 1  # 0 marks an empty slot (1 and 0 read as one: a false positive only)


class KeyRootSet:
    """Roots added so far (add, `in`), as 64-bit words; at most half the slots are used."""

    __slots__ = ("_slots", "_mask", "_size")

    def __init__(self) -> None:
        self._slots = array("Q", bytes(8 * _FIRST_SLOTS))  # (bytes: the array's raw words)
        self._mask = _FIRST_SLOTS - 1
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, root: bytes) -> bool:
        word = _word(root)
        return self._slots[self._probe(word)] == word

    def add(self, root: bytes) -> bool:
        """Add root; True when it was not in the set (`in` and add in one probe)."""
        if 2 * (self._size + 1) > len(self._slots):
            self._grow()
        if self._insert(_word(root)):
            self._size += 1
            return True
        return False

    def _probe(self, word: int) -> int:
        """The slot holding `word`, or the empty slot where it would go (one always exists: at
        most half the slots are used)."""
        slots, mask = self._slots, self._mask
        i = word & mask
        while True:
            held = slots[i]
            if held == word or held == 0:
                return i
            i = (i + 1) & mask

    def _insert(self, word: int) -> bool:
        i = self._probe(word)
        if self._slots[i] == word:
            return False
        self._slots[i] = word
        return True

    def _grow(self) -> None:
        old = self._slots
        self._slots = array("Q", bytes(16 * len(old)))
        self._mask = len(self._slots) - 1
        for word in old:
            if word:
                self._insert(word)
