"""Synthetic generators: determinism, measured rates/CV/means, prefix groups, sessions, configs."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.traces import (
    InputError,
    SyntheticConfig,
    available_generators,
    bundled_trace_path,
    config_from_dict,
    config_to_dict,
    make_workload,
)
from servesim.traces.distributions import arrival_times
from servesim.traces.synthetic_config import ArrivalConfig, DistConfig


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def gaps_of(workload) -> np.ndarray:
    return np.diff([r.arrival_time_s for r in workload.requests])


def test_registry_names():
    assert {"synthetic", "poisson", "gamma", "constant", "sessions"} <= set(available_generators())
    with pytest.raises(InputError) as err:
        make_workload("bursty", {}, rng())
    assert "gamma" in err.value.allowed and "sessions" in err.value.allowed


def test_same_seed_same_workload_different_seed_differs():
    params = {"num_requests": 300, "arrival": {"rate_per_s": 3.0, "cv": 2.0},
              "prompt_len": {"dist": "lognormal", "median": 400, "sigma": 1.0},
              "prefix": {"num_groups": 4, "fraction": 0.5}}
    a = make_workload("gamma", params, rng(5))
    b = make_workload("gamma", params, rng(5))
    c = make_workload("gamma", params, rng(6))
    assert a.requests == b.requests and a.source == b.source
    assert a.requests != c.requests


@pytest.mark.parametrize(
    ("process", "cv", "expected_cv"), [("poisson", None, 1.0), ("gamma", 3.0, 3.0),
                                       ("gamma", 0.5, 0.5), ("constant", None, 0.0)])
def test_arrival_rate_and_cv(process, cv, expected_cv):
    times = arrival_times(ArrivalConfig(process, 8.0, cv), rng(1), num=40_000)
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert 1.0 / gaps.mean() == pytest.approx(8.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(expected_cv, abs=0.05 * max(expected_cv, 1))


def test_duration_bound_generation():
    w = make_workload("poisson", {"num_requests": None, "duration_s": 600.0,
                                  "arrival": {"rate_per_s": 5.0}}, rng(2))
    assert w.duration_s < 600.0
    assert len(w) == pytest.approx(3000, rel=0.06)
    both = make_workload("constant", {"num_requests": 10, "duration_s": 600.0,
                                      "arrival": {"rate_per_s": 5.0}}, rng(2))
    assert len(both) == 10 and both.duration_s == pytest.approx(1.8)


@pytest.mark.parametrize(
    ("dist", "mean"),
    [({"dist": "fixed", "value": 300}, 300),
     ({"dist": "uniform", "low": 100, "high": 300}, 200),
     ({"dist": "lognormal", "mean": 800, "sigma": 0.8}, 800),
     ({"dist": "lognormal", "median": 500, "sigma": 0.5}, 500 * np.exp(0.125)),
     ({"dist": "exponential", "mean": 250}, 250)],
)
def test_length_distribution_means(dist, mean):
    w = make_workload("constant", {"num_requests": 20_000, "prompt_len": dist,
                                   "output_len": dist}, rng(3))
    prompt = np.array([r.prompt_len for r in w.requests])
    assert prompt.mean() == pytest.approx(mean, rel=0.03)
    assert prompt.min() >= 1


def test_empirical_lengths_from_bundled_trace_are_joint():
    path = str(bundled_trace_path("sharegpt-300"))
    w = make_workload("poisson", {"num_requests": 3000,
                                  "prompt_len": {"dist": "empirical", "path": path},
                                  "output_len": {"dist": "empirical", "path": path}}, rng(4))
    from servesim.traces import load_bundled

    source_pairs = {(r.prompt_len, r.output_len) for r in load_bundled().requests}
    assert {(r.prompt_len, r.output_len) for r in w.requests} <= source_pairs
    assert np.mean([r.prompt_len for r in w.requests]) == pytest.approx(857.5, rel=0.05)


def test_empirical_from_length_csv(tmp_path):
    path = tmp_path / "lens.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,1\n20,2\n")
    w = make_workload("constant", {"num_requests": 50,
                                   "prompt_len": {"dist": "empirical", "path": str(path)},
                                   "output_len": {"dist": "empirical", "path": str(path),
                                                  "column": "num_decode_tokens"}}, rng(0))
    assert {(r.prompt_len, r.output_len) for r in w.requests} <= {(10, 1), (20, 2)}


def test_prefix_groups():
    w = make_workload("poisson", {
        "num_requests": 4000, "prompt_len": 100,
        "prefix": {"num_groups": 5, "prefix_len": {"dist": "uniform", "low": 50, "high": 400},
                   "fraction": 0.6, "popularity": "zipf", "zipf_s": 1.2}}, rng(7))
    grouped = [r for r in w.requests if r.prefix_group is not None]
    assert len(grouped) / len(w) == pytest.approx(0.6, abs=0.03)
    by_group: dict[int, set[int]] = {}
    for r in grouped:
        by_group.setdefault(r.prefix_group, set()).add(r.prefix_len)
        assert r.prompt_len == r.prefix_len + 100  # the prefix is prepended
    assert all(len(lens) == 1 for lens in by_group.values())  # one prefix length per group
    counts = np.bincount([r.prefix_group for r in grouped], minlength=5)
    assert counts[0] > counts[4]  # zipf: group 0 most popular
    a, b = grouped[0], next(r for r in grouped[1:] if r.prefix_group == grouped[0].prefix_group)
    assert a.token_ids()[: a.prefix_len] == b.token_ids()[: b.prefix_len]


def test_sessions_grow_their_prefix():
    w = make_workload("sessions", {
        "num_requests": 400, "arrival": {"rate_per_s": 2.0},
        "prompt_len": {"dist": "uniform", "low": 20, "high": 60}, "output_len": 30,
        "prefix": {"num_groups": 2, "prefix_len": 64},
        "sessions": {"num_turns": {"dist": "uniform", "low": 2, "high": 5},
                     "think_time_s": {"dist": "exponential", "mean": 3.0},
                     "tool_call_fraction": 0.5, "tool_call_s": 0.5}}, rng(8))
    assert len(w) == 400
    sessions: dict[str, list] = {}
    for r in w.requests:
        sessions.setdefault(r.session_id, []).append(r)
    assert len(sessions) > 50
    for turns in sessions.values():
        assert [t.is_last_turn for t in turns] == [False] * (len(turns) - 1) + [True]
        for prev, nxt in zip(turns, turns[1:]):
            assert nxt.arrival_time_s >= prev.arrival_time_s + prev.output_len * 0.02
            assert nxt.prompt_len > prev.prompt_len + prev.output_len
            context = prev.token_ids() + prev.output_token_ids()
            assert nxt.token_ids()[: len(context)] == context
    multi = [t for t in sessions.values() if len(t) > 1]
    assert len(multi) > 20


def test_session_max_prompt_len_ends_sessions():
    w = make_workload("sessions", {"num_requests": 200, "prompt_len": 100, "output_len": 100,
                                   "sessions": {"num_turns": 10, "max_prompt_len": 500}}, rng(9))
    # turns: 100, then 100 + 100 out + 100 new = 300, then 500; a 4th (700) would exceed 500
    assert {r.prompt_len for r in w.requests} == {100, 300, 500}
    assert all(r.is_last_turn for r in w.requests if r.prompt_len == 500)


def test_priority_and_lora_choices():
    w = make_workload("synthetic", {"num_requests": 2000, "priority": {"values": [0, 1, 2],
                                    "weights": [0.5, 0.3, 0.2]}, "lora": {"values": [7, 8]}},
                      rng(10))
    priorities = np.array([r.priority for r in w.requests])
    assert np.mean(priorities == 0) == pytest.approx(0.5, abs=0.04)
    assert {r.lora_id for r in w.requests} == {7, 8}


def test_config_round_trip_and_errors():
    data = {"name": "x", "num_requests": 10, "arrival": {"process": "gamma", "rate_per_s": 2,
            "cv": 4}, "prompt_len": 128, "sessions": {"num_turns": 3}}
    config = config_from_dict(SyntheticConfig, data)
    assert config.prompt_len == DistConfig("fixed", value=128)
    assert config_from_dict(SyntheticConfig, config_to_dict(config)) == config
    cases = [
        ({"arrival": {"process": "weibull"}}, "arrival.process", "poisson"),
        ({"arrival": {"process": "gamma"}}, "arrival.cv", None),
        ({"arrival": {"rate_per_s": -1}}, "arrival.rate_per_s", None),
        ({"prompt_len": {"dist": "lognormal", "sigma": 1}}, "prompt_len.mean", None),
        ({"prompt_len": {"dist": "zipf"}}, "prompt_len.dist", "empirical"),
        ({"prefix": {"fraction": 1.5}}, "prefix.fraction", None),
        ({"sesions": {}}, "sesions", "sessions"),
        ({"num_requests": None}, "num_requests", None),
    ]
    for bad, field, allowed in cases:
        with pytest.raises(InputError) as err:
            config_from_dict(SyntheticConfig, bad)
        assert err.value.field == field, (bad, err.value)
        if allowed:
            assert allowed in err.value.allowed
    with pytest.raises(InputError) as err:
        make_workload("gamma", {"arrival": {"process": "poisson"}}, rng())
    assert err.value.field == "arrival.process"
