"""The P/D hand-off's cheap paths are exact: set_order of one id (or none) is that id, as the
hashed set walk gives it (scheduler/pyset.py), which mark_kv_sent / mark_kv_received take at
every transfer; the prefill side's spec is dataclasses.replace's, without its validation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servesim.scheduler import pyset
from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.simulator.cluster.pd_handoffs import prefill_spec
from servesim.traces.request_spec import RequestSpec


@pytest.mark.parametrize("ids", [(), ("azure-0",), ("",), ("é",), ("日本",), ("r" * 300,)])
def test_set_order_of_one_id_is_the_hashed_walk(ids):
    walked = pyset.set_order(list(ids))  # a list takes the hashed walk
    assert pyset.set_order(ids) == walked == list(ids)


def test_set_order_of_a_tuple_of_two_still_hashes():
    ids = ("b", "a", "b", "c", "a0", "zz")
    assert pyset.set_order(ids) == pyset.set_order(list(ids))
    assert sorted(pyset.set_order(ids)) == sorted(set(ids))


def test_prefill_spec_is_replace_with_one_output_token():
    """Every field set away from its default: the copy is replace's field for field, a new object,
    and the dispatched spec is left alone."""
    spec = RequestSpec("r-1", 2.5, 40, 7, prompt_token_ids=tuple(range(40)), prefix_group=3, prefix_len=16,
                       priority=2, session_id="s", is_last_turn=False, lora_id=1, timeout_s=9.0,
                       grammar_compile_ms=3.0, mm_items=(MultiModalFeatureSpec(offset=4, length=8, mm_hash="img"),),
                       tenant="t", slo_class="gold")
    copy = prefill_spec(spec)
    assert copy == replace(spec, output_len=1) and copy is not spec
    assert copy.output_len == 1 and spec.output_len == 7 and copy.mm_items is spec.mm_items
