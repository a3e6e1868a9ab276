"""check_invariants() for SGLangScheduler: page accounting, radix-tree locks and sizes, queues."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from servesim.scheduler.invariants import InvariantError
from servesim.scheduler.request import RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.sglang.radix_cache import RadixCache
    from servesim.scheduler.sglang.scheduler import SGLangScheduler


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def check_tree(tree: RadixCache, lockers: list | None = None) -> list:
    """Structure, sizes and (given the locked nodes of all users) lock counts of a radix tree.
    Returns its nodes."""
    ps = tree.page_size
    evictable = protected = 0
    nodes = tree.nodes()
    for node in nodes:
        if node.lock_ref < 0:
            _fail(f"{node!r} has a negative lock count")
        pages = node.host_value if node.evicted else node.value
        if len(node.key) == 0 or len(node.key) % ps or pages is None or len(pages) * ps != len(node.key):
            _fail(f"{node!r}: {len(node.key)} tokens but {pages} pages of {ps}")
        if node.evicted:  # HiCache: host only, below device nodes, never locked
            if node.value or node.lock_ref or any(not c.evicted for c in node.children.values()):
                _fail(f"{node!r}: evicted but holds device pages, a lock or a device child")
            continue
        if node.parent.children.get(tree._child_key(node.extra, node.key)) is not node:
            _fail(f"{node!r} is not its parent's child under its own key")
        if node.lock_ref > 0:
            protected += len(node.key)
        else:
            evictable += len(node.key)
        if (not node.children) != (node in tree._leaves):
            _fail(f"{node!r}: leaf set out of date")
    unit = tree.key_tokens  # sizes are in tokens, node keys in elements (tokens or page keys)
    if evictable * unit != tree.evictable_size() or protected * unit != tree.protected_size():
        _fail(f"sizes: evictable {tree.evictable_size()} (counted {evictable * unit}), "
              f"protected {tree.protected_size()} (counted {protected * unit})")
    if lockers is not None:
        users = Counter()
        for node in lockers:
            while node is not tree.root:
                users[node] += 1
                node = node.parent
        for node in nodes:
            if node.lock_ref != users[node]:
                _fail(f"{node!r}: lock_ref {node.lock_ref} != {users[node]} users on its path")
    return nodes


def _host_lockers(mem) -> list:
    """Nodes HiCache copies in flight hold locked (a write-through's node, a load's last node)."""
    if mem.hicache is None:
        return []
    writes = [node for _, _, node in mem.hicache.ongoing_writes]
    return writes + [last for _, _, (_, last) in mem.hicache.ongoing_loads]


def _check_host_pages(mem, nodes: list) -> None:
    host = [p for node in nodes if node.host_value is not None for p in node.host_value]
    everything = host + list(mem.hicache.host_pool.free_pages)
    if len(everything) != len(set(everything)) or len(everything) != mem.hicache.host_pool.num_pages:
        _fail(f"host pages: {len(everything)} accounted for ({len(set(everything))} distinct), "
              f"host pool has {mem.hicache.host_pool.num_pages}")


def check_mamba(tree, pool, held: list, lockers: list | None = None) -> None:
    """Hybrid cache: every state slot is free, held by one request (`held`) or in one tree node;
    the tree's state sizes and state locks add up (given its lockers); no leaf is a tombstone
    unless a lock keeps it; a locked state implies a locked path (full_lock_ref >= mamba_lock_ref)."""
    in_tree = [] if tree is None else [n.mamba_slot for n in tree.nodes() if n.mamba_slot is not None]
    everything = in_tree + list(held) + list(pool.free_slots)
    if len(everything) != len(set(everything)) or len(everything) != pool.num_slots:
        dup = [s for s, c in Counter(everything).items() if c > 1][:5]
        _fail(f"Mamba slots: {len(everything)} accounted for (tree / requests / free), pool has "
              f"{pool.num_slots}; owned twice: {dup}")
    if tree is None:
        return
    users = Counter(id(n) for n in lockers or [])
    evictable = protected = 0
    for node in tree.nodes():
        if node.mamba_slot is None:
            if node.mamba_lock_ref or (not node.children and node.lock_ref == 0):
                _fail(f"{node!r}: a tombstone that is locked or an unlocked leaf")
            continue
        if node.mamba_lock_ref > node.lock_ref:
            _fail(f"{node!r}: mamba_lock_ref {node.mamba_lock_ref} > lock_ref {node.lock_ref}")
        if lockers is not None and node.mamba_lock_ref != users[id(node)]:
            _fail(f"{node!r}: mamba_lock_ref {node.mamba_lock_ref} != {users[id(node)]} requests ending there")
        if node.mamba_lock_ref:
            protected += 1
        else:
            evictable += 1
    if (evictable, protected) != (tree.mamba_evictable_size(), tree.mamba_protected_size()) \
            or len(tree.mamba_nodes) != evictable + protected:
        _fail(f"Mamba sizes: evictable {tree.mamba_evictable_size()} (counted {evictable}), protected "
              f"{tree.mamba_protected_size()} (counted {protected}), {len(tree.mamba_nodes)} nodes listed")


def check_invariants(sched: SGLangScheduler) -> None:
    mem = sched.kv_cache_manager
    lockers = [kv.last_node for kv in mem.reqs.values() if kv.last_node is not None]
    nodes = check_tree(mem.tree, lockers + _host_lockers(mem))
    if mem.hicache is not None:
        _check_host_pages(mem, nodes)
    if mem.mamba_pool is not None:
        held = [kv.mamba_slot for kv in mem.reqs.values()]
        if None in held:
            _fail("a request holding KV holds no Mamba state")
        check_mamba(mem.mamba_tree, mem.mamba_pool, held, lockers)
    tree_pages = [p for node in nodes for p in node.value]
    private = [p for kv in mem.reqs.values() for p in kv.private]
    free = list(mem.pool.free_pages)
    everything = tree_pages + private + free
    if len(everything) != len(set(everything)):
        dup = [p for p, c in Counter(everything).items() if c > 1][:5]
        _fail(f"pages owned twice (tree / request / free): {dup}")
    if len(everything) != mem.pool.num_pages or 0 in everything:
        _fail(f"{len(everything)} pages accounted for, pool has {mem.pool.num_pages} (page 0 reserved)")
    tree_set = set(tree_pages)
    for rid, kv in mem.reqs.items():
        table = set(kv.pages)
        if len(table) != len(kv.pages) or not kv.private <= table:
            _fail(f"{rid}: block table repeats a page or misses a private one")
        if table - kv.private - tree_set:
            _fail(f"{rid}: a page of its block table is neither private nor cached")
        if kv.cached_len % mem.page_size or kv.cached_len > len(kv.pages) * mem.page_size:
            _fail(f"{rid}: cached_len {kv.cached_len} does not fit its pages")
        request = sched.requests.get(rid)  # (one missing is reported by _check_queues)
        if kv.last_node is not None and mem.hicache is None and request is not None:
            _check_locked_path(mem, request, kv.last_node, kv.cached_len)
    _check_queues(sched)


def _check_locked_path(mem, request, node, cached_len: int) -> None:
    """The path a request locks spells its own first cached_len tokens' key (ids or page keys)."""
    parts = []
    while node is not mem.tree.root:
        parts.append(list(node.key))
        node = node.parent
    path = [k for part in reversed(parts) for k in part]
    if path != list(mem.tree_key(request, cached_len)):
        _fail(f"{request.request_id}: its locked path is not its own first {cached_len} tokens' key")


def _check_queues(sched: SGLangScheduler) -> None:
    mem = sched.kv_cache_manager
    waiting_ids = [r.request_id for r in sched.waiting]
    running_ids = [r.request_id for r in sched.running]
    if len(set(waiting_ids)) != len(waiting_ids) or len(set(running_ids)) != len(running_ids):
        _fail("a request is queued twice")
    if set(waiting_ids) & set(running_ids):
        _fail("a request is both running and waiting")
    for r in sched.waiting:
        if r.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED) or r.request_id in mem.reqs:
            _fail(f"{r.request_id} waits with status {r.status.name} (holding KV: {r.request_id in mem.reqs})")
    for r in sched.running:
        if r.status != RequestStatus.RUNNING or r.request_id not in mem.reqs:
            _fail(f"{r.request_id} runs with status {r.status.name}")
    for r in sched.ghosts:
        if not r.is_finished():
            _fail(f"ghost {r.request_id} is not finished")
    for rid, r in sched.requests.items():
        if r.status == RequestStatus.RUNNING:
            kv = mem.reqs.get(rid)
            if kv is None or len(kv.pages) * mem.page_size < r.num_computed_tokens:
                _fail(f"{rid}: KV pages do not cover its {r.num_computed_tokens} computed tokens")
    if set(mem.reqs) - set(sched.requests):
        _fail(f"finished requests still hold KV: {sorted(set(mem.reqs) - set(sched.requests))[:5]}")
    running, _ = sched.get_request_counts()
    if running > sched.config.max_running_requests:
        _fail(f"{running} running requests > max_running_requests {sched.config.max_running_requests}")
    if sched.batch_is_full and not (sched.running or sched.ghosts or sched.chunked_req or sched.last_batch):
        _fail("batch_is_full with nothing running: prefill would never be tried again")
