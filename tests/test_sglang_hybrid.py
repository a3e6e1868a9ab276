"""SGLang's hybrid (Mamba) cache: MambaRadixCache by hand (states, tombstones, the two eviction
orders, locks), a property test of its accounting, the scheduler's state slots (admission, fork on
cache_unfinished, donation on finish, retraction), pool sizing (resolve_pools) and bad config."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from servesim.scheduler import ModelRunnerOutput, Request, SamplingParams
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.hybrid_config import MambaCacheConfig, resolve_pools
from servesim.scheduler.sglang.invariants import check_mamba, check_tree
from servesim.scheduler.sglang.mamba_radix_cache import MambaPool, MambaRadixCache
from servesim.scheduler.sglang.radix_cache import TokenToKVPool


def _cache(num_pages: int = 64, num_slots: int = 8) -> tuple[MambaRadixCache, TokenToKVPool, MambaPool]:
    pool, mpool = TokenToKVPool(num_pages, 1), MambaPool(num_slots)
    return MambaRadixCache(1, pool, mpool), pool, mpool


def _put(tree: MambaRadixCache, pool: TokenToKVPool, mpool: MambaPool, tokens: list[int]) -> tuple[int, bool]:
    """Insert tokens with fresh pages and a fresh state; frees what the tree did not take."""
    pages = pool.alloc(len(tokens))
    slot = mpool.alloc()
    already, exists = tree.insert_with_state(tokens, pages, None, slot)
    pool.free(pages[:already])
    if exists:
        mpool.free(slot)
    return already, exists


def _check(tree, mpool, lockers=()) -> None:
    check_tree(tree, list(lockers))
    check_mamba(tree, mpool, [], list(lockers))


# --- MambaRadixCache by hand ----------------------------------------------------------------------
def test_match_stops_at_the_deepest_node_with_a_state():
    tree, pool, mpool = _cache()
    assert _put(tree, pool, mpool, [1, 2, 3, 4, 5, 6]) == (0, False)
    node, n = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert n == 6 and node.mamba_slot == 0
    # A match ending inside the node splits it; the upper part has KV but no state: no hit.
    node, n = tree.match_prefix([1, 2, 3, 9])
    assert (node, n) == (tree.root, 0)
    assert tree.total_size() == 6 and tree.peek_prefix([1, 2, 3, 9]) == 0
    # Caching the shorter sequence gives the split node (a tombstone) a state: now it is a hit.
    assert _put(tree, pool, mpool, [1, 2, 3]) == (3, False)
    assert tree.match_prefix([1, 2, 3, 9])[1] == 3
    # The same end again: the state exists, the caller keeps (and frees) its slot.
    assert _put(tree, pool, mpool, [1, 2, 3]) == (3, True)
    assert (mpool.available_size(), tree.mamba_evictable_size(), tree.mamba_protected_size()) == (6, 2, 0)
    _check(tree, mpool)


def test_evicting_an_inner_state_leaves_a_tombstone_and_kv():
    tree, pool, mpool = _cache()
    _put(tree, pool, mpool, [1, 2, 3])
    _put(tree, pool, mpool, [1, 2, 3, 4, 5])
    _put(tree, pool, mpool, [1, 2, 3, 7, 8])
    tree.match_prefix([1, 2, 3, 4, 5, 0])  # the path to [4, 5] is the most recent
    # State eviction: [7, 8] is least recent -> a leaf, evicted whole (KV and state).
    assert tree.evict_mamba(1) == 1
    assert tree.total_size() == 5 and pool.available_size() == 64 - 5
    # Next: the inner node [1, 2, 3] (touched with its child, nearer the root): a tombstone.
    assert tree.evict_mamba(1) == 1
    assert tree.total_size() == 5 and mpool.available_size() == 7
    assert tree.match_prefix([1, 2, 3, 9])[1] == 0  # its KV is there but no state to resume from
    assert tree.match_prefix([1, 2, 3, 4, 5, 9])[1] == 5
    _check(tree, mpool)


def test_kv_eviction_of_a_leaf_deletes_the_tombstones_above_it():
    tree, pool, mpool = _cache()
    _put(tree, pool, mpool, [1, 2])
    _put(tree, pool, mpool, [1, 2, 3, 4])
    tree.match_prefix([1, 2, 3, 4, 9])
    node = tree.match_prefix([1, 2, 9])[0]  # touches [1, 2] only: [3, 4] is now the older
    assert tree.match_prefix([1, 2, 3, 4, 9])[1] == 4  # both equally recent again
    tree.evict_mamba(1)  # equals: the one nearer the root goes first
    assert node.mamba_slot is None and node.children
    assert tree.evict(1) == 4  # the leaf [3, 4] and the tombstone [1, 2] it leaves childless
    assert tree.total_size() == 0 and pool.available_size() == 64 and mpool.available_size() == 8
    _check(tree, mpool)


def test_locked_states_and_paths_are_not_evicted():
    tree, pool, mpool = _cache()
    _put(tree, pool, mpool, [1, 2, 3])
    _put(tree, pool, mpool, [5, 6])
    node, n = tree.match_prefix([1, 2, 3, 4])
    tree.inc_lock_ref(node)
    assert (tree.mamba_protected_size(), tree.mamba_evictable_size()) == (1, 1)
    assert tree.evict_mamba(5) == 1 and tree.evict(10) == 0  # only [5, 6] could go
    assert node.mamba_slot is not None and tree.total_size() == 3
    _check(tree, mpool, [node])
    tree.dec_lock_ref(node)
    assert tree.evict(10) == 3 and mpool.available_size() == 8
    _check(tree, mpool)


def test_a_split_keeps_the_lock_on_the_node_that_holds_the_state():
    tree, pool, mpool = _cache()
    _put(tree, pool, mpool, [1, 2, 3, 4])
    node, _ = tree.match_prefix([1, 2, 3, 4, 5])
    tree.inc_lock_ref(node)
    tree.match_prefix([1, 2, 9])  # splits [1, 2, 3, 4] at 2
    upper = node.parent
    assert (upper.mamba_slot, upper.mamba_lock_ref, upper.lock_ref) == (None, 0, 1)
    assert (node.mamba_lock_ref, node.lock_ref) == (1, 1)
    _check(tree, mpool, [node])
    tree.dec_lock_ref(node)
    _check(tree, mpool)


class MambaCacheMachine(RuleBasedStateMachine):
    """Random inserts, locked matches, unlocks and both evictions: slots and pages conserved,
    sizes and locks consistent, no locked state freed."""

    def __init__(self) -> None:
        super().__init__()
        self.tree, self.pool, self.mpool = _cache(num_pages=400, num_slots=40)
        self.locked: list = []

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=8))
    def insert(self, tokens):
        if self.pool.available_size() >= len(tokens) and self.mpool.available_size() >= 1:
            _put(self.tree, self.pool, self.mpool, tokens)

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=8))
    def lock(self, tokens):
        node, n = self.tree.match_prefix(tokens)
        assert node is self.tree.root or node.mamba_slot is not None
        self.tree.inc_lock_ref(node)
        self.locked.append((node, node.mamba_slot))

    @rule(i=st.integers(0, 50))
    def unlock(self, i):
        if self.locked:
            node, _ = self.locked.pop(i % len(self.locked))
            self.tree.dec_lock_ref(node)

    @rule(n=st.integers(1, 10))
    def evict(self, n):
        self.tree.evict(n)

    @rule(n=st.integers(1, 4))
    def evict_mamba(self, n):
        self.tree.evict_mamba(n)

    @invariant()
    def consistent(self):
        lockers = [n for n, _ in self.locked]
        nodes = check_tree(self.tree, lockers)
        check_mamba(self.tree, self.mpool, [], lockers)
        pages = [p for node in nodes for p in node.value] + list(self.pool.free_pages)
        assert sorted(pages) == list(range(1, 401))
        for node, slot in self.locked:  # a locked state is never freed or replaced
            assert node.mamba_slot == slot


TestMambaCacheMachine = MambaCacheMachine.TestCase
TestMambaCacheMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# --- the scheduler ----------------------------------------------------------------------------------
BASE = dict(max_running_requests=4, chunked_prefill_size=64, enable_chunked_prefill=True, page_size=1,
            max_total_tokens=1000, enable_radix_cache=True, overlap_schedule=False, seed=0)


def make_sched(slots: int = 12, **kw) -> SGLangScheduler:
    mamba = MambaCacheConfig(num_mamba_layers=2, max_mamba_cache_size=slots)
    return SGLangScheduler(SGLangConfig(**{**BASE, **kw}, mamba=mamba), 4096)


def req(rid: str, tokens: list[int], max_tokens: int = 3) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def step(sched: SGLangScheduler, token: int = 7):
    so = sched.schedule()
    sched.check_invariants()
    ids = list(so.num_scheduled_tokens)
    sampled = [[] if sched.requests[r].is_prefill_chunk else [token] for r in ids]
    sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled))
    sched.check_invariants()
    return so


def run_to_end(sched: SGLangScheduler) -> None:
    for _ in range(1000):
        if not sched.has_unfinished_requests():
            return
        step(sched)
    raise AssertionError("did not finish")


def _slots(sched: SGLangScheduler) -> tuple[int, int, int]:
    """(free slots, states in the tree, states held by requests)."""
    mem = sched.kv_cache_manager
    return mem.mamba_pool.available_size(), len(mem.mamba_tree.mamba_nodes), len(mem.reqs)


def test_a_request_holds_a_state_forks_one_at_prefill_end_and_donates_its_own_at_finish():
    sched = make_sched()
    prompt = list(range(100, 110))
    sched.add_request(req("a", prompt))
    step(sched)  # prefill: its own slot, and a forked copy cached at the prompt's end
    assert _slots(sched) == (10, 1, 1)
    run_to_end(sched)  # finished: its own state cached at prompt + outputs - 1 = 12 tokens
    assert _slots(sched) == (10, 2, 0)
    # A follow-up turn resumes from the 12-token state; the same prompt alone cannot (its match
    # is capped at 9 tokens, which ends inside a node without a state).
    sched.add_request(req("b", prompt + [7, 7, 7, 200]))
    sched.add_request(req("c", prompt))
    so = step(sched)
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {"b": 12, "c": 0}
    assert so.num_scheduled_tokens == {"b": 2, "c": 10}
    run_to_end(sched)


def test_a_chunked_prefill_caches_a_state_at_each_chunk_end():
    sched = make_sched(chunked_prefill_size=8)
    sched.add_request(req("a", list(range(100, 120)), max_tokens=1))
    step(sched)
    assert _slots(sched) == (11, 0, 1)
    step(sched)  # its schedule() cached the first chunk: a forked state at 8 tokens
    assert _slots(sched) == (10, 1, 1)
    step(sched)  # a state at 16; the last chunk samples its only token: its own state at 20
    assert _slots(sched) == (9, 3, 0)
    tree = sched.kv_cache_manager.mamba_tree
    assert [tree.peek_prefix(list(range(100, 100 + n))) for n in (7, 9, 17, 21)] == [0, 8, 16, 20]


def test_admission_waits_for_a_state_slot_and_evicts_cached_states_lru():
    sched = make_sched(slots=3, max_running_requests=1)
    mem = sched.kv_cache_manager
    held = [mem.mamba_pool.alloc() for _ in range(3)]  # every slot taken (held elsewhere)
    sched.add_request(req("a", list(range(100, 110))))
    assert sched.schedule().num_scheduled_tokens == {} and sched.waiting[0].request_id == "a"
    for slot in held:
        mem.mamba_pool.free(slot)
    run_to_end(sched)
    assert _slots(sched) == (1, 2, 0)  # states at 10 (forked) and 12 (donated) tokens
    sched.add_request(req("b", list(range(200, 210))))
    run_to_end(sched)  # b's fork evicted a's oldest state (the inner node at 10: a tombstone)
    assert _slots(sched) == (0, 3, 0)
    tree = mem.mamba_tree
    a_seq, b_seq = list(range(100, 110)) + [7, 7, 7], list(range(200, 210)) + [7, 7, 7]
    assert [tree.peek_prefix(a_seq[:11]), tree.peek_prefix(a_seq), tree.peek_prefix(b_seq)] == [0, 12, 12]
    sched.add_request(req("c", list(range(300, 310))))
    assert step(sched).num_scheduled_tokens == {}  # finished b still fills the batch until filtered
    step(sched)  # c's own slot and fork: a's last state (a leaf) goes whole, then b's at 10
    assert tree.peek_prefix(a_seq) == 0 and tree.total_size() == 12 + 10
    run_to_end(sched)


def test_retraction_frees_the_request_state():
    sched = make_sched(max_total_tokens=170, chunked_prefill_size=200, new_token_ratio_decay_steps=1,
                       max_running_requests=3, slots=9)
    sched.add_request(req("a", [1] * 20, max_tokens=100))
    for _ in range(4):
        step(sched)
    sched.add_request(req("b", [2] * 22, max_tokens=40))
    sched.add_request(req("c", [3] * 24, max_tokens=40))
    run_to_end(sched)  # invariants (slot accounting included) checked at every step
    assert sched.num_retractions_total > 0
    mem = sched.kv_cache_manager
    assert mem.mamba_pool.available_size() + len(mem.mamba_tree.mamba_nodes) == 9


def test_without_the_radix_cache_only_requests_hold_states():
    sched = make_sched(slots=4, enable_radix_cache=False, page_size=16, max_total_tokens=1600,
                       chunked_prefill_size=256)
    for rid in "abcd":
        sched.add_request(req(rid, [ord(rid)] * 20))
    step(sched)
    mem = sched.kv_cache_manager
    assert mem.mamba_tree is None and mem.mamba_pool.available_size() == 0
    run_to_end(sched)
    assert mem.mamba_pool.available_size() == 4


# --- pool sizing and bad config -----------------------------------------------------------------------
def test_resolve_pools_splits_memory_by_the_ratio_and_caps_running_requests():
    mamba = MambaCacheConfig(num_mamba_layers=36, mamba_cache_per_req_bytes=100_000, kv_bytes_per_token=1000)
    cfg = resolve_pools(SGLangConfig(**{**BASE, "max_total_tokens": 10_000, "max_running_requests": 256}, mamba=mamba))
    # rest 10 MB: states 10e6 * 0.9 / 1.9 -> 47 slots (4.7 MB), KV the other 5.3 MB: 5300 tokens
    assert (cfg.mamba.max_mamba_cache_size, cfg.max_total_tokens, cfg.max_running_requests) == (47, 5300, 15)
    # MTP with 2 steps: 8 requests x 3 verify states reserved first (2.4 MB), and KV headroom for
    # 8 x (2 draft + 3 verify) tokens + 100.
    cfg = resolve_pools(SGLangConfig(**{**BASE, "max_total_tokens": 10_000, "max_running_requests": 8},
                                     mamba=mamba, speculative_num_steps=2))
    assert (cfg.mamba.max_mamba_cache_size, cfg.max_total_tokens, cfg.max_running_requests) == (36, 4140, 8)
    explicit = MambaCacheConfig(num_mamba_layers=36, max_mamba_cache_size=30)
    cfg = resolve_pools(SGLangConfig(**{**BASE, "max_running_requests": 64}, mamba=explicit))
    assert (cfg.mamba.max_mamba_cache_size, cfg.max_total_tokens, cfg.max_running_requests) == (30, 1000, 10)
    cfg = resolve_pools(SGLangConfig(**{**BASE, "enable_radix_cache": False}, mamba=MambaCacheConfig(num_mamba_layers=1)))
    assert cfg.mamba.max_mamba_cache_size == 4  # one state per running request


def test_bad_hybrid_config_is_refused_with_reasons():
    with pytest.raises(ValueError, match="Page size must be 1 for MambaRadixCache"):
        make_sched(page_size=16, max_total_tokens=1600)
    with pytest.raises(ValueError, match="unresolved"):
        SGLangScheduler(SGLangConfig(**BASE, mamba=MambaCacheConfig(num_mamba_layers=1)), 4096)
    with pytest.raises(ValueError, match="needs 3 Mamba states each"):
        make_sched(slots=11)
    with pytest.raises(ValueError, match="needs sglang.mamba.max_mamba_cache_size"):
        resolve_pools(SGLangConfig(**BASE, mamba=MambaCacheConfig(num_mamba_layers=1)))
    with pytest.raises(ValueError, match="too small"):
        resolve_pools(SGLangConfig(**BASE, mamba=MambaCacheConfig(num_mamba_layers=1, max_mamba_cache_size=2)))
    with pytest.raises(ValueError, match="host tier of MambaRadixCache"):
        SGLangConfig(mamba={"num_mamba_layers": 1}, hicache={"enable_hierarchical_cache": True})
    with pytest.raises(ValueError, match="mamba_full_memory_ratio must be > 0"):
        MambaCacheConfig(mamba_full_memory_ratio=0)
    with pytest.raises(TypeError, match="num_mamba_layer"):
        SGLangConfig(mamba={"num_mamba_layer": 1})


def test_overrides_reach_the_nested_mamba_config_with_the_same_checks():
    from servesim.simulator.config import SimConfig
    from servesim.simulator.config_values import apply_overrides
    from servesim.traces.errors import InputError

    cfg = apply_overrides(SimConfig(engine="sglang"), {"sglang.mamba.num_mamba_layers": "36",
                                                       "sglang.mamba.max_mamba_cache_size": "96"})
    assert (cfg.sglang.mamba.num_mamba_layers, cfg.sglang.mamba.max_mamba_cache_size) == (36, 96)
    with pytest.raises(InputError, match="did you mean num_mamba_layers"):
        apply_overrides(SimConfig(engine="sglang"), {"sglang.mamba.num_mamba_layer": "36"})
    with pytest.raises(InputError, match="sglang.mamba.mamba_full_memory_ratio"):
        apply_overrides(SimConfig(engine="sglang"), {"sglang.mamba.mamba_full_memory_ratio": "-1"})
    with pytest.raises(InputError, match="sglang.speculative_eagle_topk"):
        apply_overrides(SimConfig(engine="sglang"), {"sglang.speculative_eagle_topk": "4"})


def test_the_engine_fills_kv_bytes_from_the_model_and_splits_the_memory():
    from servesim.scheduler import CacheConfig, SchedulerConfig
    from servesim.simulator.config import SimConfig
    from servesim.simulator.scheduler_kinds import make_engine_scheduler

    mamba = MambaCacheConfig(num_mamba_layers=36, mamba_cache_per_req_bytes=131072 * 1000)
    cfg = SimConfig(engine="sglang", scheduler=SchedulerConfig(max_num_seqs=64),
                    cache=CacheConfig(block_size=16, num_gpu_blocks=1001), derive_num_gpu_blocks=False,
                    sglang=SGLangConfig(page_size=1, mamba=mamba))
    sched = make_engine_scheduler("sglang", cfg.scheduler, cfg.cache, cfg)
    # llama-3.1-8b: 131072 B of KV per token, so a state is 1000 tokens' worth; 16000 tokens of
    # memory: 16000 * 0.9 / 1.9 = 7578.9 -> 7 states, 9000 KV tokens, 7 // 3 = 2 running requests
    c = sched.config
    assert (c.mamba.kv_bytes_per_token, c.mamba.max_mamba_cache_size, c.max_total_tokens,
            c.max_running_requests) == (131072, 7, 9000, 2)


def test_a_hybrid_model_fills_the_mamba_pool_from_its_spec():
    """Qwen3-Next-80B-A3B at TP 4: 36 Gated DeltaNet layers (one full-attention layer in four), each
    request's state = 36 x one layer's conv + temporal state on one GPU; KV bytes from the 12
    attention layers. A text model stays as it is; set values win."""
    from servesim.simulator.config import HardwareConfig
    from servesim.simulator.scheduler_kinds.sglang import resolve_mamba
    from servesim.simulator.specs import kv_bytes_per_token, resolve_model

    hw = HardwareConfig(model="qwen3-next-80b-a3b", gpu="h100", tp=4)
    model = resolve_model(hw.model)
    m = resolve_mamba(SGLangConfig(page_size=1), hw).mamba
    assert m.num_mamba_layers == model.count_layers("mamba") == 36
    assert m.mamba_cache_per_req_bytes == 36 * model.linear_attention.state_bytes(4, model.dtype_bytes)
    assert m.kv_bytes_per_token == kv_bytes_per_token(model, 4) > 0
    text = HardwareConfig(model="llama-3.1-8b", gpu="h100")
    assert not resolve_mamba(SGLangConfig(), text).mamba.enabled
    given = SGLangConfig(page_size=1, mamba=MambaCacheConfig(num_mamba_layers=2, mamba_cache_per_req_bytes=1000))
    assert resolve_mamba(given, hw).mamba.mamba_cache_per_req_bytes == 1000
