"""Compile the simulator's engine, linked to the scheduler, with mypyc into build/mypyc_sim/ (run by
`make`; `--force` rebuilds).

What is compiled: the engine and its mixins (the loop, stepping bookkeeping, macro-steps, runs
through finishes, deferred runs) -- the interpreted code around every scheduler call, a third of
the Azure hour's time -- and what the engine calls at every step: the step table, the request
records (request_records.py; metrics.py's post-run code subclasses it, interpreted) and the
simulated executor (~5 % of the hour's instructions when interpreted). Everything else in
simulator/ stays interpreted (the cost models, the clients, what is built after the run). A
compiled instance refuses a patched method: tests wrap the executor, or swap its cost model.

Why linked: the engine reads the scheduler's outputs and requests at every step. Compiled on its
own, every such attribute and call went through Python's protocol (a type lookup and a boxed
value: ~5 % of the Azure hour's instructions); compiled with the scheduler in one mypyc
compilation, as two libraries (compile_scheduler.compile_groups), they are struct reads and C calls.

How: scheduler/, simulator/ and traces/ are copied to a staging tree (mypy reads the types of
whatever the engine imports; follow_imports=silent checks only the compiled modules), the engine
modules and the scheduler's compiled modules are marked as tools/compile_scheduler.py marks them
(interpreted subclasses allowed, dataclass __init__s written out, `self: Engine` mixin methods
accepted) and compiled. Published to build/mypyc_sim/: servesim/simulator/ holds the engine's
extension modules alone, servesim/scheduler/ a whole scheduler staging tree (its compiled modules
from this build, as compile_scheduler.py lays one out). While the MANIFEST matches both
simulator/'s and scheduler/'s sources, servesim/__init__.py's checkout finder imports the
scheduler from that tree and puts the engine's folder ahead of simulator/ (every other module is
the folder's own): the two libraries always come from one build. SERVESIM_PURE_PYTHON=1, a stale
or missing build select the pure-Python engine (the reference: tests/test_compiled.py compares
the two), with the scheduler-only build (build/mypyc/) if that one is current.

Exit status 0 when the build is up to date or was built; 1 when mypyc or the C compiler failed
(the Makefile then goes on with the pure-Python engine and says so).
"""

from __future__ import annotations

import compileall
import shutil
import sys
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile_scheduler import COMPILED as SCHEDULER_COMPILED  # noqa: E402
from compile_scheduler import GROUP as SCHEDULER_GROUP  # noqa: E402
from compile_scheduler import (compile_groups, mark_subclassable, native_dataclass_inits, run_build,  # noqa: E402
                               tool_digest)

from servesim import _native  # noqa: E402  (after the path insert: run as a script)

# The engine (the reference core's owned objects) and the fast path (simulator/fastpath/), paths under simulator/.
COMPILED = ("step_table.py", "request_records.py", "executor.py", "request_factory.py", "step_book.py", "watchdog.py", "deadlines.py",
            "engine.py", "fastpath/timeline.py", "fastpath/through.py", "fastpath/runs.py", "fastpath/deferred.py",
            "fastpath/planner.py")
GROUP = "servesim.simulator._native"
_FOLDERS = ("scheduler", "simulator", "traces")  # what the engine's imports reach, for mypy


def stage(src: Path) -> dict[str, str]:
    """The staging tree: a servesim package of the folders mypy reads, the compiled modules marked;
    the copied sources' digests (simulator/'s, scheduler/'s), taken before marking."""
    if src.exists():
        shutil.rmtree(src)
    for folder in _FOLDERS:  # scheduler/ whole: its copy is published as the scheduler's package
        skip = ("__pycache__", "*.pyc") if folder == "scheduler" else ("__pycache__", "*.pyc", "data")
        shutil.copytree(ROOT / folder, src / "servesim" / folder, ignore=shutil.ignore_patterns(*skip))
    (src / "servesim" / "__init__.py").write_text("")  # only so mypy names the modules servesim.*
    # simulator/'s own digest (the copy leaves its data folders out); scheduler/'s of the copy,
    # which is published whole (compile_scheduler.stage's rule)
    digests = {"sources": _native.sources_digest(ROOT / "simulator"),
               "scheduler_sources": _native.sources_digest(src / _native.PACKAGE)}
    marked = [_native.SIM_PACKAGE / rel for rel in COMPILED] + [_native.PACKAGE / rel for rel in SCHEDULER_COMPILED]
    for rel in marked:
        path = src / rel
        path.write_text(mark_subclassable(native_dataclass_inits(path.read_text())))
    return digests


def build(src: Path, jobs: int) -> None:
    compile_groups(src, [([str(_native.PACKAGE / rel) for rel in SCHEDULER_COMPILED], SCHEDULER_GROUP),
                         ([str(_native.SIM_PACKAGE / rel) for rel in COMPILED], GROUP)],
                   "servesim-simulator-native", jobs)


def main() -> int:
    return run_build(ROOT / _native.SIM_STAGING, "mypyc_sim.lock", _build_if_stale)


def _build_if_stale(live: Path, force: bool, jobs: int) -> int:
    manifest = _native.read_manifest(live)
    tool = tool_digest(Path(__file__))
    if (not force and manifest.get("sources") == _native.sources_digest(ROOT / "simulator")
            and manifest.get("scheduler_sources") == _native.sources_digest(ROOT / "scheduler")
            and manifest.get("ext_suffix") == EXTENSION_SUFFIXES[0] and manifest.get("tool") == tool):
        print("compiled engine: up to date")
        return 0
    started = time.monotonic()
    print(f"compiling the engine with mypyc ({len(COMPILED)} modules, {jobs} jobs) ...", flush=True)
    work = live.with_name(live.name + ".work")  # the staging tree and the C sources
    fresh = live.with_name(live.name + ".new")  # what is published: the extension modules alone
    digests = stage(work / "src")
    try:
        build(work / "src", jobs)
    except (Exception, SystemExit) as e:  # mypy errors surface as SystemExit from setup()
        print(f"compiled engine: build failed ({type(e).__name__}: {e}); C sources in {work}", file=sys.stderr)
        return 1
    if fresh.exists():
        shutil.rmtree(fresh)
    if not _publish_tree(work / "src", fresh, live):
        return 1
    _native.publish_build(fresh, live, {**digests, "tool": tool, "modules": ",".join(COMPILED)})
    shutil.rmtree(work, ignore_errors=True)
    print(f"compiled engine: built in {time.monotonic() - started:.0f} s ({live})")
    return 0


def _publish_tree(src: Path, fresh: Path, live: Path) -> bool:
    """Lay out `fresh` (to become `live`): the engine's extension modules alone, and the scheduler's
    staging tree whole (its .py copies, as marked, beside this build's extension modules, with
    bytecode written for their final place). False when a module did not build."""
    suffix = EXTENSION_SUFFIXES[0]
    package = fresh / _native.SIM_PACKAGE
    package.mkdir(parents=True)
    for built in (src / _native.SIM_PACKAGE).glob(f"*{suffix}"):
        shutil.copy2(built, package / built.name)
    # A subpackage with compiled modules is published whole (its .py files beside its extension
    # modules): the build's folder comes first on servesim.simulator's path, so the subpackage is
    # imported from there, every module of it.
    for sub in sorted({Path(rel).parent for rel in COMPILED} - {Path(".")}):
        shutil.copytree(src / _native.SIM_PACKAGE / sub, package / sub,
                        ignore=shutil.ignore_patterns("__pycache__", "*.c", "*.o", "build"))
        compileall.compile_dir(str(package / sub), ddir=str(live / _native.SIM_PACKAGE / sub), quiet=1, workers=1)
    shutil.copytree(src / _native.PACKAGE, fresh / _native.PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(str(fresh / _native.PACKAGE), ddir=str(live / _native.PACKAGE), quiet=1, workers=1)
    for folder, names in ((_native.SIM_PACKAGE, COMPILED), (_native.PACKAGE, SCHEDULER_COMPILED)):
        expected = {str(Path(rel).with_suffix("")) for rel in names} | {"_native__mypyc"}
        found = {str(p.relative_to(fresh / folder)).removesuffix(suffix) for p in (fresh / folder).rglob(f"*{suffix}")}
        if found != expected:
            print(f"compiled engine: build incomplete in {folder} (built {sorted(found)}, expected {sorted(expected)})",
                  file=sys.stderr)
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
