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
    heavy = _loaded(args) & set(HEAVY)
    assert not heavy, f"`servesim {' '.join(args)}` imported {sorted(heavy)}; import them inside the function"


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
