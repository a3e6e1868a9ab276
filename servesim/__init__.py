"""servesim: a discrete-event simulator of LLM serving engines.

The repository keeps scheduler/, simulator/, gpu_runner/ and traces/ beside this folder (the design
card's layout); installed, they are servesim.scheduler, servesim.simulator, ... (setup.py maps them).

From a source checkout that is not the installed one (a git worktree, or `PYTHONPATH=.` in a venv
without servesim, such as the vLLM-oracle venv), the installed mapping would point at another
checkout's folders, or at nothing. So when this package sits in a checkout, a finder placed first on
sys.meta_path resolves servesim.<folder> to *this* checkout's folder. Deeper modules then follow
from the subpackage's __path__ as usual. Installed from a wheel the folders are real subpackages
and no checkout finder is added.

The compiled build (servesim/_native.py decides; tools/build_native.py makes it): in a checkout,
while build/native/'s MANIFEST matches the sources, each compiled folder's build directory
(extension modules only) is searched ahead of the folder itself, for the folder and each of its
subpackages; SERVESIM_PURE_PYTHON=1, no build or a stale one (one warning line) mean the folders
alone. The choice is made once per process, for every folder together (the libraries are linked).
Installed from a wheel built with a compiler, the extension modules sit beside the .py files; with
SERVESIM_PURE_PYTHON=1 a finder loads servesim's modules from the .py files instead.

This module imports nothing heavy: `import servesim.scheduler` must stay stdlib-only.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import SOURCE_SUFFIXES, FileFinder, ModuleSpec, PathFinder, SourceFileLoader
from pathlib import Path

from servesim import _native
from servesim._layout import DATA_FOLDERS, MAPPED_FOLDERS

_CHECKOUT = Path(__file__).resolve().parent.parent


class _CheckoutFinder(MetaPathFinder):
    """Finds servesim.<folder> for the MAPPED_FOLDERS in the checkout this package lives in, and,
    while the compiled build is in use, each compiled folder's subpackages (build directory first)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._build: _native.Selection | None = None

    def _selection(self) -> _native.Selection:
        """The build, decided at the first import of a folder, for all of them."""
        if self._build is None:
            sel = self._build = _native.select_build(self._root)
            _native.pure_reason = sel.reason
            if sel.stale:  # one line on stderr (a warnings.warn would add a second, the source line)
                print(f"servesim: warning: using the pure-Python modules: {sel.reason}", file=sys.stderr)
        return self._build

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        parts = fullname.split(".")
        if parts[0] != __name__ or len(parts) < 2 or (parts[1] not in MAPPED_FOLDERS and parts[1] not in DATA_FOLDERS):
            return None
        if len(parts) == 2:
            # FileFinder looks up the last name component, so this is root/<folder> under the
            # servesim name (module identity is by name: the top-level `scheduler` is never imported).
            spec = PathFinder.find_spec(fullname, [str(self._root)])
        else:
            if path is None:
                return None
            # A deeper module follows its parent's __path__ here, before an editable install's
            # finder (later on sys.meta_path) could map the name to its own checkout: a subpackage
            # that exists in both would otherwise come from the other checkout.
            spec = PathFinder.find_spec(fullname, path)
            if spec is None:  # not in this checkout: not another checkout's either
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        if spec is not None and spec.submodule_search_locations is not None:
            self._compiled_first(parts[1:], spec.submodule_search_locations)
        return spec

    def _compiled_first(self, parts: list[str], search: list[str]) -> None:
        """A compiled folder's package searches its build directory first, then its own folder (a
        compiled module is found as the extension; the rest, data included, in the folder)."""
        sel = self._selection()
        if parts[0] not in sel.folders:
            return
        compiled, own = sel.root.joinpath(*parts), self._root.joinpath(*parts)
        search[:] = [str(d) for d in (compiled, own) if d.is_dir()]

    def __repr__(self) -> str:
        return f"<servesim checkout finder {self._root}>"


class _SourceFinder(MetaPathFinder):
    """An installed servesim under SERVESIM_PURE_PYTHON: its modules from their .py files, never
    from the compiled extension modules beside them (the wheel's)."""

    def __init__(self) -> None:
        self._finders: dict[str, FileFinder] = {}

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        if not fullname.startswith(__name__ + ".") or path is None:
            return None
        for entry in path:
            finder = self._finders.get(entry)
            if finder is None:
                finder = self._finders[entry] = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES))
            spec = finder.find_spec(fullname)
            if spec is not None and spec.loader is not None:
                return spec
        return None

    def __repr__(self) -> str:
        return "<servesim pure-Python finder>"


def _in_checkout() -> bool:
    return (_CHECKOUT / "pyproject.toml").is_file() and all(
        (_CHECKOUT / folder / "__init__.py").is_file() for folder in MAPPED_FOLDERS)


if _in_checkout():
    if not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder(_CHECKOUT))
elif _native.pure_requested():
    _native.pure_reason = f"{_native.PURE_ENV} is set"
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())
