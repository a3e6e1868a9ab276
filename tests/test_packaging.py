"""The wheel installs one import name, `servesim`; the repository folders are its subpackages.

Why: issue 14 — `scheduler`, `simulator` and `traces` are names of existing PyPI packages; a wheel
that installed them top-level would break (or be broken by) whichever was installed next to it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("scheduler", "simulator", "gpu_runner", "traces")


def _run(code: str, cwd: Path, env: dict | None = None) -> str:
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of the checkout's files (tracked, or new and not ignored): setuptools writes
    # build/ and *.egg-info next to the sources, which must not appear in the working tree.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True, timeout=600)
    (whl,) = out.glob("servesim-*.whl")
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
    # Package data travels: bundled traces, model specs and HF configs, the calibrated cost model index.
    for tracked in subprocess.run(["git", "ls-files", "traces/data", "simulator/specs", "simulator/cost_model/calibrated"],
                                  cwd=ROOT, capture_output=True, text=True, check=True).stdout.split():
        assert f"servesim/{tracked}" in names, tracked
    assert not [n for n in names if "__pycache__" in n or n.startswith("servesim/tests/")]


@pytest.mark.slow
def test_the_installed_wheel_runs_without_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    code = ("import importlib.util, json, sys\n"
            "import servesim.scheduler, servesim.traces as t\n"
            "from servesim.simulator.specs import resolve_model\n"
            "w = t.load_bundled(t.DEFAULT_TRACE)\n"
            "print(json.dumps({'scheduler': servesim.scheduler.__file__, 'n': len(w.requests),\n"
            "                  'model': resolve_model('llama-3.1-8b').name,\n"
            "                  'shadow': [m for m in ('scheduler', 'simulator', 'traces', 'gpu_runner')\n"
            "                             if m in sys.modules],\n"
            "                  'finders': [repr(f) for f in sys.meta_path if 'checkout' in repr(f)]}))\n")
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    got = json.loads(_run(code, cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert got["scheduler"].startswith(str(target)), got
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
    scheduler = _run(code, cwd=tmp_path, env=env).split()[0]
    assert scheduler in (str(ROOT / "scheduler" / "__init__.py"),
                         str(ROOT / "build" / "mypyc" / "servesim" / "scheduler" / "__init__.py"),
                         str(ROOT / "build" / "mypyc_sim" / "servesim" / "scheduler" / "__init__.py"))
