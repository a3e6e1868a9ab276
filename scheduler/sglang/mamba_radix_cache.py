"""SGLang's hybrid (Mamba / linear-attention) cache: the Mamba state pool and MambaRadixCache.

Modelled on sgl-project/sglang python/sglang/srt/mem_cache/mamba_radix_cache.py (MambaRadixCache
"v1", no extra buffer: page_size 1) and memory_pool.py (MambaPool inside HybridReqToTokenPool),
as read at commit 00df707e8de4ab0110fb5527bf3c9dffc535671a and the v0.5.9 model runner's sizing.

A linear-attention layer keeps one fixed-size recurrent state per sequence (conv + temporal
state), updated in place: the state after token t cannot be rolled back to token t' < t. So:
* The pool (MambaPool) counts whole states: a slot holds one sequence's state for every
  linear-attention layer. A running request owns one slot (HybridReqToTokenPool.alloc).
* A tree node may hold a slot: the state after its last token. A prefix hit is only usable up to
  the deepest matched node that holds one (match_prefix stops there); the KV pages beyond it are
  matched but not used. A node whose state was evicted keeps its KV for its children: a
  "tombstone". Leaves always hold a state (a leaf that would be a tombstone is deleted).
* Two eviction orders: KV eviction takes unlocked leaves, least recently used first, freeing
  their KV and state and deleting the tombstones left childless; state eviction takes any node
  with an unlocked state (leaves are deleted whole, inner nodes become tombstones), nodes nearer
  the root first among equally recent ones (SGLang makes a matched path's parents older).
* Locks: a request locks the KV path of its matched node (lock_ref, as RadixCache) and the
  node's state (mamba_lock_ref; SGLang's invariant full_lock_ref >= mamba_lock_ref).
Invariant (check_mamba in invariants.py): every slot is free, held by one request, or in one
tree node, never two of these.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

from servesim.scheduler.sglang.radix_cache import RadixCache, TokenToKVPool, TreeNode


class MambaPool:
    """Free Mamba state slots (SGLang's MambaPool): ids 0..num_slots-1, reused FIFO."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the Mamba pool needs >= 1 slot, got {num_slots}")
        self.num_slots = num_slots
        self.free_slots: deque[int] = deque(range(num_slots))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        return self.free_slots.popleft() if self.free_slots else None

    def free(self, slot: int) -> None:
        self.free_slots.append(slot)


class MambaRadixCache(RadixCache):
    """RadixCache whose nodes may also hold a Mamba state slot (see the module docstring)."""

    def __init__(self, page_size: int, pool: TokenToKVPool, mamba_pool: MambaPool) -> None:
        if page_size != 1:
            # SGLang's own assertion (MambaRadixCache.__init__ without the extra buffer).
            raise ValueError(f"Page size must be 1 for MambaRadixCache v1, got {page_size} "
                             "(set sglang.page_size: 1, or disable the radix cache)")
        super().__init__(page_size, pool)
        self.mamba_pool = mamba_pool
        self.mamba_nodes: set[TreeNode] = set()  # nodes holding a slot
        self.mamba_evictable_size_ = 0  # slots of nodes with mamba_lock_ref == 0
        self.mamba_protected_size_ = 0  # slots of nodes with mamba_lock_ref > 0

    # --- sizes -----------------------------------------------------------------------------------
    def mamba_evictable_size(self) -> int:
        return self.mamba_evictable_size_

    def mamba_protected_size(self) -> int:
        return self.mamba_protected_size_

    # --- lookup ----------------------------------------------------------------------------------
    def _best(self, node: TreeNode, matched: int) -> tuple[TreeNode, int]:
        """The deepest node at or above `node` holding a state (or the root), and its depth."""
        while node is not self.root and node.mamba_slot is None:
            matched -= len(node.key)
            node = node.up()
        return node, matched

    def match_prefix(self, tokens: Sequence[Hashable], extra: Hashable = None) -> tuple[TreeNode, int]:
        """(node, tokens) of the longest cached prefix that ends at a node with a state. The walk
        splits a partly matched node as RadixCache does; only the usable node and its ancestors
        count as accessed (SGLang's _match_post_processor)."""
        key = self._as_key(tokens)
        node, matched, partial, n = self._walk(key, extra, None)
        if partial is not None:
            node = self._split(partial, n)
        best, depth = self._best(node, matched)
        now = next(self._clock)
        up = best
        while up is not self.root:
            up.last_access = now
            self._offer(up)
            up = up.up()
        return best, depth

    def peek_prefix(self, tokens: Sequence[Hashable], extra: Hashable = None) -> int:
        key = self._as_key(tokens)
        node, matched, partial, n = self._walk(key, extra, None)
        if partial is not None:
            matched -= n  # a part of a node: a split would leave it without a state
        return self._best(node, matched)[1]

    # --- insert ----------------------------------------------------------------------------------
    def insert_with_state(self, tokens: Sequence[Hashable], pages: Sequence[int], extra: Hashable,
                          mamba_slot: int) -> tuple[int, bool]:
        """Cache `tokens` with their pages and the state after them. Returns (tokens already
        cached, whether the end node already held a state): then `mamba_slot` stays the caller's
        (SGLang frees it); otherwise the tree owns it from here."""
        node, matched = self._insert_at(tokens, pages, extra)
        if node is self.root or node.mamba_slot is not None:
            return matched, True
        node.mamba_slot = mamba_slot  # a new leaf, or a tombstone given a state again
        self.mamba_nodes.add(node)
        self.mamba_evictable_size_ += 1  # nobody locks a node's state before it has one
        return matched, False

    # --- locks -----------------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        if node.mamba_slot is not None:
            if node.mamba_lock_ref == 0:
                self.mamba_evictable_size_ -= 1
                self.mamba_protected_size_ += 1
            node.mamba_lock_ref += 1
        super().inc_lock_ref(node)

    def dec_lock_ref(self, node: TreeNode) -> None:
        if node.mamba_slot is not None:
            if node.mamba_lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref below zero on the state of {node!r}")
            if node.mamba_lock_ref == 1:
                self.mamba_evictable_size_ += 1
                self.mamba_protected_size_ -= 1
            node.mamba_lock_ref -= 1
        super().dec_lock_ref(node)

    # --- eviction --------------------------------------------------------------------------------
    def _drop_state(self, node: TreeNode) -> None:
        """Free an unlocked node's state (the node stays: a tombstone if it has children)."""
        assert node.mamba_slot is not None and node.mamba_lock_ref == 0, node
        self.mamba_pool.free(node.mamba_slot)
        node.mamba_slot = None
        self.mamba_nodes.discard(node)
        self.mamba_evictable_size_ -= 1

    def _evict_leaf(self, node: TreeNode) -> int:
        """KV eviction of a leaf: its pages and state, then every tombstone left a childless,
        unlocked leaf above it (SGLang's _iteratively_delete_tombstone_leaf)."""
        if node.mamba_slot is not None:
            self._drop_state(node)
        self.pool.free(node.value)
        self._delete_leaf(node)
        freed = len(node.key)
        parent = node.up()
        while (parent is not self.root and parent.mamba_slot is None and not parent.children
               and parent.lock_ref == 0):
            self.pool.free(parent.value)
            self._delete_leaf(parent)
            freed += len(parent.key)
            parent = parent.up()
        if parent is not self.root:
            self._offer(parent)
        return freed

    def _depth(self, node: TreeNode) -> int:
        depth = 0
        while node is not self.root:
            depth, node = depth + 1, node.up()
        return depth

    def evict_mamba(self, num_slots: int) -> int:
        """Free at least num_slots states (or all unlocked ones), least recently used first,
        nearer the root first among equals: inner nodes become tombstones, leaves are evicted
        whole. Returns states freed. A linear scan per state: the pool is sized at 3x the
        running requests, so evictions of states are rare next to KV evictions."""
        freed = 0
        while freed < num_slots:
            candidates = [n for n in self.mamba_nodes if n.mamba_lock_ref == 0]
            if not candidates:
                break
            victim = min(candidates, key=lambda n: (n.last_access, self._depth(n), n.id))
            if victim.children:
                self._drop_state(victim)
            else:
                assert victim.lock_ref == 0, victim  # a leaf's KV lock implies its state's
                self._evict_leaf(victim)
            freed += 1
        return freed

    def reset(self) -> None:
        for node in self.mamba_nodes:
            assert node.mamba_slot is not None, node  # mamba_nodes: the nodes holding a slot
            self.mamba_pool.free(node.mamba_slot)
        self.mamba_nodes.clear()
        self.mamba_evictable_size_ = self.mamba_protected_size_ = 0
        super().reset()
