"""The notebooks run top to bottom on the venv's kernel from a copy outside the repository (they
find the shipped scenarios and the shared data through servesim.api, not the working folder), with
`jupyter nbconvert --execute` too, and are stored without outputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "servesim-test-venv"
pytestmark = pytest.mark.slow  # each notebook runs in a kernel: 10-20 s apiece


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    """A kernelspec for this very interpreter, found first through JUPYTER_PATH: works in a fresh
    venv (ipykernel installed, nothing registered) and never writes into the venv or ~/.local."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    base = tmp_path_factory.mktemp("jupyter")
    spec = base / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "servesim (test venv)", "language": "python"}))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", os.pathsep.join([str(base), os.environ.get("JUPYTER_PATH", "")]).rstrip(os.pathsep))
    mp.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    from jupyter_client.kernelspec import KernelSpecManager

    assert KernelSpecManager().get_kernel_spec(KERNEL).argv[0] == sys.executable
    yield KERNEL
    mp.undo()


def test_there_are_at_least_three_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear outputs before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, kernel_name, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    elsewhere = tmp_path / "elsewhere"  # a copy outside the repository, run where it lies
    elsewhere.mkdir()
    book = nbformat.read(shutil.copy(path, elsewhere), as_version=4)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary folders land here
    NotebookClient(book, timeout=180, kernel_name=kernel_name,
                   resources={"metadata": {"path": str(elsewhere)}}).execute()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("servesim")]
    assert not left, f"{path.name} left temporary folders behind: {left}"
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_jupyter_nbconvert_executes_a_notebook_copied_anywhere(kernel_name, tmp_path):
    """The command a user types: `jupyter nbconvert --to notebook --execute` on a copy elsewhere."""
    jupyter = Path(sys.executable).with_name("jupyter")
    if not jupyter.exists():
        pytest.skip("jupyter is not installed in this venv")
    copy = Path(shutil.copy(ROOT / "notebooks" / "04_hybrid_and_multimodal.ipynb", tmp_path))
    out = subprocess.run([str(jupyter), "nbconvert", "--to", "notebook", "--execute",
                          f"--ExecutePreprocessor.kernel_name={kernel_name}",
                          "--output", "ran.ipynb", copy.name], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ran = nbformat.read(tmp_path / "ran.ipynb", as_version=4)
    outputs = [o for c in ran.cells if c.cell_type == "code" for o in c.outputs]
    assert outputs and not [o for o in outputs if o.output_type == "error"]
