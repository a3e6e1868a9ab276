"""Which build of simulator/kernels.py runs: the mypyc one, or the module itself (the reference).

`make` (tools/compile_kernels.py) compiles a copy of kernels.py into build/mypyc_kernels/ and
writes a MANIFEST naming the source's sha256 and the interpreter's extension suffix. The build
is loaded only when both match this checkout and interpreter and SERVESIM_PURE_PYTHON is not set
(the switch the compiled scheduler obeys too); anything else runs kernels.py as it is, so an
edited kernels.py is never shadowed by an old build. Installed from a wheel there is no build.

The compiled module is loaded from its file under a private name that is on no import path.
"""

from __future__ import annotations

import hashlib
import os
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType

from servesim.simulator import kernels

# The compiled scheduler's switch too (servesim/_native.py, which the simulator may not import: it
# sits below the servesim front package; tests/test_kernels.py checks the two names agree).
PURE_ENV = "SERVESIM_PURE_PYTHON"
BUILD_DIR = Path("build") / "mypyc_kernels"  # relative to the checkout root
MODULE = "_servesim_simulator_kernels"  # the compiled module's name (its PyInit_ symbol)
MANIFEST = "MANIFEST"


def source_digest(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def read_manifest(build: Path) -> dict[str, str]:
    """key=value lines; {} when there is no finished build (the MANIFEST is written last)."""
    try:
        text = (build / MANIFEST).read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def compiled_path(root: Path) -> Path:
    return root / BUILD_DIR / (MODULE + EXTENSION_SUFFIXES[0])


def find_build(root: Path, source: Path) -> tuple[Path | None, str]:
    """The compiled module's file to load, or None, and why."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None, f"{PURE_ENV} is set"
    manifest = read_manifest(root / BUILD_DIR)
    if not manifest:
        return None, "no compiled build (run make)"
    if manifest.get("ext_suffix") != EXTENSION_SUFFIXES[0]:
        return None, "stale compiled build: built for another Python (run make)"
    if manifest.get("source") != source_digest(source):
        return None, "stale compiled build: simulator/kernels.py changed since it was built (run make)"
    path = compiled_path(root)
    if not path.is_file():
        return None, "no compiled build (run make)"
    return path, "compiled (mypyc)"


def _load(path: Path) -> ModuleType:
    loader = ExtensionFileLoader(MODULE, str(path))
    module = module_from_spec(spec_from_loader(MODULE, loader))
    loader.exec_module(module)
    return module


def _select() -> tuple[ModuleType, str]:
    source = Path(kernels.__file__)
    path, reason = find_build(source.resolve().parent.parent, source)
    if path is None:
        return kernels, f"pure Python ({reason})"
    try:
        return _load(path), reason
    except ImportError as e:  # a build this interpreter cannot load: the reference runs
        return kernels, f"pure Python (compiled build unusable: {e})"


_impl, mode = _select()  # mode: one line for `servesim --version` and tests
step_timeline = _impl.step_timeline
decode_step_prices = _impl.decode_step_prices
DenseRooflinePricer = _impl.DenseRooflinePricer
