"""servesim: a discrete-event simulator of LLM serving engines.

The repository keeps scheduler/, simulator/, gpu_runner/ and traces/ beside this folder (the design
card's layout); installed, they are servesim.scheduler, servesim.simulator, ... (setup.py maps them).

From a source checkout that is not the installed one (a git worktree, or `PYTHONPATH=.` in a venv
without servesim, such as the vLLM-oracle venv), the installed mapping would point at another
checkout's folders, or at nothing. So when this package sits in a checkout, a finder placed first on
sys.meta_path resolves servesim.<folder> to *this* checkout's folder. Deeper modules then follow
from the subpackage's __path__ as usual. Installed from a wheel the folders are real subpackages
and no finder is added.

The compiled scheduler: when `make` has built scheduler/ with mypyc (servesim/_native.py: a
staging tree, its MANIFEST matching the current sources), servesim.scheduler is imported from that
tree instead; SERVESIM_PURE_PYTHON=1 selects the pure-Python folder, and a stale build is never
used (one warning line says so). The compiled engine (build/mypyc_sim/, tools/compile_simulator.py)
is linked to the scheduler compiled with it and carries its staging tree: while current, the
scheduler is imported from there and the engine's folder (extension modules only) goes ahead of
simulator/ on servesim.simulator's search path; else the scheduler-only build (build/mypyc/).
The choice is made once per process, for both (_native.select_builds).

This module imports nothing heavy: `import servesim.scheduler` must stay stdlib-only.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from servesim import _native
from servesim._layout import MAPPED_FOLDERS

_CHECKOUT = Path(__file__).resolve().parent.parent


class _CheckoutFinder(MetaPathFinder):
    """Finds servesim.<folder> for the MAPPED_FOLDERS in the checkout this package lives in."""

    def __init__(self, root: Path) -> None:
        self._root = str(root)
        self._builds: _native.Selection | None = None

    def _selection(self) -> _native.Selection:
        """Both packages' builds, decided at the first import of either (one build's engine is
        never loaded beside another build's scheduler)."""
        if self._builds is None:
            sel = self._builds = _native.select_builds(Path(self._root))
            _native.decision = ("compiled (mypyc)" if sel.scheduler else "pure Python", sel.scheduler_reason)
            _native.sim_decision = ("compiled (mypyc)" if sel.simulator else "pure Python", sel.simulator_reason)
        return self._builds

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        parent, _, child = fullname.rpartition(".")
        if parent != __name__:
            # A deeper module of a mapped folder follows its parent's __path__ here, before an
            # editable install's finder (later on sys.meta_path) maps the name to its own checkout
            # (a subpackage that exists in both would otherwise come from the other checkout).
            top = fullname.split(".")
            if len(top) > 2 and top[0] == __name__ and top[1] in MAPPED_FOLDERS and path is not None:
                spec = PathFinder.find_spec(fullname, path)
                if spec is None:  # not in this checkout: not another checkout's either
                    raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
                return spec
            return None
        if child not in MAPPED_FOLDERS:
            return None
        # FileFinder looks up the last name component, so this is root/<folder> under the
        # servesim name (module identity is by name: the top-level `scheduler` is never imported).
        if child == "scheduler":
            return self._scheduler_spec(fullname)
        spec = PathFinder.find_spec(fullname, [self._root])
        if child == "simulator" and spec is not None and spec.submodule_search_locations is not None:
            self._add_compiled_engine(spec.submodule_search_locations)
        return spec

    def _add_compiled_engine(self, search: list[str]) -> None:
        """The compiled engine's folder (extension modules only) ahead of simulator/ itself."""
        sel = self._selection()
        folder, reason = sel.simulator, sel.simulator_reason
        if folder is None:
            if reason.startswith("stale"):
                print(f"servesim: warning: using the pure-Python engine: {reason}", file=sys.stderr)
            return
        search.insert(0, str(folder))

    def _scheduler_spec(self, fullname: str) -> ModuleSpec | None:
        sel = self._selection()
        package, reason = sel.scheduler, sel.scheduler_reason
        if package is None:
            if reason.startswith("stale"):
                # One line on stderr (a warnings.warn would add a second, the source line).
                print(f"servesim: warning: using the pure-Python scheduler: {reason}", file=sys.stderr)
            return PathFinder.find_spec(fullname, [self._root])
        # The staging tree holds servesim/scheduler/ (extension modules beside .py copies; the
        # extension wins in FileFinder's order), so submodules follow its __path__ as usual.
        return PathFinder.find_spec(fullname, [str(package.parent)])

    def __repr__(self) -> str:
        return f"<servesim checkout finder {self._root}>"


def _in_checkout() -> bool:
    return (_CHECKOUT / "pyproject.toml").is_file() and all(
        (_CHECKOUT / folder / "__init__.py").is_file() for folder in MAPPED_FOLDERS)


if _in_checkout() and not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _CheckoutFinder(_CHECKOUT))
