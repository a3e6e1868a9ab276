"""The fast path plugs in beside the reference core and nothing below reaches it.

- The reference engine (simulator/engine.py and everything it imports, lazy imports included)
  never imports the fast path (simulator/fastpath/) nor the scheduler's bulk package
  (scheduler/bulk/); the scheduler outside scheduler/bulk/ never imports the bulk package.
- Only the builder (simulator/build.py) and the cluster (for router proofs) import the fast path,
  and only the fast path imports the bulk package.
- An engine built without a planner loads neither package at run time, and a checkout with both
  packages deleted still replays a trace (the slower, complete simulator).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_import_graph import GRAPH, ROOT

FASTPATH = "servesim.simulator.fastpath"
BULK = "servesim.scheduler.bulk"
# Who may import the fast path from outside it: the one place that attaches planners, and the
# cluster, which asks for its router's proofs only when its replicas have planners.
FASTPATH_IMPORTERS = {"servesim.simulator.build", "servesim.simulator.cluster.cluster"}


def _inside(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def _reach(start: str) -> set[str]:
    """Every module `start` can load: its imports, theirs, ... and each one's parent packages."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in GRAPH]
        todo += sorted(GRAPH.get(mod, ()))
    return seen


def test_the_reference_engine_never_reaches_the_fast_path_or_the_bulk_package():
    reached = _reach("servesim.simulator.engine")
    assert "servesim.simulator.step_book" in reached  # the walk sees the engine's own parts
    bad = sorted(m for m in reached if _inside(m, FASTPATH) or _inside(m, BULK))
    assert not bad, bad


def test_only_the_builder_and_the_cluster_import_the_fast_path():
    importers = {s for s, ds in GRAPH.items() if not _inside(s, FASTPATH) and any(_inside(d, FASTPATH) for d in ds)}
    assert importers <= FASTPATH_IMPORTERS, sorted(importers - FASTPATH_IMPORTERS)
    assert "servesim.simulator.build" in importers


def test_only_the_fast_path_imports_the_bulk_package():
    bad = sorted(f"{s} -> {d}" for s, ds in GRAPH.items() if not _inside(s, BULK) and not _inside(s, FASTPATH)
                 for d in ds if _inside(d, BULK))
    assert not bad, bad


_PLAIN_RUN = """
import sys
from servesim.simulator.config import SimConfig
from servesim.simulator.engine import Engine
from servesim.traces.bundled import load_bundled
from servesim.traces.workload import Workload
res = Engine(SimConfig(), Workload(load_bundled().requests[:30], "thirty", "test")).run()
assert res.num_steps > 0
loaded = sorted(m for m in sys.modules if m.startswith(("servesim.simulator.fastpath", "servesim.scheduler.bulk")))
assert not loaded, loaded
print("ok", res.num_steps)
"""


def test_an_engine_without_a_planner_loads_neither_package():
    out = subprocess.run([sys.executable, "-c", _PLAIN_RUN], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


@pytest.mark.slow
def test_a_checkout_without_the_fast_path_still_replays(tmp_path: Path):
    """Delete simulator/fastpath/ and scheduler/bulk/ from a copy of the checkout: every engine is
    the reference, says why, and the results equal the full checkout's."""
    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", ".venv", "runs", ".git")
    copy.mkdir()
    for name in ("servesim", "scheduler", "simulator", "traces", "gpu_runner"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")  # what makes it a checkout (servesim/__init__.py)
    for name in ("simulator/fastpath", "scheduler/bulk"):
        shutil.rmtree(copy / name, ignore_errors=True)
    env = {**os.environ, "SERVESIM_PURE_PYTHON": "1", "PYTHONPATH": str(copy)}
    script = """
from servesim.simulator.build import build_engine
from servesim.simulator.config import SimConfig
from servesim.traces.bundled import load_bundled
from servesim.traces.workload import Workload
eng = build_engine(SimConfig(), Workload(load_bundled().requests[:30], "thirty", "test"))
assert eng.planner is None and "not installed" in eng.planner_declined, eng.planner_declined
res = eng.run()
print(res.metrics.requests_frame().to_csv())
"""
    cut = subprocess.run([sys.executable, "-c", script], cwd=copy, env=env, capture_output=True, text=True,
                         timeout=300)
    assert cut.returncode == 0, cut.stderr
    full = subprocess.run([sys.executable, "-c", script.replace(
        'assert eng.planner is None and "not installed" in eng.planner_declined, eng.planner_declined',
        "assert eng.planner is not None")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    assert cut.stdout == full.stdout
