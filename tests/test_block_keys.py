"""Prefix-cache keys from token provenance (scheduler/block_keys.py) against hashed ids.

The promise: two blocks get equal keys exactly when their ids, and every id before them, are
equal, so the cache hits and misses as with hashing. Checked three ways: block by block against
the hashed ids of the same requests (random stream layouts), trace specs' runs against the ids
they generate, and whole simulations with both keyings compared byte for byte.
"""

from __future__ import annotations

import hashlib
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.scheduler import Request, SamplingParams, TokenProvenance, TokenSegment, make_block_hasher
from servesim.traces.tokens import stream_tokens
from servesim.traces.workload import RequestSpec, Workload

BLOCK = 4


def _stream_id(source: bytes, pos: int) -> int:
    """A toy pseudo-random stream: the id at (source, pos)."""
    return int.from_bytes(hashlib.sha256(source + pos.to_bytes(8, "little")).digest()[:4], "little") >> 1


def _request(rid: str, runs: list[tuple[bytes, int, int]], output_source: bytes | None, num_outputs: int,
             keyed: bool, lora_id: int | None = None, salt: str | None = None) -> Request:
    ids = [_stream_id(src, start + i) for src, start, n in runs for i in range(n)]
    provenance = None
    if keyed:
        provenance = TokenProvenance(tuple(TokenSegment(*r) for r in runs), output_source)
    req = Request(rid, array("i", ids), SamplingParams(max_tokens=max(num_outputs, 1)), lora_id=lora_id,
                  cache_salt=salt, block_hasher=make_block_hasher(BLOCK), token_provenance=provenance)
    for k in range(num_outputs):  # one at a time, as decode steps append them
        src = output_source if output_source is not None else b"private:" + rid.encode()
        req.append_output_token_ids(_stream_id(src, k))
    return req


_run = st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.sampled_from([0, 3, 4, 8]), st.integers(1, 11))
_layout = st.tuples(st.lists(_run, min_size=1, max_size=4), st.sampled_from([None, b"o1", b"o2"]),
                    st.integers(0, 9), st.sampled_from([None, 1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_layout, min_size=2, max_size=5))
def test_keys_equal_exactly_where_hashed_ids_are_equal(layouts):
    """Key equality between any two blocks of any two requests is hash equality (random layouts:
    few streams and starts, so runs often coincide, continue each other or diverge mid-block)."""
    hashed, keyed = [], []
    for i, (runs, out, num_out, lora) in enumerate(layouts):
        hashed.append(_request(f"r{i}", runs, out, num_out, keyed=False, lora_id=lora).block_hashes)
        keyed.append(_request(f"r{i}", runs, out, num_out, keyed=True, lora_id=lora).block_hashes)
    for i in range(len(layouts)):
        assert len(keyed[i]) == len(hashed[i])  # every full block has a key
        for j in range(len(layouts)):
            for b in range(min(len(keyed[i]), len(keyed[j]))):
                assert (keyed[i][b] == keyed[j][b]) == (hashed[i][b] == hashed[j][b]), (i, j, b, layouts)


def test_undeclared_outputs_are_hashed_and_chained_from_the_last_key():
    same = [_request(r, [(b"a", 0, 6)], None, 7, keyed=True) for r in ("x", "y")]
    # prompt blocks 0 (ids 0-3) equal; block 1 holds prompt ids 4-5 and each request's own outputs
    assert same[0].block_hashes[0] == same[1].block_hashes[0]
    assert same[0].block_hashes[1] != same[1].block_hashes[1]
    shared_out = [_request("x", [(b"a", 0, 6)], None, 7, keyed=True) for _ in range(2)]
    assert shared_out[0].block_hashes == shared_out[1].block_hashes  # same ids after the prompt too


def test_salt_and_lora_separate_keys():
    base = _request("x", [(b"a", 0, 8)], None, 0, keyed=True).block_hashes
    assert _request("y", [(b"a", 0, 8)], None, 0, keyed=True).block_hashes == base
    assert _request("y", [(b"a", 0, 8)], None, 0, keyed=True, salt="s").block_hashes[0] != base[0]
    assert _request("y", [(b"a", 0, 8)], None, 0, keyed=True, lora_id=2).block_hashes[0] != base[0]


def test_head_keys_are_the_whole_requests_first_keys():
    prov = TokenProvenance((TokenSegment(b"a", 0, 5), TokenSegment(b"b", 9, 7), TokenSegment(b"c", 0, 9)), b"o")
    whole = Request("w", array("i", [0] * 21), SamplingParams(), block_hasher=make_block_hasher(BLOCK),
                    token_provenance=prov)
    for n in (4, 5, 8, 12, 13, 21):
        head = Request("h", array("i", [0] * n), SamplingParams(), block_hasher=make_block_hasher(BLOCK),
                       token_provenance=prov.head(n))
        assert head.block_hashes == whole.block_hashes[: n // BLOCK]


def test_provenance_must_cover_the_prompt():
    prov = TokenProvenance((TokenSegment(b"a", 0, 5),))
    with pytest.raises(ValueError, match="covers 5 ids, the prompt has 6"):
        Request("r", [1] * 6, SamplingParams(), token_provenance=prov)
    with pytest.raises(ValueError):
        TokenSegment(b"", 0, 1)
    with pytest.raises(ValueError):
        TokenSegment(b"a", 0, 0)


# --- trace specs: the runs they declare are the ids they generate -----------------------------------
_SPECS = [
    RequestSpec("plain", 0.0, 37, 5),
    RequestSpec("hash-ids", 0.0, 1200, 5, prefix_hash_ids=(7, 7, 3)),
    RequestSpec("hash-ids-past", 0.0, 1700, 5, prefix_hash_ids=(1, 2)),
    RequestSpec("hash-ids-short", 0.0, 100, 5, prefix_hash_ids=(1,), prefix_block_len=64),
    RequestSpec("group", 0.0, 90, 5, prefix_group=3, prefix_len=40),
    RequestSpec("group-all", 0.0, 40, 5, prefix_group=3, prefix_len=40),
    RequestSpec("turn-2", 0.0, 300, 5, session_id="s1", is_last_turn=False),
]


@pytest.mark.parametrize("spec", _SPECS, ids=lambda s: s.request_id)
def test_token_segments_generate_token_array(spec):
    runs = spec.token_segments()
    assert sum(n for _, _, n in runs) == spec.prompt_len
    parts = [stream_tokens(int.from_bytes(src.removeprefix(b"stream:"), "little"), start, start + n)
             for src, start, n in runs]
    assert np.array_equal(np.concatenate(parts), spec.token_array())


def test_real_ids_declare_nothing():
    assert RequestSpec("r", 0.0, 3, 1, prompt_token_ids=(5, 6, 7)).token_segments() is None


# --- whole simulations: both keyings give byte-identical results -----------------------------------
def _sharing_workload() -> Workload:
    rng = np.random.default_rng(7)
    specs = []
    for i in range(160):
        t = i * 0.01
        kind = i % 5
        n_out = int(rng.integers(20, 200))
        if kind == 0:
            specs.append(RequestSpec(f"g{i}", t, int(rng.integers(200, 900)), n_out, prefix_group=i % 3,
                                     prefix_len=int(rng.choice([100, 180]))))
        elif kind == 1:
            ids = tuple(int(x) for x in rng.integers(0, 4, size=int(rng.integers(1, 4))))
            n = int(rng.integers(256 * len(ids) - 255, 256 * len(ids) + 400))  # the last id partly, or past them
            specs.append(RequestSpec(f"m{i}", t, n, n_out, prefix_hash_ids=ids,
                                     prefix_block_len=256))
        elif kind == 2:
            turn = i // 5
            specs.append(RequestSpec(f"s{i}", t, 150 + 40 * (turn % 6), n_out, session_id=f"sess{turn % 4}"))
        elif kind == 3:
            specs.append(RequestSpec(f"l{i}", t, int(rng.integers(50, 500)), n_out, prefix_group=9,
                                     prefix_len=48, lora_id=1 + i % 2))
        else:
            specs.append(RequestSpec(f"r{i}", t, 64, n_out, prompt_token_ids=tuple(range(i % 2, 64 + i % 2))))
    return Workload(specs, name="sharing", source="tests/test_block_keys.py")


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_simulations_identical_with_either_keying(tmp_path, async_scheduling):
    from servesim.running import run
    from servesim.scheduler import CacheConfig, SchedulerConfig
    from servesim.simulator.config import SimConfig

    outs = {}
    for keys in ("provenance", "token_ids"):
        # a small pool: evictions and preemptions exercise the cache
        cfg = SimConfig(scheduler=SchedulerConfig(max_model_len=2048, max_num_batched_tokens=512,
                                                  async_scheduling=async_scheduling),
                        cache=CacheConfig(num_gpu_blocks=260), derive_num_gpu_blocks=False, prefix_cache_keys=keys)
        res = run(cfg, _sharing_workload(), tmp_path / keys)
        outs[keys] = res
    summary = outs["provenance"].summary
    print(summary)
    assert summary["prefix_cache_hit_tokens"] > 2000  # the workload shares prefixes: the comparison means something
    assert summary["num_preemptions"] > 0
    for name in ("requests.parquet", "steps.parquet"):
        assert (tmp_path / "provenance" / name).read_bytes() == (tmp_path / "token_ids" / name).read_bytes(), name


def test_prefix_cache_keys_is_validated():
    from servesim.simulator.config import SimConfig
    from servesim.traces.errors import InputError

    with pytest.raises(InputError, match="provenance | token_ids"):
        SimConfig(prefix_cache_keys="sha")


def test_prefix_aware_routing_identical_with_either_keying():
    """The router asks each replica's cache with the request's provenance (cached_prefix_tokens):
    its choices, hence the whole cluster run, match the hashed-ids run."""
    from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict

    frames = {}
    for keys in ("provenance", "token_ids"):
        sim = sim_config_from_dict({"prefix_cache_keys": keys, "scheduler.max_model_len": 2048,
                                    "cache.num_gpu_blocks": 600, "derive_num_gpu_blocks": False})
        cfg = ClusterConfig(replicas=[ReplicaGroup(3, sim)], router=RouterConfig("prefix_aware"))
        res = run_cluster(cfg, _sharing_workload())
        frames[keys] = res
    a, b = frames["provenance"], frames["token_ids"]
    assert a.summary["prefix_cache_hit_tokens"] > 2000
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
