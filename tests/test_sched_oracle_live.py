"""Live parity: the whole feature matrix against the real vLLM 0.19.1 oracle (skipped without its venv).

`make parity` does the same on a random seed each time; this runs one fixed, unrecorded seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("VLLM_ORACLE_VENV", "/tmp/vllm-oracle-venv"))
ORACLE = Path(os.environ.get("VLLM_ORACLE_DIR", ROOT.parent / "shared" / "tools" / "vllm_oracle"))


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.skipif(not (VENV / "bin" / "python").exists() or not ORACLE.exists(), reason="no vLLM oracle venv")
def test_feature_matrix_matches_the_live_oracle():
    # Configs cycle through tools/parity.py's FEATURES (18): one config per feature.
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "parity.py"), "--seed", "31337", "--configs", "18"],
                         capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "(100.00 %)" in res.stdout
