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


def test_the_library_is_found_by_name_from_any_folder(tmp_path, monkeypatch):
    from servesim.api import scenario_names, scenario_path
    from servesim.scenario import load_scenario
    from servesim.traces.errors import InputError

    assert "kv_size_preemptions" in scenario_names() and not [n for n in scenario_names() if "/" in n or n[0] == "_"]
    assert scenario_path("kv_size_preemptions.yaml") == scenario_path("kv_size_preemptions")
    monkeypatch.chdir(tmp_path)  # nothing of the repository here
    assert load_scenario("kv_size_preemptions").name == "kv_size_preemptions"
    with pytest.raises(InputError, match="did you mean 'kv_size_preemptions'"):
        load_scenario("kv_size_preemtions")
    with pytest.raises(InputError, match="cluster or plan config"):
        scenario_path("cluster/pd_vs_colocated_pd")
    (tmp_path / "kv_size_preemptions").write_text("name: mine\nworkload: {trace: sharegpt-300}\n")
    assert load_scenario("kv_size_preemptions").name == "mine"  # a file of that name wins
    with pytest.raises(InputError, match="cannot read scenario"):
        load_scenario("missing.yaml")  # a path is a path: never looked up in the library
