"""KVDecodeRuns.admission_surely_fits: the no-lookup bound a run proof uses to give up on a waiting
head that will be admitted. Whenever it answers True, the lookup-based decision it replaces
(admission_fails, can_fit_full_sequence) must admit the head too, whatever its prefix hit:
checked on pools churned by shared-prefix requests, tight enough that many heads are refused."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sched_helpers import make_sched, req, step
from servesim.scheduler.bulk.kv import KVDecodeRuns


@settings(max_examples=60, deadline=None)
@given(num_blocks=st.integers(8, 40),
       prompts=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 60)), min_size=2, max_size=12),
       num_steps=st.integers(0, 12), reserve=st.booleans())
def test_surely_fits_never_contradicts_the_lookup(num_blocks, prompts, num_steps, reserve):
    sched = make_sched(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=32, max_model_len=128,
                       scheduler_reserve_full_isl=reserve)
    kv = KVDecodeRuns(sched.kv_cache_manager)
    kvm = sched.kv_cache_manager
    for i, (prefix, n) in enumerate(prompts):  # four shared 16-token prefixes: hits on cached blocks
        sched.add_request(req(sched, f"r{i}", [100 * prefix + t for t in range(16)] + [5000 + 97 * i + t for t in range(n)],
                              max_tokens=4))
        if i % 3 == 2:
            for _ in range(num_steps // 4 + 1):
                step(sched)
    for _ in range(num_steps):
        for head in list(sched.waiting):
            if kvm.num_blocks_held(head.request_id) or not kv.admission_surely_fits(head):
                continue
            hit, num_hit = kvm.peek_computed_blocks(head)
            for budget in (1, 7, 32):
                num_new = min(head.num_tokens - num_hit, budget)
                assert not kv.admission_fails(head, num_new, hit, num_hit, reserve)
            assert kvm.can_fit_full_sequence(head, num_hit, hit)
        step(sched)


def test_surely_fits_is_the_whole_prompts_blocks():
    """8 free blocks of 4 tokens: a 32-token prompt surely fits, a 33-token one is not proven."""
    sched = make_sched(num_blocks=9, block_size=4)  # one block is the null block
    kv = KVDecodeRuns(sched.kv_cache_manager)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 8
    assert kv.admission_surely_fits(req(sched, "a", 32))
    assert not kv.admission_surely_fits(req(sched, "b", 33))


def test_a_hit_on_evictable_blocks_still_fits():
    """The head hits 4 cached blocks of a finished request, all on the free queue (taking them
    counts as allocating them): 8 free blocks still cover its 8-block prompt, as the bound says."""
    sched = make_sched(num_blocks=9, block_size=4, max_num_batched_tokens=64)
    kv = KVDecodeRuns(sched.kv_cache_manager)
    kvm = sched.kv_cache_manager
    shared = list(range(200, 216))
    sched.add_request(req(sched, "a", shared + [1, 2], max_tokens=1))
    while sched.has_unfinished_requests():
        step(sched)
    head = req(sched, "b", shared + list(range(300, 316)))
    sched.add_request(head)
    hit, num_hit = kvm.peek_computed_blocks(head)
    assert num_hit == 16 and all(b.ref_cnt == 0 for b in hit.blocks[0])
    assert kv.admission_surely_fits(head)
    assert not kv.admission_fails(head, head.num_tokens - num_hit, hit, num_hit, True)
