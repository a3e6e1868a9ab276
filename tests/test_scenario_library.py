"""Every shipped scenario runs end to end with `servesim run --smoke` (a few requests per variant)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import servesim.commands.plot  # noqa: F401  (registers `plot` on the app)
import servesim.commands.run  # noqa: F401  (registers `run` on the app)
from servesim.cli import app
from servesim.scenario.workload import SMOKE_MAX_REQUESTS

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_runs_with_smoke(path, tmp_path):
    result = CliRunner().invoke(app, ["run", str(path), "--smoke", "--workers", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    table = pd.read_parquet(tmp_path / "sweep.parquet")
    assert (table["status"] == "ok").all(), table[["variant", "error"]]
    assert (table["num_requests"] <= SMOKE_MAX_REQUESTS).all() and (table["num_finished"] >= 1).all()
    assert "ttft_s.p50" in table.columns
