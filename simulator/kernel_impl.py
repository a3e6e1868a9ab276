"""The simulator's numeric kernels as the engine calls them, and which build of them runs.

simulator/kernels.py is one of the modules the compiled build compiles (tools/build_native.py, with
the engine): `servesim.simulator.kernels` is then the extension module wherever the import system
finds one first (a checkout's current build/native/, selected by servesim/_native.py with the rest
of the build; an installed wheel's, beside kernels.py), and kernels.py itself, the reference,
otherwise. The compiled functions return the very floats the reference does
(tests/test_kernels.py). `servesim --version` reports the build (servesim/_native.py::kernels_mode).
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES

from servesim.simulator import kernels

compiled: bool = str(kernels.__file__).endswith(tuple(EXTENSION_SUFFIXES))
step_timeline = kernels.step_timeline
decode_step_prices = kernels.decode_step_prices
DenseRooflinePricer = kernels.DenseRooflinePricer
