"""Running sweeps: resume after a kill, failing variants, determinism, process pool, Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from servesim.scenario import load_scenario, load_sweep, run_scenario, store
from servesim.scenario.table import WALL_COLUMNS
from servesim.simulator.cost_model import register_cost_model
from servesim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def tiny(n: int = 12, **sweep) -> dict:
    """A small poisson workload with a sweep: well under a second per variant."""
    return {"name": "tiny", "workload": {"generator": "poisson", "num_requests": n, "arrival": {"rate_per_s": 20},
                                         "prompt_len": 200, "output_len": 20},
            "sweep": sweep or {"scheduler.max_num_seqs": [4, 8, 16]}}


def statuses(progress_log) -> dict[str, str]:
    return {o.name: o.status for o, _, _ in progress_log}


def test_resume_reruns_only_what_is_missing(tmp_path):
    log: list = []
    first = run_scenario(tiny(), out_dir=tmp_path, progress=lambda *a: log.append(a))
    assert set(statuses(log).values()) == {"ok"} and list(first.table["status"]) == ["ok"] * 3
    names = list(first.table["variant"])
    mtimes = {n: (tmp_path / "variants" / n / "summary.json").stat().st_mtime_ns for n in names}
    (tmp_path / "variants" / names[1] / "summary.json").unlink()  # as if killed before publishing
    log.clear()
    second = run_scenario(tiny(), out_dir=tmp_path, progress=lambda *a: log.append(a))
    assert statuses(log) == {names[0]: "cached", names[1]: "ok", names[2]: "cached"}
    for n in (names[0], names[2]):
        assert (tmp_path / "variants" / n / "summary.json").stat().st_mtime_ns == mtimes[n]
    assert list(second.table["status"]) == ["ok"] * 3
    pd.testing.assert_frame_equal(first.table.drop(columns=list(WALL_COLUMNS)),
                                  second.table.drop(columns=list(WALL_COLUMNS)))


@pytest.mark.slow
def test_a_killed_sweep_loses_nothing_finished(tmp_path):
    scen = tmp_path / "slow.yaml"
    scen.write_text("workload: {generator: poisson, num_requests: 150, arrival: {rate_per_s: 40}, "
                    "prompt_len: 300, output_len: 60}\nsweep:\n  seed: [1, 2, 3, 4, 5, 6]\n")
    out = tmp_path / "out"
    code = ("from servesim.scenario import run_scenario; "
            f"run_scenario({str(scen)!r}, out_dir={str(out)!r}, workers=1)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if list(out.glob("variants/*/summary.json")):
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no clean-up code runs: like kill -9 or a lost node
        proc.wait()
    done_before = {p.parent.name for p in out.glob("variants/*/summary.json")}
    assert done_before and len(done_before) < 6, "the kill should land mid-sweep"
    log: list = []
    res = run_scenario(scen, out_dir=out, progress=lambda *a: log.append(a))
    got = statuses(log)
    assert {n for n, s in got.items() if s == "cached"} == done_before
    assert list(res.table["status"]) == ["ok"] * 6
    assert not (out / store.STAGING).exists() or not any((out / store.STAGING).iterdir())


register_cost_model("test-explode")(lambda model=None, gpu=None, tp=None, explode=False, **kw: _Explode(explode))


class _Explode:
    name = "test-explode"

    def __init__(self, explode: bool):
        self.explode = explode

    def step_time_s(self, shape) -> float:
        if self.explode:
            raise RuntimeError("boom: the cost model broke mid-run")
        return 0.002 + 1e-5 * shape.num_tokens


def test_failing_variants_are_reported_and_do_not_stop_the_others(tmp_path):
    sc = tiny(**{"cost_model.params.explode": [False, True], "cache.block_size": [16, 0]})
    sc["cost_model"] = {"name": "test-explode"}
    log: list = []
    res = run_scenario(sc, out_dir=tmp_path, progress=lambda *a: log.append(a))  # in-process: sees the model
    table = res.table.set_index("variant")
    assert list(res.table["status"]) == ["ok", "error", "error", "error"]
    assert set(res.failed) == set(res.table["variant"][1:])
    crash = res.table["variant"][2]  # explode=True, block_size=16: valid, fails at run time
    assert "boom" in table.loc[crash, "error"]
    text = (tmp_path / "variants" / crash / "error.txt").read_text()
    assert "Traceback" in text and "boom" in text
    assert (tmp_path / "variants" / crash / "variant.yaml").is_file()
    invalid = res.table["variant"][1]  # block_size=0: refused before running
    assert "block_size must be >= 1" in (tmp_path / "variants" / invalid / "error.txt").read_text()
    assert not (tmp_path / "variants" / invalid / "summary.json").exists()
    assert table.loc[res.table["variant"][0], "num_finished"] == 12


def test_same_seed_same_table(tmp_path):
    a = run_scenario(tiny(**{"seed": [3, 4]}), out_dir=tmp_path / "a").table
    b = run_scenario(tiny(**{"seed": [3, 4]}), out_dir=tmp_path / "b").table
    pd.testing.assert_frame_equal(a.drop(columns=list(WALL_COLUMNS)), b.drop(columns=list(WALL_COLUMNS)))
    assert a["ttft_s.p50"].iloc[0] != a["ttft_s.p50"].iloc[1]  # the seed reaches the generator
    assert {"seed", "num_preemptions", "ttft_s.p50", "throughput.output_tokens_per_s"} <= set(a.columns)


@pytest.mark.slow
def test_process_pool_and_saved_configs(tmp_path):
    res = run_scenario(tiny(**{"scheduler.max_num_seqs": [4, 16]}), out_dir=tmp_path, workers=2)
    assert list(res.table["status"]) == ["ok", "ok"]
    for name in res.table["variant"]:
        folder = tmp_path / "variants" / name
        assert {"summary.json", "config.yaml", "variant.yaml", "requests.parquet", "steps.parquet",
                "timeseries.csv", "request_meta.parquet", "breakdown.json"} <= {p.name for p in folder.iterdir()}
        again = load_scenario(folder / "variant.yaml")  # the saved config reproduces the variant
        assert again.variants[0].name.endswith(name.rsplit("-", 1)[1])
    assert (tmp_path / "scenario.yaml").is_file() and (tmp_path / "sweep.json").is_file()
    assert res.variant(0).requests["ttft_s"].notna().all()


def test_breakdowns_by_priority_and_job(tmp_path):
    sc = {"workload": {"generator": "sessions", "num_requests": 14, "priority": {"values": [0, 1]},
                       "sessions": {"num_turns": 3, "think_time_s": 0.5}},
          "scheduler": {"policy": "priority"}}
    t = run_scenario(sc, out_dir=tmp_path).table
    assert {"by_priority.0.ttft_s.p50", "by_priority.1.ttft_s.p50", "jobs.completion_s.p50",
            "jobs.num_jobs"} <= set(t.columns)


@pytest.mark.xdist_group("ray")  # one worker runs every test that starts Ray (Makefile: --dist loadgroup)
@pytest.mark.slow
def test_ray_backend_on_a_local_instance(tmp_path):
    pytest.importorskip("ray")
    log: list = []
    res = run_scenario(tiny(**{"scheduler.max_num_seqs": [4, 16]}), out_dir=tmp_path, backend="ray",
                       workers=2, progress=lambda *a: log.append(a))
    assert list(res.table["status"]) == ["ok", "ok"] and len(log) == 2
    local = run_scenario(tiny(**{"scheduler.max_num_seqs": [4, 16]}), out_dir=tmp_path / "local").table
    pd.testing.assert_frame_equal(res.table.drop(columns=list(WALL_COLUMNS)),
                                  local.drop(columns=list(WALL_COLUMNS)))


def test_ray_missing_gives_the_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(InputError, match=r"pip install servesim\[ray\]"):
        run_scenario(tiny(), out_dir=tmp_path, backend="ray")
    with pytest.raises(InputError, match="unknown backend"):
        run_scenario(tiny(), out_dir=tmp_path, backend="slurm")


def test_load_sweep_of_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_sweep(tmp_path)


def test_cli_exit_codes_and_messages(tmp_path, monkeypatch, capsys):
    from typer.testing import CliRunner

    import servesim.commands.run  # noqa: F401  (registers `run`)
    from servesim.cli import app, main

    scen = tmp_path / "s.yaml"
    scen.write_text("workload: {generator: poisson, num_requests: 6}\nsweep:\n  cache.block_size: [16, 0]\n")
    result = CliRunner().invoke(app, ["run", str(scen), "--out", str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code == 1  # one variant failed; the other's results and the table are written
    assert (tmp_path / "out" / "sweep.parquet").is_file()
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {generator: poisson}\nscheduler: {max_num_seq: 4}\n")
    monkeypatch.setattr(sys, "argv", ["servesim", "run", str(bad), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "bad.yaml, line 2" in err and "max_num_seq" in err and "did you mean max_num_seqs" in err
    assert not (tmp_path / "x").exists()  # nothing ran
