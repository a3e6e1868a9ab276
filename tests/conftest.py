"""Session-wide guard: nothing imports a repository folder under its bare name.

The folders are installed as servesim.scheduler, servesim.simulator, ... (setup.py). Importing one
also as top-level `scheduler` (possible from the repository root, which is on sys.path under
`python -m pytest`) would load a second copy of every module — two registries, two Request classes —
and tests would pass or fail for the wrong reason. So a run that did it fails, naming the modules.
"""

from __future__ import annotations

import sys

_BARE = ("scheduler", "simulator", "gpu_runner", "traces")


def pytest_sessionfinish(session, exitstatus):
    shadows = sorted(m for m in sys.modules if m.split(".")[0] in _BARE)
    if shadows:
        print(f"\nerror: modules imported under a bare folder name (use servesim.<folder>): {shadows[:10]}",
              file=sys.stderr)
        session.exitstatus = 1
