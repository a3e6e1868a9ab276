"""SGLang radix cache: unit cases and a hypothesis state machine over insert/match/lock/evict."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from servesim.scheduler.sglang.invariants import check_tree
from servesim.scheduler.sglang.radix_cache import RadixCache, TokenToKVPool


def _cache(num_pages: int = 64, page_size: int = 1) -> tuple[RadixCache, TokenToKVPool]:
    pool = TokenToKVPool(num_pages, page_size)
    return RadixCache(page_size, pool), pool


def _put(tree: RadixCache, pool: TokenToKVPool, tokens: list[int], extra=None) -> int:
    """Insert like cache_finished_req: fresh pages, duplicates of cached pages freed again."""
    ps = tree.page_size
    n_pages = len(tokens) // ps
    pages = pool.alloc(n_pages)
    already = tree.insert(tokens, pages, extra)
    pool.free(pages[:already // ps])
    return already


def test_insert_then_match_returns_the_full_length_and_pages():
    tree, pool = _cache()
    assert _put(tree, pool, [1, 2, 3, 4]) == 0
    node, n = tree.match_prefix([1, 2, 3, 4, 9])
    assert n == 4 and tuple(node.key) == (1, 2, 3, 4) and tree.path_pages(node) == node.value and len(node.value) == 4
    assert _put(tree, pool, [1, 2, 3, 4, 5]) == 4  # the first 4 were cached already


def test_partial_match_splits_the_node():
    tree, pool = _cache()
    _put(tree, pool, [1, 2, 3, 4])
    node, n = tree.match_prefix([1, 2, 7])
    assert n == 2 and tuple(node.key) == (1, 2) and len(node.children) == 1
    child = next(iter(node.children.values()))
    assert tree.path_pages(child) == node.value + child.value
    assert tree.total_size() == 4 and tree.evictable_size() == 4
    check_tree(tree, [])


def test_pages_match_whole_pages_only():
    tree, pool = _cache(page_size=4)
    assert _put(tree, pool, list(range(10))) == 0  # 8 tokens cached, the last 2 are not a page
    assert tree.total_size() == 8
    _, n = tree.match_prefix(list(range(7)) + [99])
    assert n == 4  # the second page differs in its last token: whole pages only
    _, n = tree.match_prefix(list(range(12)))
    assert n == 8


def test_extra_key_namespaces_entries():
    tree, pool = _cache()
    _put(tree, pool, [1, 2, 3], extra=("lora", 1))
    assert tree.match_prefix([1, 2, 3])[1] == 0
    assert tree.match_prefix([1, 2, 3], ("lora", 1))[1] == 3


def test_locks_protect_the_path_and_eviction_is_lru():
    tree, pool = _cache(num_pages=16)
    _put(tree, pool, [1, 2, 3, 4])  # older
    _put(tree, pool, [5, 6])
    _put(tree, pool, [7, 8, 9])
    node, _ = tree.match_prefix([7, 8, 9])  # touch: now the most recent
    tree.inc_lock_ref(node)
    assert tree.protected_size() == 3 and tree.evictable_size() == 6
    assert tree.evict(1) == 4  # the least recently used leaf goes first, whole
    assert tree.match_prefix([1, 2, 3, 4])[1] == 0 and tree.match_prefix([5, 6])[1] == 2
    assert tree.evict(100) == 2  # the locked node survives any amount
    assert tree.match_prefix([7, 8, 9])[1] == 3
    assert len(pool.free_pages) == 16 - 3
    tree.dec_lock_ref(node)
    assert tree.evictable_size() == 3 and tree.protected_size() == 0
    with pytest.raises(RuntimeError):
        tree.dec_lock_ref(node)


def test_evicting_a_leaf_makes_its_unlocked_parent_evictable():
    tree, pool = _cache()
    _put(tree, pool, [1, 2, 3, 4])
    _put(tree, pool, [1, 2, 5, 6])  # splits: (1,2) -> (3,4), (5,6)
    assert tree.evict(6) == 6
    assert tree.total_size() == 0 and len(pool.free_pages) == 64


class FreshHeapTree(RadixCache):
    """The reference eviction: a heap of every unlocked leaf built afresh at each call (SGLang's
    own evict), which the tree's kept order (RadixCache._offer) must reproduce exactly."""

    def evict(self, num_tokens: int) -> int:
        heap = [(n.last_access, n.id, n) for n in self._leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[2]
            if node.lock_ref > 0 or node.children:
                continue
            if self.pool is not None:
                self.pool.free(node.value)
            freed += len(node.key)
            self._delete_leaf(node)
            parent = node.parent
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed


def _shape(tree: RadixCache) -> list:
    return sorted((n.id, tuple(n.key), tuple(n.value), n.lock_ref, n.last_access) for n in tree.nodes())


class RadixMachine(RuleBasedStateMachine):
    """Random inserts (small alphabet: lots of shared prefixes), matches, locks and evictions, on
    the tree and on a twin evicting by the reference (FreshHeapTree): both stay identical."""

    def __init__(self) -> None:
        super().__init__()
        self.page_size = 2
        self.pool = TokenToKVPool(40, self.page_size)
        self.tree = RadixCache(self.page_size, self.pool)
        self.users: list = []  # locked nodes, one entry per user
        self.ref_pool = TokenToKVPool(40, self.page_size)
        self.ref = FreshHeapTree(self.page_size, self.ref_pool)
        self.ref_users: list = []

    tokens = st.lists(st.integers(0, 2), min_size=0, max_size=12)

    @rule(tokens=tokens)
    def insert(self, tokens):
        ps = self.page_size
        need = len(tokens) // ps
        for tree, pool in ((self.tree, self.pool), (self.ref, self.ref_pool)):
            if need > len(pool.free_pages):
                tree.evict((need - len(pool.free_pages)) * ps)
            pages = pool.alloc(need)
            if pages is None:
                continue  # everything left is locked
            already = tree.insert(tokens, pages)
            pool.free(pages[:already // ps])
            # Match after insert returns the full (page-aligned) length.
            node, n = tree.match_prefix(tokens)
            assert n == need * ps and len(tree.path_pages(node)) == need

    @rule(tokens=tokens)
    def lock(self, tokens):
        for tree, users in ((self.tree, self.users), (self.ref, self.ref_users)):
            node, _ = tree.match_prefix(tokens)
            if node is not tree.root:
                tree.inc_lock_ref(node)
                users.append(node)

    @precondition(lambda self: self.users)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        self.tree.dec_lock_ref(self.users.pop(i % len(self.users)))
        self.ref.dec_lock_ref(self.ref_users.pop(i % len(self.ref_users)))

    @rule(n=st.integers(0, 30))
    def evict(self, n):
        locked = [(node, node.key) for node in self.tree.nodes() if node.lock_ref > 0]
        before = self.tree.evictable_size()
        freed = self.tree.evict(n)
        assert freed == self.ref.evict(n)
        assert freed <= before and (freed >= n or self.tree.evictable_size() == 0)
        alive = set(map(id, self.tree.nodes()))
        assert all(id(node) in alive and node.key == key for node, key in locked)  # never a locked node

    @invariant()
    def consistent(self):
        check_tree(self.tree, self.users)  # lock counts == users on the path; sizes add up
        assert self.tree.evictable_size() + self.tree.protected_size() == self.tree.total_size()
        assert all(n.lock_ref >= 0 for n in self.tree.nodes())
        tree_pages = [p for n in self.tree.nodes() for p in n.value]
        assert sorted(tree_pages + list(self.pool.free_pages)) == list(range(1, self.pool.num_pages + 1))
        assert _shape(self.tree) == _shape(self.ref) and list(self.pool.free_pages) == list(self.ref_pool.free_pages)


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_keys_are_compact_arrays_and_ids_beyond_int32_still_match():
    """Keys are arrays (requests' ids as they hold them, no tuple of Python ints); a list with an id
    beyond int32 becomes an int64 array, which matches int32 ones by value."""
    from array import array

    from servesim.scheduler.sglang.radix_cache import as_key

    assert as_key([1, 2]).typecode == "i" and as_key([1, 2 ** 40]).typecode == "q"
    with pytest.raises(ValueError, match="int64"):
        as_key([2 ** 70])
    tree, pool = _cache()
    _put(tree, pool, [1, 2, 3, 4])
    assert tree.match_prefix(array("q", [1, 2, 3, 4]))[1] == 4
    assert tree.peek_prefix((1, 2, 9)) == 2
    _put(tree, pool, [1, 2, 2 ** 40, 5])  # splits the first node after two tokens
    node, n = tree.match_prefix(array("i", [1, 2, 3, 4]))
    assert n == 4 and tuple(node.key) == (3, 4)
    node, n = tree.match_prefix([1, 2, 2 ** 40, 5, 6])
    assert n == 4 and tuple(node.key) == (2 ** 40, 5) and node.key.typecode == "q"
