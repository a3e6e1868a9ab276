"""Liveness fuzz (tests/fuzz_driver.py): a bounded run in every `make test`, a long one on demand.

    pytest -m fuzz tests/test_fuzz.py       # the long run (deselected by default: see pyproject)
"""

from __future__ import annotations

import pytest

from fuzz_driver import fuzz


@pytest.mark.parametrize("seed", [101, 202])
@pytest.mark.slow
def test_fuzz_bounded(seed):
    figs = fuzz(max_steps=4000, seed=seed)  # bounded by steps, not wall time: the same run on every machine
    assert not figs.findings, figs.findings[0]
    assert figs.steps >= 4000 and figs.completed > 0 and figs.rejected > 0


@pytest.mark.fuzz
def test_fuzz_long():
    figs = fuzz(max_steps=300_000, seed=7)
    assert not figs.findings, figs.findings[0]
