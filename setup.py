"""Package layout: the repository's top-level folders installed under the one import name `servesim`.

scheduler/, simulator/, gpu_runner/ and traces/ stay where the design card puts them; the wheel
(and an editable install) exposes them as servesim.scheduler, servesim.simulator, ... so servesim
never shadows the PyPI packages called `scheduler`, `simulator` or `traces`. Metadata lives in
pyproject.toml; only the folder mapping, which pyproject's static keys cannot derive, is here.
"""

from pathlib import Path
from runpy import run_path

from setuptools import find_namespace_packages, setup

# One list, read by path (the build does not put this folder on sys.path).
MAPPED_FOLDERS = run_path(str(Path(__file__).parent / "servesim" / "_layout.py"))["MAPPED_FOLDERS"]

# Namespace discovery so data folders (traces/data, simulator/specs/...) count as packages and
# their files ship as package data.
_SKIP = ["*.__pycache__", "*.__pycache__.*"]
packages = find_namespace_packages(include=["servesim", "servesim.*"], exclude=_SKIP)
for folder in MAPPED_FOLDERS:
    packages += [f"servesim.{name}" for name in find_namespace_packages(include=[folder, f"{folder}.*"], exclude=_SKIP)]

setup(
    packages=packages,
    package_dir={f"servesim.{folder}": folder for folder in MAPPED_FOLDERS},
)
