"""Where the compiled scheduler lives in a checkout, and whether it may be used.

`make` (tools/compile_scheduler.py) compiles scheduler/ with mypyc into a staging tree,
build/mypyc/servesim/scheduler/: a copy of every scheduler/*.py plus the extension modules, so
module names come out as servesim.scheduler.* (mypyc names modules by path). The staging tree is
used in place of scheduler/ only when its MANIFEST says it was built from exactly the sources the
checkout holds now (a content hash of scheduler/**/*.py) for this interpreter's extension suffix,
and SERVESIM_PURE_PYTHON is not set. Anything else means the pure-Python folder: the reference.

The compiled engine (tools/compile_simulator.py, build/mypyc_sim/) is linked to the scheduler it
was compiled with and carries that scheduler's staging tree: while it is current (simulator/'s and
scheduler/'s sources both match), both packages come from it (select_builds), so the two libraries
always come from one build; otherwise the scheduler-only build (build/mypyc/) if current, and the
pure-Python engine.

Stdlib only and cheap (read by servesim/__init__.py on every import of servesim.scheduler).
"""

from __future__ import annotations

import hashlib
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import NamedTuple

PURE_ENV = "SERVESIM_PURE_PYTHON"
STAGING = Path("build") / "mypyc"  # relative to the checkout root
MANIFEST = "MANIFEST"  # in STAGING; written last by the build, removed first
PACKAGE = Path("servesim") / "scheduler"  # the package inside STAGING
# The compiled engine (tools/compile_simulator.py): only its extension modules, in a folder put
# ahead of simulator/ on servesim.simulator's search path (every other module is the folder's own).
SIM_STAGING = Path("build") / "mypyc_sim"
SIM_PACKAGE = Path("servesim") / "simulator"

# What the checkout finder decided, for `servesim --version` and tests: (mode, reason).
decision: tuple[str, str] = ("pure Python", "not a checkout (installed wheel)")
sim_decision: tuple[str, str] = ("pure Python", "not a checkout (installed wheel)")


def source_files(folder: Path) -> list[Path]:
    """Every .py file under folder, in a fixed order (the digest depends on it)."""
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def sources_digest(folder: Path) -> str:
    """sha256 over the relative path and bytes of each .py file: a new, removed or edited file changes it."""
    h = hashlib.sha256()
    for path in source_files(folder):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def read_manifest(staging: Path) -> dict[str, str]:
    """key=value lines; {} when there is no finished build."""
    try:
        text = (staging / MANIFEST).read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def compiled_package(checkout: Path) -> tuple[Path | None, str]:
    """The staging package folder to import servesim.scheduler from, or None, and why.

    A build that exists but does not match the sources is never used (the reason says so and the
    caller warns); a missing build is the normal state of a fresh clone and needs no warning.
    """
    return _compiled(checkout, STAGING, "scheduler", PACKAGE)


def compiled_simulator(checkout: Path) -> tuple[Path | None, str]:
    """The folder of the compiled engine's extension modules to search before simulator/, or None,
    and why (as compiled_package: a stale build is never used; it is stale when scheduler/ changed
    too, since it is linked to the scheduler built with it)."""
    return _compiled(checkout, SIM_STAGING, "simulator", SIM_PACKAGE, linked="scheduler")


class Selection(NamedTuple):
    """Which builds a process imports: a folder (or None: pure Python) and why, for each package."""

    scheduler: Path | None  # the staging package to import servesim.scheduler from
    scheduler_reason: str
    simulator: Path | None  # the engine's extension modules, searched before simulator/
    simulator_reason: str


def select_builds(checkout: Path) -> Selection:
    """The engine build (and the scheduler staged in it) while current, else the scheduler-only
    build if current and the pure-Python engine: decided once per process (the checkout finder
    keeps it), so a build published meanwhile never pairs one build's engine with another's
    scheduler."""
    engine, reason = compiled_simulator(checkout)
    if engine is not None:
        return Selection(checkout / SIM_STAGING / PACKAGE, reason, engine, reason)
    scheduler, scheduler_reason = compiled_package(checkout)
    return Selection(scheduler, scheduler_reason, None, reason)


def _compiled(checkout: Path, staging_rel: Path, folder: str, package: Path,
              linked: str | None = None) -> tuple[Path | None, str]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None, f"{PURE_ENV} is set"
    staging = checkout / staging_rel
    manifest = read_manifest(staging)
    if not manifest:
        return None, "no compiled build (run make)"
    if manifest.get("ext_suffix") != EXTENSION_SUFFIXES[0]:
        return None, f"stale compiled build: built for {manifest.get('ext_suffix')}, not this Python (run make)"
    if manifest.get("sources") != sources_digest(checkout / folder):
        return None, f"stale compiled build: {folder}/ changed since it was built (run make)"
    if linked is not None and manifest.get(f"{linked}_sources") != sources_digest(checkout / linked):
        return None, f"stale compiled build: {linked}/ changed since the {folder} was built with it (run make)"
    return staging / package, "compiled (mypyc)"


def scheduler_mode() -> str:
    """One line: which scheduler build this process runs, e.g. for `servesim --version`.

    Asks the loaded module itself, so it cannot disagree with what actually runs.
    """
    from servesim.scheduler import scheduler as module  # noqa: PLC0415 (stdlib-only either way)

    if any(str(module.__file__).endswith(suffix) for suffix in EXTENSION_SUFFIXES):
        return "compiled (mypyc)"
    mode, reason = decision
    return f"pure Python ({reason})" if mode == "pure Python" else "pure Python"


def simulator_mode() -> str:
    """One line: which engine build this process runs (the checkout finder's decision; reading
    the engine itself would import its third-party packages, which --version must not)."""
    import servesim.simulator  # noqa: F401, PLC0415 (the finder decides as it imports the package)

    mode, reason = sim_decision
    return mode if mode == "compiled (mypyc)" else f"pure Python ({reason})"


def publish_build(fresh: Path, live: Path, fields: dict[str, str]) -> None:
    """Finish a mypyc build (tools/compile_scheduler.py, tools/compile_kernels.py): write its
    MANIFEST last (`fields`, this interpreter's extension suffix, the mypy version), then put the
    folder `fresh` in the place of `live`: a reader finds the old build or the new one, never half
    of one, and a build without a MANIFEST is never used."""
    import shutil  # noqa: PLC0415 (only builds need these; this module is read on every import)

    import mypy.version  # noqa: PLC0415

    fields = {**fields, "ext_suffix": EXTENSION_SUFFIXES[0], "mypy": mypy.version.__version__}
    (fresh / MANIFEST).write_text("".join(f"{key}={value}\n" for key, value in fields.items()))
    old = live.with_name(live.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if live.exists():
        live.rename(old)
    fresh.rename(live)
    shutil.rmtree(old, ignore_errors=True)
