"""SGLang's KV memory: a token-slot pool handed out in pages, and the radix-tree prefix cache.

Block ids. SGLang's KV is token-granular (`TokenToKVPool`, one slot per token; with page_size > 1
slots come in aligned pages). Our SchedulerOutput speaks in block ids, so the pool hands out whole
pages and reports a page id as the "block id": page p holds token slots [p * page_size,
(p + 1) * page_size). With page_size == cache.block_size (the default mapping) a page id means
exactly what a vLLM block id means to the executors; with page_size 1 every token slot is a block.
Page 0 is never handed out (SGLang reserves slot 0 for padding; vLLM reserves block 0 as its null
block), so ids start at 1.

The tree. Keys are token ids, matched in whole pages: a child is found by its first page of
tokens (namespaced by an extra key: LoRA id and cache salt), and a partial match splits the node
so the matched part is a node of its own. A tree may instead be keyed by page keys (`key_tokens`
> 1): one element per page, each the prefix-cache key of the page and everything before it (a
vLLM block key: scheduler/block_keys.py), so two pages' keys are equal exactly when the tokens up
to their ends are; it matches, splits and evicts at the same page boundaries as a token tree over
those ids, and counts sizes in tokens alike. Each node holds the pages of its tokens. Nodes used by
running requests are locked (lock_ref counts the requests whose matched path goes through the
node; inc/dec walk up to the root); unlocked leaves are evicted least-recently-used first.
evictable_size + protected_size is always the number of tokens in the tree.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections import deque
from collections.abc import Hashable, Sequence
from typing import cast


class TokenToKVPool:
    """Free KV pages (SGLang's TokenToKVPoolAllocator at page granularity)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need >= 1 page of >= 1 token, got {num_pages} pages of {page_size}")
        self.page_size = page_size
        self.num_pages = num_pages  # usable pages; ids 1..num_pages
        # FIFO reuse: freed pages go to the back (deterministic; SGLang appends freed slots too).
        self.free_pages: deque[int] = deque(range(1, num_pages + 1))

    def available_size(self) -> int:
        """Free tokens (whole free pages)."""
        return len(self.free_pages) * self.page_size

    def alloc(self, num_pages: int) -> list[int] | None:
        if num_pages > len(self.free_pages):
            return None
        return [self.free_pages.popleft() for _page in range(num_pages)]

    def free(self, pages: Sequence[int]) -> None:
        self.free_pages.extend(pages)


class TreeNode:
    __slots__ = ("id", "key", "value", "children", "parent", "lock_ref", "last_access", "extra",
                 "host_value", "hit_count", "loading", "evicted", "mamba_slot", "mamba_lock_ref")

    def __init__(self, node_id: int, key: Sequence[Hashable] = (), value: list[int] | None = None,
                 parent: TreeNode | None = None, extra: Hashable = None) -> None:
        self.id = node_id
        self.key = key  # key elements of this edge (tokens, or page keys); a whole number of pages
        self.value = value if value is not None else []  # page ids, len(key) // page_size
        self.children: dict[tuple, TreeNode] = {}  # (extra, first page of tokens) -> child
        self.parent = parent
        self.lock_ref = 0  # requests whose matched path runs through this node
        self.last_access = 0  # logical clock (no wall clock in scheduler/): LRU order
        self.extra = extra
        # HiCache (hiradix_cache.py) only: the host copy's pages (None: not backed up), the hits
        # counted toward a selective write-through, a load from host in flight, and whether the
        # device copy is gone (value is then empty; the node lives on host only).
        self.host_value: list[int] | None = None
        self.hit_count = 0
        self.loading = False
        self.evicted = False
        # MambaRadixCache (mamba_radix_cache.py) only: the Mamba pool slot holding the recurrent
        # state after this node's last token (None: none, a "tombstone" when the node has
        # children), and the requests that copy their state from it (locked: not evictable).
        self.mamba_slot: int | None = None
        self.mamba_lock_ref = 0

    def up(self) -> TreeNode:
        """The parent: every node in a tree but the root has one (the root's parent is None)."""
        parent = self.parent
        assert parent is not None, f"{self!r} has no parent (the root)"
        return parent

    def __hash__(self) -> int:
        # Written out: a compiled class defining __lt__ does not inherit object's hash. The id is
        # unique in its tree and never changes (equality stays identity).
        return self.id

    def __lt__(self, other: TreeNode) -> bool:  # heap tie-break: older access, then creation
        return (self.last_access, self.id) < (other.last_access, other.id)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, tokens={len(self.key)}, lock_ref={self.lock_ref})"


def as_key(tokens: Sequence[int]) -> array:
    """Token ids as a tree key: a compact array (a slice copies raw ints, == compares them in C;
    a tuple of Python ints costs ~200x more to build and ~30x more to compare). array('i') as
    requests hold their ids, array('q') for ids beyond int32 (arrays of different typecodes
    still compare by value). The caller passes its own copy (a slice): keys are never aliased."""
    if type(tokens) is array:
        return tokens
    try:
        return array("i", tokens)
    except OverflowError:
        pass
    try:
        return array("q", tokens)
    except OverflowError:
        raise ValueError("token ids must fit int64 (traces hold ids in [0, 2**31))") from None


def _common_prefix_len(a: Sequence[Hashable], b: Sequence[Hashable], off: int, page_size: int) -> int:
    """Length of the common prefix of a and b[off:], rounded down to whole pages (slice
    comparisons in C: the whole overlap first, else a bisection for the first difference)."""
    n = min(len(a), len(b) - off)
    if a[:n] == b[off:off + n]:
        return n // page_size * page_size
    lo, hi = 0, n  # a[:lo] == b[off:off + lo]; a[:hi] != b[off:off + hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[off + lo:off + mid]:
            lo = mid
        else:
            hi = mid
    return lo // page_size * page_size


class RadixCache:
    """Radix tree over token ids (or page keys) whose node values are KV page ids.

    `pool` receives the pages of evicted nodes; None builds a "simulated" tree (values are
    placeholders, nothing is freed) such as the one the LPM policy uses for in-batch dedup.
    `key_tokens`: tokens one key element stands for: 1 for token ids (`page_size` elements a
    page); a page's tokens for page keys (page_size is then 1: one element a page). Sizes,
    matches and evictions are counted in tokens either way; keys and node lengths in elements.
    """

    def __init__(self, page_size: int, pool: TokenToKVPool | None = None, key_tokens: int = 1) -> None:
        if key_tokens < 1 or (key_tokens > 1 and page_size != 1):
            raise ValueError(f"a page-keyed tree has one element a page (page_size 1), got page_size {page_size}, "
                             f"{key_tokens} tokens an element")
        self.page_size = page_size
        self.key_tokens = key_tokens
        self.pool = pool
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self.root = TreeNode(0)
        self.root.lock_ref = 1  # the root is never evictable
        self.evictable_size_ = 0  # key elements in nodes with lock_ref == 0
        self.protected_size_ = 0  # key elements in nodes with lock_ref > 0
        self._leaves: set[TreeNode] = set()  # childless non-root nodes (eviction candidates)
        # Eviction order, kept between calls: (last access, id, node) for every unlocked leaf at its
        # current access time, plus stale entries evict skips (_offer says when entries are made).
        self._lru: list[tuple[int, int, TreeNode]] = []

    # --- sizes -----------------------------------------------------------------------------------
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
        return self.evictable_size_ * self.key_tokens

    def protected_size(self) -> int:
        """Tokens in locked nodes."""
        return self.protected_size_ * self.key_tokens

    def total_size(self) -> int:
        return sum(len(n.key) for n in self.nodes()) * self.key_tokens

    def nodes(self) -> list[TreeNode]:
        """Every non-root node (iterative walk: trees can be deep)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    # --- lookup ----------------------------------------------------------------------------------
    def _as_key(self, keys: Sequence[Hashable]) -> Sequence[Hashable]:
        """The tree's own copy of a lookup or insert key, cut to whole pages: token ids as a
        compact array (as_key), page keys as a list."""
        cut = keys[:len(keys) // self.page_size * self.page_size]
        return cut if self.key_tokens > 1 else as_key(cast(Sequence[int], cut))

    def _child_key(self, extra: Hashable, key: Sequence[Hashable], off: int = 0) -> tuple:
        """A child's entry in its parent: the namespace and the first page of its tokens (those of
        key[off:])."""
        return (extra, tuple(key[off:off + self.page_size]))

    def _walk(self, key: Sequence[Hashable], extra: Hashable,
              now: int | None) -> tuple[TreeNode, int, TreeNode | None, int]:
        """Follow `key` (whole pages) down from the root: (the last node matched whole, tokens
        matched, the child matched only partly or None, its common length). Visited children
        count as accessed at `now` (None: a read-only walk). Positions move by an offset: no
        level copies the rest of the key."""
        ps = self.page_size
        node, off, end = self.root, 0, len(key)
        while off < end:
            child = node.children.get(self._child_key(extra, key, off))
            if child is None:
                break
            if now is not None:
                child.last_access = now
                self._offer(child)
            n = _common_prefix_len(child.key, key, off, ps)
            if n < len(child.key):
                return node, off + n, child, n
            node, off = child, off + n
        return node, off, None, 0

    def match_prefix(self, tokens: Sequence[Hashable], extra: Hashable = None) -> tuple[TreeNode, int]:
        """(last node, matched tokens) of the longest cached prefix, in whole pages (`tokens`: the
        key elements, token ids or page keys).

        A match ending inside a node splits it, so the last node covers exactly the match (what
        a request then locks). Visited nodes count as accessed (LRU)."""
        node, matched, partial, n = self._walk(self._as_key(tokens), extra, next(self._clock))
        if partial is not None:
            node = self._split(partial, n)
        return node, matched * self.key_tokens

    def peek_prefix(self, tokens: Sequence[Hashable], extra: Hashable = None) -> int:
        """Tokens match_prefix would match, in whole pages, without touching the tree (no LRU
        access, no split): for queries such as a router's."""
        return self._walk(self._as_key(tokens), extra, None)[1] * self.key_tokens

    def path_pages(self, node: TreeNode) -> list[int]:
        """Pages of the cached prefix that ends at `node` (SGLang's prefix_indices)."""
        parts = []
        while node is not self.root:
            parts.append(node.value)
            node = node.up()
        return [p for part in reversed(parts) for p in part]

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after n tokens; the new upper node inherits its lock count and access time."""
        ps = self.page_size
        parent = child.up()
        upper = TreeNode(next(self._ids), child.key[:n], child.value[:n // ps], parent, child.extra)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.key, child.value, child.parent = child.key[n:], child.value[n // ps:], upper
        upper.children[self._child_key(child.extra, child.key)] = child
        parent.children[self._child_key(upper.extra, upper.key)] = upper
        return upper

    # --- insert ----------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[Hashable], pages: Sequence[int], extra: Hashable = None) -> int:
        """Cache `tokens` (the key elements, truncated to whole pages) with their `pages`; returns
        how many leading tokens were already cached. Pages of that leading part stay the caller's
        (SGLang frees them as duplicates); the pages of the rest now belong to the tree."""
        return self._insert_at(tokens, pages, extra)[1] * self.key_tokens

    def _insert_at(self, tokens: Sequence[Hashable], pages: Sequence[int], extra: Hashable) -> tuple[TreeNode, int]:
        """insert's work: (the node that ends at the inserted key, key elements already cached)."""
        ps = self.page_size
        key = self._as_key(tokens)
        pages = list(pages[:len(key) // ps])
        if len(pages) * ps != len(key):
            raise ValueError(f"{len(key)} key elements need {len(key) // ps} pages, got {len(pages)}")
        now = next(self._clock)
        node, matched, partial, n = self._walk(key, extra, now)
        if partial is not None:
            node = self._split(partial, n)
        if matched < len(key):
            leaf = TreeNode(next(self._ids), key[matched:], pages[matched // ps:], node, extra)
            leaf.last_access = now
            node.children[self._child_key(extra, leaf.key)] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            self.evictable_size_ += len(leaf.key)
            self._offer(leaf)
            node = leaf
        return node, matched

    # --- locks -----------------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.up()

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref below zero on {node!r}")
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._offer(node)
            node = node.up()

    # --- eviction --------------------------------------------------------------------------------
    def _offer(self, node: TreeNode) -> None:
        """Enter `node` in the eviction order if it is an unlocked leaf now, at its access time:
        called wherever a node may have become one (a new leaf, an unlock, a child evicted) or
        one was accessed. An entry goes stale when its node is locked, gains a child, leaves the
        tree or is accessed again; evict skips those, and the list is rebuilt when they pile up."""
        if node.lock_ref == 0 and node in self._leaves:
            heapq.heappush(self._lru, (node.last_access, node.id, node))
            if len(self._lru) > 2 * len(self._leaves) + 256:
                self._lru = [(n.last_access, n.id, n) for n in self._leaves if n.lock_ref == 0]
                heapq.heapify(self._lru)

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves, least recently used first (ties: the older node), until
        num_tokens are freed (or none is left); a parent left childless and unlocked becomes a
        candidate. Returns tokens freed. The order is kept between calls (_offer), so a call costs
        what it evicts, not a pass over every leaf."""
        unit = self.key_tokens
        target = -(-num_tokens // unit)  # key elements: whole pages either way
        freed = 0
        while freed < target and self._lru:
            last, _, node = heapq.heappop(self._lru)
            if node.lock_ref > 0 or node.last_access != last or node not in self._leaves:
                continue  # stale: locked, accessed since, or no longer a leaf of the tree
            freed += self._evict_leaf(node)
        return freed * unit

    def _evict_leaf(self, node: TreeNode) -> int:
        """Free an unlocked leaf's pages and delete it; its parent may become a candidate.
        Returns key elements freed (MambaRadixCache also drops the tombstones left childless)."""
        if self.pool is not None:
            self.pool.free(node.value)
        self._delete_leaf(node)
        parent = node.up()
        if parent is not self.root:
            self._offer(parent)
        return len(node.key)

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.up()
        del parent.children[self._child_key(node.extra, node.key)]
        self._leaves.discard(node)
        if parent is not self.root and not parent.children:
            self._leaves.add(parent)
        self.evictable_size_ -= len(node.key)

    def reset(self) -> None:
        """Drop everything (only for trees no request holds a lock in, e.g. the simulated one)."""
        if self.pool is not None:
            for node in self.nodes():
                self.pool.free(node.value)
        self.root.children.clear()
        self._leaves.clear()
        self._lru.clear()
        self.evictable_size_ = self.protected_size_ = 0
