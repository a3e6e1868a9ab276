"""Which build of servesim's compiled modules a process runs: the one selector, and what it reports.

The compiled build (tools/build_native.py) compiles listed modules of scheduler/ and simulator/ with
mypyc, linked in one compilation. Two places hold one:
- a checkout: build/native/servesim/<folder>/ holds the extension modules alone, and its MANIFEST
  names the compiled folders, a digest of each folder's sources and the interpreter's extension
  suffix. select_build() takes it only whole and only while all of these match the checkout and
  SERVESIM_PURE_PYTHON is not set; servesim/__init__.py's checkout finder then searches each
  compiled folder's build directory ahead of the folder (a compiled module is the extension, every
  other module the folder's .py). No build: pure Python, silently; a stale one: pure Python, and the
  finder prints one warning line. A build is never used in part: its libraries are linked together.
- an installed wheel built with a compiler: each extension module sits beside its .py file and
  Python's import system takes the extension. With SERVESIM_PURE_PYTHON set, servesim/__init__.py
  puts a finder first that loads servesim's modules from their .py files (the pure-Python
  reference, as in a checkout).

The kernels (simulator/kernels.py) are one of the engine's compiled modules: simulator/kernel_impl.py
imports whichever the import system finds, so they follow this same selection.

What runs is read from the modules themselves (their spec's origin: an extension or a .py file), so
the report cannot disagree with it; the reason for pure Python comes from the selection.

Stdlib only and cheap (read by servesim/__init__.py on the first import of a servesim folder).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import find_spec
from pathlib import Path

PURE_ENV = "SERVESIM_PURE_PYTHON"
BUILD = Path("build") / "native"  # relative to the checkout root (tools/build_native.py writes it)
MANIFEST = "MANIFEST"  # in BUILD; written last by the build
COMPILED = "compiled (mypyc)"

# Why pure Python, when it is: the checkout finder's selection, or the installed package's state
# (servesim/__init__.py sets it before any servesim folder is imported).
pure_reason: str = "installed from a pure-Python wheel"


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


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


def read_manifest(build: Path) -> dict[str, str]:
    """key=value lines; {} when there is no finished build."""
    try:
        text = (build / MANIFEST).read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@dataclass(frozen=True, slots=True)
class Selection:
    """A checkout's compiled build, used whole or not at all."""

    root: Path | None  # build/native/servesim: holds <folder>/ for each compiled folder; None: pure Python
    folders: tuple[str, ...]  # the compiled folders (scheduler, simulator)
    reason: str  # COMPILED, or why pure Python

    @property
    def stale(self) -> bool:
        return self.reason.startswith("stale")


def select_build(checkout: Path) -> Selection:
    """The checkout's build if its MANIFEST matches every compiled folder's sources and this
    interpreter, and SERVESIM_PURE_PYTHON is not set; decided once per process by the checkout
    finder (a build published meanwhile is never mixed with the one in use)."""
    if pure_requested():
        return Selection(None, (), f"{PURE_ENV} is set")
    build = checkout / BUILD
    manifest = read_manifest(build)
    folders = tuple(filter(None, manifest.get("packages", "").split(",")))
    if not folders:
        return Selection(None, (), "no compiled build (run make)")
    if manifest.get("ext_suffix") != EXTENSION_SUFFIXES[0]:
        return Selection(None, (), f"stale compiled build: built for {manifest.get('ext_suffix')}, "
                                   "not this Python (run make)")
    for folder in folders:
        if manifest.get(f"{folder}_sources") != sources_digest(checkout / folder):
            return Selection(None, (), f"stale compiled build: {folder}/ changed since it was built (run make)")
    return Selection(build / "servesim", folders, COMPILED)


def module_mode(name: str) -> str:
    """One line: whether the module `name` runs compiled, read from the module the import system
    finds (its parent packages are imported, the module itself is not)."""
    spec = find_spec(name)
    origin = spec.origin if spec is not None and spec.origin else ""
    if origin.endswith(tuple(EXTENSION_SUFFIXES)):
        return COMPILED
    return f"pure Python ({pure_reason})"


def scheduler_mode() -> str:
    """Which scheduler build this process runs, e.g. for `servesim --version`."""
    return module_mode("servesim.scheduler.scheduler")


def simulator_mode() -> str:
    """Which engine build this process runs (without importing the engine's third-party packages)."""
    return module_mode("servesim.simulator.engine")


def kernels_mode() -> str:
    """Which build of the simulator's numeric kernels this process runs."""
    return module_mode("servesim.simulator.kernels")
