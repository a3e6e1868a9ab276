"""SGLang's memory bulk operations for runs of plain decode steps (macro-steps).

`SGLangMemoryRuns` owns no state of its own: it reads and writes its SGLangMemory's page pool,
radix tree and block tables (a friend: scheduler/bulk/__init__.py). It takes the pages of a run
as the steps' grow() calls take them, evicting where a step's decode memory check would, so page
ids, evictions and the pool's order are the stepped ones. Owned by SGLang's bulk path
(scheduler/bulk/sglang.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.request import Request
    from servesim.scheduler.sglang.memory import SGLangMemory


class SGLangMemoryRuns:
    """Bulk page operations of a run of plain SGLang decode steps on one SGLangMemory."""

    def __init__(self, memory: SGLangMemory) -> None:
        self.memory = memory

    def first_alloc_steps(self, requests: Sequence[Request]) -> list[int]:
        """For each request, the step of a decode run (0-based) whose grow() takes its first new
        page: step j grows it to num_computed_tokens + j + 1 tokens, and a page is taken when that
        passes what its pages hold (check_decode_mem's count: computed >= pages * page_size);
        then one every page_size steps."""
        ps, reqs = self.memory.page_size, self.memory.reqs
        return [max(0, len(reqs[r.request_id].pages) * ps - r.num_computed_tokens) for r in requests]

    def run_pages(self, first: list[int], num_steps: int, caps: Sequence[int] | None = None) -> int:
        """Pages the first num_steps steps of a run take (first: first_alloc_steps; request i is
        scheduled in the first caps[i] steps only)."""
        ps = self.memory.page_size
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
        room = self.memory.num_free_pages()
        if self.run_pages(first, max_steps, caps) <= room:
            return max_steps
        lo, hi = 0, max_steps  # fits lo steps, not hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.run_pages(first, mid, caps) <= room:
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
        order (`finish` releases each: cache insert, pages to the back of the pool). Returns
        num_free_pages() after each schedule. `first`: first_alloc_steps(requests) before the run
        (the caller may have moved the requests' counters to the run's end already, which the
        finishes read)."""
        limits = caps if caps is not None else [num_steps] * len(requests)
        ps = self.memory.page_size
        takes = sorted((j, i) for i, (j0, c) in enumerate(zip(first, limits)) for j in range(j0, min(c, num_steps), ps))
        if len(takes) <= len(self.memory.pool.free_pages):
            return self._take_up_front(requests, num_steps, takes, finish_at, finish)
        return self._take_step_by_step(requests, num_steps, takes, finish_at, finish)

    def _give(self, request: Request, page: int) -> None:
        """A page for the request's table, reported (the step's output would have sent it)."""
        kv = self.memory.reqs[request.request_id]
        kv.pages.append(page)
        kv.private.add(page)
        kv.num_reported = len(kv.pages)

    def _take_up_front(self, requests: Sequence[Request], num_steps: int, takes: list[tuple[int, int]],
                       finish_at: list[list[Request]] | None, finish: Callable[[Request], None] | None) -> list[int]:
        """Every page the run takes is free now: no step evicts, and the pages taken are the
        pool's first ones whatever the finishes free meanwhile (to its back). Taken at once."""
        mem = self.memory
        ps = mem.page_size
        pages = mem.pool.alloc(len(takes))
        assert pages is not None
        per_step = [0] * num_steps
        for (j, i), page in zip(takes, pages):
            self._give(requests[i], page)
            per_step[j] += 1
        not_yet = len(pages)  # taken up front, not yet by step j's schedule
        free_after = []
        for j, num in enumerate(per_step):
            not_yet -= num
            free_after.append(len(mem.pool.free_pages) + not_yet + mem.tree.evictable_size() // ps)
            if finish_at is not None and finish is not None:
                for r in finish_at[j]:
                    finish(r)
        return free_after

    def _take_step_by_step(self, requests: Sequence[Request], num_steps: int, takes: list[tuple[int, int]],
                           finish_at: list[list[Request]] | None, finish: Callable[[Request], None] | None) -> list[int]:
        """Some step finds the pool short: replay each step's check_decode_mem (evict when the
        pool holds fewer pages than the step takes), its grow() calls, then its update's finishes
        (their freed pages may be taken by a later step, as when stepping)."""
        mem = self.memory
        ps = mem.page_size
        free_after = []
        t = 0
        for j in range(num_steps):
            u = t
            while u < len(takes) and takes[u][0] == j:
                u += 1
            need = u - t
            if need and len(mem.pool.free_pages) < need:
                mem.tree.evict(need * ps)
            pages = mem.pool.alloc(need)
            if pages is None:
                raise MemoryError(f"KV pool out of memory in step {j} of a decode run (decode_run_fit)")
            for (_, i), page in zip(takes[t:u], pages):
                self._give(requests[i], page)
            t = u
            free_after.append(len(mem.pool.free_pages) + mem.tree.evictable_size() // ps)
            if finish_at is not None and finish is not None:
                for r in finish_at[j]:
                    finish(r)
        return free_after

    def usage_at(self, num_free_pages: int) -> float:
        """`usage` when num_free_pages() is num_free_pages (the same float)."""
        return 1.0 - num_free_pages / self.memory.pool.num_pages

    def usages_at(self, num_free_pages: list[int]) -> list[float]:
        """usage_at of each count, in one call."""
        num_pages = self.memory.pool.num_pages
        return [1.0 - n / num_pages for n in num_free_pages]
