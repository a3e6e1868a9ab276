"""RequestSpec.token_ids(): determinism, range, and prefix sharing that survives re-chunking."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.traces import InputError, RequestSpec, load_bundled

ROOT = Path(__file__).resolve().parents[1]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def mooncake(rid: str, ids: tuple[int, ...], prompt_len: int) -> RequestSpec:
    return RequestSpec(rid, 0.0, prompt_len, 1, prefix_hash_ids=ids)


@settings(max_examples=60, deadline=None)
@given(
    shared=st.integers(0, 4),
    tail_a=st.lists(st.integers(100, 10**9), min_size=1, max_size=3, unique=True),
    tail_b=st.lists(st.integers(10**9 + 1, 2 * 10**9), min_size=1, max_size=3),
    cut_a=st.integers(1, 512),
    cut_b=st.integers(1, 512),
)
def test_shared_hash_ids_share_exactly_the_covered_tokens(shared, tail_a, tail_b, cut_a, cut_b):
    head = tuple(range(shared))
    a_ids, b_ids = head + tuple(tail_a), head + tuple(tail_b)
    a = mooncake("a", a_ids, (len(a_ids) - 1) * 512 + cut_a)
    b = mooncake("b", b_ids, (len(b_ids) - 1) * 512 + cut_b)
    ta, tb = a.token_ids(), b.token_ids()
    assert len(ta) == a.prompt_len and len(tb) == b.prompt_len
    assert common_prefix(ta, tb) == min(shared * 512, a.prompt_len, b.prompt_len)


@pytest.mark.slow
def test_mooncake_sharing_survives_any_vllm_block_size():
    """Chained block hashes over materialised tokens reuse exactly the blocks the hash ids say."""
    requests = load_bundled("mooncake-conversation-5min").requests[:250]
    for block in (16, 48, 512):  # 48 does not divide 512
        seen_tokens: set[int] = set()
        seen_ids: set[tuple] = set()
        hits_tokens = hits_ids = 0
        for r in requests:
            tokens = r.token_array()
            parent = 0
            for j in range(r.prompt_len // block):
                parent = hash((parent, tokens[j * block:(j + 1) * block].tobytes()))
                hits_tokens += parent in seen_tokens
                seen_tokens.add(parent)
                # ground truth from the hash ids: the block is fixed by the ids covering it
                covering = r.prefix_hash_ids[: -(-(j + 1) * block // 512)]
                key = (covering, j)
                hits_ids += key in seen_ids
                seen_ids.add(key)
        assert hits_tokens == hits_ids
        assert hits_ids > 0


def test_prefix_groups_and_unique_rest():
    a = RequestSpec("a", 0.0, 300, 5, prefix_group=3, prefix_len=200)
    b = RequestSpec("b", 0.0, 250, 5, prefix_group=3, prefix_len=200)
    c = RequestSpec("c", 0.0, 300, 5, prefix_group=4, prefix_len=200)
    assert common_prefix(a.token_ids(), b.token_ids()) == 200
    assert common_prefix(a.token_ids(), c.token_ids()) == 0
    plain = RequestSpec("a2", 0.0, 300, 5)
    assert common_prefix(plain.token_ids(), RequestSpec("a3", 0.0, 300, 5).token_ids()) == 0


def test_sessions_reread_previous_prompt_and_output():
    t0 = RequestSpec("s-t0", 0.0, 100, 20, prefix_group=1, prefix_len=40, session_id="s",
                     is_last_turn=False)
    t1 = RequestSpec("s-t1", 5.0, 100 + 20 + 30, 8, prefix_group=1, prefix_len=40,
                     session_id="s")
    context = t0.token_ids() + t0.output_token_ids()
    assert t1.token_ids()[: len(context)] == context
    other = RequestSpec("x-t0", 0.0, 100, 20, prefix_group=1, prefix_len=40, session_id="x")
    assert common_prefix(other.token_ids(), t0.token_ids()) == 40


def test_real_ids_win_and_range_and_mod():
    r = RequestSpec("r", 0.0, 3, 1, prompt_token_ids=(5, 6, 7))
    assert r.token_ids() == [5, 6, 7]
    big = RequestSpec("big", 0.0, 5000, 1, prefix_hash_ids=(1, 2, 3), prefix_group=None)
    ids = np.asarray(big.token_ids())
    assert ids.min() >= 0 and ids.max() < 2**31
    folded = big.token_ids_mod(49152)
    assert max(folded) < 49152 and folded == [t % 49152 for t in ids.tolist()]
    with pytest.raises(InputError):
        big.token_ids_mod(0)


def test_token_ids_are_stable_across_processes():
    """No salted hash(): a fresh interpreter (different PYTHONHASHSEED) gives the same ids."""
    code = ("from servesim.traces import RequestSpec;"
            "r=RequestSpec('req-1',0.0,600,1,prefix_hash_ids=(9,),prefix_group=None);"
            "print(r.token_ids()[-3:], RequestSpec('q',0.0,4,1,prefix_group=2,prefix_len=2)"
            ".token_ids())")
    outs = {
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONHASHSEED": seed, "PATH": ""}, check=True).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_importing_errors_does_not_pull_in_numpy():
    """Every package imports traces.errors; the oracle venv may lack numpy/pandas."""
    code = "import sys, traces.errors; print('numpy' in sys.modules or 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt_len": 0}, "prompt_len"),
        ({"output_len": 0}, "output_len"),
        ({"arrival_time_s": -1.0}, "arrival_time_s"),
        ({"prompt_token_ids": (1, 2)}, "prompt_token_ids"),
        ({"prefix_len": 5}, "prefix_group"),
        ({"prefix_group": 1, "prefix_len": 11}, "prefix_len"),
        ({"prefix_hash_ids": (1, 2)}, "prefix_hash_ids"),
        ({"session_id": ""}, "session_id"),
    ],
)
def test_request_spec_validation(kwargs, field):
    base = {"request_id": "r", "arrival_time_s": 0.0, "prompt_len": 10, "output_len": 1}
    with pytest.raises(InputError) as err:
        RequestSpec(**{**base, **kwargs})
    assert err.value.field == field
