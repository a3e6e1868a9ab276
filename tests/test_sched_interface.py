"""The scheduler contract (scheduler/interface.py): every scheduler implements it, exactly, and its
queries answer what the scheduler itself would do without changing anything."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from servesim import _native
from servesim.scheduler import AsyncScheduler, Request, SamplingParams, Scheduler
from servesim.scheduler.bulk import decode_runs_for
from servesim.scheduler.bulk.interface import DecodeRuns
from servesim.scheduler.interface import KVCacheUsage, SchedulerCapabilities, SchedulerInterface
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster
from servesim.simulator.cluster.config import sim_config_from_dict
from sched_helpers import make_sched, output_for, req
from servesim.traces.bundled import load_bundled
from servesim.traces.workload import RequestSpec, Workload

SGL = dict(max_running_requests=16, chunked_prefill_size=64, enable_chunked_prefill=True, page_size=4,
           max_total_tokens=400, enable_radix_cache=True, overlap_schedule=False, seed=0)


def cluster(n: int, router: str, sim) -> ClusterConfig:
    return ClusterConfig(replicas=[ReplicaGroup(count=n, sim=sim)], router=RouterConfig(router, {}), seed=0)


def sglang(**kw) -> SGLangScheduler:
    return SGLangScheduler(SGLangConfig(**{**SGL, **kw}), 256)


def pd_schedulers() -> list:
    from servesim.simulator.cluster.pd_connectors import RemoteDecodeConnector, RemotePrefillConnector
    from servesim.simulator.cluster.pd_schedulers import decode_scheduler, prefill_scheduler
    from servesim.simulator.config import SimConfig
    from servesim.simulator.startup import resolve_cache

    cfg = SimConfig()
    cache = resolve_cache(cfg)[0]
    return [decode_scheduler(cfg, cache, RemotePrefillConnector(lambda r, n: None)),
            prefill_scheduler(cfg, cache, RemoteDecodeConnector())]


def all_schedulers() -> list:
    return [make_sched(), make_sched(async_scheduling=True), sglang(), sglang(overlap_schedule=True),
            *pd_schedulers()]


def protocol_members(proto: type) -> dict[str, object]:
    """Every member a Protocol declares: annotated attributes and methods (its own, not object's)."""
    members = {name: None for name in proto.__annotations__}
    for name, value in vars(proto).items():
        if not name.startswith("_") and (callable(value) or isinstance(value, property)):
            members[name] = value
    return members


@pytest.mark.parametrize("sched", all_schedulers(), ids=lambda s: type(s).__name__)
def test_every_scheduler_implements_the_contract(sched):
    assert isinstance(sched, SchedulerInterface)
    assert isinstance(sched.kv_cache_manager, KVCacheUsage)
    assert isinstance(sched.capabilities, SchedulerCapabilities)
    members = protocol_members(SchedulerInterface)
    assert {"capabilities", "overlap_allowed", "next_event_s", "cached_prefix_tokens"} <= set(members)
    assert_implements(sched, members)


def assert_implements(sched, members: dict[str, object]) -> None:
    """`sched` has every member; each method accepts the declared parameters, by name and in
    order (static-style)."""
    for name, declared in members.items():
        assert hasattr(sched, name), f"{type(sched).__name__} lacks {name}"
        if declared is None:
            continue
        want = list(inspect.signature(declared).parameters)[1:]
        try:
            have = list(inspect.signature(getattr(sched, name)).parameters)
        except ValueError:
            # A mypyc-compiled method whose defaults (an enum member) no text signature can spell;
            # the same source is checked in the pure-Python run of this file (tests/test_compiled.py).
            assert _native.scheduler_mode().startswith("compiled"), f"{type(sched).__name__}.{name}"
            continue
        assert have[:len(want)] == want, f"{type(sched).__name__}.{name}{have} vs {want}"


@pytest.mark.parametrize("sched", all_schedulers()[:4], ids=lambda s: type(s).__name__)
def test_the_bulk_decode_paths_implement_their_contract(sched):
    """The bulk decode path a scheduler declares (scheduler/bulk/: what macro-steps drive) has every
    member DecodeRuns declares, with its parameters; usage_at and usages_at give the KV manager's
    own `usage` floats; finished_req_ids is the scheduler's set itself."""
    runs = decode_runs_for(sched)
    assert runs is not None
    counts = [0, 1, 7, 100]
    assert runs.usages_at(counts) == [runs.usage_at(n) for n in counts]
    assert runs.usage_at(sched.get_num_free_blocks()) == sched.kv_cache_manager.usage
    assert runs.finished_req_ids() is sched.finished_req_ids
    members = protocol_members(DecodeRuns)
    assert {"decode_run_horizon", "schedule_decode_steps", "decode_run_extra_steps", "finished_req_ids",
            "usage_at", "usages_at"} <= set(members)
    assert_implements(runs, members)


def test_the_bulk_decode_path_is_declared_not_told_by_type():
    """A scheduler names its bulk path (SchedulerCapabilities.decode_runs); of the P/D schedulers,
    subclasses of vLLM's, the prefill side (delayed frees, stalls) names none and steps, the decode
    side names its own (scheduler/bulk/pd.py), not the vLLM path it inherits."""
    from servesim.scheduler.bulk.pd import PDDecodeRuns

    assert [s.capabilities.decode_runs for s in all_schedulers()] == ["vllm", "vllm", "sglang", "sglang",
                                                                      "pd_decode", None]
    decode, prefill = pd_schedulers()
    assert type(decode_runs_for(decode)) is PDDecodeRuns
    assert decode_runs_for(prefill) is None


def test_capabilities_are_declared_not_probed():
    assert make_sched().capabilities == SchedulerCapabilities(1, True, "block_hash", "vllm")
    assert make_sched(async_scheduling=True).capabilities.max_steps_in_flight == 2
    assert make_sched(enable_prefix_caching=False).capabilities.prefix_cache is None
    assert sglang().capabilities == SchedulerCapabilities(1, False, "radix", "sglang")
    assert sglang(overlap_schedule=True, enable_radix_cache=False).capabilities == SchedulerCapabilities(2, False, None, "sglang")
    # P/D schedulers are vLLM's (async by default, as SimConfig's vLLM 0.19 defaults).
    assert [s.capabilities for s in pd_schedulers()] == [SchedulerCapabilities(2, True, "block_hash", "pd_decode"),
                                                         SchedulerCapabilities(2, True, "block_hash", None)]
    with pytest.raises(ValueError, match="max_steps_in_flight"):
        SchedulerCapabilities(3, True, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_sched().capabilities.idle_is_stable = False


def test_overlap_allowed_vllm_always_sglang_by_rule():
    s = make_sched()
    assert s.overlap_allowed(s.schedule(), s.schedule())
    g = sglang(overlap_schedule=True, disable_consecutive_prefill_overlap=True)
    g.add_request(Request("a", list(range(8)), SamplingParams(max_tokens=2)))
    g.add_request(Request("b", list(range(100, 108)), SamplingParams(max_tokens=2)))
    first = g.schedule()
    assert g.overlap_allowed(first, first) is False  # two prefills in a row run serially


def test_next_event_s_is_the_earliest_pin_expiry():
    s = make_sched(policy="continuum", block_size=4, num_blocks=50, continuum_default_gap_s=0.5)
    assert s.next_event_s() is None
    r = req(s, "t1", list(range(20)), max_tokens=2, job_id="job", is_last_step=False)
    s.add_request(r, now_s=0.0)
    t = 0.0
    while not r.is_finished():
        t += 0.01
        out = s.schedule(now_s=t)
        s.update_from_output(out, output_for(out), now_s=t)
    assert s.policy.pins and s.next_event_s() == s.policy.pins[0].unpin_at_s > t
    assert make_sched().next_event_s() is None and sglang().next_event_s() is None


def _serve_vllm(s: Scheduler, rid: str, tokens: list[int], **kw) -> None:
    """Run one request to its end (1 output token): its full prompt blocks stay cached."""
    r = req(s, rid, tokens, max_tokens=1, **kw)
    s.add_request(r)
    while not r.is_finished():
        out = s.schedule()
        s.update_from_output(out, output_for(out))


def test_cached_prefix_tokens_vllm_counts_full_blocks_capped_at_len_minus_one():
    s = make_sched(block_size=4, num_blocks=50)
    prompt = list(range(10))
    assert s.cached_prefix_tokens(prompt) == 0  # cold cache
    _serve_vllm(s, "a", prompt)  # 10 computed tokens: blocks [0..3] and [4..7] are cached
    s.make_stats()
    free_order = [b.block_id for b in s.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()]
    assert s.cached_prefix_tokens(prompt) == 8
    assert s.cached_prefix_tokens(prompt + [99] * 20) == 8  # longer prompt: still two blocks
    assert s.cached_prefix_tokens(prompt[:9]) == 8  # cap 8: both blocks
    assert s.cached_prefix_tokens(prompt[:8]) == 4  # cap 7: the last token is always recomputed
    assert s.cached_prefix_tokens(prompt[:5] + [77] * 5) == 4  # diverges inside block 2
    assert s.cached_prefix_tokens(prompt, lora_id=3) == 0  # another adapter's namespace
    assert s.cached_prefix_tokens(prompt[:1]) == 0 and s.cached_prefix_tokens([]) == 0
    # Nothing changed: no stats recorded, the free queue (LRU order) untouched.
    assert s.make_stats().prefix_cache_stats.queries == 0
    assert [b.block_id for b in s.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()] == free_order
    assert make_sched(enable_prefix_caching=False).cached_prefix_tokens(prompt) == 0


def test_cached_prefix_tokens_vllm_long_prompt_matches_the_schedulers_own_hit():
    s = make_sched(block_size=4, num_blocks=400, max_model_len=1024, max_num_batched_tokens=1024)
    prompt = list(range(300))  # past the first hashed head (8 blocks = 32 tokens) and its x4 growth
    _serve_vllm(s, "a", prompt)
    assert s.cached_prefix_tokens(prompt + [5]) == 300
    s.add_request(req(s, "b", prompt + [5], max_tokens=1))
    assert s.schedule().scheduled_new_reqs[0].num_computed_tokens == 300


def _serve_sglang(s: SGLangScheduler, rid: str, tokens: list[int], lora_id=None) -> None:
    s.add_request(Request(rid, tokens, SamplingParams(max_tokens=1, ignore_eos=True), lora_id=lora_id))
    while s.has_unfinished_requests():
        so = s.schedule()
        ids = list(so.num_scheduled_tokens)
        sampled = [[] if s.requests[r].is_prefill_chunk else [7] for r in ids]
        s.update_from_output(so, output_for(so, dict(zip(ids, sampled))))


def test_cached_prefix_tokens_sglang_counts_whole_pages_of_the_radix_tree():
    s = sglang(page_size=4)
    prompt = list(range(10))
    assert s.cached_prefix_tokens(prompt) == 0
    _serve_sglang(s, "a", prompt)  # finished: its 10 computed tokens cached as 2 whole pages
    tree = s.kv_cache_manager.tree
    before = [(n.id, n.last_access, len(n.key)) for n in tree.nodes()]
    assert s.cached_prefix_tokens(prompt) == 8
    assert s.cached_prefix_tokens(prompt[:9]) == 8
    assert s.cached_prefix_tokens(prompt[:8]) == 4  # at most len - 1 tokens are matched
    assert s.cached_prefix_tokens(prompt[:6] + [77] * 4) == 4  # a partial match: no split
    assert s.cached_prefix_tokens(prompt, lora_id=2) == 0
    assert s.cached_prefix_tokens([]) == 0
    assert [(n.id, n.last_access, len(n.key)) for n in tree.nodes()] == before  # no LRU touch, no split
    assert sglang(enable_radix_cache=False).cached_prefix_tokens(prompt) == 0
    _serve_sglang(s, "b", prompt, lora_id=2)
    assert s.cached_prefix_tokens(prompt, lora_id=2) == 8


def test_prefix_aware_routes_by_prefix_under_sglang():
    """The router asks only cached_prefix_tokens, so SGLang's radix tree steers it too."""
    sim = sim_config_from_dict({"engine": "sglang"})
    shared = RequestSpec("warm", 0.0, prompt_len=512, output_len=1, prefix_group=1, prefix_len=512)
    later = [RequestSpec(f"hit{i}", 5.0 + i, prompt_len=600, output_len=1, prefix_group=1, prefix_len=512)
             for i in range(3)]
    res = run_cluster(cluster(3, "prefix_aware", sim), Workload([shared, *later], "prefix", "test"))
    df = res.requests.set_index("request_id")
    home = df.loc["warm", "replica"]
    assert (df.loc[[f"hit{i}" for i in range(3)], "replica"] == home).all()
    assert (df.loc[[f"hit{i}" for i in range(3)], "route_reason"] == "prefix").all()
    assert df.loc["hit0", "route_score"] == pytest.approx(512 / 600)


@pytest.mark.slow
def test_prefix_aware_beats_round_robin_under_sglang():
    wl = load_bundled("mooncake-conversation-5min")
    reqs = [dataclasses.replace(r, output_len=min(r.output_len, 4)) for r in wl.requests if r.prompt_len <= 16000]
    wl = Workload(reqs[:160], "mooncake-160", "test")
    sim = sim_config_from_dict({"engine": "sglang", "scheduler.max_model_len": 16384})
    rr = run_cluster(cluster(4, "round_robin", sim), wl)
    lo = run_cluster(cluster(4, "least_outstanding", sim), wl)  # what prefix_aware degraded to before
    pa = run_cluster(cluster(4, "prefix_aware", sim), wl)
    assert pa.summary["prefix_cache_hit_rate"] > rr.summary["prefix_cache_hit_rate"] * 1.2
    assert pa.summary["prefix_cache_hit_rate"] > lo.summary["prefix_cache_hit_rate"]
    assert (pa.requests["route_reason"] == "prefix").any()


def test_no_caller_probes_a_scheduler_with_getattr():
    """Capabilities are declared (SchedulerCapabilities), never probed: a guard for new callers."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    probe = re.compile(r"(getattr|hasattr)\(\s*(self\.|e\.|engine\.)?(sched|scheduler)\b")
    offenders = [f"{p.relative_to(root)}:{i}" for pkg in ("scheduler", "simulator", "servesim")
                 for p in sorted((root / pkg).rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert offenders == []
