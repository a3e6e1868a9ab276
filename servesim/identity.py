"""A run's identity: what produced a result folder (run.json), so it can be reproduced and compared.

    servesim: version, the git commit of the source tree (and whether it had local changes),
              the builds in use (compiled or pure Python, per layer)
    command:  the command line (or "python API" with the entry point)
    inputs:   every input file with its size and sha256
    seed, python, platform

The run's settings are config.yaml beside it: SimConfig as resolved (the KV pool's derived size
written as the number it came to) and the `workload:` section that rebuilt the workload, so
`servesim run RUN/config.yaml` replays the same requests with the same settings.
"""

from __future__ import annotations

import hashlib
import platform
import shlex
import subprocess
import sys
from pathlib import Path

_SOURCE = Path(__file__).resolve().parent


def run_identity(seed: int, input_paths: list[str]) -> dict:
    from servesim._native import kernels_mode, scheduler_mode, simulator_mode
    from servesim.cli import _version

    commit, dirty = _git_commit()
    return {
        "servesim": {"version": _version(), "commit": commit, "local_changes": dirty,
                     "build": {"scheduler": scheduler_mode(), "simulator": simulator_mode(),
                               "kernels": kernels_mode()}},
        "command": _command(),
        "inputs": [_file_identity(p) for p in input_paths],
        "seed": seed,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _command() -> str:
    """The command line when the CLI's main() runs this process, else the Python entry point."""
    from servesim.cli import _whole_process

    if _whole_process:
        return shlex.join(["servesim", *sys.argv[1:]])
    argv0 = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return f"python API ({argv0 or 'interactive'})"


def _git_commit() -> tuple[str | None, bool | None]:
    """(commit, has local changes) of the checkout servesim runs from; (None, None) elsewhere."""
    try:
        head = subprocess.run(["git", "-C", str(_SOURCE), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(["git", "-C", str(_SOURCE), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def _file_identity(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        from servesim.traces.bundled import available_bundled_traces, bundled_trace_path

        if path not in available_bundled_traces():  # a file gone since
            return {"path": str(path), "sha256": None, "bytes": None}
        p = bundled_trace_path(path)
    digest = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return {"path": str(p.resolve()), "sha256": digest.hexdigest(), "bytes": p.stat().st_size}
