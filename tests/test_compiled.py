"""The compiled build (mypyc, tools/build_native.py, built by `make`) against the pure-Python reference.

`make test` runs the whole suite on the default build (compiled when `make` could build it), and
this file runs the golden, parity and engine tests on the other build in a subprocess, and replays
the bundled default (async and sync) on both, comparing the result files byte for byte. Without a
compiled build those tests skip, naming why; CI sets SERVESIM_REQUIRE_COMPILED=1 so a build that
silently failed there is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from servesim import _native

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_native  # noqa: E402
# The golden traces and the vLLM-parity tests, the contract and policy plug-in tests, the
# engine's (exact timelines, macro-steps through finishes, deferred cluster runs) and SGLang's
# bulk decode path against stepping.
OTHER_BUILD_TESTS = ("tests/test_sched_golden.py", "tests/test_sched_vllm_parity_fixes.py",
                     "tests/test_sched_interface.py", "tests/test_sched_policies.py", "tests/test_sim_engine.py",
                     "tests/test_macro_runs.py", "tests/test_deferred_runs.py", "tests/test_sglang_decode_run.py",
                     "tests/test_sglang_macro_steps.py", "tests/test_pd_golden.py")


def _fresh_build() -> bool:
    env_backup = os.environ.pop(_native.PURE_ENV, None)
    try:
        return _native.select_build(ROOT).root is not None
    finally:
        if env_backup is not None:
            os.environ[_native.PURE_ENV] = env_backup


def _need_build() -> None:
    if not _fresh_build():
        reason = _native.select_build(ROOT).reason if _native.PURE_ENV not in os.environ else "no fresh build"
        pytest.skip(f"no compiled build to compare with ({reason}; `make` builds it)")


def _env(compiled: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if not compiled:
        env[_native.PURE_ENV] = "1"
    return env


def _mode(compiled: bool) -> str:
    code = ("from servesim._native import kernels_mode, scheduler_mode, simulator_mode; "
            "print(scheduler_mode(), simulator_mode(), kernels_mode(), sep='; ')")
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
    from servesim.simulator import engine, kernels

    for module, module_mode in ((engine, _native.simulator_mode()), (kernels, _native.kernels_mode())):
        assert module_mode.startswith("compiled") == (not str(module.__file__).endswith(".py")), module
        assert module_mode.startswith("compiled") == compiled, module  # one build: all or none


def test_ci_has_the_compiled_build():
    if os.environ.get("SERVESIM_REQUIRE_COMPILED") != "1":
        pytest.skip("only where SERVESIM_REQUIRE_COMPILED=1 (CI): elsewhere a missing compiler is allowed")
    assert _fresh_build(), _native.select_build(ROOT)
    assert _mode(compiled=True) == "; ".join([_native.COMPILED] * 3)


def _fake_build(root: Path, folders: tuple[str, ...], suffix: str = EXTENSION_SUFFIXES[0]) -> Path:
    """A checkout with `folders` and a build MANIFEST matching them (no extension modules)."""
    for name in folders:
        (root / name).mkdir(exist_ok=True)
        (root / name / "a.py").write_text("x = 1\n")
    build = root / _native.BUILD
    build.mkdir(parents=True, exist_ok=True)
    digests = "".join(f"{name}_sources={_native.sources_digest(root / name)}\n" for name in folders)
    (build / _native.MANIFEST).write_text(f"packages={','.join(folders)}\n{digests}ext_suffix={suffix}\n")
    return build


def test_a_stale_or_foreign_build_is_never_used(tmp_path, monkeypatch):
    """The one build is used only while its MANIFEST matches every compiled folder's sources and this
    interpreter, and never under SERVESIM_PURE_PYTHON; stale anywhere, it is used nowhere (its
    libraries are linked: the engine's is never loaded beside another build's scheduler)."""
    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    assert _native.select_build(tmp_path) == _native.Selection(None, (), "no compiled build (run make)")
    build = _fake_build(tmp_path, ("scheduler", "simulator"))
    assert _native.select_build(tmp_path) == _native.Selection(build / "servesim", ("scheduler", "simulator"),
                                                               _native.COMPILED)
    for folder in ("scheduler", "simulator"):
        (tmp_path / folder / "b.py").write_text("")  # a new file counts, not only edits
        sel = _native.select_build(tmp_path)
        assert sel.root is None and sel.stale and sel.reason.startswith(f"stale compiled build: {folder}/ changed")
        (tmp_path / folder / "b.py").unlink()
        (tmp_path / folder / "a.py").write_text("x = 2\n")
        assert _native.select_build(tmp_path).reason.startswith(f"stale compiled build: {folder}/ changed")
        (tmp_path / folder / "a.py").write_text("x = 1\n")
        assert _native.select_build(tmp_path).root is not None
    monkeypatch.setenv(_native.PURE_ENV, "1")
    assert _native.select_build(tmp_path) == _native.Selection(None, (), f"{_native.PURE_ENV} is set")
    monkeypatch.delenv(_native.PURE_ENV)
    _fake_build(tmp_path, ("scheduler", "simulator"), suffix=".cpython-399-x.so")
    assert _native.select_build(tmp_path).reason.startswith("stale compiled build: built for .cpython-399-x.so")


def test_the_checkout_finder_searches_the_build_first_in_every_compiled_package(tmp_path):
    """A compiled folder and each of its subpackages search the build's directory, then the folder's;
    a stale build prints one warning line and is not searched."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import servesim.scheduler as s, servesim.scheduler.kv as kv\n"
            "import servesim.traces as t; print(s.__path__, kv.__path__, t.__path__, sep='\\n')")
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "servesim", root / "servesim", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "pyproject.toml").write_text("")
    for folder in ("scheduler", "traces"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "data"))
    for folder in ("simulator", "gpu_runner"):  # not imported here; a checkout has them
        (root / folder).mkdir()
        (root / folder / "__init__.py").write_text("")
    build = _fake_build(root, ("scheduler",))
    (build / "servesim" / "scheduler" / "kv").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    res = subprocess.run([sys.executable, "-c", code, str(root)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == "", res.stderr[-3000:]
    paths = res.stdout.split("\n")
    assert paths[0] == str([str(build / "servesim" / "scheduler"), str(root / "scheduler")])
    assert paths[1] == str([str(build / "servesim" / "scheduler" / "kv"), str(root / "scheduler" / "kv")])
    assert paths[2] == str([str(root / "traces")])  # not compiled: its own folder alone
    (root / "scheduler" / "new.py").write_text("")  # stale now
    res = subprocess.run([sys.executable, "-c", code, str(root)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.splitlines() == ["servesim: warning: using the pure-Python modules: stale compiled build: "
                                       "scheduler/ changed since it was built (run make)"]
    assert res.stdout.split("\n")[0] == str([str(root / "scheduler")])


def test_a_listed_module_that_does_not_exist_stops_the_build_naming_it(tmp_path, capsys):
    assert build_native.build_checkout(tmp_path, force=False, jobs=1) == 1
    err = capsys.readouterr().err
    assert "listed for compiling but not found: scheduler/_schedule.py" in err
    assert "edit COMPILED at the top of tools/build_native.py" in err


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
@pytest.mark.parametrize("loop", ["async", "sync", "sglang"])
def test_replay_is_byte_identical_pure_and_compiled(loop, tmp_path):
    _need_build()
    extra = {"async": (), "sync": ("--set", "scheduler.async_scheduling=false"), "sglang": ("--engine", "sglang")}[loop]
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
    # Test doubles subclass Engine from Python: the compiled loop calls their
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
