"""Hand-built cases for each divergence from vLLM 0.19.1 fixed in issue 15 (like vLLM's own tests).

Each test states what vLLM does (scheduler.py / async_scheduler.py / config/vllm.py of 0.19.1) and
checks ours does the same; the golden traces (tests/golden/{spec_*,aborts*,kv_connector*}) check it
step for step against the real scheduler.
"""

from __future__ import annotations

import pytest

from servesim.scheduler import ModelRunnerOutput, RequestStatus, SchedulerConfig
from servesim.scheduler.output import KVConnectorOutput
from servesim.scheduler.pyset import set_order
from sched_helpers import make_sched, req, step


class RecordingConnector:
    """A decode-side connector: requests in `remote` load their prompt asynchronously, once."""

    def __init__(self, remote=(), delay_free=()) -> None:
        self.remote = set(remote)
        self.delay_free = set(delay_free)  # prefill side: keep these requests' blocks when they finish
        self.allocs: list[tuple[str, int, int]] = []  # (req id, blocks held, external tokens)
        self.finished: list[tuple[str, list[int]]] = []

    def get_num_new_matched_tokens(self, request, num_local_computed_tokens):
        if request.request_id in self.remote:
            return request.num_prompt_tokens - num_local_computed_tokens, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.allocs.append((request.request_id, len(blocks.get_block_ids()[0]), num_external_tokens))
        self.remote.discard(request.request_id)

    def request_finished(self, request, block_ids):
        self.finished.append((request.request_id, list(block_ids[0])))
        return request.request_id in self.delay_free, None

    def build_connector_meta(self, scheduler_output):
        return None

    def update_connector_output(self, connector_output):
        pass

    def take_events(self):
        return ()


def _output(out, sampled: dict[str, list[int]], kv: KVConnectorOutput | None = None) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [sampled.get(r, []) for r in ids],
                             kv_connector_output=kv)


# --- draft_model speculation: one drafting slot per sequence is kept out of the budget ----------
def test_draft_model_budget_is_batched_tokens_minus_max_num_seqs():
    # vLLM: VllmConfig._set_max_num_scheduled_tokens, max_num_new_slots_for_drafting == 1.
    s = make_sched(max_num_batched_tokens=64, max_num_seqs=16, num_spec_tokens=2, spec_method="draft_model")
    s.add_request(req(s, "a", 100))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"a": 48}
    assert s.max_num_scheduled_tokens == 48


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_other_spec_methods_keep_the_whole_budget(method):
    s = make_sched(max_num_batched_tokens=64, max_num_seqs=16, num_spec_tokens=2, spec_method=method)
    s.add_request(req(s, "a", 100))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"a": 64}


def test_draft_model_budget_must_leave_room_to_schedule():
    with pytest.raises(ValueError, match="drafting"):
        SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=16, num_spec_tokens=1, spec_method="draft_model")


# --- async speculative decoding: draft placeholders are -1 -------------------------------------
def test_async_draft_placeholders_are_minus_one_and_never_accepted():
    s = make_sched(async_scheduling=True, num_spec_tokens=2, spec_method="eagle", block_size=4)
    s.add_request(req(s, "a", 6, max_tokens=20))
    out0 = s.schedule()  # the whole prompt: it will sample, so it gets placeholders
    assert s.requests["a"].spec_token_ids == [-1, -1]
    out1 = s.schedule()  # scheduled before out0's output is known
    assert out1.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    assert out1.num_scheduled_tokens == {"a": 3}
    s.update_from_output(out0, _output(out0, {"a": [11]}))
    # The worker verified two -1 placeholders: both rejected, one token out, two clawed back.
    eco = s.update_from_output(out1, _output(out1, {"a": [12]}))
    req_a = s.requests["a"]
    assert req_a.output_token_ids == [11, 12]
    assert req_a.num_computed_tokens == 7 and req_a.num_output_placeholders == 0
    stats = eco.scheduler_stats.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 2, 0)
    s.check_invariants()


# --- one finish_requests call for several running requests --------------------------------------
def _three_running():
    s = make_sched(block_size=4, enable_prefix_caching=False)
    for rid in ("c", "a", "b"):
        s.add_request(req(s, rid, 8, max_tokens=50))
    step(s)
    return s


def test_finish_requests_frees_in_set_order_and_ignores_duplicates():
    s = _three_running()
    blocks = {rid: s.kv_cache_manager.get_block_ids(rid)[0] for rid in ("a", "b", "c")}
    ids = ["c", "a", "b", "a"]
    done = s.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
    order = set_order(ids)
    assert sorted(order) == ["a", "b", "c"] and done == order
    # Each request frees its blocks tail first; requests follow the set's iteration order.
    tail = [b.block_id for b in s.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()][-6:]
    assert tail == [bid for rid in order for bid in reversed(blocks[rid])]
    assert s.finished_req_ids == {"a", "b", "c"} and not s.running
    s.check_invariants()


def test_set_order_is_cpython_order_under_hash_seed_zero():
    # The order vLLM acts in is iter(set(ids)) with PYTHONHASHSEED=0 (the oracle's seed).
    import subprocess
    import sys

    code = ("import random, sys; sys.path.insert(0, sys.argv[1]); from servesim.scheduler.pyset import set_order\n"
            "rng = random.Random(5)\n"
            "for n in (1, 2, 5, 6, 19, 40, 200):\n"
            "    ids = [f'r{rng.randrange(999):05d}' for _ in range(n)] + ['', 'é', '日本']\n"
            "    assert list(set(ids)) == set_order(ids), ids\n")
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    res = subprocess.run([sys.executable, "-c", code, root], env={"PYTHONHASHSEED": "0"}, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr



def test_a_request_hashes_as_object_does():
    # Requests live in sets: the compiled class spells out the identity hash (request.py), which
    # must be CPython's own, so a set of requests iterates as in the pure-Python build.
    from servesim.scheduler.request import Request, SamplingParams

    reqs = [Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=2)) for i in range(500)]
    assert [hash(r) for r in reqs] == [object.__hash__(r) for r in reqs]


# --- KV connector: decode side ------------------------------------------------------------------
def _parked(remote=("r",), **kw):
    s = make_sched(block_size=4, **kw)
    conn = RecordingConnector(remote)
    s.connector = conn
    s.add_request(req(s, "r", 10, max_tokens=4))
    out = s.schedule()
    assert out.num_scheduled_tokens == {} and s.requests["r"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    return s, conn, out


def test_update_state_after_alloc_runs_on_every_admission():
    s = make_sched(block_size=4)
    conn = RecordingConnector(remote={"r"})
    s.connector = conn
    s.add_request(req(s, "r", 10))
    s.add_request(req(s, "l", 6))
    s.schedule()
    assert conn.allocs == [("r", 3, 10), ("l", 2, 0)]  # the local request too, with 0 external tokens


def test_parked_request_counts_loaded_tokens_then_recomputes_the_last_one():
    s, _, out = _parked()
    r = s.requests["r"]
    assert r.num_computed_tokens == 10 and r.num_external_computed_tokens == 10
    s.update_from_output(out, _output(out, {}, KVConnectorOutput(finished_recving=("r",))))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r": 1} and out.scheduled_new_reqs[0].num_computed_tokens == 9
    assert r.num_cached_tokens == 9


def test_abort_while_loading_keeps_blocks_until_the_load_is_reported():
    s, conn, out = _parked()
    pool = s.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    assert s.finish_requests(["r"], RequestStatus.FINISHED_ABORTED) == ["r"]
    # vLLM: delay_free_blocks -- the worker may still be writing into those blocks.
    assert pool.get_num_free_blocks() == free_before and "r" in s.requests
    assert s.finished_req_ids == {"r"} and not s.has_unfinished_requests()
    assert conn.finished == [("r", s.kv_cache_manager.get_block_ids("r")[0])]
    s.check_invariants()
    out = s.schedule()
    s.update_from_output(out, _output(out, {}, KVConnectorOutput(finished_recving=("r",))))
    assert pool.get_num_free_blocks() == free_before + 3 and "r" not in s.requests
    s.check_invariants()


def test_abort_after_the_load_landed_frees_at_once():
    s, _, out = _parked()
    s.update_from_output(out, _output(out, {}, KVConnectorOutput(finished_recving=("r",))))
    free_before = s.kv_cache_manager.block_pool.get_num_free_blocks()
    s.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == free_before + 3 and "r" not in s.requests


def test_connector_sees_the_block_table_without_out_of_window_blocks():
    # vLLM's _connector_finished calls remove_skipped_blocks(num_tokens) first.
    s = make_sched(block_size=4, sliding_window=8, enable_prefix_caching=False)
    conn = RecordingConnector()
    s.connector = conn
    s.add_request(req(s, "a", 16, max_tokens=1))
    step(s)
    assert conn.finished[0][0] == "a" and conn.finished[0][1][:2] == [0, 0]


# --- KV connector: prefill side (delayed free until finished_sending) ---------------------------
def test_prefill_side_keeps_blocks_until_the_send_is_reported():
    s = make_sched(block_size=4)
    s.connector = RecordingConnector(delay_free={"p"})
    s.add_request(req(s, "p", 10, max_tokens=1))
    pool = s.kv_cache_manager.block_pool
    free0 = pool.get_num_free_blocks()
    _, eco = step(s)
    assert eco.outputs[0].finish_reason == "length"
    assert pool.get_num_free_blocks() == free0 - 3  # finished, but its KV is still being read
    assert "p" in s.requests and not s.has_unfinished_requests() and s.finished_req_ids == {"p"}
    s.check_invariants()
    s.mark_kv_sent("p")  # = KVConnectorOutput.finished_sending in a step's output
    assert pool.get_num_free_blocks() == free0 and "p" not in s.requests
    s.check_invariants()


def test_finished_sending_in_a_step_output_frees():
    s = make_sched(block_size=4)
    s.connector = RecordingConnector(delay_free={"p"})
    s.add_request(req(s, "p", 10, max_tokens=1))
    s.add_request(req(s, "q", 6, max_tokens=3))
    free0 = s.kv_cache_manager.block_pool.get_num_free_blocks()
    step(s)
    out = s.schedule()
    s.update_from_output(out, _output(out, {"q": [5]}, KVConnectorOutput(finished_sending=("p",))))
    assert "p" not in s.requests
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == free0 - len(s.kv_cache_manager.get_block_ids("q")[0])
