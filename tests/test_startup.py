"""Start-up stays cheap: the CLI's `--version` and `--help` load no heavy library (issue 18, fixed costs).

Why: half of a small `servesim replay` was start-up and result writing. pandas, pyarrow, matplotlib and
torch cost 0.3-2 s to import; a module-level import of one of them anywhere on the CLI's import path
(servesim.cli, a command module, what those import at the top) makes every `--help` pay it. Each check
runs in a fresh interpreter, since this test process has long since imported them all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pandas", "pyarrow", "matplotlib", "torch", "numpy", "scipy", "simpy")

_PROBE = """
import json, sys
sys.argv = ["servesim", *json.loads(sys.argv[1])]
from servesim.cli import main
try:
    main()
except SystemExit:
    pass
print("\\n@@" + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))
"""


def _loaded(args: list[str]) -> set[str]:
    """Top-level packages imported after `servesim ARGS` ran in a fresh interpreter."""
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return set(json.loads(res.stdout.rpartition("\n@@")[2]))


@pytest.mark.parametrize("args", [["--help"], ["replay", "--help"], ["cluster", "--help"], ["run", "--help"]])
def test_help_imports_no_heavy_library(args):
    loaded = _loaded(args)
    heavy = loaded & set(HEAVY)
    assert not heavy, f"`servesim {' '.join(args)}` imported {sorted(heavy)}; import them inside the function"
    # typer 0.29 coerces every parameter through pydantic (~0.2 s of every CLI process on a slow
    # machine): pyproject.toml keeps typer below it
    assert "pydantic" not in loaded, "typer >= 0.29 imports pydantic: pyproject.toml pins typer<0.29"


def test_version_imports_not_even_typer():
    loaded = _loaded(["--version"])
    assert not loaded & {"typer", "pydantic", "click", *HEAVY}, sorted(loaded)


def test_importing_the_cli_module_loads_no_third_party_library():
    """Command modules do `from servesim.cli import app`; only that builds the typer app."""
    res = subprocess.run([sys.executable, "-c", "import sys, servesim.cli; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    loaded = {m.split(".")[0] for m in res.stdout.split()}
    assert not loaded & {"typer", "pydantic", "click", "rich", "yaml", *HEAVY}, sorted(loaded)


def test_a_replay_imports_no_pandas(tmp_path):
    """A replay (trace loading, simulation, summary, result files) runs without pandas, ~0.2 s of
    every CLI process (docs/SPEED.md): the bundled trace and an Azure CSV (read with the csv
    module, its timestamps by numpy)."""
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     + "".join(f"2023-11-16 18:15:{10 + i:02d}.5000000,{100 + 7 * i},{20 + i}\n" for i in range(30)))
    for args in (["replay", "--out", str(tmp_path / "bundled")], ["replay", str(azure), "--out", str(tmp_path / "az")]):
        loaded = _loaded(args)
        assert not loaded & {"pandas", "matplotlib", "torch"}, f"`servesim {' '.join(args)}` imported {sorted(loaded)}"
        assert (tmp_path / args[-1] / "requests.parquet").is_file()


@pytest.mark.slow
def test_a_cluster_run_imports_no_pandas(tmp_path):
    """`servesim cluster` (a generated workload, colocated and P/D, the results folder) runs without
    pandas too: its summary and files read the tables as columns (simulator/cluster/results.py)."""
    colocated = tmp_path / "colocated.yaml"
    colocated.write_text("workload: {generator: poisson, num_requests: 40, arrival: {rate_per_s: 20}}\n"
                         "replicas: [{count: 2}]\nrouter: least_kv\n")
    pd_file = tmp_path / "pd.yaml"
    pd_file.write_text("workload: {generator: poisson, num_requests: 40, arrival: {rate_per_s: 20}}\n"
                       "replicas: [{count: 1, role: prefill}, {count: 1, role: decode}]\nrouter: least_outstanding\n"
                       "pd: {decode_router: least_kv}\n")
    for path in (colocated, pd_file):
        out = tmp_path / f"{path.stem}-out"
        loaded = _loaded(["cluster", str(path), "--out", str(out)])
        assert not loaded & {"pandas", "matplotlib", "torch"}, f"`servesim cluster {path.name}` imported {sorted(loaded)}"
        assert (out / "requests.parquet").is_file() and (out / "steps.parquet").is_file()


@pytest.mark.slow
def test_api_cluster_results_build_their_frames_on_first_read(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("workload: {generator: poisson, num_requests: 30, arrival: {rate_per_s: 20}}\n"
                    "replicas: [{count: 2}]\n")
    code = ("import sys\n"
            "from servesim.api import cluster\n"
            f"res = cluster({str(path)!r})\n"
            "assert 'pandas' not in sys.modules, 'the cluster run imported pandas'\n"
            "frame = res.requests\n"
            "assert 'pandas' in sys.modules and len(frame) == 30 and res.requests is frame\n"
            "assert list(frame.columns[:5]) == ['request_id', 'replica', 'route_time_s', 'route_reason', 'route_score']\n"
            "assert list(res.steps.columns[:2]) == ['replica', 'step']\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_api_results_build_their_frames_on_first_read(tmp_path):
    code = ("import sys\n"
            "from servesim.api import replay\n"
            f"res = replay(None, out_dir={str(tmp_path / 'out')!r})\n"
            "assert 'pandas' not in sys.modules, 'the replay imported pandas'\n"
            "frame = res.requests\n"
            "assert 'pandas' in sys.modules and len(frame) == res.summary['num_requests'] and res.requests is frame\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
def test_a_replay_needs_neither_torch_nor_triton_nor_ray(tmp_path):
    """`make run` installs the core only (Makefile): a replay, a scenario and a cluster run must not
    import the GPU runner's or the Ray backend's packages."""
    from pathlib import Path

    code = (
        "import sys\n"
        "from servesim.api import replay, run_scenario\n"
        f"replay(max_requests=20, out_dir={str(tmp_path / 'r')!r})\n"
        f"run_scenario('scenarios/whisper_asr_encoder_budget.yaml', smoke=True, out_dir={str(tmp_path / 's')!r})\n"
        "print(sorted(m for m in ('torch', 'triton', 'ray', 'gguf') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("given", [{}, {"OPENBLAS_NUM_THREADS": "4"}, {"OMP_NUM_THREADS": "2"}, {"GOTO_NUM_THREADS": "3"}])
def test_the_cli_caps_blas_threads_unless_the_user_chose(given, monkeypatch):
    from servesim import cli

    for name in cli.BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    cli.cap_blas_threads()
    import os

    assert os.environ.get("OPENBLAS_NUM_THREADS") == given.get("OPENBLAS_NUM_THREADS", None if given else "1")
    for name, value in given.items():
        assert os.environ[name] == value


def test_a_replay_process_runs_one_blas_thread():
    """Set before numpy is imported: OpenBLAS reads it once, when numpy loads it (then no thread
    but the main one, where /proc lists them)."""
    probe = ("import json, os, sys\nsys.argv = ['servesim', '--help']\nfrom servesim.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\nimport numpy\n"
             "threads = len(os.listdir('/proc/self/task')) if os.path.isdir('/proc/self/task') else 1\n"
             "print('@@' + os.environ.get('OPENBLAS_NUM_THREADS', '') + ' ' + str(threads))")
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.rpartition("@@")[2].split() == ["1", "1"]


@pytest.mark.parametrize("given", [None, "1", "0"])
def test_a_replay_process_asks_for_no_huge_pages_unless_the_user_chose(given):
    """cli.no_huge_page_faults: set before numpy is imported (numpy reads it once, at import)."""
    probe = ("import sys\nsys.argv = ['servesim', '--help']\nfrom servesim.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\nimport numpy\n"
             "print('@@' + str(numpy._core.multiarray._get_madvise_hugepage()))")
    import os

    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if given is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = given
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.rpartition("@@")[2].strip() == str(given == "1")
