"""Waiting-queue orderings (SGLang's SchedulePolicy.calc_priority), registered by name.

Each ordering sorts the waiting list in place before a prefill batch is formed; the order then
persists (as in SGLang, whose waiting_queue is a plain list sorted in place). Cache-aware
orderings (lpm, dfs-weight) match every waiting request against the radix cache first; with the
cache disabled they fall back to fcfs, and lpm also falls back to fcfs (no sorting at all) when
the queue is longer than lpm_fallback_queue_len, because matching a long queue is expensive.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.scheduler.sglang.config import CACHE_AWARE_POLICIES, ORDERINGS, SGLangConfig
from servesim.scheduler.sglang.memory import SGLangMemory, extra_key
from servesim.scheduler.sglang.radix_cache import RadixCache, TreeNode

if TYPE_CHECKING:
    from servesim.scheduler.request import Request


@dataclass(slots=True)
class QueueContext:
    """What an ordering may look at."""

    config: SGLangConfig
    memory: SGLangMemory
    rng: random.Random  # seeded: the `random` policy is reproducible
    entry_seq: dict[str, int]  # req_id -> order of entry into the waiting queue (FCFS time)


Ordering = Callable[[list, QueueContext], None]


def register_ordering(name: str):
    return ORDERINGS.register(name)


def active_policy(policy: str, queue_len: int, cfg: SGLangConfig, cache_enabled: bool) -> str:
    if policy in CACHE_AWARE_POLICIES and not cache_enabled:
        return "fcfs"  # SchedulePolicy._validate_and_adjust_policy
    if policy == "lpm" and queue_len > cfg.lpm_fallback_queue_len:
        return "fcfs"  # _determine_active_policy: only LPM has the long-queue fallback
    return policy


def calc_priority(policy: str, waiting: list, ctx: QueueContext) -> None:
    """Sort `waiting` in place with the named ordering (after SGLang's fallbacks)."""
    name = active_policy(policy, len(waiting), ctx.config, ctx.memory.cache_enabled)
    ORDERINGS.get(name)(waiting, ctx)


def _priority_key(request: Request, cfg: SGLangConfig) -> int:
    return request.priority if cfg.schedule_low_priority_values_first else -request.priority


@register_ordering("fcfs")
def _fcfs(waiting: list, ctx: QueueContext) -> None:
    # Plain FCFS keeps the queue as it is: arrivals and retracted requests are appended.
    if ctx.config.enable_priority_scheduling:
        waiting.sort(key=lambda r: (_priority_key(r, ctx.config), ctx.entry_seq[r.request_id]))


@register_ordering("lof")
def _lof(waiting: list, ctx: QueueContext) -> None:
    """Longest output first: most max_new_tokens first (priority first when enabled)."""
    if ctx.config.enable_priority_scheduling:
        waiting.sort(key=lambda r: (_priority_key(r, ctx.config), -r.max_tokens))
    else:
        waiting.sort(key=lambda r: -r.max_tokens)


@register_ordering("random")
def _random(waiting: list, ctx: QueueContext) -> None:
    ctx.rng.shuffle(waiting)


def compute_prefix_matches(waiting: list, ctx: QueueContext) -> tuple[dict[str, int], dict[str, TreeNode], set[str]]:
    """Match each waiting request against the cache (full token list, as SGLang's policy does).

    In-batch prefix caching: a request with a short cache hit that shares a long prefix with an
    earlier waiter is deprioritized, so only one of them computes the shared prefix and the
    others hit the cache afterwards. Returns (matched tokens, last node, deprioritized ids)."""
    cfg = ctx.config
    matched: dict[str, int] = {}
    last_node: dict[str, TreeNode] = {}
    deprioritized: set[str] = set()
    in_batch = RadixCache(page_size=1)  # simulated tree over the waiting queue
    for r in waiting:
        node, n = ctx.memory.lookup(r, r.num_tokens)
        matched[r.request_id], last_node[r.request_id] = n, node
        if n <= cfg.in_batch_prefix_check_threshold:
            tokens = r.all_token_ids  # (token-granular: the in-batch tree reads ids whatever the cache's keys)
            _, shared = in_batch.match_prefix(tokens, extra_key(r))
            if shared >= cfg.in_batch_prefix_deprioritize_threshold:
                deprioritized.add(r.request_id)
            else:
                in_batch.insert(tokens, range(len(tokens)), extra_key(r))
    return matched, last_node, deprioritized


@register_ordering("lpm")
def _lpm(waiting: list, ctx: QueueContext) -> None:
    """Longest prefix match first; deprioritized in-batch duplicates go last (stable sort)."""
    matched, _, deprioritized = compute_prefix_matches(waiting, ctx)
    waiting.sort(key=lambda r: float("inf") if r.request_id in deprioritized else -matched[r.request_id])


@register_ordering("dfs-weight")
def _dfs_weight(waiting: list, ctx: QueueContext) -> None:
    """Depth-first walk of the radix tree, heavier subtrees (more waiting requests ending in
    them) first; requests are emitted after their node's subtree, grouping shared prefixes."""
    _, last_node, _ = compute_prefix_matches(waiting, ctx)
    root = ctx.memory.tree.root
    reqs_at: dict[TreeNode, list] = defaultdict(list)
    for r in waiting:
        reqs_at[last_node[r.request_id]].append(r)
    weight: dict[TreeNode, int] = defaultdict(int)
    for node, reqs in reqs_at.items():
        weight[node] = len(reqs)
    # Post-order accumulation of subtree weights (iterative: trees can be deep).
    order, stack = [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    for node in reversed(order):
        if node is not root:
            weight[node.up()] += weight[node]
    out: list = []
    stack2: list[tuple[TreeNode, bool]] = [(root, False)]
    while stack2:
        node, expanded = stack2.pop()
        if expanded:
            out.extend(reqs_at.get(node, ()))
            continue
        stack2.append((node, True))
        children = sorted(node.children.values(), key=lambda c: -weight[c])  # stable, as SGLang
        stack2.extend((c, False) for c in reversed(children))
    waiting[:] = out
