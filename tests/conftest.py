"""Session-wide guard: nothing imports a repository folder under its bare name.

The folders are installed as servesim.scheduler, servesim.simulator, ... (setup.py). Importing one
also as top-level `scheduler` (possible from the repository root, which is on sys.path under
`python -m pytest`) would load a second copy of every module — two registries, two Request classes —
and tests would pass or fail for the wrong reason. So a run that did it fails, naming the modules.

Under pytest-xdist (`make test` runs workers) the tests import in the workers, not in the
controller: each worker hands its list to the controller in `workeroutput` (xdist's documented
channel; a worker's own exit status does not reach the controller's), and the controller fails the
run.
"""

from __future__ import annotations

import sys

import pytest

_BARE = ("scheduler", "simulator", "gpu_runner", "traces")
_FROM_WORKERS = pytest.StashKey[list[str]]()


def _shadows() -> list[str]:
    return sorted(m for m in sys.modules if m.split(".")[0] in _BARE)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown (and never called) without xdist
def pytest_testnodedown(node, error):
    found = node.config.stash.setdefault(_FROM_WORKERS, [])
    found.extend(node.workeroutput.get("bare_modules", ()))


def pytest_sessionfinish(session, exitstatus):
    # xdist sets `workeroutput` on a worker's config only: there, report to the controller.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["bare_modules"] = _shadows()
        return
    shadows = sorted(set(_shadows()) | set(session.config.stash.get(_FROM_WORKERS, [])))
    if shadows:
        print(f"\nerror: modules imported under a bare folder name (use servesim.<folder>): {shadows[:10]}",
              file=sys.stderr)
        session.exitstatus = 1
