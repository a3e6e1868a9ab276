"""Compile the simulator's engine with mypyc into build/mypyc_sim/ (run by `make`; `--force` rebuilds).

What is compiled: the engine and its mixins (the loop, stepping bookkeeping, macro-steps, runs
through finishes, deferred runs) -- the interpreted code around every scheduler call, a third of
the Azure hour's time -- and what the engine calls at every step: the step table, the request
records (request_records.py; metrics.py's post-run code subclasses it, interpreted) and the
simulated executor (~5 % of the hour's instructions when interpreted). Everything else in
simulator/ stays interpreted (the cost models, the clients, what is built after the run). A
compiled instance refuses a patched method: tests wrap the executor, or swap its cost model.

How: scheduler/, simulator/ and traces/ are copied to a staging tree (mypy reads the types of
whatever the engine imports; follow_imports=silent checks only the compiled modules), the engine
modules are marked as tools/compile_scheduler.py marks the scheduler's (interpreted subclasses
allowed, dataclass __init__s written out, `self: Engine` mixin methods accepted) and compiled into
one shared library. Only the extension modules are published, to build/mypyc_sim/servesim/simulator/:
servesim/__init__.py's checkout finder puts that folder ahead of simulator/ on the package's
search path while the MANIFEST matches simulator/'s sources, so the compiled engine is imported
and every other module is the folder's own. SERVESIM_PURE_PYTHON=1, a stale or missing build
select the pure-Python engine (the reference: tests/test_compiled.py compares the two).

Exit status 0 when the build is up to date or was built; 1 when mypyc or the C compiler failed
(the Makefile then goes on with the pure-Python engine and says so).
"""

from __future__ import annotations

import shutil
import sys
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile_scheduler import (compile_group, mark_subclassable, native_dataclass_inits, run_build,  # noqa: E402
                               tool_digest)

from servesim import _native  # noqa: E402  (after the path insert: run as a script)

COMPILED = ("step_table.py", "request_records.py", "executor.py", "engine_steps.py", "engine_rank.py", "finish_run.py", "deferred_run.py", "macro_step.py", "engine.py")
GROUP = "servesim.simulator._native"
_FOLDERS = ("scheduler", "simulator", "traces")  # what the engine's imports reach, for mypy


def stage(src: Path) -> None:
    """The staging tree: a servesim package of the folders mypy reads, the engine modules marked."""
    if src.exists():
        shutil.rmtree(src)
    for folder in _FOLDERS:
        shutil.copytree(ROOT / folder, src / "servesim" / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data"))
    (src / "servesim" / "__init__.py").write_text("")  # only so mypy names the modules servesim.*
    for rel in COMPILED:
        path = src / _native.SIM_PACKAGE / rel
        path.write_text(mark_subclassable(native_dataclass_inits(path.read_text())))


def build(src: Path, jobs: int) -> None:
    compile_group(src, [str(_native.SIM_PACKAGE / rel) for rel in COMPILED], GROUP, "servesim-simulator-native", jobs)


def main() -> int:
    return run_build(ROOT / _native.SIM_STAGING, "mypyc_sim.lock", _build_if_stale)


def _build_if_stale(live: Path, force: bool, jobs: int) -> int:
    manifest = _native.read_manifest(live)
    digest = _native.sources_digest(ROOT / "simulator")
    tool = tool_digest(Path(__file__))
    if (not force and manifest.get("sources") == digest and manifest.get("ext_suffix") == EXTENSION_SUFFIXES[0]
            and manifest.get("tool") == tool):
        print("compiled engine: up to date")
        return 0
    started = time.monotonic()
    print(f"compiling the engine with mypyc ({len(COMPILED)} modules, {jobs} jobs) ...", flush=True)
    work = live.with_name(live.name + ".work")  # the staging tree and the C sources
    fresh = live.with_name(live.name + ".new")  # what is published: the extension modules alone
    stage(work / "src")
    try:
        build(work / "src", jobs)
    except (Exception, SystemExit) as e:  # mypy errors surface as SystemExit from setup()
        print(f"compiled engine: build failed ({type(e).__name__}: {e}); C sources in {work}", file=sys.stderr)
        return 1
    if fresh.exists():
        shutil.rmtree(fresh)
    package = fresh / _native.SIM_PACKAGE
    package.mkdir(parents=True)
    suffix = EXTENSION_SUFFIXES[0]
    for built in (work / "src" / _native.SIM_PACKAGE).glob(f"*{suffix}"):
        shutil.copy2(built, package / built.name)
    expected = {Path(rel).stem for rel in COMPILED} | {"_native__mypyc"}
    found = {p.name.removesuffix(suffix) for p in package.iterdir()}
    if found != expected:
        print(f"compiled engine: build incomplete (built {sorted(found)}, expected {sorted(expected)})",
              file=sys.stderr)
        return 1
    _native.publish_build(fresh, live, {"sources": digest, "tool": tool, "modules": ",".join(COMPILED)})
    shutil.rmtree(work, ignore_errors=True)
    print(f"compiled engine: built in {time.monotonic() - started:.0f} s ({live})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
