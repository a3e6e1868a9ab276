"""SGLang's radix tree keyed by page keys (memory.py) against the tree keyed by token ids: the same
tree, node for node, under random inserts, matches, locks and evictions; a scheduler that never
builds a synthetic prompt's ids; and whole simulations byte-identical with either keying."""

from __future__ import annotations

import hashlib
import random

import pytest

from servesim.scheduler import ModelRunnerOutput, Request, SamplingParams
from servesim.scheduler.block_keys import stream_source
from servesim.scheduler.hashing import TokenProvenance, TokenSegment
from servesim.scheduler.lazy_ids import LazyTokenIds
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.invariants import check_tree
from servesim.scheduler.sglang.radix_cache import RadixCache, TokenToKVPool
from test_block_keys import _sharing_workload  # tests/test_block_keys.py: prefix groups, sessions, LoRA, real ids


# --- the tree: page keys and token ids side by side ---------------------------------------------------
def _page_keys(tokens: list[int], ps: int) -> list[bytes]:
    """A chained key per whole page: equal exactly when the tokens up to the page's end are."""
    keys, parent = [], b""
    for i in range(len(tokens) // ps):
        parent = hashlib.sha256(parent + repr(tokens[i * ps:(i + 1) * ps]).encode()).digest()
        keys.append(parent)
    return keys


def _shape(tree: RadixCache) -> list:
    """Every node as (id, length in tokens, pages, locks, access time)."""
    return sorted((n.id, len(n.key) * tree.key_tokens, tuple(n.value), n.lock_ref, n.last_access)
                  for n in tree.nodes())


@pytest.mark.parametrize("seed", range(8))
def test_page_keyed_tree_is_the_token_tree_node_for_node(seed):
    rng = random.Random(seed)
    ps = rng.choice([2, 4, 16])
    trees = {"tokens": RadixCache(ps, TokenToKVPool(60, ps)), "pages": RadixCache(1, TokenToKVPool(60, ps), ps)}
    keyed = {"tokens": lambda t: t, "pages": lambda t: _page_keys(t, ps)}
    locked: list[dict] = []  # matched nodes locked in both trees, oldest first
    for _ in range(300):
        op = rng.random()
        # a small alphabet and short keys: many shared prefixes, partial matches and splits
        tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 7 * ps))]
        extra = rng.choice([None, None, ("lora", 1)])
        lock, amount = rng.random() < 0.3, rng.randrange(1, 4 * ps)
        got = {}
        for name, tree in trees.items():
            if op < 0.4:  # cache_finished_req: fresh pages, the already cached part's freed again
                if tree.pool.available_size() < len(tokens):
                    tree.evict(len(tokens))
                pages = tree.pool.alloc(min(len(tokens) // ps, len(tree.pool.free_pages))) or []
                already = tree.insert(keyed[name](tokens[:len(pages) * ps]), pages, extra)
                tree.pool.free(pages[:already // ps])
                got[name] = already
            elif op < 0.75:
                key = keyed[name](tokens)
                peeked = tree.peek_prefix(key, extra)
                node, n = tree.match_prefix(key, extra)
                got[name] = (n, peeked, tuple(tree.path_pages(node)))
                if lock:
                    tree.inc_lock_ref(node)
                    if name == "tokens":  # (the first tree: a new pair of locked nodes)
                        locked.append({})
                    locked[-1][name] = node
            elif op < 0.85:
                if locked:
                    tree.dec_lock_ref(locked[0][name])
            else:
                got[name] = (tree.evict(amount), len(tree.pool.free_pages))
        if 0.75 <= op < 0.85 and locked:  # (the unlock above, in both trees)
            locked.pop(0)
        assert got.get("tokens") == got.get("pages"), (op, tokens)
        assert _shape(trees["tokens"]) == _shape(trees["pages"])
        assert (trees["pages"].evictable_size(), trees["pages"].protected_size()) == \
               (trees["tokens"].evictable_size(), trees["tokens"].protected_size())
        check_tree(trees["tokens"], [u["tokens"] for u in locked])
        check_tree(trees["pages"], [u["pages"] for u in locked])


def test_a_page_keyed_tree_has_one_element_a_page():
    with pytest.raises(ValueError, match="one element a page"):
        RadixCache(4, TokenToKVPool(8, 4), key_tokens=4)


# --- the scheduler: page keys never build a synthetic prompt's ids -----------------------------------
def _stream_ids(key: int, start: int, n: int) -> list[int]:
    """Ids start .. start + n - 1 of stream `key`: pseudo-random (no two streams or positions share
    a page's worth of ids, TokenSegment's promise)."""
    return [int.from_bytes(hashlib.blake2b(f"{key}:{p}".encode(), digest_size=4).digest(), "little") >> 2
            for p in range(start, start + n)]


class _Case:
    """One workload for both keyings: request i's prompt is a shared group's stream, then its own;
    its outputs are positions of its own output stream."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.reqs = []
        for i in range(40):
            group, shared, own = rng.randrange(3), rng.choice([0, 9, 16, 24]), rng.randrange(3, 50)
            segments = ((TokenSegment(stream_source(group), 0, shared),) if shared else ()) + \
                (TokenSegment(stream_source(100 + i), 0, own),)
            ids = (_stream_ids(group, 0, shared) if shared else []) + _stream_ids(100 + i, 0, own)
            self.reqs.append((f"r{i}", ids, segments, rng.randrange(2, 60), i // 4))

    def make(self, keyed: bool, build_ok: bool) -> list[tuple[int, Request]]:
        out = []
        for i, (rid, ids, segments, max_tokens, arrives) in enumerate(self.reqs):
            if keyed:
                def build(ids=ids):
                    assert build_ok, "a page-keyed tree built a synthetic prompt's ids"
                    return ids
                prov = TokenProvenance(segments, stream_source(1000 + i))
                r = Request(rid, LazyTokenIds(len(ids), build), SamplingParams(max_tokens=max_tokens,
                                                                              ignore_eos=True), token_provenance=prov)
            else:
                r = Request(rid, list(ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            out.append((arrives, r))
        return out


def _sched(keyed: bool, policy: str) -> SGLangScheduler:
    cfg = SGLangConfig(max_running_requests=8, chunked_prefill_size=16, enable_chunked_prefill=True, page_size=4,
                       max_total_tokens=220, enable_radix_cache=True, overlap_schedule=False, seed=0,
                       schedule_policy=policy, init_new_token_ratio=0.2, new_token_ratio_decay_steps=10)
    return SGLangScheduler(cfg, 4096, page_keys_hash_algo="sha256" if keyed else None)


def _output_view(so) -> tuple:
    c = so.scheduled_cached_reqs
    new = [(n.req_id, n.block_ids, n.num_computed_tokens) for n in so.scheduled_new_reqs]
    return (dict(so.num_scheduled_tokens), new,
            c.req_ids, c.new_block_ids, c.num_computed_tokens, sorted(c.resumed_req_ids), sorted(so.preempted_req_ids),
            sorted(so.finished_req_ids), sorted(c.all_token_ids))


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_page_keyed_scheduler_schedules_as_the_token_tree_without_building_ids(policy, seed):
    case = _Case(seed)
    build_ok = policy == "lpm"  # the LPM policy's in-batch tree reads ids (token-granular)
    scheds = {True: _sched(True, policy), False: _sched(False, policy)}
    arrivals = {keyed: case.make(keyed, build_ok) for keyed in scheds}
    assert scheds[True].kv_cache_manager.page_keys and not scheds[False].kv_cache_manager.page_keys
    probes = [(tuple(ids), segments) for _, ids, segments, _, _ in case.reqs[:6]]
    retracted = hits = 0
    for step_no in range(2000):
        views = {}
        for keyed, sched in scheds.items():
            for arrives, r in arrivals[keyed]:
                if arrives == step_no:
                    sched.add_request(r)
            so = sched.schedule()
            sched.check_invariants()  # incl. each request's locked path spelling its own key
            ids = list(so.num_scheduled_tokens)
            sampled = []
            for rid in ids:
                r = sched.requests[rid]
                k = int(rid[1:])
                sampled.append([] if r.is_prefill_chunk else _stream_ids(1000 + k, r.num_output_tokens, 1))
            sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled))
            sched.check_invariants()
            reads = [sched.cached_prefix_tokens(t, None, TokenProvenance(s)) for t, s in probes]  # a router's
            views[keyed] = (_output_view(so), reads)
            retracted += len(so.preempted_req_ids)
            hits += sum(n.num_computed_tokens for n in so.scheduled_new_reqs)
        assert views[True] == views[False], step_no
        if not any(s.has_unfinished_requests() for s in scheds.values()) and step_no > case.reqs[-1][4]:
            break
    assert hits > 0 and retracted > 0  # the cache hit and the pool ran short: the comparison means something


# --- whole simulations: both keyings give byte-identical results -----------------------------------
@pytest.mark.parametrize("sets", [
    {"scheduler.async_scheduling": True},
    {"scheduler.async_scheduling": False, "sglang.schedule_policy": "lpm"},
    {"scheduler.max_num_batched_tokens": 256, "sglang.enable_mixed_chunk": True},
])
def test_simulations_identical_with_either_keying(tmp_path, sets):
    from servesim.overrides import apply_overrides
    from servesim.running import run
    from servesim.simulator.config import SimConfig

    outs = {}
    for keys in ("provenance", "token_ids"):
        # a small pool: evictions and retractions exercise the tree
        cfg = apply_overrides(SimConfig(), {"engine": "sglang", "prefix_cache_keys": keys,
                                            "scheduler.max_model_len": 2048, "cache.num_gpu_blocks": 260,
                                            "derive_num_gpu_blocks": False, **sets})
        outs[keys] = run(cfg, _sharing_workload(), tmp_path / keys)
    summary = outs["provenance"].summary
    assert summary["prefix_cache_hit_tokens"] > 2000  # the workload shares prefixes: the comparison means something
    assert summary["num_preemptions"] > 0
    for name in ("requests.parquet", "steps.parquet"):
        assert (tmp_path / "provenance" / name).read_bytes() == (tmp_path / "token_ids" / name).read_bytes(), name


def test_prefix_aware_sglang_cluster_identical_with_either_keying():
    """The router reads each SGLang replica's tree through a probe's page keys (cached_prefix_tokens):
    its choices, hence the whole cluster run, match the token-keyed trees'."""
    from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict

    frames = {}
    for keys in ("provenance", "token_ids"):
        sim = sim_config_from_dict({"engine": "sglang", "prefix_cache_keys": keys, "scheduler.max_model_len": 2048,
                                    "cache.num_gpu_blocks": 600, "derive_num_gpu_blocks": False})
        cfg = ClusterConfig(replicas=[ReplicaGroup(3, sim)], router=RouterConfig("prefix_aware"))
        frames[keys] = run_cluster(cfg, _sharing_workload())
    a, b = frames["provenance"], frames["token_ids"]
    assert a.summary["prefix_cache_hit_tokens"] > 2000
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
