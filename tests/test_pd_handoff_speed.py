"""The P/D hand-off's cheap paths are exact: set_order of one id (or none) is that id, as the
hashed set walk gives it (scheduler/pyset.py), which mark_kv_sent / mark_kv_received take at
every transfer."""

from __future__ import annotations

import pytest

from servesim.scheduler import pyset


@pytest.mark.parametrize("ids", [(), ("azure-0",), ("",), ("é",), ("日本",), ("r" * 300,)])
def test_set_order_of_one_id_is_the_hashed_walk(ids):
    walked = pyset.set_order(list(ids))  # a list takes the hashed walk
    assert pyset.set_order(ids) == walked == list(ids)


def test_set_order_of_a_tuple_of_two_still_hashes():
    ids = ("b", "a", "b", "c", "a0", "zz")
    assert pyset.set_order(ids) == pyset.set_order(list(ids))
    assert sorted(pyset.set_order(ids)) == sorted(set(ids))
