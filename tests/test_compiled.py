"""The compiled scheduler and engine (mypyc, built by `make`) against the pure-Python reference.

`make test` runs the whole suite on the default build (compiled when `make` could build it), and
this file runs the golden, parity and engine tests on the other build in a subprocess, and replays
the bundled default (async and sync) on both, comparing the result files byte for byte. Without a
compiled build those tests skip, naming why; CI sets SERVESIM_REQUIRE_COMPILED=1 so a build that
silently failed there is a failure, not a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim import _native

ROOT = Path(__file__).resolve().parents[1]
# The golden traces and the vLLM-parity tests, the contract and policy plug-in tests, and the
# engine's: exact timelines, macro-steps through finishes, deferred cluster runs.
OTHER_BUILD_TESTS = ("tests/test_sched_golden.py", "tests/test_sched_vllm_parity_fixes.py",
                     "tests/test_sched_interface.py", "tests/test_sched_policies.py", "tests/test_sim_engine.py",
                     "tests/test_macro_runs.py", "tests/test_deferred_runs.py")


def _fresh_build() -> bool:
    env_backup = os.environ.pop(_native.PURE_ENV, None)
    try:
        sel = _native.select_builds(ROOT)
        return sel.scheduler is not None and sel.simulator is not None
    finally:
        if env_backup is not None:
            os.environ[_native.PURE_ENV] = env_backup


def _need_build() -> None:
    if not _fresh_build():
        reason = _native.select_builds(ROOT).simulator_reason if _native.PURE_ENV not in os.environ else "no fresh build"
        pytest.skip(f"no compiled scheduler to compare with ({reason}; `make` builds it)")


def _env(compiled: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if not compiled:
        env[_native.PURE_ENV] = "1"
    return env


def _mode(compiled: bool) -> str:
    code = "from servesim._native import scheduler_mode, simulator_mode; print(scheduler_mode(), simulator_mode())"
    res = subprocess.run([sys.executable, "-c", code], env=_env(compiled), capture_output=True, text=True,
                         check=True, timeout=120)
    return res.stdout.strip()


def test_the_build_in_use_is_reported():
    mode = _native.scheduler_mode()
    from servesim.scheduler import _schedule

    compiled = not str(_schedule.__file__).endswith(".py")
    assert mode.startswith("compiled") == compiled, (mode, _schedule.__file__)
    if os.environ.get(_native.PURE_ENV) == "1":
        assert mode == f"pure Python ({_native.PURE_ENV} is set)"
    from servesim.simulator import engine

    engine_mode = _native.simulator_mode()
    assert engine_mode.startswith("compiled") == (not str(engine.__file__).endswith(".py")), (engine_mode, engine.__file__)


def test_ci_has_the_compiled_build():
    if os.environ.get("SERVESIM_REQUIRE_COMPILED") != "1":
        pytest.skip("only where SERVESIM_REQUIRE_COMPILED=1 (CI): elsewhere a missing compiler is allowed")
    assert _fresh_build(), _native.select_builds(ROOT)
    assert _mode(compiled=True) == "compiled (mypyc) compiled (mypyc)"


@pytest.mark.parametrize("folder, staging, package, find", [
    ("scheduler", _native.STAGING, _native.PACKAGE, _native.compiled_package),
    ("simulator", _native.SIM_STAGING, _native.SIM_PACKAGE, _native.compiled_simulator),
], ids=["scheduler", "engine"])
def test_a_stale_or_foreign_build_is_never_used(tmp_path, monkeypatch, folder, staging, package, find):
    """Each build (the scheduler's, the engine's) is used only while its MANIFEST matches its own
    folder's sources and this interpreter, and never under SERVESIM_PURE_PYTHON; the engine's,
    linked to the scheduler compiled with it, only while scheduler/'s sources match too."""
    from importlib.machinery import EXTENSION_SUFFIXES

    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    for name in {folder, "scheduler"}:
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.py").write_text("x = 1\n")
    built = tmp_path / staging
    built.mkdir(parents=True)
    assert find(tmp_path) == (None, "no compiled build (run make)")
    digest = _native.sources_digest(tmp_path / folder)
    linked = f"scheduler_sources={_native.sources_digest(tmp_path / 'scheduler')}\n" if folder == "simulator" else ""
    (built / _native.MANIFEST).write_text(f"sources={digest}\next_suffix={EXTENSION_SUFFIXES[0]}\n{linked}")
    assert find(tmp_path) == (built / package, "compiled (mypyc)")
    if folder == "simulator":  # the scheduler it is linked to changed: stale too
        (tmp_path / "scheduler" / "a.py").write_text("x = 2\n")
        assert find(tmp_path)[1] == "stale compiled build: scheduler/ changed since the simulator was built with it (run make)"
        (tmp_path / "scheduler" / "a.py").write_text("x = 1\n")
        assert find(tmp_path)[0] is not None
    monkeypatch.setenv(_native.PURE_ENV, "1")
    assert find(tmp_path)[0] is None
    monkeypatch.delenv(_native.PURE_ENV)
    (tmp_path / folder / "b.py").write_text("")  # a new file counts, not only edits
    assert find(tmp_path)[1].startswith(f"stale compiled build: {folder}/ changed")
    (tmp_path / folder / "b.py").unlink()
    (tmp_path / folder / "a.py").write_text("x = 2\n")
    assert find(tmp_path)[1].startswith(f"stale compiled build: {folder}/ changed")
    (tmp_path / folder / "a.py").write_text("x = 1\n")
    (built / _native.MANIFEST).write_text(f"sources={digest}\next_suffix=.cpython-399-x.so\n")
    assert find(tmp_path)[1].startswith("stale compiled build: built for")


def test_the_engine_build_brings_its_own_scheduler(tmp_path, monkeypatch):
    """Both packages come from the engine's build while it is current (the engine's library is
    linked to the scheduler's of that build, never to another's); otherwise the scheduler-only
    build, if current, with the pure-Python engine."""
    from importlib.machinery import EXTENSION_SUFFIXES

    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    for name in ("scheduler", "simulator"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.py").write_text("x = 1\n")
    digests = {name: _native.sources_digest(tmp_path / name) for name in ("scheduler", "simulator")}
    suffix = f"ext_suffix={EXTENSION_SUFFIXES[0]}\n"
    for staging in (_native.STAGING, _native.SIM_STAGING):
        (tmp_path / staging).mkdir(parents=True)
    (tmp_path / _native.STAGING / _native.MANIFEST).write_text(f"sources={digests['scheduler']}\n{suffix}")
    (tmp_path / _native.SIM_STAGING / _native.MANIFEST).write_text(
        f"sources={digests['simulator']}\nscheduler_sources={digests['scheduler']}\n{suffix}")
    sel = _native.select_builds(tmp_path)
    assert (sel.scheduler, sel.simulator) == (tmp_path / _native.SIM_STAGING / _native.PACKAGE,
                                              tmp_path / _native.SIM_STAGING / _native.SIM_PACKAGE)
    (tmp_path / "simulator" / "a.py").write_text("x = 2\n")  # the engine's build is stale now
    sel = _native.select_builds(tmp_path)
    assert (sel.scheduler, sel.simulator) == (tmp_path / _native.STAGING / _native.PACKAGE, None)
    assert sel.simulator_reason.startswith("stale compiled build: simulator/ changed")
    (tmp_path / "scheduler" / "a.py").write_text("x = 2\n")  # and the scheduler's too
    assert _native.select_builds(tmp_path)[0] is None


@pytest.mark.slow
def test_golden_and_parity_tests_pass_on_the_other_build():
    _need_build()
    other_is_compiled = not _native.scheduler_mode().startswith("compiled")
    assert _mode(other_is_compiled).startswith("compiled") == other_is_compiled
    assert ("pure" in _mode(other_is_compiled)) != other_is_compiled  # the engine's build switches with it
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *OTHER_BUILD_TESTS],
                         cwd=ROOT, env=_env(other_is_compiled), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def _replay(out: Path, compiled: bool, *extra: str) -> None:
    code = "import sys; from servesim.cli import main; sys.argv = ['servesim', *sys.argv[1:]]; main()"
    cmd = [sys.executable, "-c", code, "replay", "--out", str(out), *extra]
    res = subprocess.run(cmd, env=_env(compiled), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["async", "sync"])
def test_replay_is_byte_identical_pure_and_compiled(loop, tmp_path):
    _need_build()
    extra = () if loop == "async" else ("--set", "scheduler.async_scheduling=false")
    _replay(tmp_path / "pure", False, *extra)
    _replay(tmp_path / "compiled", True, *extra)
    for name in ("requests.parquet", "steps.parquet"):
        pure, compiled = (tmp_path / "pure" / name).read_bytes(), (tmp_path / "compiled" / name).read_bytes()
        assert pure == compiled, f"{name} differs between the pure-Python and the compiled builds ({loop})"


def test_interpreted_subclasses_behave_as_in_python():
    # Compiled classes accept Python subclasses (the build marks them), compiled code calls the
    # overrides, and a class-level constant a subclass overrides is honoured (a ClassVar).
    from sched_helpers import req, step

    from servesim.scheduler import Scheduler
    from servesim.scheduler.config import CacheConfig, SchedulerConfig

    class Counting(Scheduler):
        max_steps_in_flight = 2

        def _update_request_with_output(self, request, new_ids):
            self.seen.append(request.request_id)  # an attribute the compiled base does not declare
            return super()._update_request_with_output(request, new_ids)

    sched = Counting(SchedulerConfig(max_num_batched_tokens=64, max_model_len=256),
                     CacheConfig(block_size=4, num_gpu_blocks=100))
    sched.seen = []
    assert sched.capabilities.max_steps_in_flight == 2
    sched.add_request(req(sched, "a", 10, max_tokens=2))
    while sched.has_unfinished_requests():
        step(sched)
    assert sched.seen == ["a", "a"]


def test_an_interpreted_engine_subclass_overrides_the_compiled_engine():
    # The P/D engines and test doubles subclass Engine from Python: the compiled loop calls their
    # overrides, and they may hold attributes the compiled class does not declare.
    from servesim.simulator.config import SimConfig
    from servesim.simulator.engine import Engine
    from servesim.traces.bundled import load_bundled
    from servesim.traces.workload import Workload

    class Counting(Engine):
        def apply_output(self, so, mro, rec, row, now=None):
            self.updates += 1
            super().apply_output(so, mro, rec, row, now)

    eng = Counting(SimConfig(macro_steps=False), Workload(load_bundled().requests[:5], "five", "test"))
    eng.updates = 0
    res = eng.run()
    assert eng.updates == res.num_steps > 0
