"""HiRadixCache: the radix cache with a host tier (SGLang's mem_cache/hiradix_cache.py).

A node's KV lives on device (`value`), on host (`host_value`), or both. Device eviction
(`evict`) keeps a node that has a host copy in the tree as an `evicted` node (host only); a node
without one is deleted as in the plain tree, except under write_back, where it is backed up first.
Host eviction (`evict_host`) deletes evicted leaves, freeing their host pages. Invariant (as in
SGLang): evicted nodes hang below device nodes, never above one, so a path from the root is
device-resident up to some node and host-only after it; a match returns both parts.

Write policies (HiRadixCache.inc_hit_count / _insert_helper / evict): write_through and
write_through_selective count hits on matched and inserted nodes and back a node up once its
count reaches the threshold (1 or 2); the node is locked until its copy is acknowledged
(writing_check). write_back counts nothing and backs a node up when it is evicted (SGLang blocks
on that copy: the pages are freed at once here and the copy is counted, not waited for).

Device eviction collects the device leaves and orders them each call (SGLang's
_collect_leaves_device), not the kept heap of the plain tree: HiCache runs pay a pass over the
tree per eviction.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

from servesim.scheduler.sglang.hicache import HiCacheController
from servesim.scheduler.sglang.hicache_config import LOAD_BACK_THRESHOLD_TOKENS, WRITE_THROUGH_THRESHOLD
from servesim.scheduler.sglang.radix_cache import RadixCache, TokenToKVPool, TreeNode


def _path(node: TreeNode) -> list[TreeNode]:
    """Nodes from the root's child down to `node`."""
    out = []
    while node.parent is not None:
        out.append(node)
        node = node.parent
    return out[::-1]


class HiRadixCache(RadixCache):
    def __init__(self, page_size: int, pool: TokenToKVPool, controller: HiCacheController,
                 write_policy: str) -> None:
        super().__init__(page_size, pool)
        self.ctl = controller
        self.write_back = write_policy == "write_back"
        self.write_through_threshold = WRITE_THROUGH_THRESHOLD.get(write_policy, 0)
        # Host-only nodes a load is being set up for: evict_host (reached from a write-back
        # eviction that load_back's own evict may trigger) must not delete them under it.
        self._pinned: set[TreeNode] = set()

    # --- lookup ----------------------------------------------------------------------------------
    def match_prefix_host(self, tokens: Sequence[Hashable], extra: Hashable = None
                          ) -> tuple[TreeNode, int, TreeNode, int]:
        """SGLang's match_prefix: (last device node, device tokens, last host node, host-only tokens).
        Every matched node counts a hit (_match_prefix_helper's inc_hit_count)."""
        node, matched = RadixCache.match_prefix(self, tokens, extra)
        for n in _path(node):
            self.inc_hit_count(n)
        host_len, dev = 0, node
        while dev.evicted:
            host_len += len(dev.key)
            dev = dev.up()
        return dev, matched - host_len, node, host_len

    def match_prefix(self, tokens: Sequence[Hashable], extra: Hashable = None) -> tuple[TreeNode, int]:
        """The device-resident part of the match (what a request can use without a load)."""
        dev, dev_len, _, _ = self.match_prefix_host(tokens, extra)
        return dev, dev_len

    def peek_prefix(self, tokens: Sequence[Hashable], extra: Hashable = None) -> int:
        """Device-resident tokens a match would find, changing nothing."""
        node, matched, partial, n = self._walk(self._as_key(tokens), extra, None)
        if partial is not None and partial.evicted:
            matched -= n
        while node.evicted:
            matched -= len(node.key)
            node = node.up()
        return matched

    def peek_host_prefix(self, tokens: Sequence[Hashable], extra: Hashable = None) -> int:
        """Host-only tokens a match would find below its device part (what load_back would
        bring back), changing nothing."""
        return RadixCache.peek_prefix(self, tokens, extra) - self.peek_prefix(tokens, extra)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """_split_node: the host copy, hit count and flags split with the node."""
        upper = super()._split(child, n)
        upper.hit_count, upper.loading, upper.evicted = child.hit_count, child.loading, child.evicted
        if child.host_value is not None:
            k = n // self.page_size
            upper.host_value, child.host_value = child.host_value[:k], child.host_value[k:]
        return upper

    # --- insert and write-through ------------------------------------------------------------------
    def insert(self, tokens: Sequence[Hashable], pages: Sequence[int], extra: Hashable = None) -> int:
        """_insert_helper: evicted nodes on the path take the new pages (recomputed KV), device nodes
        count a hit, the new leaf counts one (not under write_back). Returns the tokens that were
        already on device (pages after them now belong to the tree)."""
        ps = self.page_size
        aligned = len(tokens) // ps * ps
        node, matched = RadixCache.match_prefix(self, tokens[:aligned], extra)
        off = dev = 0
        for n in _path(node):
            if n.evicted:
                n.value, n.evicted = list(pages[off // ps:(off + len(n.key)) // ps]), False
                self.evictable_size_ += len(n.key)
            else:
                dev += len(n.key)
                self.inc_hit_count(n)
            off += len(n.key)
        super().insert(tokens, pages, extra)
        if matched < aligned and not self.write_back:
            self.inc_hit_count(node.children[self._child_key(extra, tokens, matched)])
        return dev

    def inc_hit_count(self, node: TreeNode) -> None:
        if self.write_back or node.evicted:
            return  # evicted nodes are backed up already
        node.hit_count += 1
        if node.host_value is None and node.hit_count >= self.write_through_threshold:
            self.write_backup(node)

    def write_backup(self, node: TreeNode, write_back: bool = False) -> int:
        """Copy a device node to host (evicting host leaves when short); under write-through the
        node stays locked until the copy is acknowledged. Returns tokens backed up (0: no room)."""
        payload = None if write_back else node
        host = self.ctl.write(len(node.key), payload)
        if host is None:
            self.evict_host(len(node.key))
            host = self.ctl.write(len(node.key), payload)
        if host is None:
            return 0
        node.host_value = host
        if not write_back:
            self.inc_lock_ref(node)
        return len(node.key)

    def writing_check(self) -> None:
        for node in self.ctl.pop_done_writes():
            self.dec_lock_ref(node)

    # --- load back -------------------------------------------------------------------------------
    def load_back(self, node: TreeNode) -> int:
        """Load the evicted chain ending at `node` back to device, all or nothing (load_back):
        returns the tokens loaded, 0 when below the threshold or the device pool is short. The
        chain stays locked and `loading` until loading_check acknowledges the copy."""
        last, chain = node, []
        while node.evicted:
            chain.append(node)
            node = node.up()
        chain.reverse()
        ancestor = node
        num_tokens = sum(len(n.key) for n in chain)
        if num_tokens < LOAD_BACK_THRESHOLD_TOKENS:
            return 0
        self.inc_lock_ref(ancestor)  # its own prefix is not evicted to make room
        if self.pool.available_size() < num_tokens:
            self._pinned.update(chain)
            self.evict(num_tokens)
            self._pinned.clear()
        pages = self.pool.alloc(num_tokens // self.page_size)
        self.dec_lock_ref(ancestor)
        if pages is None:
            return 0
        off = 0
        for n in chain:
            k = len(n.key) // self.page_size
            n.value, n.evicted, n.loading = pages[off:off + k], False, True
            off += k
        self.evictable_size_ += num_tokens
        self.inc_lock_ref(last)
        self.ctl.load(num_tokens, (ancestor, last))
        return num_tokens

    def loading_check(self) -> list[TreeNode]:
        """Acknowledge finished loads: unlock and clear `loading`; returns their last nodes."""
        done = []
        for ancestor, last in self.ctl.pop_done_loads():
            self.dec_lock_ref(last)
            node = last
            while node is not ancestor:
                node.loading = False
                node = node.up()
            done.append(last)
        return done

    # --- eviction --------------------------------------------------------------------------------
    def _is_device_leaf(self, node: TreeNode) -> bool:
        return not node.evicted and all(c.evicted for c in node.children.values())

    def evict(self, num_tokens: int) -> int:
        """Device eviction, least recently used device leaf first: keep backed-up nodes on host."""
        leaves = [n for n in self.nodes() if self._is_device_leaf(n)]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            x = heapq.heappop(leaves)
            if x.lock_ref > 0:
                continue
            if x.host_value is None and self.write_back:
                self.write_backup(x, write_back=True)
            parent = x.up()
            if x.host_value is not None:
                self.pool.free(x.value)
                x.value, x.evicted = [], True
                self.evictable_size_ -= len(x.key)
            else:
                self._evict_regular(x)
            freed += len(x.key)
            if parent is not self.root and self._is_device_leaf(parent):
                heapq.heappush(leaves, parent)
        return freed

    def _evict_regular(self, node: TreeNode) -> None:
        """Delete a node with no host copy; host-only nodes below it go with it."""
        self.pool.free(node.value)
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        self._delete_leaf(node)

    def _drop_host_subtree(self, node: TreeNode) -> None:
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        assert node.host_value is not None, node  # below a device node only host-only nodes hang
        self.ctl.host_pool.free(node.host_value)
        self._unlink(node)

    def _unlink(self, node: TreeNode) -> None:
        """Take a host-only node out of the tree (it holds no device tokens: sizes are unchanged)."""
        parent = node.up()
        del parent.children[self._child_key(node.extra, node.key)]
        self._leaves.discard(node)
        if parent is not self.root and not parent.children:
            self._leaves.add(parent)

    def evict_host(self, num_tokens: int) -> int:
        """Free host copies of evicted leaves, least recently used first (evict_host)."""
        leaves = [n for n in self.nodes() if n.evicted and not n.children and n not in self._pinned]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            x = heapq.heappop(leaves)
            assert x.host_value is not None, x  # an evicted node lives on host
            self.ctl.host_pool.free(x.host_value)
            freed += len(x.key)
            parent = x.up()
            self._unlink(x)
            if parent is not self.root and parent.evicted and not parent.children and parent not in self._pinned:
                heapq.heappush(leaves, parent)
        return freed

    def device_size(self) -> int:
        return sum(len(n.key) for n in self.nodes() if not n.evicted)
