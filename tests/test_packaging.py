"""The wheel installs one import name, `servesim`; the repository folders are its subpackages.

Why: issue 14 — `scheduler`, `simulator` and `traces` are names of existing PyPI packages; a wheel
that installed them top-level would break (or be broken by) whichever was installed next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("scheduler", "simulator", "gpu_runner", "traces")
NO_COMPILE_ENV = "SERVESIM_NO_COMPILE"  # setup.py's
sys.path.insert(0, str(ROOT / "tools"))
import build_native  # noqa: E402


def _run(code: str, cwd: Path, env: dict | None = None) -> str:
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> Path:
    # Built from a copy of the checkout's files (tracked, or new and not ignored): setuptools writes
    # build/ and *.egg-info next to the sources, which must not appear in the working tree.
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    return src


def _build_wheel(src: Path, out: Path, compiled: bool) -> tuple[Path, str]:
    """The wheel pip builds from src (this environment's setuptools and mypy: no build isolation,
    so no download), and what the build said on stderr."""
    env = {k: v for k, v in os.environ.items() if k != NO_COMPILE_ENV}
    if not compiled:
        env[NO_COMPILE_ENV] = "1"  # the pure-Python wheel, in seconds
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "-v", "-w", str(out)], env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (whl,) = out.glob("servesim-*.whl")
    return whl, res.stdout + res.stderr


@pytest.fixture(scope="module")
def wheel(source_tree, tmp_path_factory) -> Path:
    whl, _ = _build_wheel(source_tree, tmp_path_factory.mktemp("wheel"), compiled=False)
    return whl


@pytest.mark.slow
def test_the_wheel_has_one_top_level_name_and_ships_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"servesim"}, tops
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["servesim"]
    for folder in MAPPED:
        assert f"servesim/{folder}/__init__.py" in names
    # Every file of the folders travels, package data included: bundled traces, model specs and HF
    # configs, the calibrated cost model index, the cost model's collective and MoE tables.
    # ... and the shipped what-if library (servesim/_layout.py DATA_FOLDERS: data only, no __init__.py)
    tracked = subprocess.run(["git", "ls-files", *MAPPED, "scenarios"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not [rel for rel in tracked if f"servesim/{rel}" not in names]
    assert not [n for n in names if "__pycache__" in n or n.startswith("servesim/tests/")]
    # SERVESIM_NO_COMPILE=1: pure Python, for any interpreter and platform
    assert wheel.name.endswith("-py3-none-any.whl") and not [n for n in names if n.endswith(".so")]


@pytest.mark.slow
def test_the_installed_wheel_runs_without_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    code = ("import importlib.util, json, sys\n"
            "import servesim.scheduler, servesim.traces as t\n"
            "from servesim.simulator.specs import resolve_model\n"
            "w = t.load_bundled(t.DEFAULT_TRACE)\n"
            "from servesim.scenario.library import scenario_path\n"
            "assert scenario_path('kv_size_preemptions').is_file()\n"
            "print(json.dumps({'scheduler': servesim.scheduler.__file__, 'n': len(w.requests),\n"
            "                  'model': resolve_model('llama-3.1-8b').name,\n"
            "                  'shadow': [m for m in ('scheduler', 'simulator', 'traces', 'gpu_runner')\n"
            "                             if m in sys.modules],\n"
            "                  'finders': [repr(f) for f in sys.meta_path if 'checkout' in repr(f)]}))\n")
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    got = json.loads(_run(code, cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert got["scheduler"].startswith(str(target)), got  # and the library's scenarios from the wheel
    assert got["n"] > 0 and got["model"] and got["shadow"] == [] and got["finders"] == []


def test_the_scheduler_layer_loads_only_the_standard_library():
    # servesim/__init__.py runs before servesim.scheduler: it must stay stdlib-only and cheap.
    code = ("import sys; before = set(sys.modules)\n"
            "import servesim.scheduler.scheduler, servesim.scheduler.kv, servesim.scheduler.sglang\n"
            "new = sorted(m.split('.')[0] for m in set(sys.modules) - before)\n"
            "print(sorted({m for m in new if m != 'servesim' and m not in sys.stdlib_module_names}))\n")
    assert _run(code, cwd=ROOT).strip() == "[]"


def test_a_checkout_on_the_path_imports_its_own_folders(tmp_path):
    # A worktree or `PYTHONPATH=.` must import *that* checkout's folders, not the installed one's.
    code = "import servesim.scheduler as s, servesim.traces as t; print(s.__file__); print(t.__file__)"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SERVESIM_PURE_PYTHON": "1"}
    out = _run(code, cwd=tmp_path, env=env).split()
    assert out == [str(ROOT / "scheduler" / "__init__.py"), str(ROOT / "traces" / "__init__.py")]
    # Without the switch the scheduler may come from this checkout's compiled build (never another's).
    del env["SERVESIM_PURE_PYTHON"]
    # (the build holds extension modules alone: the package's __init__ is the folder's own).
    assert _run(code, cwd=tmp_path, env=env).split()[0] == str(ROOT / "scheduler" / "__init__.py")


@pytest.fixture(scope="module")
def compiled_wheel(source_tree, tmp_path_factory) -> Path:
    reason = build_native.compiler_missing()
    if reason is not None:
        if os.environ.get("SERVESIM_REQUIRE_COMPILED") == "1":
            pytest.fail(f"the compiled wheel must build here: {reason}")
        pytest.skip(f"no compiled wheel here: {reason}")
    whl, log = _build_wheel(source_tree, tmp_path_factory.mktemp("compiled-wheel"), compiled=True)
    assert "the compiled build failed" not in log, log[-4000:]
    return whl


def _venv_with(whl: Path, where: Path) -> Path:
    """A fresh venv (not this one: it sees no checkout) with `whl` installed; its third-party
    packages are this environment's (a .pth line naming our site-packages, read after the venv's
    own, so the installed servesim comes first: nothing is downloaded)."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "_servesim_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(whl)],
                   check=True, capture_output=True, timeout=600)
    return venv


def _servesim(venv: Path, *args: str, cwd: Path, pure: bool = False) -> str:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(cwd)}
    if pure:
        env["SERVESIM_PURE_PYTHON"] = "1"
    res = subprocess.run([str(venv / "bin" / "servesim"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res.stdout


@pytest.mark.slow
def test_the_compiled_wheel_installs_and_replays_as_the_checkout(compiled_wheel, tmp_path):
    """`pip wheel .` with mypyc and a C compiler: each compiled module's extension beside its .py file;
    installed in a fresh venv, `servesim --version` says compiled, SERVESIM_PURE_PYTHON=1 says pure
    Python, and a replay of the bundled default gives the checkout's result files byte for byte."""
    names = set(zipfile.ZipFile(compiled_wheel).namelist())
    assert not compiled_wheel.name.endswith("-none-any.whl"), compiled_wheel.name
    suffix = EXTENSION_SUFFIXES[0]
    for rel in build_native.listed_modules():
        assert {f"servesim/{rel}", f"servesim/{rel.removesuffix('.py')}{suffix}"} <= names, rel
    for folder in build_native.COMPILED:
        assert f"servesim/{folder}/_native__mypyc{suffix}" in names
    venv = _venv_with(compiled_wheel, tmp_path)
    away = tmp_path / "away"
    away.mkdir()
    compiled = "compiled (mypyc)"
    assert _servesim(venv, "--version", cwd=away).splitlines()[1:] == [
        f"scheduler: {compiled}", f"simulator engine: {compiled}", f"simulator kernels: {compiled}"]
    pure = "pure Python (SERVESIM_PURE_PYTHON is set)"
    assert _servesim(venv, "--version", cwd=away, pure=True).splitlines()[1:] == [
        f"scheduler: {pure}", f"simulator engine: {pure}", f"simulator kernels: {pure}"]
    code = "import sys; from servesim.cli import main; sys.argv = ['servesim', *sys.argv[1:]]; main()"
    subprocess.run([sys.executable, "-c", code, "replay", "--out", str(tmp_path / "checkout")], cwd=ROOT,
                   check=True, capture_output=True, timeout=900)
    _servesim(venv, "replay", "--out", str(tmp_path / "installed"), cwd=away)
    _servesim(venv, "replay", "--out", str(tmp_path / "installed-pure"), cwd=away, pure=True)
    for name in ("requests.parquet", "steps.parquet"):
        want = (tmp_path / "checkout" / name).read_bytes()
        assert (tmp_path / "installed" / name).read_bytes() == want, name
        assert (tmp_path / "installed-pure" / name).read_bytes() == want, name
