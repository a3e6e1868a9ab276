"""benchmarks/sim_speed.py's paired goals (PAIRS): which cases each compares, and the ratios and
verdicts sim_speed.py and instructions.py print from a cost per simulated second."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sim_speed():
    spec = importlib.util.spec_from_file_location("sim_speed_under_test", ROOT / "benchmarks" / "sim_speed.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses resolve their module by name)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_each_pair_compares_two_cases_of_the_benchmark(sim_speed):
    names = {c.name for c in sim_speed.cases()}
    assert sim_speed.PAIRS
    for p in sim_speed.PAIRS:
        assert p.case in names and p.plain in names and p.case != p.plain, p
        assert p.goal >= 1.0
    by_case = {p.case: p for p in sim_speed.PAIRS}
    assert by_case["pd-hour"].plain == "colocated-hour" and by_case["pd-hour"].goal == 1.5
    assert by_case["mooncake"].plain == "mooncake-steps" and by_case["mooncake"].goal == 1.0


def test_ratios_only_for_pairs_with_both_costs(sim_speed):
    costs = {"pd-hour": 3.0, "colocated-hour": 2.0, "hour": 1.0, "mooncake": 4.0}
    ratios = {(p.case, p.plain): r for p, r in sim_speed.paired_ratios(costs)}
    assert ratios == {("pd-hour", "colocated-hour"): 1.5}  # spec/sglang lack their case, mooncake its plain
    assert sim_speed.paired_ratios({"pd-hour": 1.0, "colocated-hour": 0.0}) == []  # no division by zero


def test_lines_give_the_verdict_against_each_goal(sim_speed):
    lines = sim_speed.pair_lines({"pd-hour": 3.1, "colocated-hour": 2.0, "mooncake": 0.9,
                                  "mooncake-steps": 1.0}, "test")
    assert lines[0] == "paired goals (test):"
    assert "  pd-hour / colocated-hour: 1.550 (goal <= 1.5: not met)" in lines
    assert "  mooncake / mooncake-steps: 0.900 (goal <= 1: met)" in lines
    assert sim_speed.pair_lines({"hour": 1.0}, "test") == []
