"""Per-request KV bookkeeping on top of the page pool and radix cache (SGLang's req_to_token pool
plus the cache_unfinished_req / cache_finished_req / release paths); the scheduler's
`kv_cache_manager` (the engine reads its `usage`).

A request's block table (`pages`) is append-only while it holds KV, so SchedulerOutput can report
it as vLLM deltas. Its leading pages may belong to the tree (shared, protected by the lock on
`last_node`); the others are `private` to it and freed when it lets go. When inserting finds that
another request already cached the same tokens, SGLang frees the duplicate slots at once and
rewrites req_to_token; we keep the duplicates private until the request lets go (see
docs/SGLANG_MODEL.md), which keeps block tables append-only.

Page keys (`page_keys`, with the plain radix tree and pages of more than one token): the tree is
keyed by each page's prefix-cache key (the request's `block_hashes` at page_size tokens a block:
scheduler/block_keys.py) instead of its token ids. Equal keys mean equal ids up to the page's
end, so it matches, splits, inserts and evicts exactly where the token tree does, and a
synthetic prompt's ids are never built (the scheduler attaches the hasher: SGLangScheduler).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servesim.scheduler.sglang.hicache import HiCacheController
from servesim.scheduler.sglang.hiradix_cache import HiRadixCache
from servesim.scheduler.sglang.mamba_radix_cache import MambaPool, MambaRadixCache
from servesim.scheduler.sglang.radix_cache import RadixCache, TokenToKVPool, TreeNode

if TYPE_CHECKING:
    from servesim.scheduler.request import Request


@dataclass(slots=True)
class ReqKV:
    """The KV a request holds while RUNNING (SGLang: req_pool_idx, prefix_indices, last_node)."""

    pages: list[int] = field(default_factory=list)  # block table: page i holds tokens [i*ps, (i+1)*ps)
    private: set[int] = field(default_factory=set)  # pages only this request references
    last_node: TreeNode | None = None  # locked end of the cached prefix (None: cache disabled)
    cached_len: int = 0  # tokens covered by tree pages (page-aligned)
    num_reported: int = 0  # pages already sent to the executor in a SchedulerOutput
    mamba_slot: int | None = None  # hybrid models: its own Mamba state slot (req.mamba_pool_idx)


def extra_key(request: Request) -> Hashable:
    """Namespace of a request's cache entries (SGLang's RadixKey.extra_key: LoRA, cache salt)."""
    if request.lora_id is None and request.cache_salt is None:
        return None
    return (request.lora_id, request.cache_salt)


class SGLangMemory:
    def __init__(self, num_pages: int, page_size: int, enable_radix_cache: bool,
                 hicache: HiCacheController | None = None, write_policy: str = "write_through",
                 mamba_slots: int = 0, page_keys: bool = False) -> None:
        self.page_size = page_size
        self.pool = TokenToKVPool(num_pages, page_size)
        self.hicache = hicache
        # Hybrid (linear-attention) models: the Mamba state pool beside the KV pool, and with the
        # radix cache on, MambaRadixCache (its tree holds states too: mamba_radix_cache.py).
        self.mamba_pool = MambaPool(mamba_slots) if mamba_slots else None
        self.mamba_tree: MambaRadixCache | None = None
        if self.mamba_pool is not None and enable_radix_cache:
            self.mamba_tree = MambaRadixCache(page_size, self.pool, self.mamba_pool)
        # With HiCache, the tree with a host tier (its host-side operations are reached through
        # hi_tree, the same object as `tree`; None without HiCache).
        self.hi_tree: HiRadixCache | None = None
        if self.mamba_tree is None and hicache is not None:
            self.hi_tree = HiRadixCache(page_size, self.pool, hicache, write_policy)
        # Page keys: only the plain tree (the host tier and the Mamba tree key tokens), and only
        # where a page is more than one token (a key per token would cost more than the ids).
        self.page_keys = (page_keys and enable_radix_cache and self.hi_tree is None and self.mamba_tree is None
                          and page_size > 1)
        self.tree: RadixCache = self.mamba_tree if self.mamba_tree is not None else \
            self.hi_tree if self.hi_tree is not None else \
            RadixCache(1, self.pool, key_tokens=page_size) if self.page_keys else RadixCache(page_size, self.pool)
        self.cache_enabled = enable_radix_cache
        self.reqs: dict[str, ReqKV] = {}
        # HiCache: waiting requests whose load from host is in flight (request id -> its last node),
        # and host tokens loaded for a request not yet admitted (counted as host hits on admission).
        self.loading: dict[str, TreeNode] = {}
        self.loaded_tokens: dict[str, int] = {}

    # --- engine-facing -----------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        """Fraction of pages in use; evictable cached pages count as free (as vLLM's usage does)."""
        free = len(self.pool.free_pages) + self.tree.evictable_size() // self.page_size
        return 1.0 - free / self.pool.num_pages

    def num_free_pages(self) -> int:
        """Free plus evictable pages (vLLM counts cached-but-unused blocks as free too)."""
        return len(self.pool.free_pages) + self.tree.evictable_size() // self.page_size

    def available_and_evictable(self) -> int:
        return self.pool.available_size() + self.tree.evictable_size()

    # --- prefix lookup and admission ---------------------------------------------------------------
    def tree_key(self, request: Request, num_tokens: int) -> Sequence[Hashable]:
        """The tree's key for the request's first num_tokens tokens: its ids, or with page keys the
        keys of its whole pages among them."""
        if not self.page_keys:
            return request.all_token_ids[:num_tokens]
        n = num_tokens // self.page_size
        keys = request.block_hashes
        if len(keys) < n:  # the hasher keys every full page as tokens are appended
            raise AssertionError(f"{request.request_id}: {len(keys)} page keys for {num_tokens} tokens")
        return keys[:n]

    def lookup(self, request: Request, num_tokens: int) -> tuple[TreeNode, int]:
        """The tree's match of the request's first num_tokens tokens: (last node, tokens matched,
        whole pages). Visited nodes count as accessed; a node matched in part is split."""
        return self.tree.match_prefix(self.tree_key(request, num_tokens), extra_key(request))

    def match(self, request: Request, limit: int) -> tuple[list[int], TreeNode | None, int]:
        """Cached prefix of the request's first `limit` tokens: (pages, node, tokens)."""
        if not self.cache_enabled:
            return [], None, 0
        node, n = self.lookup(request, limit)
        return self.tree.path_pages(node), node, n

    def match_with_host(self, request: Request, limit: int
                        ) -> tuple[list[int], TreeNode | None, int, TreeNode | None, int]:
        """`match` plus, with HiCache, the host-only part beyond it: (pages, node, tokens, last host
        node, host-only tokens); one match (SGLang's MatchResult), so hits are counted once."""
        if self.hi_tree is None or not self.cache_enabled:
            return (*self.match(request, limit), None, 0)
        dev, n, host_node, host_len = self.hi_tree.match_prefix_host(request.all_token_ids[:limit], extra_key(request))
        return self.tree.path_pages(dev), dev, n, host_node, host_len

    # --- HiCache load back ---------------------------------------------------------------------------
    def start_load_back(self, rid: str, host_node: TreeNode) -> bool:
        """init_load_back: start loading the request's host-tier prefix; True when a load was
        issued (the request then waits for it: is_loading)."""
        assert self.hi_tree is not None, "a host-tier match comes from HiRadixCache only"
        num_tokens = self.hi_tree.load_back(host_node)
        if num_tokens == 0:
            return False
        self.loading[rid] = host_node
        self.loaded_tokens[rid] = self.loaded_tokens.get(rid, 0) + num_tokens
        return True

    def is_loading(self, rid: str) -> bool:
        return rid in self.loading

    def check_hicache_events(self) -> None:
        """check_hicache_events: acknowledge finished writes (unlocking their nodes) and loads
        (their requests may be scheduled now)."""
        if self.hi_tree is None:
            return
        self.hi_tree.writing_check()
        done = set(map(id, self.hi_tree.loading_check()))
        for rid in [r for r, node in self.loading.items() if id(node) in done]:
            del self.loading[rid]

    def take_host_hit(self, rid: str, prefix_len: int, preempted: bool) -> None:
        """On admission: the loaded tokens the request's prefix still covers are host hits
        (counted like prefix-cache hits: requests never preempted, vLLM's hit-rate definition)."""
        loaded = self.loaded_tokens.pop(rid, 0)
        if loaded and self.hicache is not None and not preempted:
            self.hicache.add_host_hit(min(loaded, prefix_len))

    def forget(self, rid: str) -> None:
        """A request left the scheduler: drop its HiCache bookkeeping (a load in flight completes
        into the tree regardless)."""
        self.loading.pop(rid, None)
        self.loaded_tokens.pop(rid, None)

    def peek(self, key: Sequence[Hashable], lora_id: Hashable = None) -> int:
        """Tokens `match` would find for a prompt (whole pages), changing nothing. `key`: the
        prompt's tree key (its ids, or with page keys its pages' keys)."""
        if not self.cache_enabled:
            return 0
        return self.tree.peek_prefix(key, None if lora_id is None else (lora_id, None))

    def peek_host(self, token_ids: Sequence[int], lora_id: Hashable = None) -> int:
        """Tokens past `peek`'s that a match would find on the host tier only, changing nothing
        (0 without HiCache)."""
        if self.hi_tree is None or not self.cache_enabled:
            return 0
        return self.hi_tree.peek_host_prefix(token_ids, None if lora_id is None else (lora_id, None))

    def admit(self, rid: str, prefix_pages: list[int], node: TreeNode | None, prefix_len: int) -> ReqKV:
        """Start a block table on the cached prefix; the prefix path is locked from here on."""
        kv = ReqKV(list(prefix_pages), set(), node, prefix_len)
        if node is not None:
            self.tree.inc_lock_ref(node)  # first: the state it copies from must not be evicted now
        if self.mamba_pool is not None:
            kv.mamba_slot = self._alloc_state(rid)
        self.reqs[rid] = kv
        return kv

    # --- Mamba states --------------------------------------------------------------------------------
    def mamba_schedulable(self) -> int:
        """States a new request could get: free slots plus unlocked ones in the tree."""
        if self.mamba_pool is None:
            return 0
        evictable = self.mamba_tree.mamba_evictable_size() if self.mamba_tree is not None else 0
        return self.mamba_pool.available_size() + evictable

    def _alloc_state(self, rid: str) -> int:
        """One state slot, evicting a tree state when none is free (SGLang's alloc_req_slots /
        _alloc_mamba_slot). Admission checks mamba_schedulable, and the pool holds 3 states per
        running request (resolve_mamba), so this cannot run out; if it does, SGLang asserts."""
        slot = self.mamba_pool.alloc()
        if slot is None and self.mamba_tree is not None:
            self.mamba_tree.evict_mamba(1)
            slot = self.mamba_pool.alloc()
        if slot is None:
            raise MemoryError(f"Mamba state pool out of slots for {rid!r}")
        return slot

    # --- allocation --------------------------------------------------------------------------------
    def pages_needed(self, rid: str, end: int) -> int:
        """New pages to hold tokens [0, end)."""
        return max(0, -(-end // self.page_size) - len(self.reqs[rid].pages))

    def ensure_available(self, num_tokens: int) -> bool:
        """SGLang's evict_from_tree_cache: evict when short, then check."""
        if self.pool.available_size() < num_tokens:
            self.tree.evict(num_tokens)
        return self.pool.available_size() >= num_tokens

    def grow(self, rid: str, end: int) -> list[int]:
        """Give the request pages up to token `end`, evicting the tree when short. Admission budgets
        make this succeed; running out here is SGLang's "out of memory" error."""
        need = self.pages_needed(rid, end)
        if need == 0:
            return []
        self.ensure_available(need * self.page_size)
        pages = self.pool.alloc(need)
        if pages is None:
            raise MemoryError(f"KV pool out of memory growing {rid!r} to {end} tokens")
        kv = self.reqs[rid]
        kv.pages.extend(pages)
        kv.private.update(pages)
        return pages

    def decode_tokens_needed(self, requests: Iterable[Request], num_new: int = 1, buf_multiplier: int = 1) -> int:
        """Tokens the next decode step allocates: one page per request whose next token starts a
        page (SGLang: new_page_count_next_decode * page_size), times SGLang's buf_multiplier
        (speculative decoding: draft plus verify tokens). A verify step's num_new tokens may
        cross a page boundary elsewhere too: never less than the pages they take."""
        ps = self.page_size
        reqs = self.reqs
        boundary = sum(ps for r in requests if r.num_computed_tokens >= len(reqs[r.request_id].pages) * ps)
        if num_new == 1:
            return boundary * buf_multiplier
        exact = sum(self.pages_needed(r.request_id, r.num_computed_tokens + num_new) for r in requests) * ps
        return max(boundary * buf_multiplier, exact)

    def check_decode_mem(self, requests: Iterable[Request], num_new: int = 1, buf_multiplier: int = 1) -> bool:
        requests = list(requests)
        return self.ensure_available(self.decode_tokens_needed(requests, num_new, buf_multiplier))

    # --- caching -----------------------------------------------------------------------------------
    def _insert(self, request: Request, kv: ReqKV, kv_len: int, mamba_slot: int | None = None) -> tuple[int, bool]:
        """Insert the request's first kv_len tokens (whole pages); pages the tree adopts stop
        being private. With a Mamba tree, `mamba_slot` is the state after them. Returns (the
        aligned length inserted, whether the tree took mamba_slot)."""
        aligned = kv_len // self.page_size * self.page_size
        if aligned <= kv.cached_len:
            return kv.cached_len, False  # its end node (the locked last node) holds a state
        tokens = self.tree_key(request, aligned)
        n_pages = aligned // self.page_size
        took = False
        if self.mamba_tree is not None:
            assert mamba_slot is not None, "a hybrid request inserts with the state after its tokens"
            already, exists = self.mamba_tree.insert_with_state(tokens, kv.pages[:n_pages], extra_key(request),
                                                                mamba_slot)
            took = not exists
        else:
            already = self.tree.insert(tokens, kv.pages[:n_pages], extra_key(request))
        # Pages after the already-cached part now live in the tree; earlier private pages in
        # [cached_len, already) are duplicates another request cached first: still ours.
        kv.private.difference_update(kv.pages[already // self.page_size:n_pages])
        return aligned, took

    def cache_unfinished(self, request: Request, kv_len: int) -> None:
        """cache_unfinished_req: cache the KV computed so far and move the lock to its end."""
        kv = self.reqs[request.request_id]
        if not self.cache_enabled:
            return
        # Hybrid: the tree gets a copy of the request's state (a new slot: SGLang forks it).
        fork = self._alloc_state(request.request_id) if self.mamba_tree is not None else None
        aligned, took = self._insert(request, kv, kv_len, fork)
        if fork is not None and not took:
            self.mamba_pool.free(fork)
        if aligned <= kv.cached_len:
            return
        node, matched = self.lookup(request, aligned)
        assert matched == aligned, (matched, aligned)
        assert kv.last_node is not None, "with the cache on, a request locks its matched node (the root at least)"
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(kv.last_node)
        kv.last_node, kv.cached_len = node, aligned

    def release(self, request: Request, kv_len: int, insert: bool) -> None:
        """Let go of the request's KV: optionally cache it first (cache_finished_req), unlock the
        prefix and free private pages (a retraction does not insert: it needs the space now)."""
        kv = self.reqs.pop(request.request_id)
        took = False
        if self.cache_enabled:
            if insert:  # hybrid: the request's own state goes to the tree (SGLang donates it)
                took = self._insert(request, kv, kv_len, kv.mamba_slot)[1]
            assert kv.last_node is not None, "with the cache on, a request locks its matched node (the root at least)"
            self.tree.dec_lock_ref(kv.last_node)
        if kv.mamba_slot is not None and not took:
            self.mamba_pool.free(kv.mamba_slot)
        self.pool.free([p for p in kv.pages if p in kv.private])

    def new_pages_to_report(self, rid: str) -> list[int]:
        kv = self.reqs[rid]
        new = kv.pages[kv.num_reported:]
        kv.num_reported = len(kv.pages)
        return new
