"""benchmarks/time_split.py: a case's wall time split into start-up, the simulation by SimPy
process, and what follows; the parts add up and name the processes a run starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_split_names_each_process_and_adds_up(tmp_path):
    out = tmp_path / "split.json"
    subprocess.run([sys.executable, "benchmarks/time_split.py", "--only", "default", "--requests", "30",
                    "--json", str(out)], cwd=ROOT, check=True, capture_output=True)
    (split,) = json.loads(out.read_text())
    names = [p["name"] for p in split["processes"]]
    assert names[0].startswith("arrivals") and any(n.startswith("_engine_loop") for n in names), names
    engine = next(p for p in split["processes"] if p["name"].startswith("_engine_loop"))
    assert engine["resumes"] > 30 and engine["light"] + engine["heavy"] <= engine["resumes"]
    in_processes = sum(p["s"] for p in split["processes"])
    assert 0 < in_processes <= split["step_s"] <= split["run_s"] <= split["wall_s"]
    assert split["first_run_s"] + split["run_s"] <= split["last_run_end_s"] + 1e-9 <= split["wall_s"] + 1e-9


def test_a_bad_request_count_is_refused():
    res = subprocess.run([sys.executable, "benchmarks/time_split.py", "--only", "default", "--requests", "0"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "--requests: 0 (allowed: a positive count)" in res.stderr
