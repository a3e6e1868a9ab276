"""Per-request KV bookkeeping on top of the page pool and radix cache (SGLang's req_to_token pool
plus the cache_unfinished_req / cache_finished_req / release paths); the scheduler's
`kv_cache_manager` (the engine reads its `usage`).

A request's block table (`pages`) is append-only while it holds KV, so SchedulerOutput can report
it as vLLM deltas. Its leading pages may belong to the tree (shared, protected by the lock on
`last_node`); the others are `private` to it and freed when it lets go. When inserting finds that
another request already cached the same tokens, SGLang frees the duplicate slots at once and
rewrites req_to_token; we keep the duplicates private until the request lets go (see
docs/SGLANG_MODEL.md), which keeps block tables append-only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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


def extra_key(request: Request) -> Hashable:
    """Namespace of a request's cache entries (SGLang's RadixKey.extra_key: LoRA, cache salt)."""
    if request.lora_id is None and request.cache_salt is None:
        return None
    return (request.lora_id, request.cache_salt)


class SGLangMemory:
    def __init__(self, num_pages: int, page_size: int, enable_radix_cache: bool) -> None:
        self.page_size = page_size
        self.pool = TokenToKVPool(num_pages, page_size)
        self.tree = RadixCache(page_size, self.pool)
        self.cache_enabled = enable_radix_cache
        self.reqs: dict[str, ReqKV] = {}

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
    def match(self, request: Request, limit: int) -> tuple[list[int], TreeNode | None, int]:
        """Cached prefix of the request's first `limit` tokens: (pages, node, tokens)."""
        if not self.cache_enabled:
            return [], None, 0
        node, n = self.tree.match_prefix(request.all_token_ids[:limit], extra_key(request))
        return self.tree.path_pages(node), node, n

    def peek(self, token_ids: Sequence[int], lora_id: Hashable = None) -> int:
        """Tokens `match` would find for a prompt (whole pages), changing nothing."""
        if not self.cache_enabled:
            return 0
        return self.tree.peek_prefix(token_ids, None if lora_id is None else (lora_id, None))

    def admit(self, rid: str, prefix_pages: list[int], node: TreeNode | None, prefix_len: int) -> ReqKV:
        """Start a block table on the cached prefix; the prefix path is locked from here on."""
        kv = ReqKV(list(prefix_pages), set(), node, prefix_len)
        if node is not None:
            self.tree.inc_lock_ref(node)
        self.reqs[rid] = kv
        return kv

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

    def decode_tokens_needed(self, requests: Iterable[Request]) -> int:
        """Tokens the next decode step allocates: one page per request whose next token starts a
        page (SGLang: new_page_count_next_decode * page_size)."""
        ps = self.page_size
        return sum(ps for r in requests if r.num_computed_tokens >= len(self.reqs[r.request_id].pages) * ps)

    def check_decode_mem(self, requests: Iterable[Request]) -> bool:
        return self.ensure_available(self.decode_tokens_needed(requests))

    # --- runs of decode steps in bulk (scheduler/sglang/decode_run.py) ------------------------------
    def first_alloc_steps(self, requests: Sequence[Request]) -> list[int]:
        """For each request, the step of a decode run (0-based) whose grow() takes its first new
        page: step j grows it to num_computed_tokens + j + 1 tokens, and a page is taken when that
        passes what its pages hold (check_decode_mem's count: computed >= pages * page_size);
        then one every page_size steps."""
        ps, reqs = self.page_size, self.reqs
        return [max(0, len(reqs[r.request_id].pages) * ps - r.num_computed_tokens) for r in requests]

    def _run_pages(self, first: list[int], num_steps: int, caps: Sequence[int] | None = None) -> int:
        """Pages the first num_steps steps of a run take (first: first_alloc_steps; request i is
        scheduled in the first caps[i] steps only)."""
        ps = self.page_size
        if caps is None:
            return sum(-(-(num_steps - j0) // ps) for j0 in first if j0 < num_steps)
        return sum(-(-(min(num_steps, c) - j0) // ps) for j0, c in zip(first, caps) if j0 < min(num_steps, c))

    def decode_run_fit(self, requests: Sequence[Request], max_steps: int, caps: Sequence[int] | None = None) -> int:
        """How many of the next max_steps decode steps of `requests` pass their decode memory
        check without retracting: the pages they take are free, or evictable (a step whose pool
        is short evicts cached pages first, as ensure_available does; apply_decode_run replays it).
        Free plus evictable pages only fall through such a run: an allocation takes one, an
        eviction moves pages from one to the other, and pages a finishing request frees or
        unlocks (`caps`: request i is scheduled in the first caps[i] steps only) are not
        counted. So the run holds for m steps iff the first m steps' pages together fit: the
        largest such m, by bisection."""
        first = self.first_alloc_steps(requests)
        room = len(self.pool.free_pages) + self.tree.evictable_size() // self.page_size
        if self._run_pages(first, max_steps, caps) <= room:
            return max_steps
        lo, hi = 0, max_steps  # fits lo steps, not hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._run_pages(first, mid, caps) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    def apply_decode_run(self, requests: Sequence[Request], num_steps: int, first: list[int],
                         caps: Sequence[int] | None = None, finish_at: list[list[Request]] | None = None,
                         finish: Callable[[Request], None] | None = None) -> list[int]:
        """Take the pages of num_steps decode steps of `requests` (decode_run_fit steps at most;
        request i in the first caps[i] only) as the steps' schedules do: each step's memory
        check evicts from the tree when the pool is short, then its grow() calls take pages in
        batch order; so page ids, evictions and the pool's order are the stepped ones (each page
        reported: _give). `finish_at[j]`: the requests the update after schedule j finishes, in
        order (`finish` releases each: cache insert, pages to the back of the pool). Returns num_free_pages() after each schedule. `first`:
        first_alloc_steps(requests) before the run (the caller may have moved the requests'
        counters to the run's end already, which the finishes read)."""
        limits = caps if caps is not None else [num_steps] * len(requests)
        takes = sorted((j, i) for i, (j0, c) in enumerate(zip(first, limits)) for j in range(j0, min(c, num_steps), self.page_size))
        if len(takes) <= len(self.pool.free_pages):
            free_after = self._take_up_front(requests, num_steps, takes, finish_at, finish)
        else:
            free_after = self._take_step_by_step(requests, num_steps, takes, finish_at, finish)
        return free_after

    def _give(self, request: Request, page: int) -> None:
        """A page for the request's table, reported (the step's output would have sent it)."""
        kv = self.reqs[request.request_id]
        kv.pages.append(page)
        kv.private.add(page)
        kv.num_reported = len(kv.pages)

    def _take_up_front(self, requests: Sequence[Request], num_steps: int, takes: list[tuple[int, int]],
                       finish_at: list[list[Request]] | None, finish: Callable[[Request], None] | None) -> list[int]:
        """Every page the run takes is free now: no step evicts, and the pages taken are the
        pool's first ones whatever the finishes free meanwhile (to its back). Taken at once."""
        ps = self.page_size
        pages = self.pool.alloc(len(takes))
        assert pages is not None
        per_step = [0] * num_steps
        for (j, i), page in zip(takes, pages):
            self._give(requests[i], page)
            per_step[j] += 1
        not_yet = len(pages)  # taken up front, not yet by step j's schedule
        free_after = []
        for j, num in enumerate(per_step):
            not_yet -= num
            free_after.append(len(self.pool.free_pages) + not_yet + self.tree.evictable_size() // ps)
            if finish_at is not None and finish is not None:
                for r in finish_at[j]:
                    finish(r)
        return free_after

    def _take_step_by_step(self, requests: Sequence[Request], num_steps: int, takes: list[tuple[int, int]],
                           finish_at: list[list[Request]] | None, finish: Callable[[Request], None] | None) -> list[int]:
        """Some step finds the pool short: replay each step's check_decode_mem (evict when the
        pool holds fewer pages than the step takes), its grow() calls, then its update's finishes
        (their freed pages may be taken by a later step, as when stepping)."""
        ps = self.page_size
        free_after = []
        t = 0
        for j in range(num_steps):
            u = t
            while u < len(takes) and takes[u][0] == j:
                u += 1
            need = u - t
            if need and len(self.pool.free_pages) < need:
                self.tree.evict(need * ps)
            pages = self.pool.alloc(need)
            if pages is None:
                raise MemoryError(f"KV pool out of memory in step {j} of a decode run (decode_run_fit)")
            for (_, i), page in zip(takes[t:u], pages):
                self._give(requests[i], page)
            t = u
            free_after.append(len(self.pool.free_pages) + self.tree.evictable_size() // ps)
            if finish_at is not None and finish is not None:
                for r in finish_at[j]:
                    finish(r)
        return free_after

    def usage_at(self, num_free_pages: int) -> float:
        """`usage` when num_free_pages() is num_free_pages (the same float)."""
        return 1.0 - num_free_pages / self.pool.num_pages

    def usages_at(self, num_free_pages: list[int]) -> list[float]:
        """usage_at of each count, in one call."""
        num_pages = self.pool.num_pages
        return [1.0 - n / num_pages for n in num_free_pages]

    # --- caching -----------------------------------------------------------------------------------
    def _insert(self, request: Request, kv: ReqKV, kv_len: int) -> int:
        """Insert the request's first kv_len tokens (whole pages); pages the tree adopts stop
        being private. Returns the aligned length inserted."""
        aligned = kv_len // self.page_size * self.page_size
        if aligned <= kv.cached_len:
            return kv.cached_len
        tokens = request.all_token_ids[:aligned]
        n_pages = aligned // self.page_size
        already = self.tree.insert(tokens, kv.pages[:n_pages], extra_key(request))
        # Pages after the already-cached part now live in the tree; earlier private pages in
        # [cached_len, already) are duplicates another request cached first: still ours.
        kv.private.difference_update(kv.pages[already // self.page_size:n_pages])
        return aligned

    def cache_unfinished(self, request: Request, kv_len: int) -> None:
        """cache_unfinished_req: cache the KV computed so far and move the lock to its end."""
        kv = self.reqs[request.request_id]
        if not self.cache_enabled:
            return
        aligned = self._insert(request, kv, kv_len)
        if aligned <= kv.cached_len:
            return
        node, matched = self.tree.match_prefix(request.all_token_ids[:aligned], extra_key(request))
        assert matched == aligned, (matched, aligned)
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(kv.last_node)
        kv.last_node, kv.cached_len = node, aligned

    def release(self, request: Request, kv_len: int, insert: bool) -> None:
        """Let go of the request's KV: optionally cache it first (cache_finished_req), unlock the
        prefix and free private pages (a retraction does not insert: it needs the space now)."""
        kv = self.reqs.pop(request.request_id)
        if self.cache_enabled:
            if insert:
                self._insert(request, kv, kv_len)
            self.tree.dec_lock_ref(kv.last_node)
        self.pool.free([p for p in kv.pages if p in kv.private])

    def new_pages_to_report(self, rid: str) -> list[int]:
        kv = self.reqs[rid]
        new = kv.pages[kv.num_reported:]
        kv.num_reported = len(kv.pages)
        return new
