"""The OffloadingConnector's scheduler side (scheduler/kv_offload/connector.py) by hand, its settings'
refusals (config.py), and a small run through our scheduler. Step-for-step parity with vLLM 0.19.1 is
in tests/test_sched_golden.py (tests/golden/offload_*, recorded by tools/offload_oracle.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from servesim.scheduler.kv_offload import OffloadConfig, make_offloading_connector
from servesim.scheduler.kv_offload.fake_worker import FakeOffloadWorker
from servesim.scheduler.oracle_trace import StepTraceConfig, run_step_trace


def _req(rid: str, num_tokens: int, gpu_block_size: int = 16, computed: int = 0):
    hashes = [f"{rid[:1]}{i}".encode() for i in range(num_tokens // gpu_block_size)]  # shared per first letter
    return SimpleNamespace(request_id=rid, num_tokens=num_tokens, block_hashes=hashes, num_computed_tokens=computed)


def _blocks(ids: list[int], num_hashed: int):
    return SimpleNamespace(blocks=([SimpleNamespace(block_id=b, block_hash=b"h" if i < num_hashed else None)
                                    for i, b in enumerate(ids)],))


def _connector(num_cpu_blocks=8, block_size=32, policy="lru"):
    return make_offloading_connector(OffloadConfig(num_cpu_blocks=num_cpu_blocks, block_size=block_size,
                                                   eviction_policy=policy), 16, True)


def test_offload_blocks_are_named_by_their_last_gpu_block_hash():
    c = _connector()
    req = _req("a", 100)  # 6 GPU blocks, 3 offload blocks of 32 tokens
    assert list(c._get_block_hashes(req)) == [b"a1", b"a3", b"a5"]
    assert list(c._get_block_hashes(req, start_idx=1, end_idx=2)) == [b"a3"]


def test_cpu_hit_is_an_async_load_past_the_gpu_hit():
    c = _connector()
    c.manager.prepare_store([b"a1", b"a3"])
    assert c.get_num_new_matched_tokens(_req("a", 100), 16) == (0, False)  # stores still in flight
    c.manager.complete_store([b"a1", b"a3"])
    # GPU hit of one block (16 tokens): offload blocks 0 and 1 hit -> 64 - 16 tokens to load.
    assert c.get_num_new_matched_tokens(_req("a", 100), 16) == (48, True)
    assert c.get_num_new_matched_tokens(_req("a", 100), 64) == (0, False)  # block 2 is not in the tier
    assert c.get_num_new_matched_tokens(_req("a", 40), 16) == (0, False)  # not one full offload block past 16
    assert c.get_num_new_matched_tokens(_req("a", 40), 0) == (32, True)
    req = _req("a1", 100)
    c.update_state_after_alloc(req, _blocks([7, 8, 9, 10], num_hashed=1), 48)
    meta = c.build_connector_meta(SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=SimpleNamespace(
        req_ids=[], new_block_ids=[], resumed_req_ids=set()), preempted_req_ids=set(), num_scheduled_tokens={}))
    load = meta.reqs_to_load["a1"]
    assert (load.gpu_block_ids, load.cpu_block_ids) == ([8, 9, 10], [0, 1])
    # Another request needing blocks being loaded waits (None), until the load is reported.
    assert c.get_num_new_matched_tokens(_req("a2", 100), 0) == (None, False)
    c.update_connector_output(SimpleNamespace(finished_sending=(), finished_recving=("a1",)))
    assert c.get_num_new_matched_tokens(_req("a2", 100), 0) == (64, True)


def _so(new=(), cached=(), tokens=None, preempted=(), finished=()):
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, block_ids=(ids,)) for r, ids in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached], new_block_ids=[ids for _, ids in cached],
                                              resumed_req_ids=set()),
        num_scheduled_tokens=tokens or {}, preempted_req_ids=set(preempted), finished_req_ids=set(finished),
        total_num_scheduled_tokens=sum((tokens or {}).values()))


def test_stores_follow_computed_tokens_and_finish_holds_blocks():
    c = _connector(num_cpu_blocks=2)
    req = _req("b", 100)
    c.update_state_after_alloc(req, _blocks([], 0), 0)
    meta = c.build_connector_meta(_so(new=[("b", [1, 2, 3])], tokens={"b": 40}))  # 40 tokens: one offload block
    st = meta.reqs_to_store["b"]
    assert (st.gpu_block_ids, st.cpu_block_ids) == ([1, 2], [0])
    req.num_computed_tokens = 40
    meta = c.build_connector_meta(_so(cached=[("b", ([4, 5, 6],))], tokens={"b": 60}))  # to 100: blocks 1, 2
    # Blocks 1 and 2 need two slots; one is free and block 0 is in flight (not evictable): no store,
    # and block 1 stays the next to store (tried again at the next step).
    assert meta.reqs_to_store == {} and c._next_stored_block_idx["b"] == 1
    assert c.request_finished(req, ([1, 2, 3, 4, 5, 6],)) == (True, None)  # stores in flight: keep blocks
    c.update_connector_output(SimpleNamespace(finished_sending=("b",), finished_recving=()))
    assert c.manager.lookup([b"b1"]) == 1


def test_fake_worker_reports_a_finished_request_once_its_stores_complete():
    w = FakeOffloadWorker(load_steps=1, store_steps=2)
    meta = SimpleNamespace(reqs_to_load={"l": None}, reqs_to_store={"s": None}, reqs_to_flush=set())
    empty = SimpleNamespace(reqs_to_load={}, reqs_to_store={}, reqs_to_flush=set())
    step = SimpleNamespace(kv_connector_metadata=meta, total_num_scheduled_tokens=5, finished_req_ids=set())
    assert w.execute(step) == ([], [])
    nxt = SimpleNamespace(kv_connector_metadata=empty, total_num_scheduled_tokens=5, finished_req_ids={"s"})
    assert w.execute(nxt) == ([], ["l"])  # s finished, its store still runs
    idle = SimpleNamespace(kv_connector_metadata=empty, total_num_scheduled_tokens=0, finished_req_ids=set())
    assert w.execute(idle) == (["s"], [])


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "exactly one of num_cpu_blocks or cpu_gib"),
    (dict(num_cpu_blocks=0), "smaller than one offload block"),
    (dict(num_cpu_blocks=4, eviction_policy="lfu"), "unknown eviction_policy 'lfu'"),
    (dict(num_cpu_blocks=4, cpu_gib=1.0), "exactly one"),
])
def test_offload_config_refusals(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OffloadConfig(**kwargs)


def test_offload_block_size_must_be_a_multiple_and_tier_hold_a_block():
    with pytest.raises(ValueError, match="not a multiple of the GPU block size 16"):
        make_offloading_connector(OffloadConfig(num_cpu_blocks=4, block_size=24), 16, True)
    with pytest.raises(ValueError, match="needs prefix caching on"):
        make_offloading_connector(OffloadConfig(num_cpu_blocks=4), 16, False)
    with pytest.raises(ValueError, match="holds no offload block"):
        OffloadConfig(cpu_gib=1e-9).num_blocks(16, kv_bytes_per_gpu_block=4096)
    # vLLM's arithmetic: 1 GiB / (4096 bytes * factor 2)
    assert OffloadConfig(cpu_gib=1.0, block_size=32).num_blocks(16, kv_bytes_per_gpu_block=4096) == 131072


def test_a_small_run_reloads_prefixes_from_the_cpu_tier():
    w = [{"req_id": f"r{i}", "prompt_token_ids": list(range(1000, 1096)) + [i], "max_tokens": 4,
          "arrival_step": 12 * i} for i in range(4)]
    w += [{"req_id": "evict", "prompt_token_ids": list(range(5000, 5160)), "max_tokens": 2, "arrival_step": 7}]
    cfg = StepTraceConfig(num_blocks=13, offload_cpu_blocks=8, offload_block_size=32, offload_load_steps=1,
                          offload_store_steps=1)
    trace = {rec["step"]: rec for rec in run_step_trace(sorted(w, key=lambda x: x["arrival_step"]), cfg)}
    # r0's three offload blocks (6 GPU blocks) are stored as computed; the store completes once r0
    # finished (step 7), and only then are they loadable.
    assert trace[0]["offload_store"] == {"r0": {"gpu": [1, 2, 3, 4, 5, 6], "cpu": [0, 1, 2]}}
    assert trace[7]["offload_finished_sending"] == ["r0"]
    # "evict" reuses most of r0's GPU blocks; r1 keeps a GPU hit of one block and loads the rest of
    # the three offload blocks (5 GPU blocks) from the tier, waiting one step for it.
    assert trace[13]["offload_load"] == {"r1": {"gpu": [2, 3, 4, 5, 6], "cpu": [0, 1, 2]}}
    assert trace[14]["offload_finished_recving"] == ["r1"]
    assert [(n["req_id"], n["num_computed_tokens"]) for n in trace[15]["new"]] == [("r1", 96)]
    # r2 then hits the GPU prefix cache again (the loaded blocks are cached): no load.
    assert [(n["req_id"], n["num_computed_tokens"]) for n in trace[24]["new"]] == [("r2", 96)]
    assert not any(rec["offload_load"] for step, rec in trace.items() if step > 13)
    # The connector's hit stats (vLLM's connector_prefix_cache_stats): r1 asked for the 81 tokens its
    # GPU hit lacked and got 80 from the tier; r2 lacked 1 token (the last, always recomputed).
    stats = {step: (rec["offload_prefix_cache_stats"]["queries"], rec["offload_prefix_cache_stats"]["hits"])
             for step, rec in trace.items() if rec["offload_prefix_cache_stats"]["requests"]}
    assert stats == {0: (97, 0), 8: (160, 0), 13: (81, 80), 24: (1, 0), 36: (1, 0)}


def test_connectors_and_policies_registered_by_name():
    from servesim.scheduler.kv_offload import KV_CONNECTORS
    from servesim.scheduler.registry import UnknownNameError

    c = KV_CONNECTORS.get("OffloadingConnector")(OffloadConfig(num_cpu_blocks=3, eviction_policy="arc"), 16, True)
    assert c.offloaded_block_size == 16 and c.manager.num_free_blocks() == 3
    with pytest.raises(UnknownNameError, match="did you mean 'OffloadingConnector'"):
        KV_CONNECTORS.get("OffloadConnector")


def test_step_trace_cli_reproduces_an_offload_golden_byte_for_byte(tmp_path):
    """`servesim step-trace` with the offload flags writes the oracle's trace text. The golden pool
    (120 blocks) is below the CLI's start-up check for max_model_len 2048, so the CLI runs with 1920
    (no request there is longer than 972 tokens: the decisions do not change)."""
    import gzip
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    d = Path(__file__).parent / "golden" / "offload_arc_async_aborts"
    argv = ["step-trace", str(d / "workload.jsonl"), "--out", str(tmp_path / "t.jsonl"), "--max-model-len", "1920"]
    for k, v in json.loads((d / "config.json").read_text())["trace_flags"].items():
        argv += ["--" + k.replace("_", "-")] + ([] if v is True else [str(v)])
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    with gzip.open(d / "trace.jsonl.gz", "rt") as f:
        assert (tmp_path / "t.jsonl").read_text() == f.read()


def test_step_trace_cli_refuses_bad_offload_settings(tmp_path):
    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    w = tmp_path / "w.jsonl"
    w.write_text('{"req_id": "a", "prompt_token_ids": [1, 2], "max_tokens": 3, "arrival_step": 0}\n')
    base = ["step-trace", str(w), "--out", str(tmp_path / "t.jsonl"), "--offload-cpu-blocks", "4"]
    for extra, match in [(["--offload-block-size", "24"], "not a multiple of the GPU block size 16"),
                         (["--no-prefix-caching"], "needs prefix caching on"),
                         (["--offload-eviction-policy", "lur"], "did you mean 'lru'")]:
        res = CliRunner().invoke(app, base + extra)
        assert res.exit_code != 0 and match in res.output, res.output
