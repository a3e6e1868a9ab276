"""KeyRootSet (scheduler/kv/root_set.py): the key roots a KV cache manager has seen, as words."""

from __future__ import annotations

import hashlib

from servesim.scheduler.kv.root_set import KeyRootSet, _word


def _root(i: int) -> bytes:
    return hashlib.sha256(i.to_bytes(8, "little")).digest()


def test_every_root_added_is_in_and_others_are_not():
    roots = KeyRootSet()
    added = [_root(i) for i in range(5000)]  # past several doublings of the first 1024 slots
    for r in added:
        assert r not in roots
        roots.add(r)
        assert r in roots
    assert len(roots) == 5000
    assert all(r in roots for r in added)
    assert not any(_root(i) in roots for i in range(5000, 10000))
    roots.add(added[7])  # adding again changes nothing
    assert len(roots) == 5000


def test_roots_equal_in_their_first_eight_bytes_read_as_one():
    """A false positive only (the manager then ends private caching early: no lookup changes)."""
    roots = KeyRootSet()
    roots.add(b"\x01" * 8 + b"a" * 24)
    assert b"\x01" * 8 + b"b" * 24 in roots
    zero = bytes(32)  # the empty-slot word: held as 1
    roots.add(zero)
    assert zero in roots and b"\x01" + bytes(31) in roots and len(roots) == 2


def test_a_word_is_the_roots_first_62_bits():
    """Little-endian, so roots differing only in the top two bits of their eighth byte read as one
    (a false positive, as above)."""
    for i in range(3000):
        r = _root(i)
        assert _word(r) == (int.from_bytes(r[:8], "little") & ((1 << 62) - 1) or 1)
    roots = KeyRootSet()
    roots.add(b"\x05" * 7 + b"\x01" + bytes(24))
    assert b"\x05" * 7 + b"\xc1" + bytes(24) in roots
    assert b"\x05" * 7 + b"\x02" + bytes(24) not in roots
