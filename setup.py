"""Package layout and the compiled build of the wheel.

Layout: the repository's top-level folders installed under the one import name `servesim`.
scheduler/, simulator/, gpu_runner/ and traces/ stay where the design card puts them; the wheel
(and an editable install) exposes them as servesim.scheduler, servesim.simulator, ... so servesim
never shadows the PyPI packages called `scheduler`, `simulator` or `traces`. Metadata lives in
pyproject.toml; only the folder mapping, which pyproject's static keys cannot derive, is here.

The compiled build: `pip wheel .` and `pip install .` compile the modules tools/build_native.py lists
(the same staging, transforms and linked libraries as a checkout's `make compile`) and put each
extension module beside its .py file in the wheel, where Python imports it first. The wheel is pure
Python instead when SERVESIM_NO_COMPILE=1 is set, or mypyc, a C compiler or tools/build_native.py
is missing (said on stderr); a build that fails falls back to the .py files with a message and
never fails the install (the wheel is then tagged for this platform but holds no extension module).
An editable install compiles nothing: a checkout's compiled build is `make compile`'s.
"""

import importlib.util
import os
import sys
from pathlib import Path
from runpy import run_path

from setuptools import Distribution, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NO_COMPILE_ENV = "SERVESIM_NO_COMPILE"
BUILD_SCRIPT = HERE / "tools" / "build_native.py"

# One list, read by path (the build does not put this folder on sys.path).
_LAYOUT = run_path(str(HERE / "servesim" / "_layout.py"))
MAPPED_FOLDERS = _LAYOUT["MAPPED_FOLDERS"] + _LAYOUT["DATA_FOLDERS"]

# Namespace discovery so data folders (traces/data, simulator/specs/...) count as packages and
# their files ship as package data.
_SKIP = ["*.__pycache__", "*.__pycache__.*"]
packages = find_namespace_packages(include=["servesim", "servesim.*"], exclude=_SKIP)
for folder in MAPPED_FOLDERS:
    packages += [f"servesim.{name}" for name in find_namespace_packages(include=[folder, f"{folder}.*"], exclude=_SKIP)]


def _load_build_script():
    """tools/build_native.py, loaded by path (the build does not put tools/ on sys.path)."""
    spec = importlib.util.spec_from_file_location("servesim_build_native", BUILD_SCRIPT)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def _why_pure() -> str | None:
    """Why this build makes the pure-Python wheel, or None: it compiles (cheap checks only: this
    runs for every build-backend hook)."""
    if os.environ.get(NO_COMPILE_ENV, "") not in ("", "0"):
        return f"{NO_COMPILE_ENV} is set"
    if not BUILD_SCRIPT.is_file():
        return "tools/build_native.py is not in this source tree"
    return _load_build_script().compiler_missing()


class CompiledDistribution(Distribution):
    """Declares extension modules before they exist (build_native_ext makes them): the wheel is
    tagged for this interpreter and platform, and setuptools runs build_ext."""

    def has_ext_modules(self) -> bool:
        return True


class build_native_ext(build_ext):  # noqa: N801 (a setuptools command's name)
    """build_ext for tools/build_native.py's modules, built into the wheel beside their .py files."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        if self.inplace or self.editable_mode:
            return  # a checkout runs make's build (build/native/), never extension modules in its folders
        native = _load_build_script()
        try:
            self.distribution.ext_modules = native.wheel_extensions(HERE, Path(self.build_temp).resolve() / "native")
            # setuptools reads the extensions (and sets up each one's name and output file) in
            # finalize_options, which ran before they existed: the options again, from their
            # defaults (not set on this command's line: a wheel's build passes none, and an
            # in-place build never comes here) and the build command's.
            self.initialize_options()
            self.finalize_options()
            print(f"servesim: compiling {len(native.listed_modules())} modules with mypyc", file=sys.stderr)
            super().run()
        except (Exception, SystemExit) as e:  # noqa: BLE001 (a failed compile never fails the install)
            for ext in self.extensions or []:  # no extension module of a half-finished build ships
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            self.extensions = []
            print(f"servesim: the compiled build failed ({type(e).__name__}: {e}); "
                  "installing the pure-Python modules", file=sys.stderr)


_pure_reason = _why_pure()
if _pure_reason is not None:
    print(f"servesim: building the pure-Python package ({_pure_reason})", file=sys.stderr)

setup(
    packages=packages,
    package_dir={f"servesim.{folder}": folder for folder in MAPPED_FOLDERS},
    **({} if _pure_reason else {"distclass": CompiledDistribution, "cmdclass": {"build_ext": build_native_ext}}),
)
