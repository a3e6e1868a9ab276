"""The notebooks run top to bottom on the venv's kernel, and are stored without outputs."""

from __future__ import annotations

import json
import os
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

    book = nbformat.read(path, as_version=4)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary folders land here
    NotebookClient(book, timeout=180, kernel_name=kernel_name,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("servesim")]
    assert not left, f"{path.name} left temporary folders behind: {left}"
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
